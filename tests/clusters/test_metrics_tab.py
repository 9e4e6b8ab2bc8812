"""The Metrics tab (issue 23, item 3; docs/metrics.md, "The Metrics tab"), the node rows' GPU
utilisation and health badge, and the page's poll on both tabs: the charts' geometry from known
samples (clusters/web/charts.py), the figures the page shows, the window picker, a bad window, a
stranger's 404, colours by class only, and the poll's answers and query counts."""

from __future__ import annotations

import html
import json
import re
from datetime import UTC, datetime, timedelta
from urllib.parse import parse_qs, urlsplit

import pytest
import time_machine
from django.db import connection
from django.db.models import F
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from clusters.models import Cluster, Node
from clusters.telemetry import metrics
from clusters.telemetry.metrics import GpuPoint, Span, TracePoint, Window
from clusters.web import charts
from tests.factories import ClusterFactory

HTMX = {"HX-Request": "true"}
NOW = datetime(2026, 12, 7, 10, 0, tzinfo=UTC)


@pytest.fixture
def clock():
    with time_machine.travel(NOW, tick=False) as traveller:
        yield traveller


def ready_cluster(project, *, size: int = 2, status: str = Cluster.Status.READY) -> Cluster:
    now = timezone.now()
    return ClusterFactory(
        project=project,
        size=size,
        status=status,
        joined_at=now - timedelta(hours=1),
        ready_at=now - timedelta(hours=1),
        machines=True,
        machines__status=Node.Status.JOINED,
        machines__step=Node.Step.DONE,
    )


def gpu(index: int, utilization: float, **figures) -> dict:
    """A GPU row as `metrics.clean_report` gives it."""
    return {
        "index": index,
        "utilization_percent": utilization,
        "memory_used_mib": 40 * 1024,
        "memory_total_mib": 80 * 1024,
        "temperature_c": 60.0,
        "power_w": 500.0,
        "power_limit_w": 700.0,
        "sm_clock_mhz": 1980,
        "ecc_corrected": 0,
        "ecc_uncorrected": 0,
        "retired_pages_pending": False,
        "remapped_rows_pending": False,
        "throttle": 0,
        **figures,
    }


def report(node: Node, utilizations: list[float], *, at: datetime, **figures) -> None:
    metrics.store(
        node.pk,
        node.cluster_id,
        gpus=[gpu(index, value, **figures) for index, value in enumerate(utilizations)],
        host=None,
        at=at,
    )


def poll_url(page: str) -> str:
    found = re.search(r'<section id="cluster-status"[^>]* hx-get="([^"]*)"', page)
    assert found, "the page does not poll"
    return html.unescape(found.group(1))


def query_of(url: str) -> dict[str, str]:
    return {key: values[0] for key, values in parse_qs(urlsplit(url).query).items()}


def point(at: datetime, index: int, value: float | None, samples: int = 1) -> GpuPoint:
    span = Span.of(value)
    return GpuPoint(at, index, samples, span, Span.of(None), Span.of(None), Span.of(None))


# --- the charts' geometry -------------------------------------------------------------------


def test_it_combines_gpus_into_the_lowest_the_weighted_mean_and_the_highest():
    figure = charts.FIGURES_BY_KEY["utilization"]
    points = [
        point(NOW, 0, 20, samples=1),
        point(NOW + timedelta(seconds=3), 1, 80, samples=3),
        point(NOW + timedelta(seconds=15), 0, None),  # not read: does not count
        point(NOW + timedelta(seconds=15), 1, 50),
    ]

    series = charts.combine(points, figure, resolution_seconds=15)

    assert [(p.at, p.low, p.mean, p.high, p.samples) for p in series] == [
        (NOW, 20, 65, 80, 4),  # (20 × 1 + 80 × 3) / 4
        (NOW + timedelta(seconds=15), 50, 50, 50, 1),
    ]


def test_it_draws_a_known_series_at_known_coordinates_and_breaks_it_at_a_gap():
    figure = charts.FIGURES_BY_KEY["utilization"]
    window = Window("15m", NOW, NOW + timedelta(minutes=15), 15, [])
    series = [
        charts.SpanPoint(NOW, 0, 50, 100, 1),
        charts.SpanPoint(NOW + timedelta(seconds=15), 0, 0, 0, 1),
        # Six minutes of silence, then two points: a second run, and nothing drawn between.
        charts.SpanPoint(NOW + timedelta(minutes=6), 100, 100, 100, 1),
        charts.SpanPoint(NOW + timedelta(minutes=6, seconds=15), 50, 50, 50, 1),
    ]

    chart = charts.line_chart(series, figure=figure, window=window, top=100, subject="node-0")

    # x: 60 to 470 over 15 minutes (6.83 a point of 15 s); y: 128 (0 %) to 8 (100 %).
    assert chart.line == "M60.0,68.0 L66.83,128.0 M224.0,8.0 L230.83,68.0"
    assert chart.band == (
        "M60.0,8.0 L66.83,128.0 L66.83,128.0 L60.0,128.0 Z "
        "M224.0,8.0 L230.83,68.0 L230.83,68.0 L224.0,8.0 Z"
    )
    assert [t.label for t in chart.ticks] == ["0%", "50%", "100%"]
    assert [t.label for t in chart.times] == ["10:00", "10:07", "10:15"]
    assert (chart.summary.low, chart.summary.mean, chart.summary.high) == (0, 50, 100)
    assert chart.label == (
        "GPU utilisation, node-0, the last 15 minutes: lowest 0%, mean 50%, highest 100%."
    )
    assert chart.summary_text == "min 0% · mean 50% · max 100%"


def test_a_lone_point_is_a_dot_and_an_empty_series_says_so():
    figure = charts.FIGURES_BY_KEY["power"]
    window = Window("1h", NOW, NOW + timedelta(hours=1), 60, [])

    lone = charts.line_chart(
        [charts.SpanPoint(NOW + timedelta(minutes=30), 400, 450, 500, 4)],
        figure=figure,
        window=window,
        top=500,
        subject="node-1",
        latest=460,
    )
    empty = charts.line_chart([], figure=figure, window=window, top=100, subject="node-1")

    assert lone.line == "" and lone.dots == [charts.Dot(charts.LEFT + 205.0, 20.0)]
    assert lone.latest_text == "460 W" and lone.summary_text.startswith("min 400 W")
    assert empty.empty and empty.line == empty.band == "" and not empty.dots
    assert empty.label.endswith("no figures.")


def test_the_axis_tops_at_a_figure_s_own_limit_or_a_round_value_above_the_highest():
    power, memory = charts.FIGURES_BY_KEY["power"], charts.FIGURES_BY_KEY["memory"]
    high = [charts.SpanPoint(NOW, 300, 500, 680, 1)]

    assert charts.axis_top(power, high) == 1000
    assert charts.axis_top(power, []) == 100  # its floor
    assert charts.axis_top(memory, high, limit=80) == 80


def test_the_list_s_sparkline_spans_the_hour_on_a_0_to_100_scale():
    points = [TracePoint(NOW - timedelta(hours=1), 0), TracePoint(NOW, 100)]

    line = charts.sparkline(points, now=NOW)

    assert line is not None
    assert line.path == f"M2.0,{charts.SPARK_HEIGHT - 2}.0 L{charts.SPARK_WIDTH - 2}.0,2.0"
    assert "0% to 100%, 100% in the latest minute" in line.label
    assert charts.sparkline([], now=NOW) is None


# --- the page ---------------------------------------------------------------------------------


def test_it_shows_the_cluster_s_figures_and_the_asked_node_s_charts(owner, clock):
    cluster = ready_cluster(owner.project)
    node_0, node_1 = cluster.nodes.order_by("index")
    for seconds in (0, 15, 30):
        at = timezone.now() - timedelta(seconds=45 - seconds)
        report(node_0, [90, 100], at=at, throttle=0b1000)  # hw_slowdown
        report(node_1, [10, 20], at=at)

    url = f"/clusters/{cluster.pk}/metrics/?window=15m&node=node-0"
    body = owner.browser_client().get(url).content.decode()

    assert body.count('class="metric-chart"') == 4 * 2  # the cluster's, and node-0's
    assert body.count('class="heatmap-grid"') == 3  # and the cluster view's
    assert body.count('role="img"') == 4 * 2 + 3
    assert (
        'aria-label="GPU utilisation, every GPU of the cluster, the last 15 minutes: '
        'lowest 10%, mean 55%, highest 100%; now 55%."'
    ) in body
    assert 'node-0</span>\n      <span class="muted small">2 GPUs · 95%</span>' in body
    assert "2 GPUs · 15%" not in body  # node-1's detail was not asked for
    gpu_rows = re.findall(r'<tr><td class="num mono">(\d)</td><td class="num">([^<]+)</td>', body)
    assert gpu_rows == [("0", "90%"), ("1", "100%")]  # node-0's alone
    assert 'id="metrics-node-1"' not in body
    assert "40 of 80 GiB" in body and "500 of 700 W" in body and "60°C" in body
    assert '<span class="badge badge-warn">hw slowdown</span>' in body
    assert 'aria-current="page">15m</a>' in body


def test_its_charts_take_their_colours_from_the_stylesheet_s_classes(owner, clock):
    cluster = ready_cluster(owner.project, size=1)
    report(cluster.nodes.get(), [50], at=timezone.now())

    url = f"/clusters/{cluster.pk}/metrics/?window=15m"
    body = owner.browser_client().get(url).content.decode()

    svgs = re.findall(r'<svg class="metric-chart".*?</svg>', body, re.S)
    heatmaps = re.findall(r'<svg class="heatmap-grid".*?</svg>', body, re.S)
    assert len(svgs) == 4 and len(heatmaps) == 3
    for svg in svgs:
        assert not re.search(r'(fill|stroke|style|color)="', svg), "a colour outside the stylesheet"
        assert re.search(r'class="(dot|line)"', svg)
    for svg in heatmaps:
        assert re.search(r'<rect class="heat-l2"', svg)
        assert not re.search(r'(fill|stroke|style|color)="', svg), "a colour outside the stylesheet"


@pytest.mark.parametrize(
    "window, from_rows",
    [("15m", "raw"), ("1h", "minutes"), ("24h", "minutes"), ("7d", "hours")],
)
def test_it_draws_each_window_from_its_rows_and_marks_it_current(owner, clock, window, from_rows):
    cluster = ready_cluster(owner.project, size=1)
    node = cluster.nodes.get()
    start = timezone.now() - timedelta(hours=3)
    for minute in range(180):
        report(node, [minute % 100], at=start + timedelta(minutes=minute, seconds=1))
    metrics.roll_up(60, now=timezone.now())
    metrics.roll_up(3600, now=timezone.now())

    response = owner.browser_client().get(f"/clusters/{cluster.pk}/metrics/?window={window}")

    body = response.content.decode()
    assert response.status_code == 200
    assert f'aria-current="page">{window}</a>' in body
    cluster_chart = body.split('<svg class="metric-chart"')[1].split("</svg>")[0]
    lines = re.findall(r'<path class="line" d="([^"]+)"', cluster_chart)
    points = sum(d.count("L") + d.count("M") for d in lines) + cluster_chart.count("<circle")
    # A report a minute for three hours: the 15 of the last 15 minutes (too far apart for a
    # line at 15 s: dots), the finished minutes of the hour or all 180, the three hours.
    expected = {"raw": 15, "minutes": 60 if window == "1h" else 180, "hours": 3}[from_rows]
    assert points == expected
    assert query_of(poll_url(body))["window"] == window


def test_the_window_picker_answers_htmx_with_the_panel_and_keeps_plain_links(owner, clock):
    cluster = ready_cluster(owner.project, size=1)
    report(cluster.nodes.get(), [50], at=timezone.now())
    client = owner.browser_client()

    page = client.get(f"/clusters/{cluster.pk}/metrics/").content.decode()
    link = f"/clusters/{cluster.pk}/metrics/?window=1h"
    panel = client.get(link, headers={**HTMX, "HX-Target": "cluster-tab"}).content.decode()

    assert f'<a href="{link}" hx-get="{link}" hx-target="#cluster-tab"' in page
    assert panel.lstrip().startswith('<section id="cluster-tab"')
    assert 'aria-current="page">1h</a>' in panel
    assert query_of(poll_url(panel))["window"] == "1h"  # the header, out of band


@pytest.mark.parametrize("raw", ["2w", "<script>", "15M", "x" * 500])
def test_an_unknown_window_shows_the_default_and_says_so(owner, clock, raw):
    cluster = ready_cluster(owner.project, size=1)
    report(cluster.nodes.get(), [50], at=timezone.now())

    response = owner.browser_client().get(f"/clusters/{cluster.pk}/metrics/", {"window": raw})

    body = response.content.decode()
    assert response.status_code == 200
    # The window that fits the cluster's age (ready an hour ago).
    assert "showing the last hour" in body and "<script>" not in body.split("</header>")[-1]
    assert 'aria-current="page">1h</a>' in body


def test_a_stranger_gets_404_for_the_tab_and_its_poll(owner, stranger, clock):
    cluster = ready_cluster(owner.project, size=1)
    client = stranger.browser_client()

    assert client.get(f"/clusters/{cluster.pk}/metrics/").status_code == 404
    poll = f"/clusters/{cluster.pk}/metrics/?version=0&metrics=0"
    assert client.get(poll, headers=HTMX).status_code == 404


@pytest.mark.parametrize(
    "status, words",
    [
        (Cluster.Status.PROVISIONING, "No figures yet: the cluster is provisioning."),
        (Cluster.Status.READY, "No figures yet."),
        (Cluster.Status.TERMINATED, "No figures: this cluster has ended."),
    ],
)
def test_it_says_why_there_are_no_figures(owner, clock, status, words):
    cluster = ready_cluster(owner.project, size=1, status=status)

    body = owner.browser_client().get(f"/clusters/{cluster.pk}/metrics/").content.decode()

    assert words in body
    assert 'class="metric-chart"' not in body


def test_it_says_which_node_is_not_reporting(owner, clock):
    cluster = ready_cluster(owner.project)
    node_0 = cluster.nodes.get(index=0)
    report(node_0, [50], at=timezone.now() - timedelta(minutes=5))  # silent since

    client = owner.browser_client()
    body = client.get(f"/clusters/{cluster.pk}/metrics/").content.decode()
    node_0 = client.get(f"/clusters/{cluster.pk}/metrics/?node=node-0").content.decode()
    node_1 = client.get(f"/clusters/{cluster.pk}/metrics/?node=node-1").content.decode()

    named = re.sub(r"<[^>]+>", "", body.split('<ul class="metrics-named">')[1].split("</ul>")[0])
    assert "Not reporting: node-0, node-1" in " ".join(named.split())
    assert "silent since 09:55 UTC" in node_0
    assert "No figures yet from node-1." in node_1


def test_the_tab_reads_its_figures_in_the_same_queries_for_1_and_8_nodes(
    owner, clock, django_assert_num_queries
):
    client = owner.browser_client()
    counts = []
    for size in (1, 8):
        cluster = ready_cluster(owner.project, size=size)
        for node in cluster.nodes.all():
            report(node, [50] * 8, at=timezone.now())
        client.get(f"/clusters/{cluster.pk}/metrics/")
        with CaptureQueriesContext(connection) as queries:
            client.get(f"/clusters/{cluster.pk}/metrics/")
        counts.append(len(queries))
    assert counts[0] == counts[1]


# --- the poll ---------------------------------------------------------------------------------


def test_an_unchanged_metrics_poll_is_three_queries_and_204(
    owner, clock, django_assert_num_queries
):
    cluster = ready_cluster(owner.project)
    report(cluster.nodes.get(index=0), [50], at=timezone.now())
    client = owner.browser_client()
    url = poll_url(client.get(f"/clusters/{cluster.pk}/metrics/").content.decode())
    assert query_of(url)["metrics"] == str(metrics.metrics_version(cluster.pk))

    with django_assert_num_queries(3):  # the session, the user, the cluster's version
        response = client.get(url, headers=HTMX)

    assert response.status_code == 204


def figures_sent(body: str) -> dict:
    """The figures a Metrics tab poll sends for the page's script (#metrics-now)."""
    found = re.search(r'<script[^>]* id="metrics-now" type="application/json">(.*?)</script>', body)
    assert found, "no figures in the answer"
    return looked_up(json.loads(found.group(1)))


def looked_up(sent: dict) -> dict:
    """The figures with each GPU's words and classes looked up as the page's script does
    (static/js/app.js): per node its name, "silent since" and per GPU its index and each
    figure's class and text (None for a node with no report)."""
    nodes = []
    for name, since, quiet, gpus in sent["nodes"]:
        assert quiet in (0, 1)
        drawn = None
        if gpus is not None:
            drawn = []
            for index, *keys in gpus:
                entry = [index]
                for words, key in zip(sent["words"], keys, strict=True):
                    level, text = words[key]
                    entry += (sent["classes"][quiet][level], text)
                drawn.append(entry)
        nodes.append([name, since, drawn])
    return {**sent, "nodes": nodes}


def test_a_report_sends_the_figures_alone_without_moving_the_cluster_s_version(owner, clock):
    cluster = ready_cluster(owner.project)
    node = cluster.nodes.get(index=0)
    report(node, [50], at=timezone.now() - timedelta(seconds=15))
    client = owner.browser_client()
    page = client.get(f"/clusters/{cluster.pk}/metrics/?window=1h&node=node-0").content.decode()
    url = poll_url(page)
    version = cluster.version

    report(node, [70], at=timezone.now())
    response = client.get(url, headers=HTMX)

    body = response.content.decode()
    cluster.refresh_from_db()
    assert cluster.version == version
    assert response.status_code == 200
    assert response["HX-Reswap"] == "none"  # the header stays; nothing of the panel redrawn
    assert 'id="cluster-status"' not in body and 'id="cluster-tab"' not in body
    sent = figures_sent(body)
    assert sent["grid"] == query_of(url)["grid"]
    assert sent["nodes"][0] == [
        "node-0",
        "",
        [[0, "heat-l3", "70%", "heat-l2", "40 of 80 GiB", "heat-l2", "60°C"]],
    ]
    assert sent["nodes"][1] == ["node-1", "", None]  # no report: its outlines stand
    assert sent["title"].format(node="node-0", gpu=0, figure="70%", since="") == "node-0 GPU 0: 70%"
    # The named nodes and the open node's GPUs, out of band; the new metrics version too.
    assert re.search(r'<div id="metrics-named" hx-swap-oob="true">', body)
    assert re.search(r'<div id="metrics-node-now" hx-swap-oob="true">', body)
    assert "1 GPU · 70%" in body.split('id="metrics-node-now"')[1]
    shown = metrics.metrics_version(cluster.pk)
    assert (
        f'<input type="hidden" id="metrics-shown" name="metrics" value="{shown}" '
        'hx-swap-oob="true">' in body
    )
    # The page's poll includes that input: with it, nothing moved.
    assert client.get(url + f"&metrics={shown}", headers=HTMX).status_code == 204


def test_a_report_that_changes_the_cells_redraws_the_metrics_panel(owner, clock):
    cluster = ready_cluster(owner.project)
    node = cluster.nodes.get(index=0)
    report(node, [50], at=timezone.now() - timedelta(seconds=15))
    client = owner.browser_client()
    page = client.get(f"/clusters/{cluster.pk}/metrics/?window=1h&node=node-0").content.decode()
    url = poll_url(page)
    version = cluster.version

    report(node, [70, 20], at=timezone.now())  # a second GPU: a row of cells more
    response = client.get(url, headers=HTMX)

    body = response.content.decode()
    assert response.status_code == 200
    assert body.lstrip().startswith('<section id="cluster-status"')
    assert re.search(r'<section id="cluster-tab"[^>]* hx-swap-oob="true">', body)
    assert "2 GPUs · 45%" in body
    moved = query_of(poll_url(body))
    assert moved["metrics"] == str(metrics.metrics_version(cluster.pk))
    assert moved["window"] == "1h" and moved["version"] == str(version)
    assert moved["node"] == "node-0"  # the detail asked for stays open
    assert moved["grid"] != query_of(url)["grid"]
    assert client.get(poll_url(body), headers=HTMX).status_code == 204


def test_the_charts_redraw_on_their_own_poll(owner, clock):
    cluster = ready_cluster(owner.project)
    report(cluster.nodes.get(index=0), [50], at=timezone.now() - timedelta(seconds=15))
    client = owner.browser_client()
    page = client.get(f"/clusters/{cluster.pk}/metrics/?node=node-0").content.decode()
    found = re.search(
        r'<section class="metrics-section" id="metrics-cluster-charts"[^>]*'
        r' hx-get="([^"]*)" hx-trigger="every (\d+)s"',
        page,
    )
    assert found
    charts_url, seconds = html.unescape(found.group(1)), int(found.group(2))
    assert seconds == 60  # the hour's minutes (the cluster is an hour old): a minute
    assert query_of(charts_url) == {"node": "node-0", "part": "charts"}

    report(cluster.nodes.get(index=0), [90], at=timezone.now())
    body = client.get(charts_url, headers=HTMX).content.decode()

    assert body.lstrip().startswith('<section class="metrics-section" id="metrics-cluster-charts"')
    assert re.search(r'<div class="metric-grid" id="metrics-node-charts" hx-swap-oob="true">', body)
    assert "now 90%" in body
    assert body.count('<svg class="metric-chart"') == 8  # the cluster's four, node-0's four
    assert "Whole cluster over the last hour" in body
    Cluster.objects.filter(pk=cluster.pk).update(status=Cluster.Status.TERMINATED)
    assert client.get(charts_url, headers=HTMX).status_code == 286  # the page's poll says the rest


def test_a_moved_metrics_poll_costs_the_same_queries_for_1_and_8_nodes(owner, clock):
    client = owner.browser_client()
    counts = []
    for size in (1, 8):
        cluster = ready_cluster(owner.project, size=size)
        url = poll_url(client.get(f"/clusters/{cluster.pk}/metrics/").content.decode())
        for node in cluster.nodes.all():
            report(node, [50] * 8, at=timezone.now())
        with CaptureQueriesContext(connection) as queries:
            assert client.get(url, headers=HTMX).status_code == 200
        counts.append(len(queries))
    assert counts[0] == counts[1]


def test_other_tabs_polls_ignore_the_metrics_version(owner, clock):
    cluster = ready_cluster(owner.project)
    client = owner.browser_client()
    url = poll_url(client.get(f"/clusters/{cluster.pk}/events/").content.decode())
    assert "metrics" not in query_of(url)

    report(cluster.nodes.get(index=0), [50], at=timezone.now())

    assert client.get(url, headers=HTMX).status_code == 204


# --- the node rows ----------------------------------------------------------------------------


def node_cells(body: str) -> dict[str, str]:
    """Each node row's "GPUs now" cell, by node name."""
    rows = re.findall(r'<td id="(node-\d+)-gpus" class="node-gpus"[^>]*>(.*?)</td>', body, re.S)
    return {name: re.sub(r"<[^>]+>", "", cell).strip() for name, cell in rows}


def test_the_node_rows_show_their_gpus_mean_utilisation_in_one_query(
    owner, clock, django_assert_num_queries
):
    client = owner.browser_client()
    counts = []
    for size in (2, 8):
        cluster = ready_cluster(owner.project, size=size)
        for node in cluster.nodes.all():
            report(node, [10] * 8, at=timezone.now() - timedelta(seconds=15))
            report(node, [90, 100, 100, 100, 100, 100, 100, 100], at=timezone.now())
        client.get(f"/clusters/{cluster.pk}/machines/")
        with CaptureQueriesContext(connection) as queries:
            body = client.get(f"/clusters/{cluster.pk}/machines/").content.decode()
        reads = [q["sql"] for q in queries.captured_queries if "clusters_gpusample" in q["sql"]]
        assert len(reads) == 1
        counts.append(len(queries))
        assert set(node_cells(body).values()) == {"8 GPUs · 99%"}
    assert counts[0] == counts[1]


def test_a_row_without_a_report_shows_a_dash_and_a_silent_one_says_since_when(owner, clock):
    cluster = ready_cluster(owner.project)
    report(cluster.nodes.get(index=0), [40, 60], at=timezone.now() - timedelta(minutes=2))

    body = owner.browser_client().get(f"/clusters/{cluster.pk}/machines/").content.decode()

    assert node_cells(body) == {"node-0": "2 GPUs · 50% silent since 09:58 UTC", "node-1": "—"}


def test_an_unhealthy_node_shows_its_badge_and_problems(owner, clock):
    cluster = ready_cluster(owner.project)
    Cluster.objects.filter(pk=cluster.pk).update(
        health_problems={
            "node-1:gpu-3:ecc": {"node": "node-1", "message": "GPU 3: 2 uncorrectable ECC errors"}
        }
    )

    body = owner.browser_client().get(f"/clusters/{cluster.pk}/machines/").content.decode()

    row_0 = body.split('<tr id="node-0"')[1].split("</tr>")[0]
    row_1 = body.split('<tr id="node-1"')[1].split("</tr>")[0]
    assert "unhealthy" not in row_0
    assert '<span class="badge badge-bad">unhealthy</span>' in row_1
    assert "<li>GPU 3: 2 uncorrectable ECC errors</li>" in row_1


def test_a_report_sends_each_machine_s_gpus_cell_alone_on_the_machines_tab(owner, clock):
    """Issue 38: a report moves the GPUs cell of each row, so the poll sends those cells out of
    band (by id), never the rows, the reports or the actions, which did not move."""
    cluster = ready_cluster(owner.project, size=3)
    client = owner.browser_client()
    url = poll_url(client.get(f"/clusters/{cluster.pk}/machines/").content.decode())
    assert client.get(url, headers=HTMX).status_code == 204

    for node in cluster.nodes.all():
        report(node, [30, 50], at=timezone.now())
    with CaptureQueriesContext(connection) as queries:
        response = client.get(url, headers=HTMX)
    body = response.content.decode()

    cells = re.findall(r'<td id="(node-\d+)-gpus" class="node-gpus" hx-swap-oob="true">', body)
    assert cells == ["node-0", "node-1", "node-2"]
    assert "<tr" not in body and 'id="cluster-reports"' not in body
    assert set(node_cells(body).values()) == {"2 GPUs · 40%"}
    reads = [q["sql"] for q in queries.captured_queries if "clusters_gpusample" in q["sql"]]
    assert len(reads) == 1
    # The header stays (nothing swapped in its place) and so does its poll; the page keeps the
    # new metrics version in #metrics-shown, which that poll includes (its last value wins).
    assert 'id="cluster-status"' not in body and response["HX-Reswap"] == "none"
    assert len(queries) == 4  # the session, the user, the version; the nodes with their figures
    version = str(metrics.metrics_version(cluster.pk))
    shown = f'<input type="hidden" id="metrics-shown" name="metrics" value="{version}" '
    assert shown + 'hx-swap-oob="true">' in body
    assert client.get(f"{url}&metrics={version}", headers=HTMX).status_code == 204


def test_a_report_and_a_changed_row_send_that_row_and_the_others_cells(owner, clock):
    """A row stamped after the page's version comes whole (its cell with it), the other live
    rows' cells alone, and the reports and actions with them (the cluster changed)."""
    cluster = ready_cluster(owner.project, size=3)
    client = owner.browser_client()
    url = poll_url(client.get(f"/clusters/{cluster.pk}/machines/").content.decode())
    for node in cluster.nodes.all():
        report(node, [30, 50], at=timezone.now())
    Cluster.objects.filter(pk=cluster.pk).update(version=F("version") + 1)
    cluster.refresh_from_db()
    Node.objects.filter(cluster=cluster, index=1).update(version=cluster.version)

    body = client.get(url, headers=HTMX).content.decode()

    assert re.findall(r'<tr id="(node-\d+)" hx-swap-oob="true">', body) == ["node-1"]
    cells = re.findall(r'<td id="(node-\d+)-gpus" class="node-gpus" hx-swap-oob="true">', body)
    assert cells == ["node-0", "node-2"]
    assert set(node_cells(body)) == {"node-0", "node-1", "node-2"}  # node-1's in its row
    assert 'id="cluster-reports" hx-swap-oob="true"' in body


@pytest.mark.parametrize("tab", ["machines", "metrics"])
def test_a_moved_poll_costs_the_same_queries_at_2_and_64_nodes(owner, clock, tab):
    """Issue 38: the answer to a report (the metrics version moved) reads the same queries
    whatever the node count, on both tabs that show figures."""
    client = owner.browser_client()
    counts = []
    for size in (2, 64):
        cluster = ready_cluster(owner.project, size=size)
        url = poll_url(client.get(f"/clusters/{cluster.pk}/{tab}/").content.decode())
        for node in cluster.nodes.all():
            report(node, [30] * 8, at=timezone.now())
        client.get(url, headers=HTMX)  # warm what a first request reads once
        with CaptureQueriesContext(connection) as queries:
            response = client.get(url, headers=HTMX)
        assert response.status_code == 200
        counts.append(len(queries))
    assert counts[0] == counts[1]
