"""Workers added to a ready cluster, and replacements of lost or unhealthy workers
(clusters/lifecycle/repair.py): each passes the join steps on its own, then its software's
install; it is billed once it serves the cluster, and one that fails is released alone while the
rest of the cluster keeps running. A replacement that joins makes a cluster degraded only by what
it replaced ready again."""

from __future__ import annotations

from clusters.lifecycle.records import Failure
from clusters.lifecycle.rules import acceptance_report, joining
from clusters.lifecycle.steps import install
from clusters.lifecycle.steps.join import join_steps
from clusters.lifecycle.unit import UnitOfWork
from clusters.models import Cluster, Event, Node
from runcrate.money import usd

Status = Cluster.Status
Step = Node.Step
NodeStatus = Node.Status
Reason = Event.Reason


def workers(work: UnitOfWork) -> None:
    starting = [n for n in work.nodes if n.status == NodeStatus.STARTING]
    if starting:
        joined = [n.name for n in work.nodes if n.status == NodeStatus.JOINED]
        names = joined + [n.name for n in starting]
        peers_of = {n.pk: [p for p in names if p != n.name] for n in starting}
        for failure in join_steps(work, starting, peers_of):
            fail_worker(work, failure)
        for node in starting:
            if node.status == NodeStatus.STARTING and node.network_at is not None:
                report = acceptance_report([node], work.machine_type, at=work.now)
                work.cluster.acceptance.setdefault("nodes", []).extend(report["nodes"])
                work.cluster_dirty = True
                work.join_node(node)
                work.replan_others(node)
                if work.cluster.software == Cluster.Software.NONE:
                    work.finish_node(node)
                    worker_joined(work, node)
                else:
                    # Billed once it is up: its software joined (a worker whose install
                    # fails was never of use, and is never billed).
                    work.begin_install(node)
    targets = [n for n in work.nodes if n.status == NodeStatus.JOINED and joining(work.cluster, n)]
    if targets:
        failures, became_ready = install.install(work, targets)
        for failure in failures:
            fail_worker(work, failure)
        for node in became_ready:
            worker_joined(work, node)


def worker_joined(work: UnitOfWork, node: Node) -> None:
    work.bill(node)
    if node.replaces_id is not None:
        replaced(work, node)
        return
    work.event(
        Reason.WORKER_JOINED,
        f"Worker {node.name} joined the cluster; billed from {work.now:%H:%M:%S} UTC.",
        node=node,
        step=node.step,
    )


def replaced(work: UnitOfWork, node: Node) -> None:
    """A replacement is up: one event (and email) saying so, what it costs, and whether the
    cluster is ready again."""
    cluster = work.cluster
    again = ""
    if ready_again(work):
        work.set_status(Status.READY)
        cluster.clear_failure()
        cluster.health_problems = {}
        again = " Every machine is healthy: the cluster is ready again."
    work.event(
        Reason.NODE_REPLACED,
        f"{node.name} was replaced: a new machine took its name and private address "
        f"{node.private_ip}, billed from {work.now:%H:%M:%S} UTC at "
        f"{usd(cluster.price_per_machine_hour)}/h.{again}",
        node=node,
        step=node.step,
    )


def ready_again(work: UnitOfWork) -> bool:
    """Whether a degraded cluster is whole again: it was degraded by a lost or unhealthy
    machine, no machine is still joining, every lost one has a replacement up, and no open
    health problem names a machine that serves it."""
    cluster = work.cluster
    if cluster.status != Status.DEGRADED or cluster.failure_reason not in (
        Reason.MACHINE_LOST,
        Reason.NODE_UNHEALTHY,
    ):
        return False
    up = {n.name for n in work.nodes if n.status == NodeStatus.JOINED and n.step == Step.DONE}
    if any(joining(cluster, n) for n in work.nodes):
        return False
    if any(n.status == NodeStatus.LOST and n.name not in up for n in work.nodes):
        return False
    return not any(p.get("node") in up for p in (cluster.health_problems or {}).values())


def fail_worker(work: UnitOfWork, failure: Failure) -> None:
    node = failure.node
    # A worker is billed only once it is up (`worker_joined`): one that fails was not.
    was_joined = node.status == NodeStatus.JOINED
    work.end_node(node, NodeStatus.FAILED)
    if was_joined:
        work.replan_others(node)  # the others stop naming it
    if node.replaces_id is not None:
        # The cluster stays degraded, with its reason: the machine replaced is still gone.
        if work.cluster.status == Status.READY:
            work.set_status(Status.DEGRADED)
        work.event(
            Reason.REPLACEMENT_FAILED,
            f"{failure.message} The replacement for {node.name} is being released alone and "
            "was never billed; the cluster stays degraded. Replace it again, or terminate the "
            "cluster.",
            node=node,
            step=failure.step,
            output=failure.output,
        )
        return
    work.event(
        Reason.WORKER_FAILED,
        f"{failure.message} Worker {node.name} is being released alone; the rest of the "
        "cluster keeps running.",
        node=node,
        step=failure.step,
        output=failure.output,
    )
