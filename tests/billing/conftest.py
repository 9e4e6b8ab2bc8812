"""Billing fixtures: clusters that are billed (joined, with a usage record per machine) and
credit on the ledger, built without the lifecycle so each test sets exactly what it needs."""

from datetime import datetime
from decimal import Decimal

import pytest
from django.utils import timezone

from accounts.models import Environment, Project
from billing.models import LedgerEntry, UsageRecord
from clusters.models import Cluster, Node
from tests.factories import ClusterFactory, MachineTypeFactory


def bill_cluster(
    project: Project,
    *,
    size: int = 2,
    price: str | Decimal = "20.00",
    at: datetime | None = None,
    name: str | None = None,
    environment: Environment | None = None,
    machine_type=None,
) -> Cluster:
    """A ready cluster whose `size` machines joined (billing started) at `at`."""
    at = at or timezone.now()
    machine_type = machine_type or MachineTypeFactory(price_per_hour=Decimal(price))
    extra = {"name": name} if name else {}
    if environment is not None:
        extra["environment"] = environment
    cluster = ClusterFactory(
        project=project,
        machine_type=machine_type,
        size=size,
        status=Cluster.Status.READY,
        joined_at=at,
        ready_at=at,
        machines=True,
        machines__status=Node.Status.JOINED,
        machines__step=Node.Step.DONE,
        **extra,
    )
    UsageRecord.objects.bulk_create(
        UsageRecord(
            project=project,
            cluster=cluster,
            node=node,
            price_per_hour=machine_type.price_per_hour,
            started_at=at,
            charged_until=at,
        )
        for node in cluster.nodes.all()
    )
    return cluster


def end_cluster(cluster: Cluster, *, at: datetime, status: str = Cluster.Status.TERMINATED) -> None:
    """What the lifecycle's terminate does to billing: every machine ends at `at`."""
    UsageRecord.objects.filter(cluster=cluster, ended_at__isnull=True).update(ended_at=at)
    Cluster.objects.filter(pk=cluster.pk).update(status=status, ended_at=at)
    cluster.refresh_from_db()


def add_credit(
    project: Project,
    amount: str | Decimal,
    *,
    at: datetime | None = None,
    kind: str = LedgerEntry.Kind.TOPUP,
    note: str = "Top-up",
) -> LedgerEntry:
    return LedgerEntry.objects.create(
        project=project,
        kind=kind,
        amount=Decimal(amount),
        note=note,
        created_at=at or timezone.now(),
    )


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings):
    # PBKDF2's many rounds cost about a second per user the fixtures make; billing does not
    # depend on the hasher.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
