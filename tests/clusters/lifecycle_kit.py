"""Helpers for the lifecycle tests: an inventory, a funded project with an SSH key, and the
reconciler run in this process (the CollectingDispatcher) while time_machine moves the clock.

`Sim.tick()` is what a beat tick plus the workers do: advance every cluster that needs it and
run whatever that hands off (per-node work, the agent's reports, further advances), at the
current (frozen) time.
"""

from __future__ import annotations

import hashlib
import itertools
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from django.utils import timezone

from accounts.models import Environment, Project, SshKey, User
from accounts.projects import create_project
from billing import ledger
from billing.models import UsageRecord
from clusters import lifecycle
from clusters.models import Cluster, Node
from offers.models import Host, Location, MachineType
from tests.factories import GpuModelFactory, HostFactory, LocationFactory, MachineTypeFactory

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
_people = itertools.count()


def at(seconds: float) -> datetime:
    """`seconds` after T0, where the `clock` fixture (tests/clusters/conftest.py) starts."""
    return T0 + timedelta(seconds=seconds)


def new_project(*, balance: str = "10000.00", keys: int = 1) -> tuple[User, Project]:
    """A user with a project, credit and SSH keys; no password hashing (it is slow)."""
    n = next(_people)
    user = User.objects.create(email=f"lifecycle-{n}@example.com")
    project = create_project(owner=user, name=f"Lifecycle {n}")
    if Decimal(balance):
        ledger.credit(project=project, amount=balance, note="test credit")
    for k in range(keys):
        blob = hashlib.sha256(f"{project.pk}-{k}".encode()).hexdigest()
        SshKey.objects.create(
            project=project,
            name=f"key-{k}",
            public_key=f"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5{blob} key-{k}",
            fingerprint=f"SHA256:{blob[:43]}",
        )
    return user, project


def inventory(
    *,
    hosts: int = 4,
    boot_seconds: int = 180,
    faults: dict[int, str] | None = None,
    kind: str = MachineType.Kind.VM,
    slow_boot: bool = False,
    price: str = "20.00",
    capacity: str = Location.CapacityReporting.COUNT,
    gpus: int = 8,
) -> MachineType:
    """A machine type with `hosts` free simulated hosts; `faults` maps a host's position to its
    fault (hosts are reserved in order, so position i serves node-i)."""
    machine_type = MachineTypeFactory(
        location=LocationFactory(capacity_reporting=capacity),
        gpu=GpuModelFactory(),
        machine_kind=kind,
        boot_seconds=boot_seconds,
        slow_boot=slow_boot,
        price_per_hour=Decimal(price),
        gpus_per_machine=gpus,
    )
    for i in range(hosts):
        HostFactory(machine_type=machine_type, fault=(faults or {}).get(i, ""))
    return machine_type


def environment_of(project: Project) -> Environment:
    return project.environments.get(name="default")


def create(
    project: Project,
    machine_type: MachineType,
    *,
    nodes: int = 2,
    name: str | None = None,
    software: str = "none",
    user: User | None = None,
    **extra,
) -> Cluster:
    return lifecycle.create_cluster(
        project=project,
        user=user,
        environment=environment_of(project),
        offer_slug=machine_type.slug,
        nodes=nodes,
        name=f"c-{next(_people)}" if name is None else name,
        software=software,
        **extra,
    )


class Sim:
    """The reconciler and its workers, in this process."""

    def __init__(self) -> None:
        self.dispatcher = lifecycle.CollectingDispatcher()

    def __enter__(self) -> Sim:
        self._context = lifecycle.dispatching_to(self.dispatcher)
        self._context.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._context.__exit__(*exc)

    def tick(self) -> None:
        for cluster_id in lifecycle.clusters_needing_work():
            self.dispatcher.advance(cluster_id)
        self.dispatcher.run()

    def run_until(self, traveller, until: datetime, *, every: float = 45) -> None:
        """Tick every `every` seconds of simulated time up to and including `until`."""
        while True:
            self.tick()
            now = timezone.now()
            if now >= until:
                return
            traveller.move_to(min(now + timedelta(seconds=every), until))


def free_hosts(machine_type: MachineType) -> int:
    return Host.objects.filter(machine_type=machine_type, state=Host.State.FREE).count()


def assert_failed_cleanly(cluster: Cluster, machine_type: MachineType) -> None:
    """SPEC §3 all-or-nothing: failed, every host free again, nothing billed."""
    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.FAILED
    assert free_hosts(machine_type) == machine_type.hosts.count()
    assert not cluster.nodes.filter(holds_host=True).exists()
    assert not UsageRecord.objects.filter(cluster=cluster).exists()
    assert cluster.ended_at is not None


def node(cluster: Cluster, index: int) -> Node:
    return cluster.nodes.get(index=index)
