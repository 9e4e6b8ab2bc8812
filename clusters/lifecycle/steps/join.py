"""A provisioning cluster: its machines pass `running`, `agent` and `network` together; once
every one has, they join (billed from that instant) and the install begins, or the cluster
fails as a whole at the first node that cannot."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.conf import settings

from clusters.lifecycle.records import Failure
from clusters.lifecycle.rules import acceptance_report, deadline_with_downtime
from clusters.lifecycle.steps import agent, network, running
from clusters.lifecycle.unit import UnitOfWork
from clusters.models import Cluster, Event, Node, give_up_after

log = logging.getLogger(__name__)

Status = Cluster.Status
Step = Node.Step
NodeStatus = Node.Status
Reason = Event.Reason


def join_steps(
    work: UnitOfWork, batch: list[Node], peers_of: dict[int, list[str]]
) -> list[Failure]:
    """Carry every node of `batch` through the steps it can pass now; `peers_of` (by node)
    names the machines its network step must reach."""
    failures = []
    for node in batch:
        failure = running.observe(work, node)
        if failure is None and node.step == Step.RUNNING:
            failure = running.step(work, node)
        if failure is None and node.step == Step.AGENT:
            failure = agent.step(work, node)
        if failure is not None:
            failures.append(failure)
    if failures:
        return failures
    return network.step(work, batch, peers_of)


def provision(work: UnitOfWork) -> None:
    batch = [n for n in work.nodes if n.status == NodeStatus.STARTING]
    names = [n.name for n in batch]
    peers_of = {n.pk: [p for p in names if p != n.name] for n in batch}
    failures = join_steps(work, batch, peers_of)
    if failures:
        fail_cluster(work, failures[0])
        return
    if batch and all(n.network_at is not None for n in batch):
        join_cluster(work, batch)
        return
    if work.now >= give_up_at(work) + timedelta(seconds=settings.RUNCRATE_MIN_STEP_SECONDS):
        # A safety net: every step deadline is capped at give_up_at, so this never fires
        # unless a node waits on a state no deadline covers.
        late = next(n for n in batch if n.network_at is None)
        fail_cluster(
            work,
            Failure(
                Reason.CLUSTER_TIMEOUT,
                late,
                late.step,
                f"The cluster did not come up by its {work.cap_minutes()}-minute limit.",
            ),
        )


def give_up_at(work: UnitOfWork) -> datetime:
    """The cluster's `give_up_at`, moved back by our downtime once it has passed, as any capped
    deadline is (`deadline_with_downtime`): its 25 (45) minutes count only the machines' time,
    from the cluster's reservation."""
    give_up = work.cluster.give_up_at
    if work.now < give_up:
        return give_up
    reserved = give_up - give_up_after(work.machine_type.slow_boot)
    return deadline_with_downtime(
        give_up, since=reserved, cap=give_up, reserved_at=reserved, downtime=work.downtime
    )


def fail_cluster(work: UnitOfWork, failure: Failure) -> None:
    cluster = work.cluster
    work.set_status(Status.FAILED)
    cluster.failure_reason = failure.reason
    cluster.failure_node = failure.node.name
    cluster.failure_step = failure.step
    cluster.failure_message = work.for_user(failure.message)
    cluster.ended_at = work.now
    for node in work.nodes:
        if node.status in Node.LIVE:
            work.end_node(node, NodeStatus.FAILED if node is failure.node else NodeStatus.ENDED)
    work.event(
        failure.reason,
        f"{failure.message} The cluster failed at {failure.node.name}, step "
        f"{failure.step}; every machine is being released and nothing was billed.",
        node=failure.node,
        step=failure.step,
        output=failure.output,
    )
    log.info(
        "cluster %s failed: %s at %s/%s",
        cluster.pk,
        failure.reason,
        failure.node.name,
        failure.step,
    )


def start_billing(work: UnitOfWork, nodes: list[Node]) -> None:
    for node in nodes:
        work.join_node(node)
        work.bill(node)


def join_cluster(work: UnitOfWork, batch: list[Node]) -> None:
    cluster = work.cluster
    cluster.joined_at = work.now
    cluster.acceptance = acceptance_report(batch, work.machine_type, at=work.now)
    start_billing(work, batch)
    work.event(
        Reason.JOINED,
        f"All {len(batch)} machines joined; billing started for every machine at "
        f"{work.now:%H:%M:%S} UTC.",
    )
    if cluster.software == Cluster.Software.NONE:
        for node in batch:
            work.finish_node(node)
        work.mark_ready()
    else:
        work.set_status(Status.INSTALLING)
        cluster.install_attempts += 1
        for node in batch:
            work.begin_install(node)
        work.event(Reason.INSTALLING, f"Installing {cluster.get_software_display()} on every node.")
