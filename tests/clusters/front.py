"""Helpers shared by the tests of the cluster pages, API, emails and browser flow."""

import hashlib
from decimal import Decimal

from django.utils import timezone

from accounts.models import Project, SshKey
from billing.models import LedgerEntry
from clusters.lifecycle.rules import acceptance_report
from clusters.models import Cluster, Event, Node
from offers.models import MachineType
from tests.factories import ClusterFactory, EventFactory, HostFactory, MachineTypeFactory

Reason = Event.Reason


def ssh_key(project: Project, name: str = "laptop") -> SshKey:
    blob = hashlib.sha256(f"{project.pk}-{name}".encode()).hexdigest()
    return SshKey.objects.create(
        project=project,
        name=name,
        public_key=f"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5{blob} {name}",
        fingerprint=f"SHA256:{blob[:43]}",
    )


def credit(project: Project, amount: str = "500.00") -> None:
    LedgerEntry.objects.create(
        project=project, kind=LedgerEntry.Kind.ADJUSTMENT, amount=Decimal(amount), note="test"
    )


def machine_type_with_hosts(free: int = 4, **fields) -> MachineType:
    machine_type = MachineTypeFactory(**fields)
    for _ in range(free):
        HostFactory(machine_type=machine_type)
    return machine_type


def ready_cluster(project: Project, *, size: int = 2, **fields) -> Cluster:
    """A ready cluster of `size` machines, every one joined and done."""
    now = timezone.now()
    return ClusterFactory(
        project=project,
        size=size,
        status=Cluster.Status.READY,
        joined_at=now,
        ready_at=now,
        machines=True,
        machines__status=Node.Status.JOINED,
        machines__step=Node.Step.DONE,
        **fields,
    )


def reported_cluster(project: Project, *, size: int) -> Cluster:
    """A ready cluster of `size` machines as its agents leave it: each node's row with its 8
    GPUs, its reachability of every peer and its last health report (one entry per peer each),
    the acceptance report kept at join (`acceptance_report`, the lifecycle's own), and three
    events a machine."""
    cluster = ready_cluster(project, size=size)
    nodes = list(cluster.nodes.order_by("index"))
    names = [node.name for node in nodes]
    for node in nodes:
        peers = {name: True for name in names if name != node.name}
        node.gpus = [
            {"name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559, "driver_version": "550"}
        ] * 8
        node.reachability = peers
        node.health = {"peers": peers, "services": {"slurmd": True}, "interface_up": True}
        node.acceptance = {"latency_ms": 0.3, "bandwidth_mbit": 1600.0, "method": "iperf3"}
        node.save()
        for reason in (Reason.MACHINE_RUNNING, Reason.AGENT_CHECKED_IN, Reason.NETWORK_OK):
            EventFactory(cluster=cluster, node=node, reason=reason, message=f"{node.name}: ok.")
    cluster.acceptance = acceptance_report(nodes, cluster.machine_type, at=cluster.ready_at)
    cluster.save()
    return cluster
