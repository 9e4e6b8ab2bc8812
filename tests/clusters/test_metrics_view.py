"""The Metrics tab at any size (issue 37, item 7; docs/metrics.md, "The cluster view"): the
default window follows the cluster's age, the cluster view (a heatmap cell per GPU for
utilisation, memory and temperature; the busiest, hottest, idle and silent nodes named), one
node's detail only on demand (`?node=`), kept by the poll, and the page's queries flat in the
node count."""

from __future__ import annotations

import html
import re
from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from clusters.models import Cluster, Node
from clusters.telemetry import metrics
from tests.clusters.test_metrics_tab import HTMX, figures_sent, gpu, poll_url, query_of
from tests.factories import ClusterFactory

READY = datetime(2026, 12, 7, 10, 0, tzinfo=UTC)


def cluster_ready_at(project, at: datetime, *, size: int = 2) -> Cluster:
    return ClusterFactory(
        project=project,
        size=size,
        status=Cluster.Status.READY,
        created_at=at - timedelta(minutes=5),
        joined_at=at,
        ready_at=at,
        machines=True,
        machines__status=Node.Status.JOINED,
        machines__step=Node.Step.DONE,
    )


def report_gpus(node: Node, gpus: list[dict], *, at: datetime) -> None:
    metrics.store(node.pk, node.cluster_id, gpus=gpus, host=None, at=at)


def current_window(body: str) -> str:
    found = re.search(r'aria-current="page">(\w+)</a>', body.split('class="window-picker"')[1])
    assert found
    return found.group(1)


def words(fragment: str) -> str:
    return " ".join(html.unescape(re.sub(r"<[^>]+>", "", fragment)).split())


def named(body: str) -> str:
    return words(body.split('<ul class="metrics-named">')[1].split("</ul>")[0])


# --- the window follows the cluster's age ------------------------------------------------------


@pytest.mark.parametrize(
    "age, window",
    [
        (timedelta(seconds=30), "15m"),
        (timedelta(minutes=15), "15m"),
        (timedelta(minutes=20), "1h"),
        (timedelta(hours=3), "24h"),
        (timedelta(days=2), "7d"),
        (timedelta(days=30), "7d"),  # older than every window: the longest
    ],
)
def test_the_default_window_is_the_smallest_that_covers_the_cluster_s_life(owner, age, window):
    cluster = cluster_ready_at(owner.project, READY)
    with time_machine.travel(READY + age, tick=False):
        assert metrics.fitting_window(cluster, now=timezone.now()) == window
        body = owner.browser_client().get(f"/clusters/{cluster.pk}/metrics/").content.decode()
    assert current_window(body) == window
    # The page's poll names no window, so the window keeps following the age while it is open.
    assert "window" not in query_of(poll_url(body))


def test_a_30_second_old_cluster_s_charts_span_its_life_and_show_its_reports(owner):
    cluster = cluster_ready_at(owner.project, READY)
    node = cluster.nodes.get(index=0)
    for seconds in (2, 17):
        report_gpus(node, [gpu(0, 40.0), gpu(1, 60.0)], at=READY + timedelta(seconds=seconds))

    with time_machine.travel(READY + timedelta(seconds=30), tick=False):
        body = owner.browser_client().get(f"/clusters/{cluster.pk}/metrics/").content.decode()

    chart = body.split('<svg class="metric-chart"')[1].split("</svg>")[0]
    line = re.search(r'<path class="line" d="M([\d.]+),[\d.]+ L([\d.]+),', chart)
    assert line, "the two reports are one line"
    # The chart spans the last minute (its least), not 15 minutes: the reports' 15-s slots lie
    # a quarter of its 410-unit plot apart, in its right half (on 15 minutes: 7 units apart).
    first, second = float(line.group(1)), float(line.group(2))
    assert (first, second) == (pytest.approx(60 + 410 / 2), pytest.approx(60 + 410 * 3 / 4))
    assert ">09:59:30</text>" in chart and ">10:00:30</text>" in chart
    assert "lowest 40%, mean 50%, highest 60%; now 50%." in chart


def test_an_asked_window_wins_over_the_age(owner):
    cluster = cluster_ready_at(owner.project, READY)
    with time_machine.travel(READY + timedelta(days=3), tick=False):
        client = owner.browser_client()
        body = client.get(f"/clusters/{cluster.pk}/metrics/?window=15m").content.decode()
    assert current_window(body) == "15m"
    assert query_of(poll_url(body))["window"] == "15m"


# --- the cluster view --------------------------------------------------------------------------


@pytest.fixture
def four_nodes(owner):
    """node-0 working, node-1 working and hot on GPU 5, node-2 the busiest, node-3 idle."""
    cluster = cluster_ready_at(owner.project, READY - timedelta(minutes=5), size=4)
    now = READY
    figures = {
        0: lambda i: gpu(i, 70.0, temperature_c=60.0),
        1: lambda i: gpu(i, 80.0, temperature_c=88.0 if i == 5 else 65.0),
        2: lambda i: gpu(i, 95.0 + (i % 2), temperature_c=70.0, memory_used_mib=75 * 1024),
        3: lambda i: gpu(i, 1.0, temperature_c=35.0, memory_used_mib=0),
    }
    for node in cluster.nodes.order_by("index"):
        report_gpus(node, [figures[node.index](i) for i in range(8)], at=now)
    return cluster


def test_the_cluster_view_draws_a_cell_per_gpu_for_each_figure(owner, four_nodes):
    with time_machine.travel(READY + timedelta(seconds=5), tick=False):
        body = owner.browser_client().get(f"/clusters/{four_nodes.pk}/metrics/").content.decode()

    maps = re.findall(r'<svg class="heatmap-grid".*?</svg>', body, re.S)
    assert [re.search(r'data-figure="(\w+)"', m).group(1) for m in maps] == [
        "utilization",
        "memory",
        "temperature",
    ]
    utilization, memory, temperature = maps
    for grid in maps:
        assert grid.count("<rect ") == 4 * 8
    assert '<rect class="heat-l4" x="' in utilization
    assert "<title>node-2 GPU 1: 96%</title>" in utilization
    assert "<title>node-3 GPU 0: 1%</title>" in utilization
    assert utilization.count('class="heat-l0"') == 8  # node-3's GPUs, idle
    assert "<title>node-2 GPU 0: 75 of 80 GiB</title>" in memory
    assert '<rect class="heat-l4" x="' in memory  # 75 of 80 GiB: 80% or more
    assert "<title>node-1 GPU 5: 88°C</title>" in temperature
    assert temperature.count('class="heat-l4"') == 1
    # Said in words too: the picture's label counts the GPUs at each level.
    assert (
        'aria-label="GPU utilisation of each GPU now, a column per machine, a row per GPU: '
        "under 20%: 8 GPUs; 60–79%: 8 GPUs; 80% or more: 16 GPUs. The table of every GPU's "
        'figures follows."'
    ) in html.unescape(utilization)
    # And in the table: a row per machine, a column per GPU.
    table = body.split('<table class="table every-gpu">')[1].split("</table>")[0]
    assert table.count("<tr>") == 1 + 4
    assert "96%<br>" in table and "88°C" in table


def test_it_names_the_busiest_the_hottest_and_the_idle_nodes(owner, four_nodes):
    with time_machine.travel(READY + timedelta(seconds=5), tick=False):
        body = owner.browser_client().get(f"/clusters/{four_nodes.pk}/metrics/").content.decode()

    said = named(body)
    assert "Busiest: node-2 96%, node-1 80%, node-0 70%" in said
    assert "Hottest: node-1 88°C on GPU 5, node-2 70°C on GPU 0, node-0 60°C on GPU 0" in said
    assert "Idle (every GPU under 5%): node-3" in said
    assert "Not reporting" not in said
    link = f'href="/clusters/{four_nodes.pk}/metrics/?node=node-2"'
    assert link in body.split('<ul class="metrics-named">')[1].split("</ul>")[0]


def test_a_silent_node_is_named_and_not_judged(owner, four_nodes):
    # A minute on, only node-0 reported again: the others are silent, none busy or idle.
    with time_machine.travel(READY + timedelta(minutes=1), tick=False):
        node = four_nodes.nodes.get(index=0)
        report_gpus(node, [gpu(i, 30.0) for i in range(8)], at=timezone.now())
        body = owner.browser_client().get(f"/clusters/{four_nodes.pk}/metrics/").content.decode()

    said = named(body)
    assert "Busiest: node-0 30%" in said and "node-2" not in said.split("Not reporting")[0]
    assert "Idle (every GPU under 5%): none" in said
    assert "Not reporting: node-1, node-2, node-3" in said


def test_a_node_without_a_report_is_outlined_in_every_row(owner):
    cluster = cluster_ready_at(owner.project, READY, size=2)
    report_gpus(cluster.nodes.get(index=0), [gpu(i, 50.0) for i in range(8)], at=READY)
    with time_machine.travel(READY + timedelta(seconds=5), tick=False):
        body = owner.browser_client().get(f"/clusters/{cluster.pk}/metrics/").content.decode()

    grid = re.findall(r'<svg class="heatmap-grid".*?</svg>', body, re.S)[0]
    assert grid.count('<rect class="heat-none"') == 8
    assert "<title>node-1 GPU 7: no report in the last hour</title>" in grid
    assert "Not reporting: node-1" in named(body)


# --- one node's detail, on demand ---------------------------------------------------------------


def test_no_node_s_detail_is_drawn_until_one_is_asked_for(owner, four_nodes):
    client = owner.browser_client()
    url = f"/clusters/{four_nodes.pk}/metrics/"
    with time_machine.travel(READY + timedelta(seconds=5), tick=False):
        whole = client.get(url).content.decode()
        one = client.get(url, {"node": "node-3", "window": "15m"}).content.decode()
        unknown = client.get(url, {"node": "node-9"}).content.decode()

    assert 'class="table gpu-table"' not in whole and "metrics-node-" not in whole
    assert whole.count('class="metric-chart"') == 4  # the whole cluster's alone
    assert one.count('class="table gpu-table"') == 1
    assert 'id="metrics-node-3"' in one and 'id="metrics-node-2"' not in one
    assert one.count('class="metric-chart"') == 4 + 4
    assert '<option value="node-3" selected>' in one
    # The window links keep the node, the close link the window.
    assert f'href="/clusters/{four_nodes.pk}/metrics/?window=1h&amp;node=node-3"' in one
    assert f'href="/clusters/{four_nodes.pk}/metrics/?window=15m" hx-get=' in one
    assert query_of(poll_url(one))["node"] == "node-3"
    # A node that is not there: said, and the whole cluster shown.
    assert "There is no live machine “node-9”: showing the whole cluster." in unknown
    assert "metrics-node-" not in unknown and "node" not in query_of(poll_url(unknown))


def test_the_poll_s_redraw_keeps_the_asked_node(owner, four_nodes):
    client = owner.browser_client()
    with time_machine.travel(READY + timedelta(seconds=5), tick=False):
        page = client.get(f"/clusters/{four_nodes.pk}/metrics/?node=node-1").content.decode()
    with time_machine.travel(READY + timedelta(seconds=20), tick=False):
        report_gpus(four_nodes.nodes.get(index=1), [gpu(0, 12.0)], at=timezone.now())
        body = client.get(poll_url(page), headers=HTMX).content.decode()

    panel = body.split('<section id="cluster-tab"')[1]
    assert 'id="metrics-node-1"' in panel and "1 GPU · 12%" in panel
    assert query_of(poll_url(body))["node"] == "node-1"
    assert "data-keep-open" in panel  # the table's <details> stays as the user left it


# --- queries flat in the node count -------------------------------------------------------------


@pytest.mark.parametrize("asked", ["", "?node=node-1"])
def test_the_tab_reads_the_same_queries_at_2_and_64_nodes(owner, asked):
    client = owner.browser_client()
    counts = []
    with time_machine.travel(READY + timedelta(minutes=2), tick=False):
        for size in (2, 64):
            cluster = cluster_ready_at(owner.project, READY, size=size)
            for node in cluster.nodes.all():
                report_gpus(node, [gpu(i, 50.0) for i in range(8)], at=timezone.now())
            url = f"/clusters/{cluster.pk}/metrics/{asked}"
            body = client.get(url).content.decode()
            assert body.count("<rect ") == 3 * size * 8
            with CaptureQueriesContext(connection) as queries:
                client.get(url)
            counts.append(len(queries))
            poll = poll_url(body)
            metrics.bump_metrics_version(cluster.pk)
            with CaptureQueriesContext(connection) as queries:
                response = client.get(poll, headers=HTMX)
            assert response.status_code == 200
            assert response["HX-Reswap"] == "none"  # the figures alone (#metrics-now)
            counts.append(len(queries))
    assert counts[0] == counts[2] and counts[1] == counts[3]
    # The poll's three, the nodes with their latest GPU rows (metrics.latest: one query).
    assert counts[1] == 4


@pytest.mark.parametrize("later", [timedelta(seconds=5), timedelta(minutes=2)])
def test_the_figures_a_poll_sends_draw_the_page_s_own_cells(owner, four_nodes, later):
    """What the page's script does with them (static/js/app.js): each cell, in order, takes
    its node's GPU's class, and the title CELL_TITLE words; the table its texts. Two minutes
    on, every node is silent: its cells are outlined and say since when."""
    client = owner.browser_client()
    with time_machine.travel(READY + later, tick=False):
        body = client.get(f"/clusters/{four_nodes.pk}/metrics/").content.decode()
        metrics.bump_metrics_version(four_nodes.pk)
        sent = figures_sent(client.get(poll_url(body), headers=HTMX).content.decode())

    maps = re.findall(r'<svg class="heatmap-grid".*?</svg>', body, re.S)
    for figure, svg in enumerate(maps):
        drawn = re.findall(r'<rect class="([^"]+)"[^>]*><title>([^<]*)</title>', svg)
        cells = [
            (
                gpu[1 + 2 * figure],
                sent["title"].format(
                    node=name, gpu=gpu[0], figure=gpu[2 + 2 * figure], since=since
                ),
            )
            for name, since, gpus in sent["nodes"]
            for gpu in gpus
        ]
        assert [(css, html.unescape(title)) for css, title in drawn] == cells
        label = re.search(r'aria-label="([^"]*)" data-figure', svg)
        assert label and html.unescape(label.group(1)) == sent["labels"][figure]
    table = body.split('id="metrics-every-gpu"')[1]
    first = re.search(
        r'<td class="num">([^<]*)<br><span class="muted">([^<]*)</span>'
        r'<br><span class="muted">([^<]*)</span></td>',
        table,
    )
    assert first and list(first.groups()) == [sent["nodes"][0][2][0][i] for i in (2, 4, 6)]
    if later > timedelta(seconds=45):
        assert all("heat-silent" in gpu[1] for _, _, gpus in sent["nodes"] for gpu in gpus)
        assert sent["nodes"][0][1] == f" (silent since {READY:%H:%M} UTC)"
