"""The metrics benchmark for `python -m bench --only metrics` (issue 23, item 2), on the bench's
throwaway database: how many agent metrics reports one web process takes, and how many bytes a
node's metrics cost a day.

Reports: a ready cluster of two 8-GPU machines (the smallest there is), node-0's agent's calls
posted with Django's test Client in this process (the whole request: middleware, ninja, the
service, the database). Three kinds take turns in blocks: the bare Django view (`/healthz`),
the agent's check-in of the same node (a heartbeat: the token checked and the cluster row
locked), which is the baseline, and an 8-GPU metrics report. One web process takes
1 / (mean seconds a report) of them a second: a sync worker serves one request at a time.

The Metrics tab's poll: over HTTP beside the bare logged-in view, as the page poll's bench
does: unchanged (204 from the cluster's version and the metrics version, a cache read) and
with the metrics version one behind (a report came: the header and the panel, redrawn).

Bytes: representative rows of the four tables inserted in bulk and analysed, then each table's
size with its indexes (PostgreSQL's pg_total_relation_size, SQLite's dbstat) divided by its
rows; a node's day is what its reports at RUNCRATE_METRICS_SECONDS write (raw rows, one minute
row and 1/60 of an hour row a minute, per GPU and for the node), and its steady state what the
keeps hold (an hour of raw rows, 14 days of minutes, 90 of hours).
"""

from __future__ import annotations

import html
import json
import time
from datetime import timedelta
from decimal import Decimal
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl, urlencode, urlsplit

from django.conf import settings
from django.db import connection
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from clusters.lifecycle import agent_token
from clusters.models import GpuRollup, GpuSample, Node, NodeRollup, NodeSample, Resolution
from clusters.telemetry import metrics
from offers.models import GpuModel, Host, Location, MachineType

if TYPE_CHECKING:
    from bench.harness import Context, Timing

GPUS = 8
# The cluster the issue sizes: 64 machines of 8 GPUs, each reporting every 15 s.
CLUSTER_MACHINES = 64
CLUSTER_SECONDS = 15
# Room to spare: one web process takes at least this many times that cluster's reports.
ROOM = 2.0
SIZE_ROWS = 2_000  # representative rows per table for its bytes a row


def report_body(minute: int) -> bytes:
    """An 8-GPU report as the agent sends it (docs/metrics.md), its figures moving."""
    return json.dumps(
        {
            "gpus": [
                {
                    "index": index,
                    "uuid": f"GPU-bench-{index}",
                    "utilization_percent": (minute * 7 + index * 13) % 101,
                    "memory_used_mib": 70_000 + index,
                    "memory_total_mib": 81_559,
                    "temperature_c": 55 + index,
                    "power_w": 600.5 + index,
                    "power_limit_w": 700.0,
                    "sm_clock_mhz": 1980,
                    "throttle": ["sw_power_cap"] if index % 2 else [],
                    "ecc_corrected": 0,
                    "ecc_uncorrected": 0,
                    "retired_pages_pending": False,
                    "remapped_rows_pending": False,
                }
                for index in range(GPUS)
            ],
            "node": {
                "cpu_percent": 12.5,
                "memory_used_mib": 20_480,
                "memory_total_mib": 2_064_384,
                "disk_root_used_gib": 40.1,
                "disk_root_total_gib": 900.0,
                "disk_shared_used_gib": 1.2,
                "disk_shared_total_gib": 900.0,
                "network_rx_bytes": 123_456_789 + minute,
                "network_tx_bytes": 98_765_432 + minute,
            },
        }
    ).encode()


def metrics_machine_type() -> MachineType:
    """A location of its own with two 8-GPU hosts, so the cluster takes no other section's."""
    gpu = GpuModel.objects.create(slug="bench-metrics", name="H100 (metrics)", memory_gib=80)
    location = Location.objects.create(
        code="metrics-1",
        name="Metrics location",
        country="US",
        capacity_reporting=Location.CapacityReporting.COUNT,
    )
    machine_type = MachineType.objects.create(
        slug="metrics-1-h100x8",
        location=location,
        gpu=gpu,
        gpus_per_machine=GPUS,
        machine_kind=MachineType.Kind.VM,
        price_per_hour=Decimal("20.00"),
        boot_seconds=1,
    )
    Host.objects.bulk_create(
        Host(name=f"metrics-host-{index}", machine_type=machine_type) for index in range(2)
    )
    return machine_type


def time_calls(
    client: Client, calls: dict[str, tuple[str, bytes, dict[str, str]]], *, rounds: int
) -> dict[str, Timing]:
    """`rounds` timed calls of each kind (POST when there is a body), after 10 untimed ones,
    taking turns in blocks of 10."""
    from bench.harness import Timing

    timings = {name: Timing() for name in calls}
    done = dict.fromkeys(calls, -10)
    while any(count < rounds for count in done.values()):
        for name, (path, body, headers) in calls.items():
            for _ in range(min(10, rounds - done[name])):
                started = time.perf_counter()
                if body:
                    response = client.post(
                        path, body, content_type="application/json", headers=headers
                    )
                else:
                    response = client.get(path, headers=headers)
                elapsed = time.perf_counter() - started
                if done[name] >= 0:
                    timings[name].samples.append(elapsed)
                    timings[name].statuses[response.status_code] += 1
                done[name] += 1
    return timings


def table_bytes_per_row(model: type) -> float:
    """The table's size with its indexes, divided by its rows."""
    table = model._meta.db_table
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT pg_total_relation_size(%s)", [table])
        else:
            cursor.execute(
                "SELECT SUM(pgsize) FROM dbstat WHERE name IN "
                "(SELECT name FROM sqlite_master WHERE tbl_name = %s)",
                [table],
            )
        size = cursor.fetchone()[0] or 0
    return size / max(model.objects.count(), 1)


def fill_for_sizes(node: Node) -> None:
    """SIZE_ROWS representative rows in each of the four tables (the report's own figures),
    dated long ago so no window or rollup of the run reads them."""
    long_ago = timezone.now() - timedelta(days=400)
    per_gpu = SIZE_ROWS // GPUS
    figures = json.loads(report_body(1))
    gpu_row = {k: v for k, v in figures["gpus"][1].items() if k not in ("uuid", "throttle")}
    gpu_row["throttle"] = 4
    GpuSample.objects.bulk_create(
        GpuSample(node=node, at=long_ago + timedelta(seconds=15 * n), **{**gpu_row, "index": g})
        for n in range(per_gpu)
        for g in range(GPUS)
    )
    NodeSample.objects.bulk_create(
        NodeSample(node=node, at=long_ago + timedelta(seconds=15 * n), **figures["node"])
        for n in range(SIZE_ROWS)
    )
    spans = {
        f"{name}_{part}": value
        for name, value in (
            ("utilization", 50.5),
            ("memory_used", 70_000.0),
            ("temperature", 60.0),
            ("power", 650.0),
        )
        for part in ("min", "mean", "max")
    }
    GpuRollup.objects.bulk_create(
        GpuRollup(
            node=node,
            index=g,
            resolution=Resolution.MINUTE,
            start=long_ago + timedelta(minutes=n),
            samples=4,
            **spans,
        )
        for n in range(per_gpu)
        for g in range(GPUS)
    )
    host_spans = {
        f"{name}_{part}": value
        for name, value in (("cpu", 12.5), ("memory_used", 20_480.0))
        for part in ("min", "mean", "max")
    }
    NodeRollup.objects.bulk_create(
        NodeRollup(
            node=node,
            resolution=Resolution.MINUTE,
            start=long_ago + timedelta(minutes=n),
            samples=4,
            network_rx_bytes=123_456_789,
            network_tx_bytes=98_765_432,
            **host_spans,
        )
        for n in range(SIZE_ROWS)
    )


def metrics_tab_polls(browser: Client, cluster_id: int) -> tuple[str, str]:
    """The Metrics tab's poll as the page sends it (its `hx-get`), and the same poll from a page
    one metrics version behind: a report came since it drew its charts."""
    from bench.harness import POLL_ATTRIBUTE

    page = browser.get(f"/clusters/{cluster_id}/metrics/")
    found = POLL_ATTRIBUTE.search(page.content.decode())
    if page.status_code != 200 or not found:
        raise RuntimeError(f"the Metrics tab ({page.status_code}) has no poll (hx-get)")
    unchanged = html.unescape(found.group(1))
    parts = urlsplit(unchanged)
    query = parse_qsl(parts.query, keep_blank_values=True)
    if not any(name == "metrics" for name, _ in query):
        raise RuntimeError(f"the Metrics tab's poll says no metrics version: {unchanged}")
    moved = [(n, str(int(v) - 1) if n == "metrics" else v) for n, v in query]
    return unchanged, f"{parts.path}?{urlencode(moved)}"


def metrics_tab_section(ctx: Context, cluster_id: int) -> None:
    """The Metrics tab's poll over HTTP, beside the bare logged-in view (the page poll's own
    baseline, bench/harness.py `pages_section`): unchanged (the cluster's version and the
    metrics version, a cache read: 204) and moved (a report came: the header and the panel)."""
    from bench.harness import (
        BARE_LOGGED_IN,
        GOAL_RATIO,
        PAGE_SECONDS,
        Goal,
        Row,
        count_queries,
        format_rows,
        http_bench,
        measure_rounds,
    )

    unchanged, moved = metrics_tab_polls(ctx.browser, cluster_id)
    htmx = {**ctx.session_headers, "HX-Request": "true"}
    targets = {
        "logged-in": (BARE_LOGGED_IN, ctx.session_headers),
        "unchanged": (unchanged, htmx),
        "moved": (moved, htmx),
    }
    ctx.note(f"Timing {ctx.sizes.requests} rounds of the Metrics tab's poll over HTTP…")
    with http_bench() as bench:
        timings = measure_rounds(
            bench, targets, rounds=ctx.sizes.requests, warmup=10, seconds_per_kind=PAGE_SECONDS
        )
    if timings["unchanged"].statuses.keys() != {204} or timings["moved"].statuses.keys() != {200}:
        raise RuntimeError(
            f"the Metrics tab's poll answered {dict(timings['unchanged'].statuses)} unchanged "
            f"and {dict(timings['moved'].statuses)} moved, not 204 and 200"
        )
    bare = timings["logged-in"].median_ms
    hx = {"HX-Request": "true"}
    ratio = timings["unchanged"].median_ms / bare
    ctx.emit(
        format_rows(
            "The metrics tab's poll (Django's threaded server in this process, the cluster of "
            f"two {GPUS}-GPU machines above, window 15m), × the bare logged-in view:",
            [
                Row(
                    f"bare logged-in view, GET {BARE_LOGGED_IN} (base)",
                    timings["logged-in"],
                    count_queries(BARE_LOGGED_IN, {}, ctx.browser),
                    1.0,
                ),
                Row(
                    "unchanged poll, Metrics tab (204)",
                    timings["unchanged"],
                    count_queries(unchanged, hx, ctx.browser),
                    ratio,
                ),
                Row(
                    "moved-metrics poll, Metrics tab (header + panel)",
                    timings["moved"],
                    count_queries(moved, hx, ctx.browser),
                    timings["moved"].median_ms / bare,
                ),
            ],
        )
        + f"The poll: GET {unchanged} with HX-Request: true.\n"
    )
    ctx.goals.append(
        Goal(
            f"the Metrics tab's unchanged poll ≤ {GOAL_RATIO:g}× the bare logged-in view",
            ratio <= GOAL_RATIO,
            f"{ratio:.2f}×; a moved one {timings['moved'].median_ms / bare:.2f}×",
        )
    )


def metrics_section(ctx: Context) -> None:
    from bench.harness import Goal, Row, build_ready_cluster, format_rows, settle

    reports = max(ctx.sizes.requests, 50)
    ctx.note("Bringing up a ready cluster of two 8-GPU machines for the metrics reports…")
    cluster_id = build_ready_cluster(
        user=ctx.user, nodes=2, machine_type=metrics_machine_type(), name="metrics-bench"
    )
    node = Node.objects.get(cluster_id=cluster_id, index=0)
    auth = {"authorization": f"Bearer {agent_token(node)}"}
    check_in = (f"/api/v1/agent/nodes/{node.pk}/check-in", b'{"gpus": []}', auth)
    report = (f"/api/v1/agent/nodes/{node.pk}/metrics", report_body(0), auth)
    calls = {"healthz": ("/healthz", b"", {}), "check-in": check_in, "report": report}
    client = Client()
    seconds = settings.RUNCRATE_METRICS_SECONDS
    first = client.post(report[0], report[1], content_type="application/json", headers=auth)
    if first.json() != {"data": {"metrics_seconds": seconds}}:
        raise RuntimeError(f"the report was not kept: {first.status_code} {first.content!r}")
    settle()
    ctx.note(f"Timing {reports} rounds of the bare view, the check-in and an 8-GPU report…")
    # The node's pace (metrics.take_report) lifted: every timed report is taken and written, as
    # an agent keeping its interval's is, instead of being answered 429 after the burst. The
    # first report moved the node's pace an interval on: that is forgotten too, or the timed
    # reports of that interval would be refused.
    with override_settings(RUNCRATE_METRICS_SECONDS=0):
        Node.objects.filter(pk=node.pk).update(metrics_paced_until=None)
        timings = time_calls(client, calls, rounds=reports)
        queries = {}
        for name, (path, body, headers) in calls.items():
            with CaptureQueriesContext(connection) as captured:
                if body:
                    client.post(path, body, content_type="application/json", headers=headers)
                else:
                    client.get(path, headers=headers)
            queries[name] = len(captured)  # BEGIN and COMMIT count: each is a round trip
    if set(timings["report"].statuses) != {200}:
        raise RuntimeError(f"timed reports were refused: {dict(timings['report'].statuses)}")
    base = timings["check-in"].median_ms
    ctx.emit(
        format_rows(
            "Agent metrics reports (Django's test Client in this process, an 8-GPU machine), "
            "× the agent's check-in:",
            [
                Row("bare Django view, GET /healthz", timings["healthz"], queries["healthz"]),
                Row(
                    "agent check-in (heartbeat), POST …/check-in (base)",
                    timings["check-in"],
                    queries["check-in"],
                    1.0,
                ),
                Row(
                    f"metrics report, {GPUS} GPUs, POST …/metrics",
                    timings["report"],
                    queries["report"],
                    timings["report"].median_ms / base,
                ),
            ],
        )
    )
    mean_seconds = sum(timings["report"].samples) / len(timings["report"].samples)
    takes = 1 / mean_seconds
    needs = CLUSTER_MACHINES / CLUSTER_SECONDS

    fill_for_sizes(node)
    tables = (GpuSample, NodeSample, GpuRollup, NodeRollup)
    settle(*tables)
    size = {model: table_bytes_per_row(model) for model in tables}
    raw = GPUS * size[GpuSample] + size[NodeSample]
    rollup = GPUS * size[GpuRollup] + size[NodeRollup]
    per_day = 86_400 / seconds * raw + 1_440 * rollup + 24 * rollup
    keep = (
        metrics.RAW_KEEP / timedelta(seconds=seconds) * raw
        + metrics.MINUTES_KEEP / timedelta(minutes=1) * rollup
        + metrics.HOURS_KEEP / timedelta(hours=1) * rollup
    )
    ctx.emit(
        f"One web process takes {takes:,.0f} metrics reports a second ({mean_seconds * 1000:.2f} "
        f"ms a report, mean); a {CLUSTER_MACHINES}-machine, {GPUS}-GPU cluster reporting every "
        f"{CLUSTER_SECONDS} s sends {needs:.1f} a second: {takes / needs:,.0f}× room.\n"
        f"Bytes a row, with indexes ({connection.vendor}): GPU sample {size[GpuSample]:.0f}, "
        f"node sample {size[NodeSample]:.0f}, GPU rollup {size[GpuRollup]:.0f}, node rollup "
        f"{size[NodeRollup]:.0f}.\n"
        f"Per {GPUS}-GPU node at {seconds} s: {per_day / 1e6:.1f} MB written a day (raw rows "
        f"{86_400 / seconds * raw / 1e6:.1f} MB, deleted after an hour); "
        f"{keep / 1e6:.1f} MB kept at steady state (an hour raw, 14 days of minutes, 90 of "
        f"hours); {CLUSTER_MACHINES} nodes: {CLUSTER_MACHINES * keep / 1e9:.2f} GB.\n"
    )
    ctx.goals.append(
        Goal(
            f"one web process takes ≥ {ROOM:g}× the reports of {CLUSTER_MACHINES} 8-GPU "
            f"machines at {CLUSTER_SECONDS} s ({needs:.1f}/s)",
            takes >= ROOM * needs,
            f"{takes:,.0f} reports/s ({takes / needs:,.0f}×); a report "
            f"{timings['report'].median_ms / base:.2f}× the check-in, {queries['report']} queries",
        )
    )
    metrics_tab_section(ctx, cluster_id)
