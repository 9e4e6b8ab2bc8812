"""Workers added to a ready cluster: each passes the join steps on its own, then its
software's install; it is billed once it serves the cluster, and one that fails is released
alone while the rest of the cluster keeps running."""

from __future__ import annotations

from clusters.lifecycle.records import Failure
from clusters.lifecycle.rules import acceptance_report
from clusters.lifecycle.steps import install
from clusters.lifecycle.steps.join import join_steps
from clusters.lifecycle.unit import UnitOfWork
from clusters.models import Cluster, Event, Node

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
    targets = [n for n in work.nodes if n.status == NodeStatus.JOINED and n.step == Step.INSTALL]
    if targets:
        failures, became_ready = install.install(work, targets)
        for failure in failures:
            fail_worker(work, failure)
        for node in became_ready:
            worker_joined(work, node)


def worker_joined(work: UnitOfWork, node: Node) -> None:
    work.bill(node)
    work.event(
        Reason.WORKER_JOINED,
        f"Worker {node.name} joined the cluster; billed from {work.now:%H:%M:%S} UTC.",
        node=node,
        step=node.step,
    )


def fail_worker(work: UnitOfWork, failure: Failure) -> None:
    node = failure.node
    # A worker is billed only once it is up (`worker_joined`): one that fails was not.
    was_joined = node.status == NodeStatus.JOINED
    work.end_node(node, NodeStatus.FAILED)
    if was_joined:
        work.replan_others(node)  # the others stop naming it
    work.event(
        Reason.WORKER_FAILED,
        f"{failure.message} Worker {node.name} is being released alone; the rest of the "
        "cluster keeps running.",
        node=node,
        step=failure.step,
        output=failure.output,
    )
