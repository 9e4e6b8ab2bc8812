"""The reconciler: `advance` loads one locked cluster into a unit of work
(`clusters.lifecycle.unit`), lets the steps for its status decide what is due
(`clusters.lifecycle.steps`), and writes it back once; slow work goes to per-node tasks
(`work`)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from clusters.lifecycle import dispatch
from clusters.lifecycle.records import Failure
from clusters.lifecycle.rules import lock_cluster
from clusters.lifecycle.steps import drain, install, join, release, terminate, workers
from clusters.lifecycle.unit import NODE_FIELDS, UnitOfWork, read_nodes
from clusters.models import Cluster, Node

log = logging.getLogger(__name__)

Status = Cluster.Status

__all__ = [
    "NODE_FIELDS",
    "Failure",
    "advance",
    "advance_locked",
    "read_nodes",
    "step_deadlines",
]


def step_deadlines(cluster: Cluster, nodes: list[Node], now: datetime) -> dict[int, datetime]:
    """Each starting node's step deadline as `advance` judges it at `now`
    (`UnitOfWork.deadline`: moved back by our own downtime once the stored one has passed), by
    node id: what the cluster page counts down to, so an outage of ours never shows a machine
    out of time. Reads our downtime only when a stored deadline has passed."""
    work = UnitOfWork(cluster=cluster, nodes=nodes, now=now)
    return {
        node.pk: work.deadline(node, now)
        for node in nodes
        if node.status == Node.Status.STARTING and node.step_deadline is not None
    }


@dispatch.runs("advance")
def advance(*, cluster_id: int, now: datetime | None = None) -> list[str]:
    """Carry one cluster as far as the clock and its rows allow; returns what it did."""
    now = now or timezone.now()
    with transaction.atomic():
        cluster = lock_cluster(cluster_id)
        if cluster is None:
            return []
        return advance_locked(cluster, read_nodes(cluster), now=now)


def advance_locked(
    cluster: Cluster,
    nodes: list[Node],
    *,
    now: datetime,
    landed: Sequence[Node] = (),
    fields: Sequence[str] = (),
) -> list[str]:
    """`advance` on a cluster already locked, its nodes read: what a per-node task's write-back
    calls with the nodes whose results `landed` (changed in memory, `fields` beyond
    NODE_FIELDS), so they are written with the rest of the pass."""
    work = UnitOfWork(cluster=cluster, nodes=nodes, now=now)
    for node in landed:
        work.touch(node, *fields)
    if cluster.status == Status.PROVISIONING:
        join.provision(work)
    elif cluster.status == Status.INSTALLING:
        install.installing(work)
    elif cluster.status in Cluster.RUNNING:
        # Workers added to a ready cluster, replacements (a degraded one's too), then the
        # head's scheduler told which workers are drained.
        workers.workers(work)
        drain.drain(work)
    release.release(work)
    if cluster.status == Status.TERMINATING:
        terminate.finish_terminating(work)
    work.flush()
    if work.events and cluster.needs_work:
        # Something moved (a step passed, the cluster joined): what it unlocks is due now,
        # not at the next tick. Each follow-up only runs on progress, so this settles; none
        # when nothing is left to do (the tick would not pick the cluster either).
        dispatch.current().advance(cluster.pk)
    return work.done
