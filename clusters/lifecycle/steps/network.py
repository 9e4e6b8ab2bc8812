"""Step `network`: once every agent of a batch checked in, each node reports reaching every
peer over the private network, with figures that pass the acceptance check, in time."""

from __future__ import annotations

from datetime import datetime

from clusters.lifecycle import rounds
from clusters.lifecycle.records import Action, ActionKind, Failure
from clusters.lifecycle.rules import (
    MEASURE_TURN_SECONDS,
    acceptance_pending,
    acceptance_problem,
    measured_note,
    node_give_up_at,
    reachability_matrix,
    step_deadline,
)
from clusters.lifecycle.unit import UnitOfWork
from clusters.machines import get_driver
from clusters.models import Event, Node
from runcrate.durations import in_words

Step = Node.Step
Reason = Event.Reason


def step(work: UnitOfWork, batch: list[Node], peers_of: dict[int, list[str]]) -> list[Failure]:
    """The batch's network step; starts only once every agent of the batch checked in."""
    if any(n.step != Step.NETWORK for n in batch):
        return []
    checked_in = [n.agent_at for n in batch if n.agent_at is not None]
    assert len(checked_in) == len(batch)  # a node reaches this step once its agent checked in
    last = max(checked_in)
    # The batch measures in rounds of pairs that never share a link (at most three, whatever
    # its size), each round in waves of as many as the location's fabric carries at once: each
    # wave gets its time.
    at_once = work.machine_type.location.measurements_at_once
    turns = MEASURE_TURN_SECONDS * rounds.waves_needed([n.index for n in batch], at_once)
    placed = rounds.placements([n.index for n in batch])
    failures = []
    for node in batch:
        _keep_placement(work, node, placed.get(node.index))
        if node.step_deadline is None:
            node.step_started_at = last
            node.step_deadline = step_deadline(
                start=last,
                seconds=work.boot + turns,
                cap=node_give_up_at(node, work.machine_type),
            )
            work.touch(node)
        if node.network_at is not None:
            continue
        failure = _judge_node(work, node, peers_of[node.pk], batch, last=last, turns=turns)
        if failure is not None:
            failures.append(failure)
    return failures


def _keep_placement(work: UnitOfWork, node: Node, placement: rounds.Placement | None) -> None:
    """Keep with a reported figure the round it was measured in and its peer (the report's
    `round` and `peer`), from the batch's schedule in memory: no query per report."""
    measured = node.acceptance or {}
    if node.network_reported_at is None or placement is None or "round" in measured:
        return
    node.acceptance = measured | {"round": placement.round, "peer": f"node-{placement.peer}"}
    work.touch(node, "acceptance")


def _judge_node(
    work: UnitOfWork,
    node: Node,
    peers: list[str],
    batch: list[Node],
    *,
    last: datetime,
    turns: int,
) -> Failure | None:
    """A node on its network step: failed when a peer is unreachable, the acceptance fails or
    its time ran out; passed once it reported reaching every peer in time (a slow figure waits
    for its peer's round before anyone is named); else its measurement handed off again when
    due."""
    reached = node.reachability or {}
    unreachable = [p for p in peers if reached.get(p) is False]
    if unreachable:
        return Failure(
            Reason.NETWORK_UNREACHABLE,
            node,
            Step.NETWORK,
            f"{node.name} cannot reach {', '.join(unreachable)} over the private network.",
            output=reachability_matrix(work.nodes),
        )
    if (
        all(reached.get(p) is True for p in peers)
        and node.network_reported_at is not None
        and node.network_reported_at <= work.deadline(node, node.network_reported_at)
        and not acceptance_pending(node, work.machine_type, batch)
    ):
        problem = acceptance_problem(node, work.machine_type, batch)
        if problem:
            return Failure(Reason.ACCEPTANCE_FAILED, node, Step.NETWORK, problem)
        node.network_at = node.network_reported_at
        work.touch(node)
        work.event(
            Reason.NETWORK_OK,
            f"{node.name} reaches every other node{measured_note(node)}.",
            node=node,
            step=Step.NETWORK,
        )
        return None
    if work.now >= work.deadline(node, work.now):
        return _timed_out(work, node, peers, last=last, turns=turns)
    if (
        any(p not in reached for p in peers)
        and get_driver(node.reserved_host).agent_work_due(
            node, step=Step.NETWORK, now=work.now, since=last
        )
        and not work.backing_off(work.work_of(node).get(ActionKind.NETWORK))
    ):
        work.hand_off(node, Action(ActionKind.NETWORK))
    return None


def _timed_out(
    work: UnitOfWork, node: Node, peers: list[str], *, last: datetime, turns: int
) -> Failure:
    """A node whose network step ran out of time: the peers it never reported reaching, and
    the time it had."""
    assert node.step_deadline is not None  # set by `step`
    reached = node.reachability or {}
    if node.network_reported_at is not None and all(reached.get(p) is True for p in peers):
        # It reported, slow, and its peer's round never came: its own figure stands.
        problem = acceptance_problem(node, work.machine_type)
        if problem:
            return Failure(Reason.ACCEPTANCE_FAILED, node, Step.NETWORK, problem)
    allowed = (node.step_deadline - last).total_seconds()
    missing = [p for p in peers if p not in reached]
    turn_note = f", and {MEASURE_TURN_SECONDS} s for each wave of measurements"
    turn_note = turn_note if turns else ""
    return Failure(
        Reason.NETWORK_TIMEOUT,
        node,
        Step.NETWORK,
        f"{node.name} did not report reaching "
        f"{', '.join(missing) or 'its peers'} within {in_words(allowed)} of the "
        f"last agent checking in ({work.limit_note(node, 1)}{turn_note}"
        f"{work.downtime_note(node)}).",
        output=reachability_matrix(work.nodes),
    )
