"""Periodic checks: which clusters a tick advances, and hosts held by nothing."""

from __future__ import annotations

import logging

from django.db.models import Q

from clusters.models import Cluster, Event, Node
from offers.models import Host

log = logging.getLogger(__name__)


log = logging.getLogger(__name__)

Status = Cluster.Status
Step = Node.Step
NodeStatus = Node.Status
Reason = Event.Reason

# --- periodic -------------------------------------------------------------------------------


def clusters_needing_work() -> list[int]:
    """The clusters a tick should advance: anything still moving, or still holding a host."""
    return list(
        Cluster.objects.filter(
            Q(status__in=[Status.PROVISIONING, Status.INSTALLING, Status.TERMINATING])
            | Q(nodes__status=NodeStatus.STARTING)
            | Q(nodes__holds_host=True, nodes__status__in=[NodeStatus.FAILED, NodeStatus.ENDED])
            | Q(status=Status.READY, nodes__step=Step.INSTALL, nodes__status=NodeStatus.JOINED)
        )
        .order_by("pk")
        .values_list("pk", flat=True)
        .distinct()
    )


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
