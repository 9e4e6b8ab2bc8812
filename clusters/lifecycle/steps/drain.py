"""Drained workers (docs/lifecycle.md, "Repair"): a worker of a running cluster that is unhealthy
or lost is taken out of its software's scheduling at once, so no new job lands on it, and put
back once its problem clears.

What the cluster wants is on its nodes (`Node.drained`: why, empty while it schedules work),
set by `mark_drained` and `mark_undrained` (the health judgement, a lost machine). What the
head's scheduler holds is the key of the last DRAIN work that landed on node-0 (the names it
drained). `drain` compares the two on every pass and hands the head the work when they differ,
so a drain asked for while the head is busy (a worker joining, a prune) is done once it is free:
nothing is lost, and nothing is done twice.
"""

from __future__ import annotations

from clusters.lifecycle.records import Action, ActionKind
from clusters.lifecycle.rules import joining
from clusters.lifecycle.unit import UnitOfWork
from clusters.models import Cluster, Event, Node

NodeStatus = Node.Status
Reason = Event.Reason
Software = Cluster.Software

# How each software takes a machine out of its scheduling, in the events' words.
TAKEN_OUT: dict[str, str] = {
    Software.SLURM: "drained in Slurm",
    Software.RAY: "taken out of Ray (its raylet stopped)",
    Software.KUBERNETES: "cordoned in Kubernetes",
}


def drains(cluster: Cluster) -> bool:
    """Whether the cluster runs software that schedules work, which a drain takes a node out
    of (a cluster without software has nothing to drain)."""
    return cluster.software in TAKEN_OUT


def wanted_key(nodes: list[Node]) -> str:
    """The workers the head's scheduler should hold drained: their names, in order."""
    return ",".join(
        n.name
        for n in sorted(nodes, key=lambda n: n.index)
        if n.status == NodeStatus.JOINED and n.index != 0 and n.drained
    )


def applied_key(work: UnitOfWork, head: Node) -> str | None:
    """What the head's scheduler holds drained, as the last DRAIN work that landed on it says
    ("" before any: nothing drained); None after one that failed."""
    done = work.work_of(head).get(ActionKind.DRAIN)
    if done is None:
        return ""
    return done.key if done.ok else None


def drain(work: UnitOfWork) -> None:
    """Hand the head the DRAIN work when what it holds differs from what the cluster wants.
    Waits while a machine joins (the software's configuration is changing then) and retries a
    failed one after RETRY_AFTER."""
    cluster = work.cluster
    if not drains(cluster) or cluster.status not in Cluster.RUNNING:
        return
    head = next((n for n in work.nodes if n.index == 0 and n.status == NodeStatus.JOINED), None)
    if head is None or head.step != Node.Step.DONE:
        return
    wanted, applied = wanted_key(work.nodes), applied_key(work, head)
    if applied == wanted:
        return
    done = work.work_of(head).get(ActionKind.DRAIN)
    if (
        _waiting_for_a_join(work, applied)
        or (done is not None and not done.ok and work.backing_off(done))
        or head.lease_is_held(work.now)
    ):
        work.still_due = True  # the tick comes back for it
        return
    work.hand_off(head, Action(ActionKind.DRAIN, wanted))


def _waiting_for_a_join(work: UnitOfWork, applied: str | None) -> bool:
    """Whether the drain waits for a machine that is joining (the software's configuration
    is changing then). Not when the scheduler holds drained the name of a replacement that
    is joining: its predecessor's drain, which the scheduler may keep for the name (Slurm
    does), would keep the replacement from ever being ready; it is lifted at once."""
    joining_names = {n.name for n in work.nodes if joining(work.cluster, n)}
    if not joining_names:
        return False
    held = set(applied.split(",")) if applied else set()
    return not (held & joining_names)


def mark_drained(work: UnitOfWork, node: Node, why: str, *, lost: bool = False) -> None:
    """Take the worker `node` out of scheduling because of `why` (its problem, in words): one
    event, which says so (and tells the channels: `node.drained`). A `lost` one leaves the
    software's configuration altogether (the head's prune, `UnitOfWork.replan_others`)."""
    if not drains(work.cluster) or node.index == 0 or node.drained:
        return
    node.drained = why[:300]
    node.drained_at = work.now
    work.touch(node, "drained", "drained_at")
    software = work.cluster.get_software_display()
    if lost:
        said = (
            f"{node.name} was taken out of {software}: {why}. Jobs that ran on it are gone "
            "with it; no new one is scheduled there."
        )
    else:
        said = (
            f"{node.name} was {TAKEN_OUT[work.cluster.software]}: {why}. Jobs already on it "
            "keep running; no new one lands on it until it is healthy again or replaced."
        )
    work.event(Reason.NODE_DRAINED, said, node=node)


def mark_undrained(work: UnitOfWork, node: Node) -> None:
    """Put the worker `node` back into scheduling: what drained it cleared."""
    if not node.drained:
        return
    node.drained = ""
    node.drained_at = None
    work.touch(node, "drained", "drained_at")
    if node.status == NodeStatus.JOINED:
        work.event(
            Reason.NODE_UNDRAINED,
            f"{node.name} is healthy again and takes new jobs.",
            node=node,
        )
