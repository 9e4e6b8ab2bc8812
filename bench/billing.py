"""Billing benchmarks for `python -m bench`: the meter over many running machines beside a
set-based SQL statement, the Billing page of a project with many clusters, and the page and
the balance of a project whose ledger grows to a million lines.

They run on the bench's throwaway database (bench/harness.py) and commit what they build, as
a database in service holds it. The data builders are plain bulk inserts (no lifecycle), also
used by the tests that count queries.
"""

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from django.core.signals import request_finished, request_started
from django.db import close_old_connections, connection, transaction
from django.db.models import F
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from accounts.models import Environment, Project, User
from accounts.projects import create_project
from billing import balances, ledger
from billing.meter import charge_accrued
from billing.models import LedgerEntry, UsageDay, UsageRecord
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


def _quiet(message: str) -> None:
    pass


def hour_of(moment: datetime) -> datetime:
    """The start of the clock hour (UTC) of `moment`."""
    return moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def set_based_charge(now: datetime, *, keep: bool = False) -> int:
    """The meter's baseline: one UPDATE that charges every running record up to `now` with the
    meter's rounding (cost = price × whole seconds since its start / 3600, half up, in cents),
    computed by the database. The rows it changed. Rolled back unless `keep`, so the meter it
    takes turns with finds the rows as it left them."""
    table = connection.ops.quote_name(UsageRecord._meta.db_table)
    if connection.vendor == "postgresql":
        seconds = "FLOOR(EXTRACT(EPOCH FROM (%s - started_at)))::bigint"
        price_cents = "ROUND(price_per_hour * 100)::bigint"
        value = now
    else:
        seconds = (
            "(CAST(strftime('%%s', %s) AS INTEGER) - CAST(strftime('%%s', started_at) AS INTEGER))"
        )
        price_cents = "CAST(ROUND(price_per_hour * 100) AS INTEGER)"
        value = connection.ops.adapt_datetimefield_value(now)
    sql = (
        f"UPDATE {table} SET charged_until = %s, "  # noqa: S608 - our names, values are parameters
        f"charged_amount = ((2 * {price_cents} * {seconds} + 3600) / 7200) / 100.0 "
        "WHERE ended_at IS NULL AND charged_until < %s"
    )
    changed = 0
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(sql, [value, value, value])
            changed = cursor.rowcount
            if not keep:
                raise _Rollback
    except _Rollback:
        pass
    return changed


def meter_benchmark(
    *,
    machines: Sequence[int] = (1_000, 10_000, 50_000),
    runs: int = 10,
    per_cluster: int = 8,
    seconds_per_size: float = 20.0,
    progress: Callable[[str], None] = _quiet,
) -> list[dict]:
    """The meter's public entry (`charge_accrued`) at each number of running machines, taking
    turns with `set_based_charge` (rolled back each time): each meter run charges two more
    minutes of every machine, as the beat's meter charges one every minute. The machines stay,
    and are ended at the end.

    Every size is measured within a clock hour of its own (in the past), after an untimed run
    that catches up (and crosses the hour), so no timed run opens new hourly lines. A size
    stops after 3 runs once its runs took `seconds_per_size`."""
    from bench.harness import QueryTimer, Timing, settle, timed

    runs = min(runs, 25)  # two minutes a run, within the hour
    _, project = _owner("bench-meter@runcrate.invalid")
    base = hour_of(timezone.now()) - timedelta(hours=len(machines) + 2)
    results = []
    built = 0
    for index, size in enumerate(machines):
        progress(f"Building {size:,} running machines for the meter…")
        started = time.perf_counter()
        clusters = -(-(size - built) // per_cluster)
        build_billed_clusters(
            project=project,
            clusters=clusters,
            machines_per_cluster=per_cluster,
            started_at=base,
            name_prefix=f"meter-{index}",
        )
        built += clusters * per_cluster
        hour = base + timedelta(hours=index + 1)
        charge_accrued(now=hour + timedelta(minutes=5))
        settle(UsageRecord, LedgerEntry, UsageDay)
        build_seconds = time.perf_counter() - started
        progress(f"Timing the meter at {built:,} machines…")
        meter, baseline = Timing(), Timing()
        queries = rows = 0
        for run in range(runs):
            if run >= 3 and sum(meter.samples) + sum(baseline.samples) > seconds_per_size:
                break  # a slow meter stops here, so the run stays bounded
            moment = hour + timedelta(minutes=6 + 2 * run)
            elapsed, rows = timed(lambda moment=moment: set_based_charge(moment))
            baseline.samples.append(elapsed)
            timer = QueryTimer()
            with connection.execute_wrapper(timer):
                elapsed, _ = timed(
                    lambda moment=moment: charge_accrued(now=moment + timedelta(minutes=1))
                )
            meter.samples.append(elapsed)
            queries = len(timer.queries)
        results.append(
            {
                "size": size,
                "machines": rows,
                "meter": meter,
                "baseline": baseline,
                "queries": queries,
                "build_seconds": build_seconds,
            }
        )
    # Ended where they were charged to, so no later meter run charges them.
    UsageRecord.objects.filter(project=project, ended_at__isnull=True).update(
        ended_at=F("charged_until")
    )
    return results


def _logged_in(user: User) -> tuple[Client, dict[str, str]]:
    from django.conf import settings

    client = Client()
    client.force_login(user)
    cookie = client.cookies[settings.SESSION_COOKIE_NAME].value
    return client, {"Cookie": f"{settings.SESSION_COOKIE_NAME}={cookie}"}


def _pages(
    user: User, paths: dict[str, str], *, requests: int
) -> tuple[dict[str, object], dict[str, int]]:
    """Each path over HTTP beside the bare logged-in view, taking turns: Timings and queries."""
    from bench.harness import BARE_LOGGED_IN, count_queries, http_bench, measure_rounds

    client, headers = _logged_in(user)
    targets = {"bare": (BARE_LOGGED_IN, headers)} | {
        name: (path, headers) for name, path in paths.items()
    }
    with http_bench() as bench:
        timings = measure_rounds(bench, targets, rounds=requests, warmup=3, block=5)
    queries = {name: count_queries(path, {}, client) for name, path in paths.items()}
    queries["bare"] = count_queries(BARE_LOGGED_IN, {}, client)
    return timings, queries


def billing_page_benchmark(
    *,
    clusters: Sequence[int] = (100, 1_000, 5_000),
    machines_per_cluster: int = 8,
    requests: int = 30,
    progress: Callable[[str], None] = _quiet,
) -> list[dict]:
    """The Billing page of a project with each number of clusters × `machines_per_cluster`
    machines billed this month (and one cluster's usage rows), beside the bare logged-in view
    over HTTP: Timings and queries per request."""
    from bench.harness import settle

    user, project = _owner("bench-billing@runcrate.invalid")
    now = timezone.now()
    started = max(now - timedelta(hours=3), now.replace(day=1, hour=0, minute=0, second=0))
    results = []
    built = 0
    for index, size in enumerate(clusters):
        progress(f"Building {size:,} billed clusters for the Billing page…")
        build_billed_clusters(
            project=project,
            clusters=size - built,
            machines_per_cluster=machines_per_cluster,
            started_at=started,
            name_prefix=f"billing-{index}",
        )
        built = size
        charge_accrued(now=now)
        settle(UsageRecord, LedgerEntry, UsageDay, Cluster, Node)
        latest = Cluster.objects.filter(project=project).latest("pk").pk
        timings, queries = _pages(
            user,
            {"page": "/billing/", "cluster_rows": f"/billing/clusters/{latest}/"},
            requests=requests,
        )
        results.append(
            {
                "clusters": size,
                "machines": size * machines_per_cluster,
                "bare": timings["bare"],
                "bare_queries": queries["bare"],
                "page": timings["page"],
                "page_queries": queries["page"],
                "cluster_rows": timings["cluster_rows"],
                "cluster_rows_queries": queries["cluster_rows"],
            }
        )
    # Ended where they were charged to, so no later meter run charges them.
    UsageRecord.objects.filter(project=project, ended_at__isnull=True).update(
        ended_at=F("charged_until")
    )
    return results


def insert_series(model, *, first: int, last: int, columns: dict[str, tuple[str, list]]) -> None:
    """Rows `first` to `last` of `model` by one INSERT … SELECT over a series of numbers `n`
    (generate_series on PostgreSQL, a recursive CTE on SQLite). `columns` maps a column to its
    SQL expression of `n` and that expression's parameters; every other column gets its field's
    default (or NULL)."""
    names, expressions, params = [], [], []
    for model_field in model._meta.concrete_fields:
        if model_field.primary_key:
            continue
        column = model_field.column
        if column in columns:
            expression, values = columns[column]
        elif model_field.has_default():
            expression, values = (
                "%s",
                [model_field.get_db_prep_save(model_field.get_default(), connection)],
            )
        elif model_field.null:
            expression, values = "NULL", []
        else:
            raise ValueError(f"insert_series: {model.__name__}.{model_field.name} needs a value")
        names.append(connection.ops.quote_name(column))
        expressions.append(expression)
        params += values
    table = connection.ops.quote_name(model._meta.db_table)
    select = f"SELECT {', '.join(expressions)}"
    if connection.vendor == "postgresql":
        sql = f"INSERT INTO {table} ({', '.join(names)}) {select} FROM generate_series(%s, %s) AS s(n)"  # noqa: S608,E501 - our names
        params += [first, last]
    else:
        sql = (
            "WITH RECURSIVE s(n) AS (SELECT %s UNION ALL SELECT n + 1 FROM s WHERE n < %s) "  # noqa: S608 - our names
            f"INSERT INTO {table} ({', '.join(names)}) {select} FROM s"
        )
        params = [first, last, *params]
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(sql, params)


def add_history(
    *, project: Project, cluster_ids: list[int], first: int, last: int, before: datetime
) -> None:
    """Usage lines `first` to `last` of the project's history: line n charges cluster
    n mod C for the hour n div C hours before `before` (so no two share a cluster and hour),
    a dollar each. Set-based, in chunks of 250,000, the running balance moved with each."""
    count = len(cluster_ids)
    low = min(cluster_ids)
    if max(cluster_ids) - low + 1 != count:
        raise RuntimeError("the history's clusters need consecutive ids")
    if connection.vendor == "postgresql":

        def hours_before(moment: datetime) -> tuple[str, list]:
            return f"%s::timestamptz - (n / {count}) * interval '1 hour'", [moment]
    else:

        def hours_before(moment: datetime) -> tuple[str, list]:
            return (
                f"strftime('%%Y-%%m-%%d %%H:%%M:%%S', %s, '-' || (n / {count}) || ' hours')",
                [connection.ops.adapt_datetimefield_value(moment)],
            )

    columns = {
        "project_id": ("%s", [project.pk]),
        "kind": ("%s", [LedgerEntry.Kind.USAGE.value]),
        "amount": ("%s", [connection.ops.adapt_decimalfield_value(Decimal("-1.00"), 14, 2)]),
        "note": ("%s", ["Cluster usage (history)"]),
        "cluster_id": (f"{low} + n %% {count}", []),
        "period_start": hours_before(before),
        "created_at": hours_before(before + timedelta(hours=1)),
        "machine_seconds": ("3600", []),
    }
    for chunk in range(first, last + 1, 250_000):
        end = min(last, chunk + 249_999)
        # The project's running balance moves in the same transaction, as the ledger's own
        # writers move it (billing/balances.py), so the balance check still agrees.
        with transaction.atomic():
            insert_series(LedgerEntry, first=chunk, last=end, columns=columns)
            balances.move({project.pk: Decimal("-1.00") * (end - chunk + 1)})


def ledger_benchmark(
    *,
    lines: Sequence[int] = (20_000, 1_000_000),
    clusters: int = 100,
    requests: int = 30,
    progress: Callable[[str], None] = _quiet,
) -> list[dict]:
    """The Billing page and the balance of a project whose ledger holds each number of lines
    (its clusters' usage lines of past hours, inserted set-based), the page beside the bare
    logged-in view over HTTP, the balance (`billing.ledger.balance`) called in this process."""
    from bench.harness import Timing, measure_calls, settle

    user, project = _owner("bench-ledger@runcrate.invalid")
    now = timezone.now()
    started = now - timedelta(hours=2)
    cluster_ids = build_billed_clusters(
        project=project,
        clusters=clusters,
        machines_per_cluster=1,
        started_at=started,
        name_prefix="ledger",
    )
    charge_accrued(now=now)
    before = hour_of(started) - timedelta(hours=1)
    results = []
    built = LedgerEntry.objects.filter(project=project).count()
    for size in lines:
        progress(f"Inserting the ledger's lines up to {size:,}…")
        begun = time.perf_counter()
        if size > built:
            add_history(
                project=project,
                cluster_ids=cluster_ids,
                first=built,
                last=size - 1,
                before=before,
            )
            built = size
        settle(LedgerEntry)
        build_seconds = time.perf_counter() - begun
        progress(f"Timing the Billing page at {size:,} ledger lines…")
        timings, queries = _pages(user, {"page": "/billing/"}, requests=requests)
        balance: Timing = measure_calls(
            {"balance": lambda: ledger.balance(project=project)}, runs=requests
        )["balance"]
        with CaptureQueriesContext(connection) as balance_queries:
            ledger.balance(project=project)
        results.append(
            {
                "lines": LedgerEntry.objects.filter(project=project).count(),
                "bare": timings["bare"],
                "bare_queries": queries["bare"],
                "page": timings["page"],
                "page_queries": queries["page"],
                "balance": balance,
                "balance_queries": len(balance_queries),
                "build_seconds": build_seconds,
            }
        )
    UsageRecord.objects.filter(project=project, ended_at__isnull=True).update(
        ended_at=F("charged_until")
    )
    return results
