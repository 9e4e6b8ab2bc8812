"""Periodic checks: which clusters a tick advances, hosts held by nothing, and the heartbeats of
the machines of ready clusters (a silent one is lost)."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from clusters import policy
from clusters.lifecycle.actions import mark_lost
from clusters.machines import get_driver
from clusters.machines.base import MachineState
from clusters.models import Cluster, DueCluster, Node
from offers.models import Host

log = logging.getLogger(__name__)

Status = Cluster.Status
Step = Node.Step
NodeStatus = Node.Status

# --- periodic -------------------------------------------------------------------------------


def clusters_needing_work() -> list[int]:
    """The clusters a tick should advance: anything still moving, or still holding a host
    (`rules.needs_work`, which every write of the reconciler keeps). One read of DueCluster,
    which holds only these clusters: ready and ended clusters, however many, cost nothing."""
    return list(DueCluster.objects.order_by("cluster_id").values_list("cluster_id", flat=True))


def sweep_orphan_hosts() -> list[Host]:
    """Hosts marked taken that no node holds: reported loudly for staff, never freed blindly."""
    orphans = list(
        Host.objects.filter(
            state__in=[Host.State.RESERVED, Host.State.IN_USE, Host.State.CLEANING]
        ).exclude(nodes__holds_host=True)
    )
    for host in orphans:
        log.error("host %s is %s but no node holds it", host.name, host.state)
    return orphans


def watch_heartbeats(*, now: datetime | None = None) -> list[str]:
    """Mark lost every node of a ready or degraded cluster whose agent has been silent for
    RUNCRATE_HEARTBEAT_LOST_SECONDS, or whose machine its driver reports gone. Only nodes whose
    stored heartbeat is already old are read (an index on joined nodes' heartbeats), so a fleet
    of healthy clusters costs one query."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.RUNCRATE_HEARTBEAT_LOST_SECONDS)
    stale = (
        Node.objects.filter(
            status=NodeStatus.JOINED,
            cluster__status__in=policy.RUNNING,
        )
        .filter(Q(heartbeat_at__lte=cutoff) | Q(heartbeat_at__isnull=True))
        .select_related("host", "cluster__machine_type__location")
        .order_by("cluster_id", "index")
    )
    lost = []
    for node in stale:
        driver = get_driver(node.reserved_host)
        observation = driver.observe(node, now=now)
        heard = driver.last_heard(node, now=now)
        if observation.state is MachineState.GONE:
            why = observation.message or "its machine is gone"
        elif heard is not None and heard > cutoff:
            # Heard from since (a driver that knows more than the stored heartbeat).
            Node.objects.filter(pk=node.pk).update(heartbeat_at=heard)
            continue
        else:
            silent = int((now - (heard or node.running_at or now)).total_seconds())
            why = f"its agent has been silent for {silent} seconds"
        last = heard or node.running_at or now
        if mark_lost(node_id=node.pk, last_heard=min(last, now), why=why, now=now):
            lost.append(f"{node.cluster_id}/{node.name}")
    return lost
