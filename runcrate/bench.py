"""`manage.py bench` (`make bench`): how fast the product's hot paths are, as ratios against a
bare Django view measured in the same run, on a throwaway database.

Nothing here touches the operator's data: the command builds a separate database (a SQLite
file under `$RUNCRATE_VAR_DIR/bench/`, or `<name>_bench` on PostgreSQL) with Django's own
test-database machinery, fills it, measures, and drops it. Mail, cache and the Celery broker
are swapped for in-memory ones meanwhile, so no task reaches a running worker. docs/benchmarks.md
says what is measured and how.
"""

from __future__ import annotations

import contextlib
import cProfile
import http.client
import io
import logging
import platform
import pstats
import socket
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

import django
from django.conf import settings
from django.core.handlers.wsgi import WSGIHandler
from django.core.servers.basehttp import ThreadedWSGIServer, WSGIRequestHandler
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext, override_settings

from accounts.keys import add_ssh_key
from accounts.models import ApiKey, User, hash_api_key
from accounts.projects import create_project
from offers.models import GpuModel, Host, Location, MachineType

BENCH_EMAIL = "bench@runcrate.invalid"
BENCH_SSH_KEY = (
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAICRczkmZeBpuajNQwWKjiQ/cJwxpalTuZcRymKW1v0SO bench"
)
OFFERS_GPU = "h100-sxm"
OFFERS_NODES = 8
GOAL_RATIO = 2.0

# The synthetic catalog, shaped like the demo inventory (demo/inventory.json) at four times its
# size: five GPU models; in every location one H100 type and four others, among them a
# community RTX 4090, and here and there an InfiniBand H100 (quoted only, so never an offer)
# or a community H100. Hosts are spread evenly over the types.
GPUS = [
    ("h100-sxm", "H100 SXM 80GB", 80),
    ("h200-sxm", "H200 SXM 141GB", 141),
    ("a100-sxm", "A100 SXM 80GB", 80),
    ("l40s", "L40S 48GB", 48),
    ("rtx-4090", "RTX 4090 24GB", 24),
]
TYPES_PER_LOCATION = 5


def machine_types_for(index: int) -> list[tuple[str, int, str, str, bool, str]]:
    """The machine types of the index-th location: (gpu, GPUs per machine, kind,
    interconnect, community, price per machine-hour)."""
    even = index % 2 == 0
    types = [
        ("h100-sxm", 8, "bare_metal" if even else "vm", "ethernet", False, "23.92"),
        ("h200-sxm", 8, "bare_metal", "ethernet", False, "31.60")
        if even
        else ("a100-sxm", 8, "vm", "ethernet", False, "11.20"),
        ("l40s", 4, "container", "ethernet", False, "3.96"),
        ("rtx-4090", 2, "container", "ethernet", True, "0.78"),
    ]
    if index % 4 == 0:
        types.append(("h100-sxm", 8, "bare_metal", "infiniband", False, "27.60"))
    elif index % 5 == 0:
        types.append(("h100-sxm", 4, "container", "ethernet", True, "8.40"))
    else:
        types.append(("a100-sxm", 4, "vm", "ethernet", False, "5.60"))
    return types


# Of every 20 hosts: 13 free, 4 in use, 1 reserved, 1 cleaning, 1 offline.
STATES = (
    [Host.State.FREE] * 13
    + [Host.State.IN_USE] * 4
    + [
        Host.State.RESERVED,
        Host.State.CLEANING,
        Host.State.OFFLINE,
    ]
)


@dataclass
class Timing:
    samples: list[float] = field(default_factory=list)  # seconds per request

    @property
    def median_ms(self) -> float:
        return statistics.median(self.samples) * 1000

    @property
    def p90_ms(self) -> float:
        return statistics.quantiles(self.samples, n=10)[-1] * 1000


@dataclass
class Row:
    name: str
    timing: Timing
    queries: int
    ratio: float | None = None
    note: str = ""


# --- isolation ----------------------------------------------------------------------------


@contextlib.contextmanager
def throwaway_database(var_dir: Path) -> Iterator[str]:
    """A fresh, migrated database beside the operator's, dropped at the end whatever happens.

    Yields a description of it. Database connections are kept between requests, as the
    PostgreSQL settings do (CONN_MAX_AGE), so a request pays for its queries, not for a
    connection.
    """
    database = settings.DATABASES["default"]
    test = database.setdefault("TEST", {})
    saved_test_name = test.get("NAME")
    saved_max_age = database.get("CONN_MAX_AGE", 0)
    if connection.vendor == "sqlite":
        (var_dir / "bench").mkdir(parents=True, exist_ok=True)
        test["NAME"] = str(var_dir / "bench" / "bench.sqlite3")
    else:
        test["NAME"] = f"{database['NAME']}_bench"
    database["CONN_MAX_AGE"] = 60
    old_name = database["NAME"]
    connection.close()
    connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)
    try:
        yield f"{connection.display_name} ({test['NAME']}, dropped afterwards)"
    finally:
        connection.close()
        connection.creation.destroy_test_db(old_name, verbosity=0, keepdb=False)
        database["CONN_MAX_AGE"] = saved_max_age
        if saved_test_name is None:
            test.pop("NAME", None)
        else:
            test["NAME"] = saved_test_name


@contextlib.contextmanager
def isolated_services() -> Iterator[None]:
    """Production-like request handling, with mail, cache and broker kept in this process."""
    from runcrate.celery import app as celery_app

    saved_broker = (celery_app.conf.broker_url, celery_app.conf.broker_transport_options)
    # Nothing published yet in this process, so the producer pool is built from this.
    celery_app.conf.broker_url = "memory://"
    celery_app.conf.broker_transport_options = {}
    overrides = override_settings(
        DEBUG=False,
        ALLOWED_HOSTS=["127.0.0.1", "localhost", "testserver"],
        SECURE_SSL_REDIRECT=False,
        EMAIL_BACKEND="django.core.mail.backends.locmem.EmailBackend",
        CACHES={"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}},
        CELERY_TASK_ALWAYS_EAGER=False,
    )
    try:
        with overrides:
            yield
    finally:
        celery_app.conf.broker_url, celery_app.conf.broker_transport_options = saved_broker


# --- a real HTTP server in a thread ---------------------------------------------------------


class _QuietHandler(WSGIRequestHandler):
    # The handler writes the status line, the headers and the body separately: with Nagle's
    # algorithm on, each write after the first waits for the client's delayed ACK.
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


class _Server(ThreadedWSGIServer):
    # Join the request threads on close: each closes its database connection as it ends.
    daemon_threads = False
    block_on_close = True


class HttpBench:
    """Django's WSGI handler behind its threaded HTTP/1.1 server on 127.0.0.1, reached over one
    keep-alive connection, as an API client or a browser would."""

    def __init__(self) -> None:
        self.server = _Server(("127.0.0.1", 0), _QuietHandler, allow_reuse_address=False)
        self.server.set_app(WSGIHandler())
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.connection: http.client.HTTPConnection | None = None

    def get(self, path: str, headers: dict[str, str] | None = None) -> tuple[int, bytes, float]:
        """One request: status, body and seconds from sending to the last byte."""
        if self.connection is None:
            self.connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
            self.connection.connect()
            self.connection.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        started = time.perf_counter()
        self.connection.request("GET", path, headers=headers or {})
        response = self.connection.getresponse()
        body = response.read()
        elapsed = time.perf_counter() - started
        if response.getheader("Connection", "").lower() == "close":
            self.connection.close()
            self.connection = None
        return response.status, body, elapsed

    def close(self) -> None:
        if self.connection is not None:
            self.connection.close()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


# --- data -----------------------------------------------------------------------------------


def build_inventory(*, hosts: int, locations: int) -> int:
    """The synthetic catalog with `hosts` hosts over `locations` locations, by bulk inserts."""
    gpus = {
        slug: GpuModel.objects.create(slug=slug, name=name, memory_gib=memory)
        for slug, name, memory in GPUS
    }
    places = Location.objects.bulk_create(
        Location(
            code=f"bench-{index:02d}",
            name=f"Bench location {index:02d}",
            country=["US", "CA", "DE", "FI", "JP"][index % 5],
            capacity_reporting=(
                Location.CapacityReporting.COUNT
                if index % 2 == 0
                else Location.CapacityReporting.BOOLEAN
            ),
        )
        for index in range(locations)
    )
    types = MachineType.objects.bulk_create(
        MachineType(
            slug=f"{place.code}-{number}",
            location=place,
            gpu=gpus[gpu],
            gpus_per_machine=count,
            machine_kind=kind,
            interconnect=interconnect,
            community=community,
            price_per_hour=Decimal(price) + Decimal(index % 7) / 10,
            boot_seconds=MachineType.DEFAULT_BOOT_SECONDS[kind],
        )
        for index, place in enumerate(places)
        for number, (gpu, count, kind, interconnect, community, price) in enumerate(
            machine_types_for(index)
        )
    )
    Host.objects.bulk_create(
        (
            Host(
                name=f"bench-host-{index:06d}",
                machine_type=types[index % len(types)],
                # The k-th host of the t-th type: every type goes through every state.
                state=STATES[(index // len(types) + index % len(types)) % len(STATES)],
            )
            for index in range(hosts)
        ),
        batch_size=2000,
    )
    return len(types)


def _settle() -> None:
    """Give the new tables what a database in service has: PostgreSQL's autovacuum would have
    collected statistics and set the visibility map (index-only scans need it) by now."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("VACUUM ANALYZE")


def bench_person() -> tuple[User, str]:
    """A user with a project and an API key; returns the user and the raw key."""
    user = User.objects.create_user(BENCH_EMAIL, None)
    project = create_project(owner=user, name="Benchmark")
    raw = ApiKey.generate()
    ApiKey.objects.create(
        project=project, user=user, name="bench", prefix=raw[:12], key_hash=hash_api_key(raw)
    )
    return user, raw


def build_ready_cluster(*, user: User, nodes: int = 8) -> int:
    """A ready Slurm cluster of `nodes` machines, brought up by the lifecycle itself on the
    simulated data center with instant boot (its work run in this process); its id."""
    from billing import ledger
    from clusters import lifecycle
    from clusters.models import Cluster

    project = user.memberships.get().project
    machine_type = MachineType.objects.filter(
        gpu__slug=OFFERS_GPU,
        interconnect=MachineType.Interconnect.ETHERNET,
        community=False,
        location__capacity_reporting=Location.CapacityReporting.COUNT,
    ).first()
    ledger.credit(project=project, amount=Decimal("100000"), note="benchmark")
    add_ssh_key(project=project, user=user, name="bench", public_key=BENCH_SSH_KEY)
    with (
        override_settings(RUNCRATE_SIM_SPEED=1e9),
        lifecycle.dispatching_to(lifecycle.CollectingDispatcher()) as work,
    ):
        cluster = lifecycle.create_cluster(
            project=project,
            user=user,
            environment=project.environments.get(name="default"),
            offer_slug=machine_type.slug,
            nodes=nodes,
            name="bench-cluster",
            software=Cluster.Software.SLURM,
        )
        deadline = time.monotonic() + 60
        while cluster.status != Cluster.Status.READY and time.monotonic() < deadline:
            work.advance(cluster.pk)
            work.run()
            cluster.refresh_from_db()
            if cluster.is_final:
                break
            time.sleep(0.1)  # readiness checks run again after a moment of real time
    if cluster.status != Cluster.Status.READY:
        raise RuntimeError(f"the benchmark's cluster did not become ready: {cluster.status}")
    return cluster.pk


# --- measuring ------------------------------------------------------------------------------


def _measure_rounds(
    bench: HttpBench,
    requests: dict[str, tuple[str, dict[str, str]]],
    *,
    rounds: int,
    warmup: int,
    block: int = 10,
) -> dict[str, Timing]:
    """`rounds` timed requests of each kind, after `warmup` untimed ones.

    The kinds take turns in blocks of `block` requests, so a change in the machine's load hits
    them all alike, while each request still finds the caches as a run of its own kind left
    them (one at a time, a bare request after a large one pays for refilling them).
    """
    timings = {name: Timing() for name in requests}
    done = dict.fromkeys(requests, -warmup)
    while any(count < rounds for count in done.values()):
        for name, (path, headers) in requests.items():
            for _ in range(min(block, rounds - done[name])):
                status, body, elapsed = bench.get(path, headers)
                if status >= 400:
                    raise RuntimeError(f"{name}: GET {path} answered {status}: {body[:300]!r}")
                if done[name] >= 0:
                    timings[name].samples.append(elapsed)
                done[name] += 1
    return timings


def _count_queries(path: str, headers: dict[str, str], client: Client | None = None) -> int:
    client = client or Client()
    client.get(path, headers=headers)  # once to warm caches, like the timed requests
    with CaptureQueriesContext(connection) as queries:
        client.get(path, headers=headers)
    return len(queries)


def _profile(path: str, headers: dict[str, str], *, requests: int = 50) -> str:
    client = Client()
    client.get(path, headers=headers)
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(requests):
        client.get(path, headers=headers)
    profiler.disable()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("cumulative").print_stats(30)
    return out.getvalue()


@contextlib.contextmanager
def _quiet_logs() -> Iterator[None]:
    logging.disable(logging.WARNING)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)


def _provisioning(*, clusters: int = 100, nodes: int = 8) -> str:
    """Issue 3: clusters with instant boot, carried to ready by the reconciler in this process
    (clusters/benchmarks.py: a tick, then everything it hands off, until nothing is left)."""
    title = f"Provisioning, {clusters} clusters × {nodes} nodes with instant boot"
    try:
        from clusters.benchmarks import provision_clusters
    except ImportError:
        return f"{title}: not available yet (clusters.benchmarks)."
    result = dict(provision_clusters(clusters=clusters, nodes=nodes))
    known = {"clusters_ready", "ticks", "worker_seconds", "queries", "tasks", "create_seconds"}
    if not known <= result.keys():
        return f"{title}: {result}"
    per_cluster_ms = result["worker_seconds"] / clusters * 1000
    return (
        f"{title}:\n"
        f"  {result['clusters_ready']} of {clusters} ready after {result['ticks']} ticks; "
        f"worker time {result['worker_seconds']:.2f} s ({per_cluster_ms:.0f} ms per cluster), "
        f"{result['tasks']:,} tasks, {result['queries']:,} queries;\n"
        f"  creating them (reservation included) took {result['create_seconds']:.2f} s."
    )


def _billing() -> str:
    """Issue 4's figures, where billing/benchmarks.py provides them."""
    try:
        from billing.benchmarks import billing_page_benchmark, meter_benchmark
    except ImportError:
        return ""
    meter = meter_benchmark()
    page = billing_page_benchmark()
    return (
        f"Meter, one run over {meter['machines']:,} running machines: {meter['seconds']:.2f} s, "
        f"{meter['queries']} queries (a second run: {meter['second_run_seconds']:.2f} s, "
        f"{meter['second_run_records']} records charged).\n"
        f"Billing page, {page['clusters']:,} clusters / {page['machines']:,} machines "
        f"(test client, in-process): {page['page_median_ms']:.1f} ms, {page['page_queries']} "
        f"queries; one cluster's rows {page['cluster_rows_median_ms']:.1f} ms, "
        f"{page['cluster_rows_queries']} queries; bare view {page['bare_median_ms']:.1f} ms."
    )


def run(
    *,
    hosts: int = 20_000,
    locations: int = 40,
    requests: int = 200,
    profile: bool = False,
    emit: Callable[[str], None] = print,
    progress: Callable[[str], None] = lambda message: None,
) -> bool:
    """Measure and `emit` each block of the report as soon as it is known; progress notes go
    to `progress`. False when a section failed (its error is in the report)."""
    started = time.monotonic()

    def note(message: str) -> None:
        progress(f"[{time.monotonic() - started:5.1f} s] {message}")

    succeeded = True
    with isolated_services(), throwaway_database(Path(settings.VAR_DIR)) as database:
        note(f"Building {hosts:,} hosts over {locations} locations in {database}…")
        build_inventory(hosts=hosts, locations=locations)
        _settle()
        user, key = bench_person()
        api = {"Authorization": f"Bearer {key}"}
        offers = f"/api/v1/offers?gpu={OFFERS_GPU}&nodes={OFFERS_NODES}&include_community=true"
        browser = Client()
        browser.force_login(user)
        session = browser.cookies[settings.SESSION_COOKIE_NAME].value
        fragment = f"/clusters/{build_ready_cluster(user=user)}/"
        htmx = {"Cookie": f"{settings.SESSION_COOKIE_NAME}={session}", "HX-Request": "true"}
        targets = {"bare": ("/healthz", {}), "offers": (offers, api), "fragment": (fragment, htmx)}

        note(f"Timing {requests} rounds of {len(targets)} requests over HTTP…")
        bench = HttpBench()
        try:
            timings = _measure_rounds(bench, targets, rounds=requests, warmup=20)
        finally:
            bench.close()
        bare = timings["bare"]

        def ratio(name: str) -> float:
            return timings[name].median_ms / bare.median_ms

        rows = [
            Row("bare Django view, GET /healthz", bare, _count_queries("/healthz", {}), 1.0),
            Row(
                f"offers API, {hosts:,} hosts / {locations} locations",
                timings["offers"],
                _count_queries(offers, api),
                ratio("offers"),
                note=f"goal ≤ {GOAL_RATIO:g}",
            ),
            Row(
                "cluster status fragment, 8 nodes",
                timings["fragment"],
                _count_queries(fragment, {"HX-Request": "true"}, browser),
                ratio("fragment"),
            ),
        ]
        emit(format_table(database=database, requests=requests, rows=rows, offers=offers))
        if profile:
            note("Profiling the offers API…")
            emit("Where the offers API spends its time (cProfile, in-process):\n")
            emit(_profile(offers, api))
        # Billing rolls its data back; provisioning leaves 100 running clusters behind, which
        # the meter would count, so it comes last.
        for title, section in [
            ("Billing", _billing),
            ("Provisioning 100 clusters of 8 nodes", _provisioning),
        ]:
            note(f"{title}…")
            try:
                # Their own warnings (a cluster failing, say) are summed up in the line below.
                with _quiet_logs():
                    text = section()
            except Exception as error:  # noqa: BLE001 - reported, and the command fails
                succeeded = False
                text = f"{title}: FAILED, {type(error).__name__}: {error}"
            if text:
                emit(text)
    emit(f"\nFinished in {time.monotonic() - started:.0f} s; the benchmark database is gone.")
    return succeeded


def format_table(*, database: str, requests: int, rows: list[Row], offers: str) -> str:
    lines = [
        f"Runcrate Clusters benchmark: Python {platform.python_version()}, "
        f"Django {django.get_version()}",
        f"Database: {database}",
        f"Median and 90th percentile of {requests} requests each over HTTP to Django's "
        "threaded server, the kinds",
        "taking turns in blocks of 10; DEBUG off, database connections kept between requests.",
        "",
        f"{'':<44}{'median':>10}{'p90':>10}{'queries':>9}{'× bare':>8}",
    ]
    for row in rows:
        ratio = f"{row.ratio:.1f}" if row.ratio is not None else ""
        note = f"  ({row.note})" if row.note else ""
        lines.append(
            f"{row.name:<44}{row.timing.median_ms:>7.2f} ms{row.timing.p90_ms:>7.2f} ms"
            f"{row.queries:>9}{ratio:>8}{note}"
        )
    lines += ["", f"The offers request: GET {offers}", ""]
    return "\n".join(lines)
