"""`python -m bench` (`make bench`): how fast the product's hot paths are, each figure beside
its own baseline measured in the same run, on a throwaway database.

Nothing here touches the operator's data: the command builds a separate database (a SQLite
file under `$RUNCRATE_VAR_DIR/bench/`, or `<name>_bench` on PostgreSQL) with Django's own
test-database machinery, fills it with committed and analysed data, measures, and drops it.
Mail, cache and the Celery broker are swapped for in-memory ones in this process; the load
run's server (gunicorn, started as the Procfile starts it) gets a folder of its own for its
cache and broker. docs/benchmarks.md says what is measured and how.
"""

from __future__ import annotations

import contextlib
import cProfile
import html
import http.client
import io
import json
import logging
import os
import platform
import pstats
import re
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from decimal import Decimal
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit

import django
from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.core.handlers.wsgi import WSGIHandler
from django.core.servers.basehttp import ThreadedWSGIServer, WSGIRequestHandler
from django.db import connection
from django.http import HttpRequest, HttpResponse
from django.test import Client
from django.test.utils import CaptureQueriesContext, override_settings
from django.urls import path

from accounts.keys import add_ssh_key
from accounts.models import ApiKey, User
from accounts.projects import create_project
from config import urls as product_urls
from offers.models import GpuModel, Host, Location, MachineType

BENCH_EMAIL = "bench@runcrate.invalid"
BENCH_SSH_KEY = (
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAICRczkmZeBpuajNQwWKjiQ/cJwxpalTuZcRymKW1v0SO bench"
)
OFFERS_GPU = "h100-sxm"
OFFERS_NODES = 8
POLL_GPU = "bench-poll"
GOAL_RATIO = 2.0
# "The same" at two sizes: the larger within this factor of the smaller, or within SAME_MS of
# it (timer noise on sub-millisecond figures is a good part of either).
SAME_RATIO = 1.5
SAME_MS = 0.5


SAME_TEXT = f"≤ {SAME_RATIO:g}× or + {SAME_MS:g} ms"
# A slow page stops at this many seconds of timed requests (with 50 samples at least).
PAGE_SECONDS = 5.0
LOAD_RPS_GOAL = 500
LOAD_P99_GOAL_MS = 100
BARE_LOGGED_IN = "/bench/logged-in"
BASE_DIR = Path(__file__).resolve().parent.parent

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


@dataclass(frozen=True)
class Sizes:
    """What one run builds and how many samples it takes (the issue's sizes by default)."""

    offers_hosts: tuple[int, ...] = (2_000, 20_000, 100_000)
    locations: int = 40
    poll_nodes: tuple[int, ...] = (8, 64)
    requests: int = 300  # timed requests per kind over HTTP in this process
    load_requests: int = 500  # per target and round under gunicorn
    load_rounds: int = 2
    load_cap_seconds: float = 6.0  # per target and round
    load_connections: int = 8
    tick_clusters: tuple[int, ...] = (2_000, 20_000)
    tick_runs: int = 30
    meter_machines: tuple[int, ...] = (1_000, 10_000, 50_000)
    meter_runs: int = 10
    billing_clusters: tuple[int, ...] = (100, 1_000, 5_000)
    page_requests: int = 30
    ledger_lines: tuple[int, ...] = (20_000, 1_000_000)
    provisioning: tuple[int, int] = (100, 8)  # clusters, nodes
    sections: tuple[str, ...] = ()  # empty: every section


QUICK = Sizes(
    offers_hosts=(200, 400),
    locations=4,
    poll_nodes=(2, 4),
    requests=20,
    load_requests=40,
    load_rounds=1,
    load_cap_seconds=10.0,
    load_connections=2,
    tick_clusters=(20, 200),
    tick_runs=5,
    meter_machines=(40, 80),
    meter_runs=3,
    billing_clusters=(5, 10),
    page_requests=5,
    ledger_lines=(1_000, 3_000),
    provisioning=(2, 2),
)
SECTIONS = ("pages", "load", "tick", "meter", "billing", "ledger", "metrics", "provisioning")


def size_at(sizes: tuple[int, ...], preferred: int) -> int:
    """`preferred` when it is among `sizes`, else the middle one (a smaller run's stand-in)."""
    return preferred if preferred in sizes else sizes[len(sizes) // 2]


@dataclass
class Timing:
    samples: list[float] = field(default_factory=list)  # seconds each
    statuses: Counter = field(default_factory=Counter)

    def _quantile(self, n: int) -> float:
        if len(self.samples) < 2:
            return self.samples[0] * 1000
        return statistics.quantiles(self.samples, n=n, method="inclusive")[-1] * 1000

    @property
    def median_ms(self) -> float:
        return statistics.median(self.samples) * 1000

    @property
    def p90_ms(self) -> float:
        return self._quantile(10)

    @property
    def p99_ms(self) -> float:
        return self._quantile(100)

    @property
    def status(self) -> str:
        return "/".join(str(code) for code in sorted(self.statuses))


def same(small: Timing, large: Timing) -> bool:
    """Whether `large` is "the same" as `small` (SAME_RATIO, SAME_MS)."""
    return large.median_ms <= max(small.median_ms * SAME_RATIO, small.median_ms + SAME_MS)


@dataclass
class Row:
    name: str
    timing: Timing
    queries: int | None = None
    ratio: float | None = None
    note: str = ""


@dataclass
class Goal:
    text: str
    met: bool | None  # None: not measurable on this run
    figures: str

    def line(self) -> str:
        mark = {True: "met    ", False: "NOT met", None: "n/a    "}[self.met]
        return f"  {mark}  {self.text}: {self.figures}"


def timed(function: Callable[[], object]) -> tuple[float, object]:
    started = time.perf_counter()
    result = function()
    return time.perf_counter() - started, result


# --- the bare logged-in view, served beside the product's URLs ------------------------------


@login_required
def bare_logged_in(request: HttpRequest) -> HttpResponse:
    """The baseline of pages: a view behind login (the session and its user read, as every
    page reads them) that does nothing else."""
    return HttpResponse(b"ok", content_type="text/plain")


# The bench's URLconf (ROOT_URLCONF for its servers): the product's URLs and the bare view.
urlpatterns = [path(BARE_LOGGED_IN.lstrip("/"), bare_logged_in), *product_urls.urlpatterns]


# --- isolation ----------------------------------------------------------------------------


@contextlib.contextmanager
def throwaway_database(var_dir: Path, *, suffix: str = "bench") -> Iterator[str]:
    """A fresh, migrated database beside the operator's (`<name>_<suffix>`, or a SQLite file
    of that name under `var_dir/bench/`), dropped at the end whatever happens.

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
        test["NAME"] = str(var_dir / "bench" / f"{suffix}.sqlite3")
    else:
        test["NAME"] = f"{database['NAME']}_{suffix}"
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
def isolated_services(secret_key: str) -> Iterator[None]:
    """Production-like request handling, with mail, cache and broker kept in this process, the
    bench's URLconf, and a secret key of the run's own (the load run's server gets the same, so
    it accepts the sessions made here)."""
    from config.celery import app as celery_app

    saved_broker = (celery_app.conf.broker_url, celery_app.conf.broker_transport_options)
    # Nothing published yet in this process, so the producer pool is built from this.
    celery_app.conf.broker_url = "memory://"
    celery_app.conf.broker_transport_options = {}
    overrides = override_settings(
        DEBUG=False,
        SECRET_KEY=secret_key,
        ROOT_URLCONF="bench.harness",
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


def settle(*models: type) -> None:
    """Give the new rows what a database in service has: statistics for the planner (and on
    PostgreSQL the visibility map that index-only scans need), as autovacuum or an ANALYZE
    would have left them. The given models' tables, or every table."""
    tables = [connection.ops.quote_name(model._meta.db_table) for model in models]
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            # VACUUM cannot run in a transaction (a test's): ANALYZE alone then.
            vacuum = "ANALYZE" if connection.in_atomic_block else "VACUUM ANALYZE"
            cursor.execute(f"{vacuum} {', '.join(tables)}")
        elif tables:
            for table in tables:
                cursor.execute(f"ANALYZE {table}")
        else:
            cursor.execute("ANALYZE")


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


@contextlib.contextmanager
def http_bench() -> Iterator[HttpBench]:
    bench = HttpBench()
    try:
        yield bench
    finally:
        bench.close()


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
    add_hosts(types, start=0, end=hosts)
    return len(types)


def add_hosts(types: list[MachineType], *, start: int, end: int) -> None:
    """Hosts number `start` to `end` (excluded) of the catalog, spread over its types."""
    Host.objects.bulk_create(
        (
            Host(
                name=f"bench-host-{index:06d}",
                machine_type=types[index % len(types)],
                # The k-th host of the t-th type: every type goes through every state.
                state=STATES[(index // len(types) + index % len(types)) % len(STATES)],
            )
            for index in range(start, end)
        ),
        batch_size=5000,
    )


def catalog_types() -> list[MachineType]:
    """The synthetic catalog's machine types, in the order build_inventory made them."""
    return list(MachineType.objects.filter(location__code__startswith="bench-").order_by("pk"))


def bench_person() -> tuple[User, str]:
    """A user with a project, credit, an SSH key and an API key; returns the user and the raw
    key."""
    from billing import ledger

    user = User.objects.create_user(BENCH_EMAIL, None)
    project = create_project(owner=user, name="Benchmark")
    raw = ApiKey.generate()
    ApiKey.objects.create(
        project=project, user=user, name="bench", prefix=raw[:12], key_hash=_hash_key(raw)
    )
    ledger.credit(project=project, amount=Decimal("1000000"), note="benchmark")
    add_ssh_key(project=project, user=user, name="bench", public_key=BENCH_SSH_KEY)
    return user, raw


def _hash_key(raw: str) -> str:
    from accounts.models import hash_api_key

    return hash_api_key(raw)


def poll_machine_type(*, hosts: int) -> MachineType:
    """A location of its own for the polled clusters (H100s nobody else asks for), with
    `hosts` free hosts that count their capacity, so clusters of up to 64 nodes fit."""
    gpu = GpuModel.objects.create(slug=POLL_GPU, name="H100 SXM 80GB (poll)", memory_gib=80)
    location = Location.objects.create(
        code="poll-1",
        name="Poll location",
        country="US",
        capacity_reporting=Location.CapacityReporting.COUNT,
    )
    machine_type = MachineType.objects.create(
        slug="poll-1-h100x8",
        location=location,
        gpu=gpu,
        gpus_per_machine=8,
        machine_kind=MachineType.Kind.VM,
        price_per_hour=Decimal("20.00"),
        boot_seconds=1,
    )
    Host.objects.bulk_create(
        Host(name=f"poll-host-{index:03d}", machine_type=machine_type) for index in range(hosts)
    )
    return machine_type


def build_ready_cluster(
    *, user: User, nodes: int = 8, machine_type: MachineType | None = None, name: str = ""
) -> int:
    """A ready Slurm cluster of `nodes` machines, brought up by the lifecycle itself on the
    simulated data center with instant boot (its work run in this process); its id."""
    from clusters import lifecycle
    from clusters.models import Cluster

    project = user.memberships.get().project
    machine_type = (
        machine_type
        or MachineType.objects.filter(
            gpu__slug=OFFERS_GPU,
            interconnect=MachineType.Interconnect.ETHERNET,
            community=False,
            location__capacity_reporting=Location.CapacityReporting.COUNT,
        ).first()
    )
    with (
        override_settings(RUNCRATE_SIM_SPEED=1e9, RUNCRATE_MIN_STEP_SECONDS=3600),
        lifecycle.dispatching_to(lifecycle.CollectingDispatcher()) as work,
    ):
        cluster = lifecycle.create_cluster(
            project=project,
            user=user,
            environment=project.environments.get(name="default"),
            offer_slug=machine_type.slug,
            nodes=nodes,
            name=name or f"bench-{nodes}-nodes",
            software=Cluster.Software.SLURM,
        )
        deadline = time.monotonic() + 120
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


POLL_ATTRIBUTE = re.compile(r'<section id="cluster-status"[^>]*?\shx-get="([^"]+)"')


def poll_paths(browser: Client, cluster_id: int) -> tuple[str, str, str]:
    """What the cluster page's poll sends, read from the page itself (its `hx-get`): the poll
    of a cluster as the page shows it, one that finds it changed (the version one less), and
    a note when the page sends no version to change."""
    page = browser.get(f"/clusters/{cluster_id}/")
    found = POLL_ATTRIBUTE.search(page.content.decode())
    if page.status_code != 200 or not found:
        raise RuntimeError(f"the cluster page ({page.status_code}) has no poll (hx-get)")
    unchanged = html.unescape(found.group(1))
    parts = urlsplit(unchanged)
    query = parse_qsl(parts.query, keep_blank_values=True)
    if not any(name == "version" for name, _ in query):
        return unchanged, unchanged, "the page sends no version: a changed poll is the same"
    changed = [(n, str(int(v) - 1) if n == "version" else v) for n, v in query]
    return unchanged, f"{parts.path}?{urlencode(changed)}", ""


# --- measuring ------------------------------------------------------------------------------


def measure_rounds(
    bench: HttpBench,
    requests: dict[str, tuple[str, dict[str, str]]],
    *,
    rounds: int,
    warmup: int,
    block: int = 10,
    seconds_per_kind: float | None = None,
    at_least: int = 50,
) -> dict[str, Timing]:
    """`rounds` timed requests of each kind, after `warmup` untimed ones.

    The kinds take turns in blocks of `block` requests, so a change in the machine's load hits
    them all alike, while each request still finds the caches as a run of its own kind left
    them (one at a time, a bare request after a large one pays for refilling them). With
    `seconds_per_kind`, a kind whose timed requests took that long stops at the end of its
    block once it has `at_least` samples (so a slow page cannot stretch the run), while the
    others go on.
    """
    timings = {name: Timing() for name in requests}
    done = dict.fromkeys(requests, -warmup)
    wanted = dict.fromkeys(requests, rounds)
    while any(done[name] < wanted[name] for name in requests):
        for name, (path_, headers) in requests.items():
            for _ in range(min(block, wanted[name] - done[name])):
                status, body, elapsed = bench.get(path_, headers)
                if status >= 400:
                    raise RuntimeError(f"{name}: GET {path_} answered {status}: {body[:300]!r}")
                if done[name] >= 0:
                    timings[name].samples.append(elapsed)
                    timings[name].statuses[status] += 1
                done[name] += 1
            samples = timings[name].samples
            if (
                seconds_per_kind is not None
                and len(samples) >= min(at_least, rounds)
                and sum(samples) >= seconds_per_kind
            ):
                wanted[name] = done[name]
    return timings


_measure_rounds = measure_rounds  # the name tests and older callers use


def measure_calls(calls: dict[str, Callable[[], object]], *, runs: int) -> dict[str, Timing]:
    """`runs` timed calls of each function, taking turns (after one untimed call of each)."""
    timings = {name: Timing() for name in calls}
    for function in calls.values():
        function()
    for _ in range(runs):
        for name, function in calls.items():
            elapsed, _ = timed(function)
            timings[name].samples.append(elapsed)
    return timings


def count_queries(path_: str, headers: dict[str, str], client: Client | None = None) -> int:
    client = client or Client()
    client.get(path_, headers=headers)  # once to warm caches, like the timed requests
    with CaptureQueriesContext(connection) as queries:
        client.get(path_, headers=headers)
    return len(queries)


_count_queries = count_queries


class QueryTimer:
    """An execute wrapper that counts the queries run and times each (perf_counter, not the
    millisecond-rounded times Django's query log keeps)."""

    def __init__(self) -> None:
        self.queries: list[tuple[str, float]] = []

    def __call__(self, execute: Callable, sql, params, many, context):
        started = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            self.queries.append((sql, time.perf_counter() - started))

    def reads_seconds(self) -> float:
        return sum(s for sql, s in self.queries if sql.lstrip().upper().startswith("SELECT"))


def _profile(path_: str, headers: dict[str, str], *, requests: int = 50) -> str:
    client = Client()
    client.get(path_, headers=headers)
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(requests):
        client.get(path_, headers=headers)
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


def format_rows(title: str, rows: list[Row], *, ratio_label: str = "× base") -> str:
    lines = [
        title,
        f"{'':<52}{'median':>12}{'p90':>12}{'p99':>12}{'n':>5}{'status':>8}{'queries':>8}"
        f"{ratio_label:>8}",
    ]
    for row in rows:
        t = row.timing
        ratio = f"{row.ratio:.2f}" if row.ratio is not None else ""
        queries = "" if row.queries is None else str(row.queries)
        note = f"  {row.note}" if row.note else ""
        lines.append(
            f"{row.name:<52}{t.median_ms:>9.2f} ms{t.p90_ms:>9.2f} ms{t.p99_ms:>9.2f} ms"
            f"{len(t.samples):>5}{t.status:>8}{queries:>8}{ratio:>8}{note}"
        )
    return "\n".join(lines) + "\n"


# --- the sections ---------------------------------------------------------------------------


@dataclass
class Context:
    """What the sections share: the bench's user, its API key and logged-in headers."""

    sizes: Sizes
    user: User
    api: dict[str, str]
    session_headers: dict[str, str]
    browser: Client
    goals: list[Goal]
    note: Callable[[str], None]
    emit: Callable[[str], None]
    profile: bool = False
    offers_path: str = ""
    polls: dict[int, tuple[str, str, str]] = field(default_factory=dict)  # nodes: paths, note
    poll_cluster_ids: dict[int, int] = field(default_factory=dict)


def _offers_path() -> str:
    return f"/api/v1/offers?gpu={OFFERS_GPU}&nodes={OFFERS_NODES}&include_community=true"


def pages_section(ctx: Context) -> None:
    """The poll and the offers API over HTTP in this process, each beside its baseline."""
    sizes = ctx.sizes
    logged_in = ctx.session_headers
    htmx = {**logged_in, "HX-Request": "true"}
    targets: dict[str, tuple[str, dict[str, str]]] = {
        "healthz": ("/healthz", {}),
        "logged-in": (BARE_LOGGED_IN, logged_in),
    }
    for nodes, (unchanged, changed, _) in ctx.polls.items():
        targets[f"poll {nodes}"] = (unchanged, htmx)
        targets[f"changed {nodes}"] = (changed, htmx)
    ctx.note(f"Timing {sizes.requests} rounds of {len(targets)} page requests over HTTP…")
    with http_bench() as bench:
        timings = measure_rounds(
            bench, targets, rounds=sizes.requests, warmup=20, seconds_per_kind=PAGE_SECONDS
        )
    bare = timings["logged-in"].median_ms
    rows = [
        Row("bare Django view, GET /healthz", timings["healthz"], count_queries("/healthz", {})),
        Row(
            f"bare logged-in view, GET {BARE_LOGGED_IN} (base)",
            timings["logged-in"],
            count_queries(BARE_LOGGED_IN, {}, ctx.browser),
            1.0,
        ),
    ]
    poll_ratios = []
    for nodes, (unchanged, changed, note) in ctx.polls.items():
        for kind, path_ in (("poll", unchanged), ("changed", changed)):
            timing = timings[f"{kind} {nodes}"]
            ratio = timing.median_ms / bare
            if kind == "poll":
                poll_ratios.append((nodes, ratio))
            rows.append(
                Row(
                    f"{'unchanged' if kind == 'poll' else 'changed'} poll, {nodes} nodes",
                    timing,
                    count_queries(path_, {"HX-Request": "true"}, ctx.browser),
                    ratio,
                    note if kind == "changed" else "",
                )
            )
    first = next(iter(ctx.polls.values()))
    ctx.emit(
        format_rows(
            "Pages over HTTP (Django's threaded server in this process, one keep-alive "
            "connection), × the bare logged-in view:",
            rows,
        )
        + f"The poll: GET {first[0]} with HX-Request: true.\n"
    )
    ctx.goals.append(
        Goal(
            f"unchanged poll ≤ {GOAL_RATIO:g}× the bare logged-in view",
            all(r <= GOAL_RATIO for _, r in poll_ratios),
            ", ".join(f"{r:.2f}× at {n} nodes" for n, r in poll_ratios),
        )
    )


def offers_section(ctx: Context, hosts: int) -> float:
    """The offers API at `hosts` hosts beside the bare bearer-key view; the ratio."""
    me = "/api/v1/me"
    targets = {"me": (me, ctx.api), "offers": (ctx.offers_path, ctx.api)}
    ctx.note(f"Timing the offers API at {hosts:,} hosts…")
    with http_bench() as bench:
        timings = measure_rounds(bench, targets, rounds=ctx.sizes.requests, warmup=20)
    ratio = timings["offers"].median_ms / timings["me"].median_ms
    ctx.emit(
        format_rows(
            f"Offers API at {hosts:,} hosts / {ctx.sizes.locations} locations over HTTP, × the "
            "bare bearer-key view:",
            [
                Row(
                    f"bare bearer-key view, GET {me} (base)",
                    timings["me"],
                    count_queries(me, ctx.api),
                    1.0,
                ),
                Row(
                    f"offers API, {hosts:,} hosts",
                    timings["offers"],
                    count_queries(ctx.offers_path, ctx.api),
                    ratio,
                ),
            ],
        )
    )
    if ctx.profile:
        ctx.emit("Where the offers API spends its time (cProfile, in-process):\n")
        ctx.emit(_profile(ctx.offers_path, ctx.api))
    return ratio


# --- the load run under the production server -------------------------------------------------


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def procfile_web() -> str:
    """The Procfile's `web` command, as honcho or a platform would run it."""
    for line in (BASE_DIR / "Procfile").read_text().splitlines():
        if line.startswith("web:"):
            return line.removeprefix("web:").strip()
    raise RuntimeError("the Procfile has no web line")


SERVER_SETTINGS = """\
# Written by `python -m bench` for its load run, and removed with its database.
from config.settings import *  # noqa: F403

DATABASES = {{"default": {{**DATABASES["default"], "NAME": {name!r}}}}}  # noqa: F405
ROOT_URLCONF = "bench.harness"
# The load touches no static file; no collectstatic needed.
STORAGES = {{
    **STORAGES,  # noqa: F405
    "staticfiles": {{"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"}},
}}
"""


@contextlib.contextmanager
def production_server(
    folder: Path, secret_key: str, *, wait_seconds: float = 60
) -> Iterator[tuple[int, str]]:
    """gunicorn as the Procfile starts it, on a free port of 127.0.0.1, against the bench's
    database (committed, so another process sees it), DEBUG off, its cache and broker in
    `folder`; stopped at the end. Yields the port and the command."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "benchsettings.py").write_text(
        SERVER_SETTINGS.format(name=str(connection.settings_dict["NAME"]))
    )
    port = free_port()
    bin_dir = Path(sys.executable).parent
    env = {
        key: value
        for key, value in os.environ.items()
        # Its cache and broker live in `folder`, never in a Redis another product uses.
        if key not in {"REDIS_URL", "REDIS_CACHE_URL", "SENTRY_DSN"}
    }
    env.update(
        DJANGO_SETTINGS_MODULE="benchsettings",
        PYTHONPATH=os.pathsep.join([str(folder), str(BASE_DIR)]),
        RUNCRATE_VAR_DIR=str(folder / "var"),
        DEBUG="false",
        SECRET_KEY=secret_key,
        ALLOWED_HOSTS="127.0.0.1",
        SECURE_SSL_REDIRECT="false",
        HOST="127.0.0.1",
        PORT=str(port),
        PATH=os.pathsep.join([str(bin_dir), env.get("PATH", "")]),
    )
    command = procfile_web()
    log = (folder / "gunicorn.log").open("wb")
    process = subprocess.Popen(  # noqa: S603 - the Procfile's own line, run as honcho would
        ["/bin/sh", "-c", f"exec {command}"],
        cwd=BASE_DIR,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        _wait_healthy(process, port, wait_seconds, folder / "gunicorn.log")
        shown = command.replace("${HOST:-0.0.0.0}", "127.0.0.1").replace("${PORT:-8000}", "PORT")
        workers = env.get("WEB_CONCURRENCY") or re.search(r"WEB_CONCURRENCY:-(\d+)", command)
        yield port, f"{shown} (workers: {workers if isinstance(workers, str) else workers[1]})"
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=40)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def _wait_healthy(process: subprocess.Popen, port: int, seconds: float, log: Path) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            break
        try:
            probe = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            probe.request("GET", "/healthz")
            if probe.getresponse().status == 200:
                probe.close()
                return
            probe.close()
        except OSError:
            pass
        time.sleep(0.2)
    tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
    raise RuntimeError(f"gunicorn did not answer /healthz within {seconds:.0f} s:\n{tail}")


def run_load(port: int, targets: list[dict], sizes: Sizes) -> dict:
    """The load generator (bench/loadgen.py) in a process of its own."""
    plan = {
        "port": port,
        "connections": sizes.load_connections,
        "rounds": sizes.load_rounds,
        "requests": sizes.load_requests,
        "cap_seconds": sizes.load_cap_seconds,
        "warmup": min(sizes.load_requests, 25 * sizes.load_connections),
        "targets": targets,
    }
    budget = (sizes.load_rounds + 1) * len(targets) * (sizes.load_cap_seconds + 5) + 60
    done = subprocess.run(  # noqa: S603 - our own script, no shell
        [sys.executable, "-I", str(BASE_DIR / "bench" / "loadgen.py")],
        input=json.dumps(plan),
        capture_output=True,
        text=True,
        timeout=budget,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the load generator failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout)


def load_section(ctx: Context, folder: Path, secret_key: str) -> None:
    sizes = ctx.sizes
    htmx = {**ctx.session_headers, "HX-Request": "true"}
    nodes = sizes.poll_nodes[0]
    unchanged, changed, _ = ctx.polls[nodes]
    targets = [
        {"name": "/healthz", "path": "/healthz", "headers": {}},
        {"name": "bare logged-in view", "path": BARE_LOGGED_IN, "headers": ctx.session_headers},
        {"name": f"unchanged poll, {nodes} nodes", "path": unchanged, "headers": htmx},
        {"name": f"changed poll, {nodes} nodes", "path": changed, "headers": htmx},
        {"name": "bare bearer-key view", "path": "/api/v1/me", "headers": ctx.api},
        {"name": "offers API", "path": ctx.offers_path, "headers": ctx.api},
    ]
    ctx.note("Starting gunicorn for the load run…")
    with production_server(folder, secret_key) as (port, command):
        ctx.note(
            f"Load: {sizes.load_rounds} rounds × {len(targets)} targets × "
            f"{sizes.load_requests} requests over {sizes.load_connections} connections…"
        )
        results = run_load(port, targets, sizes)
    lines = [
        f"Load run under the production server: {command}",
        f"load generator: bench/loadgen.py, {sizes.load_connections} processes with a "
        f"connection each, {sizes.load_rounds} rounds of {sizes.load_requests} requests per "
        f"target (targets taking turns), {sizes.load_cap_seconds:g} s cap per turn; "
        f"{os.cpu_count()} CPUs for server and load together.",
        f"{'':<36}{'requests/s':>11}{'p50':>10}{'p99':>10}{'done':>7}{'errors':>7}{'status':>10}",
    ]
    figures: dict[str, tuple[float, float, float]] = {}
    for target in targets:
        result = results[target["name"]]
        timing = Timing(samples=result["latencies"])
        rps = result["done"] / result["seconds"] if result["seconds"] else 0.0
        p50 = timing.median_ms if timing.samples else float("nan")
        p99 = timing.p99_ms if timing.samples else float("nan")
        figures[target["name"]] = (rps, p50, p99)
        status = "/".join(f"{code}" for code in sorted(result["statuses"]))
        capped = "  (capped)" if result["capped"] else ""
        lines.append(
            f"{target['name']:<36}{rps:>11.0f}{p50:>7.1f} ms{p99:>7.1f} ms{result['done']:>7}"
            f"{result['errors']:>7}{status:>10}{capped}"
        )
        if result["errors"] or any(int(code) >= 400 for code in result["statuses"]):
            raise RuntimeError(f"the load run's {target['name']} failed: {result}")
    ctx.emit("\n".join(lines) + "\n")
    poll_rps, _, poll_p99 = figures[f"unchanged poll, {nodes} nodes"]
    bare_rps, _, bare_p99 = figures["bare logged-in view"]
    share = poll_rps / bare_rps if bare_rps else 0.0
    ctx.goals.append(
        Goal(
            "under gunicorn the unchanged poll serves ≥ 50% of the bare logged-in view's "
            "requests/s",
            share >= 0.5,
            f"{share:.0%} ({poll_rps:.0f} against {bare_rps:.0f} requests/s)",
        )
    )
    allows = bare_rps >= LOAD_RPS_GOAL and bare_p99 < LOAD_P99_GOAL_MS
    ctx.goals.append(
        Goal(
            f"under gunicorn the poll serves {LOAD_RPS_GOAL} requests/s with p99 < "
            f"{LOAD_P99_GOAL_MS} ms (if the machine allows it)",
            (poll_rps >= LOAD_RPS_GOAL and poll_p99 < LOAD_P99_GOAL_MS) if allows else None,
            f"{poll_rps:.0f} requests/s, p99 {poll_p99:.1f} ms"
            + (
                ""
                if allows
                else f"; this machine does not allow it: the bare logged-in view itself "
                f"serves {bare_rps:.0f} requests/s, p99 {bare_p99:.1f} ms"
            ),
        )
    )


# --- the sections run by others' modules ------------------------------------------------------


def tick_section(ctx: Context) -> None:
    from bench.clusters import tick_benchmark

    results = tick_benchmark(
        sizes=ctx.sizes.tick_clusters,
        runs=ctx.sizes.tick_runs,
        progress=ctx.note,
    )
    rows = [
        Row(
            f"tick's reads, {r['clusters']:,} ready clusters ({r['nodes']:,} nodes)",
            r["reads"],
            r["queries"],
            r["reads"].median_ms / results[0]["reads"].median_ms,
            f"whole tick {r['tick'].median_ms:.2f} ms; built in {r['build_seconds']:.1f} s",
        )
        for r in results
    ]
    ctx.emit(
        format_rows(
            "The tick (clusters.tasks.tick in this process, in-memory broker): the time of its "
            "SELECTs, × the smallest size:",
            rows,
        )
    )
    ratio = rows[-1].ratio
    ctx.goals.append(
        Goal(
            f"tick query time the same at {results[0]['clusters']:,} and "
            f"{results[-1]['clusters']:,} ready clusters ({SAME_TEXT})",
            same(results[0]["reads"], results[-1]["reads"]),
            f"{ratio:.2f}× ({results[-1]['reads'].median_ms:.2f} ms against "
            f"{results[0]['reads'].median_ms:.2f} ms)",
        )
    )


def meter_section(ctx: Context) -> None:
    from bench.billing import meter_benchmark

    results = meter_benchmark(
        machines=ctx.sizes.meter_machines, runs=ctx.sizes.meter_runs, progress=ctx.note
    )
    rows = []
    for r in results:
        rows.append(
            Row(
                f"set-based UPDATE, {r['machines']:,} machines (base)",
                r["baseline"],
                1,
                1.0,
            )
        )
        rows.append(
            Row(
                f"meter (charge_accrued), {r['machines']:,} machines",
                r["meter"],
                r["queries"],
                r["meter"].median_ms / r["baseline"].median_ms,
                f"built in {r['build_seconds']:.1f} s",
            )
        )
    ctx.emit(
        format_rows(
            "The meter, two minutes of every running machine per run, taking turns with a "
            "set-based SQL UPDATE that computes the same charge (rolled back each time):",
            rows,
        )
    )
    target = size_at(ctx.sizes.meter_machines, 10_000)
    at = next(r for r in results if r["size"] == target)
    ratio = at["meter"].median_ms / at["baseline"].median_ms
    ctx.goals.append(
        Goal(
            f"meter ≤ {GOAL_RATIO:g}× its set-based baseline at {target:,} machines",
            ratio <= GOAL_RATIO,
            f"{ratio:.2f}× ({at['meter'].median_ms:.1f} ms against "
            f"{at['baseline'].median_ms:.1f} ms)",
        )
    )


def billing_section(ctx: Context) -> None:
    from bench.billing import billing_page_benchmark

    results = billing_page_benchmark(
        clusters=ctx.sizes.billing_clusters, requests=ctx.sizes.page_requests, progress=ctx.note
    )
    rows = []
    for r in results:
        rows += [
            Row(
                f"bare logged-in view, {r['clusters']:,} clusters (base)",
                r["bare"],
                r["bare_queries"],
                1.0,
            ),
            Row(
                f"Billing page, {r['clusters']:,} clusters",
                r["page"],
                r["page_queries"],
                r["page"].median_ms / r["bare"].median_ms,
            ),
            Row(
                "  one cluster's usage rows",
                r["cluster_rows"],
                r["cluster_rows_queries"],
                r["cluster_rows"].median_ms / r["bare"].median_ms,
            ),
        ]
    ctx.emit(
        format_rows(
            "The Billing page over HTTP (clusters of 8 machines billed this month), × the bare "
            "logged-in view:",
            rows,
        )
    )
    if len(results) > 1:  # the page stays flat: its largest size beside its smallest
        small, large = results[0], results[-1]
        ctx.emit(
            f"Billing page, {large['clusters']:,} clusters vs {small['clusters']:,}: "
            f"{large['page'].median_ms / small['page'].median_ms:.2f}× "
            f"({large['page'].median_ms:.1f} ms vs {small['page'].median_ms:.1f} ms median; "
            "docs/billing.md allows 1.5×)"
        )


def ledger_section(ctx: Context) -> None:
    from bench.billing import ledger_benchmark

    results = ledger_benchmark(
        lines=ctx.sizes.ledger_lines, requests=ctx.sizes.page_requests, progress=ctx.note
    )
    rows = []
    for r in results:
        rows += [
            Row(
                f"bare logged-in view, {r['lines']:,} lines (base)",
                r["bare"],
                r["bare_queries"],
                1.0,
            ),
            Row(
                f"Billing page, {r['lines']:,} ledger lines",
                r["page"],
                r["page_queries"],
                r["page"].median_ms / r["bare"].median_ms,
            ),
            Row(
                f"balance (billing.ledger.balance), {r['lines']:,} lines",
                r["balance"],
                r["balance_queries"],
                None,
                f"lines inserted in {r['build_seconds']:.1f} s",
            ),
        ]
    ctx.emit(format_rows("A project's ledger grows (set-based inserts):", rows))
    small, large = results[0], results[-1]
    page = large["page"].median_ms / small["page"].median_ms
    balance = large["balance"].median_ms / small["balance"].median_ms
    ctx.goals.append(
        Goal(
            f"Billing page and balance time the same at {small['lines']:,} and "
            f"{large['lines']:,} ledger lines ({SAME_TEXT})",
            same(small["page"], large["page"]) and same(small["balance"], large["balance"]),
            f"page {page:.2f}× ({small['page'].median_ms:.1f} → "
            f"{large['page'].median_ms:.1f} ms), balance {balance:.2f}× "
            f"({small['balance'].median_ms:.2f} → {large['balance'].median_ms:.2f} ms); "
            f"{large['lines'] - small['lines']:,} lines inserted in "
            f"{large['build_seconds']:.1f} s",
        )
    )


def polls_section(ctx: Context) -> None:
    from bench.polls import polls_section as section

    section(ctx)


def metrics_section(ctx: Context) -> None:
    """Issue 23: agent metrics reports a web process takes, and their bytes (bench/metrics.py)."""
    from bench.metrics import metrics_section as measure

    measure(ctx)


def provisioning_section(ctx: Context) -> None:
    """Issue 3: clusters with instant boot, carried to ready by the reconciler in this process
    (bench/clusters.py: a tick, then everything it hands off, until nothing is left)."""
    from bench.clusters import provision_clusters

    clusters, nodes = ctx.sizes.provisioning
    ctx.note(f"Provisioning {clusters} clusters × {nodes} nodes…")
    result = dict(provision_clusters(clusters=clusters, nodes=nodes))
    per_cluster_ms = result["worker_seconds"] / clusters * 1000
    machines = clusters * nodes
    commits = result.get("commits")
    ctx.emit(
        f"Provisioning, {clusters} clusters × {nodes} nodes with instant boot:\n"
        f"  {result['clusters_ready']} of {clusters} ready after {result['ticks']} ticks; "
        f"worker time {result['worker_seconds']:.2f} s ({per_cluster_ms:.0f} ms per cluster), "
        f"{result['tasks']:,} tasks, {result['queries']:,} queries "
        f"({result['queries'] / machines:.1f} per node)"
        + (f", {commits:,} commits ({commits / machines:.2f} per node)" if commits else "")
        + f";\n  creating them (reservation included) took {result['create_seconds']:.2f} s.\n"
    )


# --- the run --------------------------------------------------------------------------------


def run(
    *,
    sizes: Sizes = Sizes(),  # noqa: B008 - frozen
    profile: bool = False,
    emit: Callable[[str], None] = print,
    progress: Callable[[str], None] = lambda message: None,
) -> bool:
    """Measure and `emit` each block of the report as soon as it is known; progress notes go
    to `progress`. False when a section failed (its error is in the report)."""
    started = time.monotonic()

    def note(message: str) -> None:
        progress(f"[{time.monotonic() - started:5.1f} s] {message}")

    wanted = set(sizes.sections or SECTIONS)
    succeeded = True
    goals: list[Goal] = []
    secret_key = secrets.token_urlsafe(50)
    var_dir = Path(settings.VAR_DIR)
    with isolated_services(secret_key), throwaway_database(var_dir) as database:
        emit(
            f"Runcrate Clusters benchmark: Python {platform.python_version()}, "
            f"Django {django.get_version()}, {os.cpu_count()} CPUs, "
            f"load average {_load_average()}\nDatabase: {database}\n"
            "DEBUG off, database connections kept between requests, every figure's data "
            "committed and analysed (ANALYZE) before it is timed.\n"
        )
        user, key = bench_person()
        browser = Client()
        browser.force_login(user)
        session = browser.cookies[settings.SESSION_COOKIE_NAME].value
        ctx = Context(
            sizes=sizes,
            user=user,
            api={"Authorization": f"Bearer {key}"},
            session_headers={"Cookie": f"{settings.SESSION_COOKIE_NAME}={session}"},
            browser=browser,
            goals=goals,
            note=note,
            emit=emit,
            profile=profile,
            offers_path=_offers_path(),
        )

        def section(title: str, body: Callable[[], None]) -> None:
            nonlocal succeeded
            note(f"{title}…")
            try:
                # Their own warnings (a cluster failing, say) are summed up in their figures.
                with _quiet_logs():
                    body()
            except Exception as error:  # noqa: BLE001 - reported, and the command fails
                succeeded = False
                emit(f"{title}: FAILED, {type(error).__name__}: {error}\n")

        def pages_and_offers() -> None:
            poll_type = poll_machine_type(hosts=sum(sizes.poll_nodes) + 8)
            for nodes in sizes.poll_nodes:
                note(f"Bringing up a ready cluster of {nodes} nodes…")
                cluster_id = build_ready_cluster(
                    user=user, nodes=nodes, machine_type=poll_type, name=f"poll-{nodes}"
                )
                ctx.poll_cluster_ids[nodes] = cluster_id
                ctx.polls[nodes] = poll_paths(browser, cluster_id)
            note(f"Building {sizes.offers_hosts[0]:,} hosts over {sizes.locations} locations…")
            build_inventory(hosts=sizes.offers_hosts[0], locations=sizes.locations)
            settle()
            if "pages" in wanted:
                pages_section(ctx)
                polls_section(ctx)
            types = catalog_types()
            built = sizes.offers_hosts[0]
            ratios = []
            load_size = size_at(sizes.offers_hosts, 20_000)
            for hosts in sizes.offers_hosts:
                if hosts > built:
                    note(f"Adding hosts up to {hosts:,}…")
                    add_hosts(types, start=built, end=hosts)
                    built = hosts
                    settle()
                if "pages" in wanted:
                    ratios.append((hosts, offers_section(ctx, hosts)))
                if hosts == load_size and "load" in wanted:
                    section("Load run", lambda: load_section(ctx, var_dir / "bench", secret_key))
            if ratios:
                goals.append(
                    Goal(
                        f"offers API ≤ {GOAL_RATIO:g}× the bare bearer-key view",
                        all(r <= GOAL_RATIO for _, r in ratios),
                        ", ".join(f"{r:.2f}× at {h:,} hosts" for h, r in ratios),
                    )
                )

        if wanted & {"pages", "load"}:
            section("Pages and offers", pages_and_offers)
        # The meter comes before anything else that leaves machines running, and provisioning,
        # which leaves its clusters running, comes last.
        for name, body in [
            ("tick", lambda: tick_section(ctx)),
            ("meter", lambda: meter_section(ctx)),
            ("billing", lambda: billing_section(ctx)),
            ("ledger", lambda: ledger_section(ctx)),
            ("metrics", lambda: metrics_section(ctx)),
            ("provisioning", lambda: provisioning_section(ctx)),
        ]:
            if name in wanted:
                section(name.capitalize(), body)
        if goals:
            emit("Goals (issue 12), as ratios in this run:\n" + "\n".join(g.line() for g in goals))
    emit(
        f"\nFinished in {time.monotonic() - started:.0f} s (load average {_load_average()}); "
        "the benchmark database is gone."
    )
    return succeeded


def _load_average() -> str:
    try:
        return " ".join(f"{value:.1f}" for value in os.getloadavg())
    except OSError:
        return "unknown"


def sizes_from(*, quick: bool, **overrides: object) -> Sizes:
    """The default sizes (or QUICK ones), with the options given."""
    base = QUICK if quick else Sizes()
    return replace(base, **{k: v for k, v in overrides.items() if v is not None})
