"""Acceptance in rounds (docs/lifecycle.md, "Acceptance before billing"): who measures the
private network against whom, and when, so that no two measurements ever share a machine's
link, and a cluster of any size is measured in at most three rounds.

A measurement is one node (the sender) moving a stream to one peer (the receiver) for a few
seconds. A round is a set of measurements in which every node takes part in at most one, so
each figure is that pair's alone. Every node of the batch sends exactly once (its own figure)
and receives exactly once, from a different peer when the batch has three nodes or more:

    round 1:  0 -> 1,  2 -> 3,  4 -> 5, ...       (each even position to the next)
    round 2:  1 -> 2,  3 -> 4,  ...,  n-1 -> 0    (each odd position to the next, around)
    round 3:  n-1 -> 0                            (an odd batch only: its last position)

A batch of one (a worker added alone) measures to node-0, which has joined and serves its sink.

A round's measurements run side by side where the location's fabric carries them all at once
(each machine its own link to a non-blocking switch). Where it does not (an oversubscribed
fabric, or the host lab, whose every link is the same two CPUs), the location says how many
measurements it carries at once (`Location.measurements_at_once`), and each round runs in
**waves** of at most that many pairs, one wave after another: rounds decide who measures
against whom, waves only when.

Pure functions of the batch's node indices and figures: the agent service answers each agent
its round and peer (`measure_turn`, `measure_peer`), the network step judges with `slow_verdict`,
and the report keeps each node's round and peer.
"""

from __future__ import annotations

from dataclasses import dataclass

# The most rounds any batch needs (an odd one; an even one needs two).
MOST_ROUNDS = 3


@dataclass(frozen=True)
class Placement:
    """A node's own measurement: in which round it sends, to which peer (node indices)."""

    round: int
    peer: int


def schedule(count: int) -> list[list[tuple[int, int]]]:
    """The rounds for `count` nodes by position (0 .. count-1): each a list of (sender,
    receiver). Every position sends once and receives once; no position is in two
    measurements of a round; a batch of one has none (it measures to node-0, see `placements`)."""
    if count < 2:
        return []
    first = [(i, i + 1) for i in range(0, count - 1, 2)]
    if count == 2:
        return [first, [(1, 0)]]
    if count % 2 == 0:
        return [first, [(i, (i + 1) % count) for i in range(1, count, 2)]]
    second = [(i, i + 1) for i in range(1, count - 1, 2)]
    return [first, second, [(count - 1, 0)]]


def placements(indices: list[int]) -> dict[int, Placement]:
    """Each node of the batch (its node indices) by its round and peer. A batch of one worker
    sends to node-0 in round 1; node-0 alone (a cluster of one) measures nothing."""
    ordered = sorted(indices)
    if len(ordered) == 1:
        return {} if ordered[0] == 0 else {ordered[0]: Placement(1, 0)}
    return {
        ordered[sender]: Placement(number, ordered[receiver])
        for number, pairs in enumerate(schedule(len(ordered)), start=1)
        for sender, receiver in pairs
    }


def rounds_needed(indices: list[int]) -> int:
    """How many rounds the batch's measurements take (what the network step's deadline allows)."""
    return max((p.round for p in placements(indices).values()), default=0)


def waves(count: int, at_once: int | None) -> list[list[tuple[int, int]]]:
    """The measurements for `count` nodes by position, in the order they run: each round of
    `schedule` split into waves of at most `at_once` pairs (None: each round one wave). A wave
    is part of one round, so no machine is in two measurements of a wave."""
    return [
        pairs[start : start + (at_once or len(pairs))]
        for pairs in schedule(count)
        for start in range(0, len(pairs), at_once or len(pairs))
    ]


def wave_of(indices: list[int], at_once: int | None) -> dict[int, int]:
    """Each sending node of the batch (its node indices) by the wave it measures in (1, 2,
    ...), waves of at most `at_once` measurements (None: a round's all at once). A batch of one
    worker measures in wave 1; node-0 alone measures nothing."""
    ordered = sorted(indices)
    if len(ordered) == 1:
        return {} if ordered[0] == 0 else {ordered[0]: 1}
    return {
        ordered[sender]: number
        for number, pairs in enumerate(waves(len(ordered), at_once), start=1)
        for sender, _ in pairs
    }


def waves_needed(indices: list[int], at_once: int | None) -> int:
    """How many waves the batch's measurements take, one after another (what the network
    step's deadline allows): its rounds, where the fabric carries each round at once."""
    return max(wave_of(indices, at_once).values(), default=0)


def senders(placed: dict[int, Placement]) -> dict[int, int]:
    """Who sends to each node: receiver -> sender."""
    return {p.peer: sender for sender, p in placed.items()}


def slow_verdict(
    index: int, figures: dict[int, float | None], placed: dict[int, Placement], minimum: float
) -> bool | None:
    """Whether node `index`'s own figure names it slow: True (slow), False (not named) or None
    (not yet known: its figure, or a figure it is compared with, has not been reported).
    `figures` are the reported nodes' own figures (Mbit/s, None where it measured nothing).

    A node's own figure below `minimum` names it, unless its peer is the slow one: the peer's
    own figure (to another peer, in another round) is slow too while what this node received
    from a third node is healthy, so the peer is slow against two different peers and this
    node is not. Where a figure to compare with is missing, the node's own figure stands."""
    placement = placed.get(index)
    if placement is None:
        return False
    if index not in figures:
        return None
    own = figures[index]
    if own is None or own >= minimum:
        return False
    peer, sender = placement.peer, senders(placed).get(index)
    if peer not in placed or sender is None or sender == peer:
        return True  # nobody else to compare with (a batch of one or two)
    if peer not in figures or sender not in figures:
        return None  # wait for the other round before naming anyone
    peer_slow = _below(figures[peer], minimum)
    received_healthy = not _below(figures[sender], minimum)
    return not (peer_slow and received_healthy)


def _below(figure: float | None, minimum: float) -> bool:
    return figure is not None and figure < minimum
