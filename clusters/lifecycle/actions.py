"""What users (and billing) ask for: terminate, stop, retry the install, add workers."""

from __future__ import annotations

import logging

from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from accounts.models import User
from billing.models import UsageRecord
from clusters.errors import ClusterRefused
from clusters.lifecycle import dispatch
from clusters.lifecycle.reconcile import _Pass, charge_on_commit
from clusters.lifecycle.reserve import new_nodes, require_balance, reserve_hosts
from clusters.lifecycle.rules import TERMINABLE, lock_cluster
from clusters.models import Cluster, Event, Node
from offers.models import MAX_NODES

log = logging.getLogger(__name__)


log = logging.getLogger(__name__)

Status = Cluster.Status
Step = Node.Step
NodeStatus = Node.Status
Reason = Event.Reason

# --- what users ask for --------------------------------------------------------------------


def terminate(*, cluster: Cluster, user: User | None = None) -> Cluster:
    """Stop every machine together; billing ends for all nodes at this instant."""
    return _end(cluster=cluster, user=user, stop_reason="")


def stop(*, cluster: Cluster, reason: str) -> Cluster:
    """Like terminate, for lack of balance or budget; the cluster ends `stopped`."""
    return _end(cluster=cluster, user=None, stop_reason=reason)


def _end(*, cluster: Cluster, user: User | None, stop_reason: str) -> Cluster:
    now = timezone.now()
    with transaction.atomic():
        locked = lock_cluster(cluster.pk)
        if locked is None or locked.status not in TERMINABLE:
            status = locked.status if locked else "gone"
            raise ClusterRefused(
                "invalid_state",
                f"This cluster is {status}; only a provisioning, installing, ready or degraded "
                "cluster can be terminated.",
            )
        nodes = list(locked.nodes.select_related("host").order_by("index"))
        work = _Pass(cluster=locked, nodes=nodes, now=now)
        work.set_status(Status.TERMINATING)
        locked.ended_at = now
        locked.stop_reason = stop_reason
        UsageRecord.objects.filter(cluster=locked, ended_at__isnull=True).update(ended_at=now)
        for node in nodes:
            if node.status in (NodeStatus.STARTING, NodeStatus.JOINED):
                work.end_node(node, NodeStatus.ENDED)
        if stop_reason:
            reason = Reason.STOPPED_BALANCE if stop_reason == "balance" else Reason.STOPPED_BUDGET
            message = f"Stopping every machine: {locked.get_stop_reason_display()}."
        else:
            reason = Reason.TERMINATE_REQUESTED
            who = f" by {user.email}" if user else ""
            message = f"Terminate requested{who}: stopping every machine; billing ended."
        work.event(reason, message)
        work.flush()
        dispatch.current().advance(locked.pk)
        charge_on_commit(cluster_id=locked.pk)
    return locked


def retry_install(*, cluster: Cluster) -> Cluster:
    """Install the software again on every node of a degraded cluster."""
    now = timezone.now()
    with transaction.atomic():
        locked = lock_cluster(cluster.pk)
        if locked is None or locked.status != Status.DEGRADED:
            raise ClusterRefused(
                "invalid_state",
                f"Retry install is for a degraded cluster; this one is "
                f"{locked.status if locked else 'gone'}.",
            )
        nodes = list(locked.nodes.select_related("host").order_by("index"))
        work = _Pass(cluster=locked, nodes=nodes, now=now)
        work.set_status(Status.INSTALLING)
        locked.install_attempts += 1
        for node in nodes:
            if node.status == NodeStatus.JOINED:
                work.begin_install(node)
                node.lease_token = ""
                node.lease_expires_at = None
        work.event(
            Reason.RETRY_INSTALL,
            f"Installing {locked.get_software_display()} again (attempt "
            f"{locked.install_attempts}).",
        )
        work.flush()
        dispatch.current().advance(locked.pk)
    return locked


def add_workers(*, cluster: Cluster, count: int) -> Cluster:
    """Add `count` machines of the same type to a ready cluster; each is billed once it joins,
    and one that fails is released alone."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ClusterRefused("invalid_count", "Add at least one worker.", field="count")
    now = timezone.now()
    with transaction.atomic():
        locked = lock_cluster(cluster.pk)
        if locked is None or locked.status != Status.READY:
            raise ClusterRefused(
                "invalid_state",
                f"Workers can be added to a ready cluster; this one is "
                f"{locked.status if locked else 'gone'}.",
            )
        nodes = locked.nodes.all()
        live = nodes.filter(status__in=[NodeStatus.STARTING, NodeStatus.JOINED]).count()
        if live + count > MAX_NODES:
            raise ClusterRefused(
                "invalid_count",
                f"A cluster has at most {MAX_NODES} machines: this one has {live}, so at most "
                f"{MAX_NODES - live} more.",
                field="count",
            )
        require_balance(
            project=locked.project,
            machine_type=locked.machine_type,
            machines=live + count,
            doing=f"a cluster of {live + count} machines",
        )
        hosts = reserve_hosts(machine_type=locked.machine_type, count=count, now=now)
        first = (nodes.aggregate(last=Max("index"))["last"] or 0) + 1
        added = new_nodes(cluster=locked, hosts=hosts, first_index=first, is_worker=True, now=now)
        Event.objects.create(
            cluster=locked,
            at=now,
            reason=Reason.WORKERS_ADDED,
            message=(
                f"Adding {count} worker{'s' if count > 1 else ''}: "
                f"{', '.join(n.name for n in added)}."
            ),
        )
        dispatch.current().advance(locked.pk)
    return locked
