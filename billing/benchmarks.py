"""Billing benchmarks for `manage.py bench`: the meter over many running machines, and the
Billing page for a project with many clusters beside the bare view.

Each benchmark builds its data in one transaction and rolls it back at the end, so it can run
against any database, the demo's included, and leaves nothing behind. The data builders are
plain bulk inserts (no lifecycle), also used by the tests that count queries.
"""

import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from decimal import Decimal

from django.core.signals import request_finished, request_started
from django.db import close_old_connections, connection, transaction
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from accounts.models import Environment, Project, User
from accounts.projects import create_project
from billing.meter import charge_accrued
from billing.models import LedgerEntry, UsageRecord
from clusters.models import Cluster, Node
from offers.models import GpuModel, Location, MachineType

AUTHORIZED_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBenchmarkKeyOnly bench@runcrate"


class _Rollback(Exception):
    pass


@contextmanager
def rolled_back() -> Iterator[None]:
    """Run the body in a transaction that is always rolled back.

    Requests made with the test Client inside it must not close the connection (Django does
    that at each request's start and end), so those signal handlers are off meanwhile.
    """
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        with transaction.atomic():
            yield
            raise _Rollback
    except _Rollback:
        pass
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)


def bench_machine_type(price: Decimal = Decimal("2.50")) -> MachineType:
    gpu, _ = GpuModel.objects.get_or_create(
        slug="bench-h100", defaults={"name": "H100 SXM 80GB (bench)", "memory_gib": 80}
    )
    location, _ = Location.objects.get_or_create(
        code="bench-1",
        defaults={"name": "Bench", "country": "US", "capacity_reporting": "count"},
    )
    machine_type, _ = MachineType.objects.get_or_create(
        slug="bench-h100x8",
        defaults={
            "location": location,
            "gpu": gpu,
            "gpus_per_machine": 8,
            "machine_kind": MachineType.Kind.VM,
            "price_per_hour": price,
            "boot_seconds": 180,
        },
    )
    return machine_type


def build_billed_clusters(
    *,
    project: Project,
    clusters: int,
    machines_per_cluster: int,
    started_at: datetime,
    environment: Environment | None = None,
    machine_type: MachineType | None = None,
    name_prefix: str = "bench",
) -> list[int]:
    """`clusters` ready clusters of the project, every machine billed from `started_at`."""
    machine_type = machine_type or bench_machine_type()
    environment = environment or project.environments.order_by("pk").first()
    made = Cluster.objects.bulk_create(
        Cluster(
            project=project,
            environment=environment,
            name=f"{name_prefix}-{index:05d}",
            machine_type=machine_type,
            size=machines_per_cluster,
            status=Cluster.Status.READY,
            authorized_keys=AUTHORIZED_KEY,
            created_at=started_at,
            joined_at=started_at,
            ready_at=started_at,
            give_up_at=started_at + timedelta(minutes=25),
        )
        for index in range(clusters)
    )
    cluster_ids = [cluster.pk for cluster in made]
    nodes = Node.objects.bulk_create(
        Node(
            cluster_id=cluster_id,
            index=index,
            status=Node.Status.JOINED,
            step=Node.Step.DONE,
            reserved_at=started_at,
        )
        for cluster_id in cluster_ids
        for index in range(machines_per_cluster)
    )
    UsageRecord.objects.bulk_create(
        (
            UsageRecord(
                project=project,
                cluster_id=node.cluster_id,
                node_id=node.pk,
                price_per_hour=machine_type.price_per_hour,
                started_at=started_at,
                charged_until=started_at,
            )
            for node in nodes
        ),
        batch_size=2000,
    )
    return cluster_ids


def _owner(email: str) -> tuple[User, Project]:
    user = User.objects.create_user(email=email, password=None)
    project = create_project(owner=user, name="Benchmark")
    LedgerEntry.objects.create(
        project=project, kind=LedgerEntry.Kind.ADJUSTMENT, amount=Decimal("1000000.00")
    )
    return user, project


def meter_benchmark(*, machines: int = 10_000, per_cluster: int = 8) -> dict:
    """One meter run over `machines` running machines: time and queries (then a second run,
    which must charge nothing)."""
    result: dict = {}
    with rolled_back():
        now = timezone.now()
        _, project = _owner("bench-meter@runcrate.invalid")
        build_billed_clusters(
            project=project,
            clusters=-(-machines // per_cluster),
            machines_per_cluster=per_cluster,
            started_at=now - timedelta(minutes=59, seconds=30),
        )
        with CaptureQueriesContext(connection) as queries:
            started = time.perf_counter()
            charged = charge_accrued(now=now)
            elapsed = time.perf_counter() - started
        started = time.perf_counter()
        again = charge_accrued(now=now)
        again_elapsed = time.perf_counter() - started
        result = {
            "machines": charged.records,
            "seconds": round(elapsed, 3),
            "queries": len(queries),
            "charged_usd": f"{charged.amount:.2f}",
            "second_run_seconds": round(again_elapsed, 3),
            "second_run_records": again.records,
        }
    return result


def setup_billing_page(*, clusters: int = 1000, machines_per_cluster: int = 8) -> Client:
    """A logged-in client whose project has `clusters` clusters billed this month."""
    user, project = _owner("bench-billing@runcrate.invalid")
    now = timezone.now()
    started = max(now - timedelta(hours=3), now.replace(day=1, hour=0, minute=0, second=0))
    build_billed_clusters(
        project=project,
        clusters=clusters,
        machines_per_cluster=machines_per_cluster,
        started_at=started,
    )
    charge_accrued(now=now)
    client = Client()
    client.force_login(user)
    return client


def _median_ms(client: Client, path: str, requests: int) -> tuple[float, int, int]:
    timings = []
    status = 0
    for _ in range(requests):
        started = time.perf_counter()
        response = client.get(path)
        timings.append((time.perf_counter() - started) * 1000)
        status = response.status_code
    with CaptureQueriesContext(connection) as queries:
        client.get(path)
    return round(statistics.median(timings), 1), len(queries), status


def billing_page_benchmark(
    *, clusters: int = 1000, machines_per_cluster: int = 8, requests: int = 20
) -> dict:
    """The Billing page of a project with `clusters` × `machines_per_cluster` machines, beside
    the bare view (`/healthz`): median milliseconds and queries per request."""
    result: dict = {}
    with rolled_back():
        client = setup_billing_page(clusters=clusters, machines_per_cluster=machines_per_cluster)
        page_ms, page_queries, page_status = _median_ms(client, "/billing/", requests)
        usage_ms, usage_queries, _ = _median_ms(
            client, f"/billing/clusters/{Cluster.objects.latest('pk').pk}/", requests
        )
        bare_ms, bare_queries, _ = _median_ms(client, "/healthz", requests)
        result = {
            "clusters": clusters,
            "machines": clusters * machines_per_cluster,
            "page_status": page_status,
            "page_median_ms": page_ms,
            "page_queries": page_queries,
            "cluster_rows_median_ms": usage_ms,
            "cluster_rows_queries": usage_queries,
            "bare_median_ms": bare_ms,
            "bare_queries": bare_queries,
        }
    return result
