"""The live pages at 64 machines (issue 38, item 2), for `python -m bench --only pages`: on the
polled clusters the pages section built (8 and 64 nodes of 8 GPUs by default), after a few
minutes of the simulated data center's reports (`simulated_metrics.report`, one batch a run):

- the Machines and the Metrics tab's poll after a moved metrics version (a report came: the
  page's `metrics` one behind), beside the bare logged-in view, with their queries at each size,
  and the Metrics tab's charts on their own poll (`part=charts`; printed, no goal);
- the cluster page (its first tab, whole) and the API's detail (GET /api/v1/clusters/<id>) at
  the largest size beside the smallest.

Each figure is a ratio in this run (docs/benchmarks.md); the goals are the issue's.
"""

from __future__ import annotations

import html
from datetime import timedelta
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl, urlencode, urlsplit

from django.test import Client
from django.utils import timezone

from clusters.telemetry import simulated_metrics

if TYPE_CHECKING:
    from bench.harness import Context

# A moved poll's goal, × the bare logged-in view; the largest page's, × the smallest's.
MOVED_RATIO = 4.0
SIZE_RATIO = 2.0
PAGE_BASE_NODES = 8
# Reports of every simulated machine, this far apart, before the figures are timed.
REPORTS = 8
REPORT_SECONDS = 15


def fill_reports() -> None:
    """A couple of minutes of every simulated machine's reports (one batch a run)."""
    now = timezone.now()
    for back in range(REPORTS - 1, -1, -1):
        simulated_metrics.report(now=now - timedelta(seconds=back * REPORT_SECONDS))


def moved_poll(browser, path: str) -> str:
    """The tab's poll as its page sends it, one metrics version behind (a report came)."""
    from bench.harness import POLL_ATTRIBUTE

    page = browser.get(path)
    found = POLL_ATTRIBUTE.search(page.content.decode())
    if page.status_code != 200 or not found:
        raise RuntimeError(f"{path} ({page.status_code}) has no poll (hx-get)")
    poll = html.unescape(found.group(1))
    parts = urlsplit(poll)
    query = parse_qsl(parts.query, keep_blank_values=True)
    if not any(name == "metrics" for name, _ in query):
        raise RuntimeError(f"{path}'s poll says no metrics version: {poll}")
    moved = [(n, str(int(v) - 1) if n == "metrics" else v) for n, v in query]
    return f"{parts.path}?{urlencode(moved)}"


def polls_section(ctx: Context) -> None:
    """The moved polls and the pages at each size, timed over HTTP in turns."""
    from bench.harness import (
        BARE_LOGGED_IN,
        PAGE_SECONDS,
        Goal,
        Row,
        count_queries,
        format_rows,
        http_bench,
        measure_rounds,
    )

    sizes = sorted(ctx.poll_cluster_ids)
    if not sizes:
        return
    ctx.note(f"Reporting {REPORTS} runs of every simulated machine's figures…")
    fill_reports()
    htmx = {**ctx.session_headers, "HX-Request": "true"}
    targets: dict[str, tuple[str, dict[str, str]]] = {
        "logged-in": (BARE_LOGGED_IN, ctx.session_headers)
    }
    for nodes in sizes:
        cluster_id = ctx.poll_cluster_ids[nodes]
        for tab in ("machines", "metrics"):
            path = moved_poll(ctx.browser, f"/clusters/{cluster_id}/{tab}/")
            targets[f"{tab} {nodes}"] = (path, htmx)
        # The Metrics tab's charts, on their own poll (every window's resolution, up to a
        # minute): printed beside the moved polls, no goal of the issue's.
        targets[f"charts {nodes}"] = (f"/clusters/{cluster_id}/metrics/?part=charts", htmx)
        targets[f"page {nodes}"] = (f"/clusters/{cluster_id}/", ctx.session_headers)
        targets[f"api {nodes}"] = (f"/api/v1/clusters/{cluster_id}", ctx.api)
    ctx.note(f"Timing {ctx.sizes.requests} rounds of the moved polls and the pages…")
    with http_bench() as bench:
        timings = measure_rounds(
            bench, targets, rounds=ctx.sizes.requests, warmup=10, seconds_per_kind=PAGE_SECONDS
        )
    bare = timings["logged-in"].median_ms
    queries: dict[str, int] = {}
    rows = [
        Row(
            f"bare logged-in view, GET {BARE_LOGGED_IN} (base)",
            timings["logged-in"],
            count_queries(BARE_LOGGED_IN, {}, ctx.browser),
            1.0,
        )
    ]
    words = {
        "machines": "moved-metrics poll, Machines tab",
        "metrics": "moved-metrics poll, Metrics tab",
        "charts": "Metrics tab's charts, their own poll",
        "page": "cluster page, whole",
        "api": "API detail, GET /api/v1/clusters/<id>",
    }
    for name, (path, _) in targets.items():
        if name == "logged-in":
            continue
        kind, nodes = name.split()
        hx = {"HX-Request": "true"} if kind in ("machines", "metrics", "charts") else {}
        client_headers = hx if kind != "api" else ctx.api
        client = Client() if kind == "api" else ctx.browser
        queries[name] = count_queries(path, client_headers, client)
        size = len(client.get(path, headers=client_headers).content)
        timing = timings[name]
        rows.append(
            Row(
                f"{words[kind]}, {nodes} nodes",
                timing,
                queries[name],
                timing.median_ms / bare,
                f"{size / 1000:.1f} kB",
            )
        )
    ctx.emit(
        format_rows(
            "The live pages by size (Django's threaded server in this process; clusters of 8-GPU "
            f"machines after {REPORTS} runs of simulated reports), × the bare logged-in view:",
            rows,
        )
    )
    small, large = sizes[0], sizes[-1]
    for tab in ("machines", "metrics"):
        ratio = timings[f"{tab} {large}"].median_ms / bare
        flat = queries[f"{tab} {small}"] == queries[f"{tab} {large}"]
        ctx.goals.append(
            Goal(
                f"the {tab.capitalize()} tab's moved poll at {large} nodes ≤ {MOVED_RATIO:g}× the "
                f"bare logged-in view, the same queries at {small} and {large} nodes",
                ratio <= MOVED_RATIO and flat,
                f"{ratio:.2f}×; {queries[f'{tab} {small}']} and {queries[f'{tab} {large}']} "
                "queries",
            )
        )
    # The issue sizes the pages against an 8-node cluster's, where the run has one.
    base = PAGE_BASE_NODES if PAGE_BASE_NODES in sizes else small
    for kind, what in (("page", "the cluster page"), ("api", "the API detail")):
        ratio = timings[f"{kind} {large}"].median_ms / timings[f"{kind} {base}"].median_ms
        ctx.goals.append(
            Goal(
                f"{what} at {large} nodes ≤ {SIZE_RATIO:g}× at {base}",
                ratio <= SIZE_RATIO,
                f"{ratio:.2f}× ({timings[f'{kind} {large}'].median_ms:.1f} ms and "
                f"{timings[f'{kind} {base}'].median_ms:.1f} ms)",
            )
        )
