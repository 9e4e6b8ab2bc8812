"""Step `agent`: the node's agent checks in, with the GPUs it sees, in time."""

from __future__ import annotations

from clusters.lifecycle.records import Action, ActionKind, Failure
from clusters.lifecycle.rules import gpu_line, hardware_problem
from clusters.lifecycle.unit import UnitOfWork
from clusters.machines import get_driver
from clusters.models import Event, Node
from runcrate.durations import in_words

Step = Node.Step
Reason = Event.Reason


def step(work: UnitOfWork, node: Node) -> Failure | None:
    if node.agent_at is not None and node.agent_at <= work.deadline(node, node.agent_at):
        problem = hardware_problem(node, work.machine_type)
        if problem:
            return Failure(
                Reason.HARDWARE_MISMATCH,
                node,
                Step.AGENT,
                problem,
                output="\n".join(gpu_line(g) for g in node.gpus),
            )
        node.move_to(step=Step.NETWORK)
        node.step_started_at = node.agent_at
        node.step_deadline = None  # set when the last agent of its batch checks in
        work.touch(node)
        work.event(
            Reason.AGENT_CHECKED_IN,
            f"{node.name}'s agent checked in with {len(node.gpus)} × "
            f"{node.gpus[0]['name'] if node.gpus else 'GPU'}.",
            node=node,
            step=Step.AGENT,
        )
        return None
    if work.now >= work.deadline(node, work.now):
        assert node.step_deadline is not None  # work.deadline read it
        allowed = (node.step_deadline - node.step_started_at).total_seconds()
        return Failure(
            Reason.AGENT_TIMEOUT,
            node,
            Step.AGENT,
            f"{node.name}'s agent did not check in within {in_words(allowed)} of the "
            f"machine running ({work.limit_note(node, 1)}{work.downtime_note(node)}).",
        )
    due = get_driver(node.reserved_host).agent_work_due(
        node, step=Step.AGENT, now=work.now, since=node.step_started_at
    )
    if due and not work.backing_off(work.work_of(node).get(ActionKind.AGENT)):
        work.hand_off(node, Action(ActionKind.AGENT))
    return None
