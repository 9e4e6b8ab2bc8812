"""Helpers shared by the tests of the cluster pages, API, emails and browser flow."""

import hashlib
from decimal import Decimal

from accounts.models import Project, SshKey
from billing.models import LedgerEntry
from offers.models import MachineType
from tests.factories import HostFactory, MachineTypeFactory


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
