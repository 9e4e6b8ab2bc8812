"""Acceptance in rounds (issue 38): the schedule pairs the batch's nodes so that no two
measurements share a machine's link, in at most three rounds whatever the size, every node
measured; and the judgement names a slow node alone, never its healthy peer
(clusters/lifecycle/rounds.py, docs/lifecycle.md "Acceptance before billing")."""

from __future__ import annotations

import pytest

from clusters.lifecycle import rounds
from clusters.lifecycle.rounds import (
    MOST_ROUNDS,
    Placement,
    placements,
    schedule,
    slow_verdict,
    wave_of,
    waves,
)

MINIMUM = 50.0


@pytest.mark.parametrize("count", range(2, 65))
def test_every_node_is_measured_in_a_few_rounds_and_no_machine_is_in_two_at_once(count):
    rounds_ = schedule(count)
    assert 1 <= len(rounds_) <= MOST_ROUNDS
    for pairs in rounds_:
        machines = [m for pair in pairs for m in pair]
        assert len(machines) == len(set(machines)), pairs  # each machine in one measurement
        assert all(sender != receiver for sender, receiver in pairs)
        assert all(0 <= m < count for m in machines)
    sent = sorted(sender for pairs in rounds_ for sender, _ in pairs)
    received = sorted(receiver for pairs in rounds_ for _, receiver in pairs)
    assert sent == received == list(range(count))  # every node sends once and receives once
    if count >= 3:
        # Told apart from its peer: what a node receives comes from another peer than the one
        # it sends to.
        to = {s: r for pairs in rounds_ for s, r in pairs}
        came_from = {r: s for s, r in to.items()}
        assert all(to[i] != came_from[i] for i in range(count))


def test_sixty_four_nodes_take_two_rounds_and_an_odd_batch_three():
    assert len(schedule(64)) == 2
    assert schedule(4) == [[(0, 1), (2, 3)], [(1, 2), (3, 0)]]
    assert schedule(5) == [[(0, 1), (2, 3)], [(1, 2), (3, 4)], [(4, 0)]]
    assert schedule(2) == [[(0, 1)], [(1, 0)]]
    assert schedule(1) == schedule(0) == []


def test_placements_are_by_node_index_and_a_lone_worker_measures_to_node_0():
    assert placements([0, 1, 2, 3]) == {
        0: Placement(1, 1),
        1: Placement(2, 2),
        2: Placement(1, 3),
        3: Placement(2, 0),
    }
    # Added workers (node-0 has joined and is not in the batch): among themselves.
    assert placements([7, 5, 6]) == {5: Placement(1, 6), 6: Placement(2, 7), 7: Placement(3, 5)}
    assert placements([4]) == {4: Placement(1, 0)}
    assert placements([0]) == {}
    assert rounds.rounds_needed(list(range(64))) == 2
    assert rounds.rounds_needed(list(range(63))) == 3
    assert rounds.rounds_needed([0]) == 0


# --- waves: a round in parts where the location's fabric carries fewer measurements at once -----


@pytest.mark.parametrize("at_once", [1, 2, 3, 5, None])
@pytest.mark.parametrize("count", range(2, 65))
def test_waves_split_the_rounds_never_above_the_locations_figure_nor_a_machine_twice(
    count, at_once
):
    parts = waves(count, at_once)
    for pairs in parts:
        assert 1 <= len(pairs) <= (at_once or count), pairs  # the fabric's figure at most
        machines = [m for pair in pairs for m in pair]
        assert len(machines) == len(set(machines)), pairs  # no machine in two at once
    # The same measurements as the rounds, in the rounds' order, each wave inside one round.
    assert [pair for pairs in parts for pair in pairs] == [
        pair for pairs in schedule(count) for pair in pairs
    ]
    round_of = {pair: number for number, pairs in enumerate(schedule(count)) for pair in pairs}
    for pairs in parts:
        assert len({round_of[pair] for pair in pairs}) == 1, pairs
    # Each round in as few waves as the figure allows.
    expected = sum(-(-len(pairs) // (at_once or count)) for pairs in schedule(count))
    assert len(parts) == expected
    if at_once is None:
        assert parts == schedule(count)  # a non-blocking fabric: a round is one wave


def test_a_wave_of_each_sender_by_node_index_and_the_waves_needed():
    # Eight nodes, two at once: round 1 in waves 1 and 2, round 2 in waves 3 and 4.
    assert waves(8, 2) == [[(0, 1), (2, 3)], [(4, 5), (6, 7)], [(1, 2), (3, 4)], [(5, 6), (7, 0)]]
    assert wave_of(list(range(8)), 2) == {0: 1, 2: 1, 4: 2, 6: 2, 1: 3, 3: 3, 5: 4, 7: 4}
    assert wave_of(list(range(8)), None) == {i: 1 + i % 2 for i in range(8)}
    # Added workers by their indices; a lone one, and node-0 alone.
    assert wave_of([7, 5, 6], 1) == {5: 1, 6: 2, 7: 3}
    assert wave_of([4], 1) == {4: 1}
    assert wave_of([0], 2) == {}
    assert rounds.waves_needed(list(range(64)), None) == 2
    assert rounds.waves_needed(list(range(64)), 8) == 8  # 32 pairs a round, 8 at a time
    assert rounds.waves_needed(list(range(10)), 2) == 6  # 5 pairs a round: 3 waves each
    assert rounds.waves_needed(list(range(2)), 2) == 2
    assert rounds.waves_needed([0], 2) == 0


def figures_with(slow: dict[int, float], count: int = 8) -> dict[int, float | None]:
    return {i: slow.get(i, 180.0) for i in range(count)}


def verdicts(figures: dict[int, float | None], count: int = 8) -> dict[int, bool | None]:
    placed = placements(list(range(count)))
    return {i: slow_verdict(i, figures, placed, MINIMUM) for i in range(count)}


def test_a_slow_sender_is_named_alone_and_its_peer_is_not_blamed():
    # node-5 sends to node-6 in round 2 at 8 Mbit/s; node-6's own figure (to node-7) is healthy.
    seen = verdicts(figures_with({5: 8.0}))
    assert [i for i, slow in seen.items() if slow] == [5]
    assert seen[6] is False and seen[4] is False


def test_a_peer_slow_against_two_peers_is_the_one_named():
    # node-6's link is slow both ways: what node-5 sent it is slow, and its own figure too,
    # while what node-5 received from node-4 is healthy: node-5 is not named, node-6 is.
    seen = verdicts(figures_with({5: 9.0, 6: 7.0}))
    assert seen[5] is False and seen[6] is True
    assert [i for i, slow in seen.items() if slow] == [6]


def test_two_slow_nodes_each_slow_against_two_peers_are_both_named():
    # node-4 -> node-5 slow, node-5 -> node-6 slow, node-3 -> node-4 slow: node-4 is slow
    # against node-3 and node-5 (both ways), node-5 slow against node-4 and node-6.
    seen = verdicts(figures_with({3: 9.0, 4: 9.0, 5: 9.0}))
    assert seen[4] is True and seen[5] is True


def test_a_slow_figure_waits_for_the_other_round_before_naming_anyone():
    figures = {i: 180.0 for i in (0, 2, 4, 6)}  # round 1 reported
    figures[4] = 8.0
    placed = placements(list(range(8)))
    assert slow_verdict(4, figures, placed, MINIMUM) is None  # node-5's own figure not yet in
    assert slow_verdict(0, figures, placed, MINIMUM) is False  # a healthy one passes at once
    assert slow_verdict(5, figures, placed, MINIMUM) is None  # node-5 has not reported
    figures |= {i: 180.0 for i in (1, 3, 5, 7)}
    assert slow_verdict(4, figures, placed, MINIMUM) is True


def test_a_batch_of_two_names_its_own_slow_figure_and_a_missing_figure_names_nobody():
    placed = placements([0, 1])
    assert slow_verdict(1, {0: 900.0, 1: 8.0}, placed, MINIMUM) is True
    assert slow_verdict(0, {0: 900.0, 1: 8.0}, placed, MINIMUM) is False
    assert slow_verdict(1, {0: 900.0, 1: None}, placed, MINIMUM) is False
    assert slow_verdict(3, {3: 8.0}, placements([3]), MINIMUM) is True  # measured to node-0
