"""Step `running`: the node's machine is started (handed off), watched until it runs, and
failed when it does not come up in time."""

from __future__ import annotations

from clusters.lifecycle.records import Action, ActionKind, Failure, StartOutcome
from clusters.lifecycle.rules import START_ATTEMPTS, node_give_up_at, step_deadline
from clusters.lifecycle.unit import UnitOfWork
from clusters.machines import get_driver
from clusters.machines.base import MachineState
from clusters.models import Event, Node
from runcrate.durations import in_words

Step = Node.Step
Reason = Event.Reason


def observe(work: UnitOfWork, node: Node) -> Failure | None:
    """What the driver knows of a started machine: gone or failed, where users reach it, and
    (in step `running`) whether it runs, which passes the step."""
    start = work.work_of(node).start
    if start is None or not start.ok:
        return None
    observation = get_driver(node.reserved_host).observe(node, now=work.now)
    if observation.state in (MachineState.FAILED, MachineState.GONE):
        gone = observation.state is MachineState.GONE
        return Failure(
            observation.reason or (Reason.MACHINE_GONE if gone else Reason.MACHINE_FAILED),
            node,
            node.step,
            observation.message or f"{node.name}'s machine {'disappeared' if gone else 'failed'}.",
        )
    reached = (observation.public_address, observation.public_port, observation.host_key)
    if observation.state is MachineState.RUNNING and reached != (
        node.public_address,
        node.public_port,
        node.host_key,
    ):
        # Where users reach it over SSH (the connect panel); a restarted machine may move.
        node.public_address, node.public_port, node.host_key = reached
        work.touch(node)
    if node.step == Step.RUNNING and (
        observation.state is MachineState.RUNNING or node.agent_at is not None
    ):
        since = min(observation.since or work.now, node.agent_at or work.now, work.now)
        if since <= work.deadline(node, since):
            node.running_at = since
            node.move_to(step=Step.AGENT)
            node.step_started_at = since
            node.step_deadline = step_deadline(
                start=since, seconds=work.boot, cap=node_give_up_at(node, work.machine_type)
            )
            work.touch(node)
            work.event(
                Reason.MACHINE_RUNNING,
                f"{node.name}'s machine is running.",
                node=node,
                step=Step.RUNNING,
            )
    return None


def step(work: UnitOfWork, node: Node) -> Failure | None:
    """Start the machine (again, after a failed start has waited), or fail the node."""
    start = work.work_of(node).start
    started = start is not None and start.ok
    if start is not None and not start.ok and start.attempts:
        failure = start_failure(node, start)
        if failure is not None:
            return failure
    if not started and not work.backing_off(start):
        work.hand_off(node, Action(ActionKind.START))
    if node.step == Step.RUNNING and work.now >= work.deadline(node, work.now):
        assert node.step_deadline is not None  # work.deadline read it
        allowed = (node.step_deadline - node.step_started_at).total_seconds()
        return Failure(
            Reason.BOOT_TIMEOUT,
            node,
            Step.RUNNING,
            f"{node.name}'s machine did not come up within {in_words(allowed)} "
            f"({work.limit_note(node, 2)}{work.downtime_note(node)}).",
        )
    return None


def start_failure(node: Node, start: StartOutcome) -> Failure | None:
    """A start the driver refused for good (it named a reason: a host key that does not
    match), or that failed START_ATTEMPTS times (the host does not answer)."""
    if start.reason:
        reason = start.reason
    elif start.attempts >= START_ATTEMPTS:
        reason = Reason.MACHINE_FAILED
    else:
        return None
    return Failure(
        reason,
        node,
        Step.RUNNING,
        f"{node.name}'s machine could not be started: {start.error or 'no reason given'}",
        output=start.output,
    )
