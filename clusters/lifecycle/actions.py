"""What users (and billing) ask for: terminate, stop, retry the install, add workers."""

from __future__ import annotations

import logging
from datetime import datetime
from decimal import Decimal

from django.db import transaction
from django.db.models import Max
from django.utils import timezone

import audit
from accounts.models import ApiKey, User
from billing import metering
from clusters import policy
from clusters.errors import ClusterRefused
from clusters.lifecycle import dispatch, repair
from clusters.lifecycle.grow import require_count, require_workers
from clusters.lifecycle.reserve import new_nodes, reserve_hosts
from clusters.lifecycle.rules import lock_cluster, set_needs_work
from clusters.lifecycle.steps import drain
from clusters.lifecycle.unit import UnitOfWork
from clusters.models import Cluster, Event, Node
from runcrate.money import usd

log = logging.getLogger(__name__)

Status = Cluster.Status
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
        if locked is None or not locked.can_terminate:
            status = locked.status if locked else "gone"
            raise ClusterRefused("invalid_state", Cluster.terminate_refusal(status))
        # Billing ends for every machine now; no meter run charges this cluster between that
        # end and the charge once this commits (billing.metering.close_cluster).
        metering.close_cluster(cluster_id=locked.pk, at=now)
        work = UnitOfWork.load(locked, now=now)
        nodes = work.nodes
        before = locked.status
        work.set_status(Status.TERMINATING)
        locked.ended_at = now
        locked.stop_reason = stop_reason
        # A degraded cluster ended by its owner did not fail: its events keep what went wrong.
        locked.clear_failure()
        for node in nodes:
            if node.status in Node.LIVE:
                work.end_node(node, NodeStatus.ENDED)
        if stop_reason:
            reason = Reason.STOPPED_BALANCE if stop_reason == "balance" else Reason.STOPPED_BUDGET
            message = f"Stopping every machine: {locked.get_stop_reason_display()}."
        else:
            reason = Reason.TERMINATE_REQUESTED
            who = f" by {user.email}" if user else ""
            message = f"Terminate requested{who}: stopping every machine; billing ended."
        _note_end(locked, before=before)
        work.event(reason, message)
        work.flush()
        dispatch.current().advance(locked.pk)
    return locked


def _note_end(cluster: Cluster, *, before: str) -> None:
    """The audit log's entry of a terminate, or of the meter's stop (the system's), in its
    transaction."""
    changes = {"status": audit.change(before, Status.TERMINATING.value)}
    if not cluster.stop_reason:
        audit.note(summary=f"terminated cluster `{cluster.name}`", obj=cluster, changes=changes)
        return
    audit.note(
        summary=f"stopped cluster `{cluster.name}`: {cluster.get_stop_reason_display()}",
        obj=cluster,
        changes=changes,
        action=f"clusters:stop_{cluster.stop_reason}",
    )


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
        if not locked.can_retry_install:
            raise ClusterRefused(
                "invalid_state",
                "Retry install is for a cluster whose software did not install; this one is "
                f"degraded because {locked.failure_message or 'of a machine'} Terminate it "
                "when you are done.",
            )
        work = UnitOfWork.load(locked, now=now)
        nodes = work.nodes
        work.set_status(Status.INSTALLING)
        locked.install_attempts += 1
        # The last failure no longer explains the cluster: a new one is written if this fails.
        locked.clear_failure()
        for node in nodes:
            if node.status == NodeStatus.JOINED:
                work.begin_install(node)
                node.lease_token = ""
                node.lease_expires_at = None
        audit.note(
            summary=f"retried the install of cluster `{locked.name}` (attempt "
            f"{locked.install_attempts})",
            obj=locked,
            changes={"status": audit.change(Status.DEGRADED.value, Status.INSTALLING.value)},
        )
        work.event(
            Reason.RETRY_INSTALL,
            f"Installing {locked.get_software_display()} again (attempt "
            f"{locked.install_attempts}).",
        )
        work.flush()
        dispatch.current().advance(locked.pk)
    return locked


def add_workers(*, cluster: Cluster, count: int, api_key: ApiKey | None = None) -> Cluster:
    """Add `count` machines of the same type to a ready cluster; each is billed once it joins,
    and one that fails is released alone. Asked with `api_key`, the grown cluster must fit the
    key's limits; its added machines count against the key's hourly limit now, whoever created
    the cluster (`require_key_limits`). Checked as `plan_add_workers` checks it
    (`require_workers`: the create's money rules for the grown cluster)."""
    count = require_count(count)
    now = timezone.now()
    with transaction.atomic():
        locked = lock_cluster(cluster.pk)
        live = require_workers(locked, count=count, api_key=api_key, now=now)
        assert locked is not None  # require_workers refuses a cluster that is gone
        nodes = locked.nodes.all()
        hosts = reserve_hosts(machine_type=locked.machine_type, count=count, now=now)
        first = (nodes.aggregate(last=Max("index"))["last"] or 0) + 1
        version = locked.bump_version()  # new_nodes stamps the added rows with it
        added = new_nodes(cluster=locked, hosts=hosts, first_index=first, is_worker=True, now=now)
        set_needs_work(locked, True)  # its new workers are starting: the tick must see them
        Event.objects.create(
            cluster=locked,
            at=now,
            reason=Reason.WORKERS_ADDED,
            message=(
                f"Adding {count} worker{'s' if count > 1 else ''}: "
                f"{', '.join(n.name for n in added)}."
            ),
            version=version,
        )
        locked.save(update_fields=["version", "needs_work"])
        _note_added(locked, added, live=live)
        dispatch.current().advance(locked.pk)
    return locked


def _note_added(cluster: Cluster, added: list[Node], *, live: int) -> None:
    """The audit log's entry of an add, in its transaction: "added 2 workers to cluster …"."""
    count = len(added)
    audit.note(
        summary=f"added {count} worker{'s' if count > 1 else ''} to cluster `{cluster.name}` "
        f"({', '.join(n.name for n in added)})",
        obj=cluster,
        changes={"machines": audit.change(live, live + count)},
    )


def mark_lost(*, node_id: int, last_heard: datetime, why: str, now: datetime | None = None) -> bool:
    """A joined node of a ready or degraded cluster is gone silent (or gone): its billing ends
    at its last heartbeat (what was charged past it is refunded), its host is wiped and
    released, and the cluster is degraded (`machine_lost`, naming the node). Returns whether
    the node was marked."""
    now = now or timezone.now()
    cluster_id = Node.objects.filter(pk=node_id).values_list("cluster_id", flat=True).first()
    with transaction.atomic():
        locked = lock_cluster(cluster_id) if cluster_id else None
        if locked is None or not policy.is_running(locked.status):
            return False
        work = UnitOfWork.load(locked, now=now)
        nodes = work.nodes
        node = next((n for n in nodes if n.pk == node_id), None)
        if node is None or node.status != NodeStatus.JOINED:
            return False
        # Billed until its last heartbeat: what was charged past it is refunded.
        refunded = metering.close_machine(
            cluster_id=locked.pk,
            node_id=node.pk,
            project_id=locked.project_id,
            at=last_heard,
            refund_note=(
                f"Refund: {locked.name} {node.name} was lost; billed past its last heartbeat"
            ),
        )
        # Its host goes to staff once released, never back to the pool unseen; the
        # software's configuration loses it (the head's prune), which is its drain.
        repair.quarantine(work, node, f"Lost: {why}.")
        drain.mark_drained(work, node, f"it was lost ({why})", lost=True)
        work.end_node(node, NodeStatus.LOST, at=last_heard)
        work.replan_others(node)  # the others stop naming it in /etc/hosts and the hostfile
        repair.forget_problems(locked, node.name)  # they leave with it; none is "healed"
        if locked.status == Status.READY:
            work.set_status(Status.DEGRADED)
        locked.failure_reason = Reason.MACHINE_LOST
        locked.failure_node = node.name
        locked.failure_step = node.step
        locked.failure_message = f"{node.name} was lost: {why}."
        work.cluster_dirty = True
        auto = repair.auto_replaces(locked, nodes, node, now=now)
        _lost_event(work, node, why=why, last_heard=last_heard, refunded=refunded, auto=auto)
        work.flush()
        if auto:
            repair.repair_cluster(locked, now=now)
        dispatch.current().advance(locked.pk)
    log.warning("cluster %s: %s lost (%s)", locked.pk, node.name, why)
    return True


def _lost_event(
    work: UnitOfWork, node: Node, *, why: str, last_heard: datetime, refunded: Decimal, auto: bool
) -> None:
    """The `machine_lost` event: what was lost, its billing, and what is left of the cluster
    (or that the `auto` repair policy replaces it, whose one email then says it all)."""
    left = [n for n in work.nodes if n.status == NodeStatus.JOINED]
    refund = f" ({usd(refunded)} charged past it was refunded)" if refunded else ""
    if auto:
        others = (
            "it is being replaced automatically (the cluster's repair policy); you get one "
            "email once the new machine is up."
        )
    elif left:
        others = (
            f"the other {'machine keeps' if len(left) == 1 else 'machines keep'} running and "
            "billed; terminate it when you are done."
        )
    else:
        others = "no machine of it is left, and nothing more is billed; terminate it to end it."
    work.event(
        Reason.MACHINE_LOST,
        f"{node.name} was lost: {why}. Its billing ended at its last heartbeat, "
        f"{last_heard:%H:%M:%S} UTC{refund}. The cluster is degraded: {others}",
        node=node,
        step=node.step,
    )
    if auto:
        # Told by the replacement's own email (replaced, or not), not by one of its own.
        work.events[-1].emailed_at = work.now
