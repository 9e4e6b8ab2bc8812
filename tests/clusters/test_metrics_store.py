"""The agents' metrics reports, stored to last and cheap to write (issue 23, item 2;
clusters/telemetry/metrics.py, docs/metrics.md): the endpoint and what it keeps, refuses and
answers,
its query count, the beat's rollups and pruning over a simulated week, and reading a window."""

from __future__ import annotations

import statistics
from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from clusters import tasks
from clusters.lifecycle import agent_token, token_hash
from clusters.models import (
    Cluster,
    GpuRollup,
    GpuSample,
    Node,
    NodeRollup,
    NodeSample,
    Resolution,
)
from clusters.telemetry import metrics
from tests.factories import ClusterFactory

NOW = datetime(2026, 12, 7, 10, 0, tzinfo=UTC)


@pytest.fixture
def clock():
    with time_machine.travel(NOW, tick=False) as traveller:
        yield traveller


def ready_cluster(project, *, size=2, status=Cluster.Status.READY) -> Cluster:
    """A cluster whose nodes joined, each with its agent's token kept (as the lifecycle keeps
    it); `tokens(cluster)` gives them."""
    now = timezone.now()
    cluster = ClusterFactory(
        project=project,
        size=size,
        status=status,
        joined_at=now,
        ready_at=now,
        machines=True,
        machines__status=Node.Status.JOINED,
        machines__step=Node.Step.DONE,
    )
    for node in cluster.nodes.all():
        node.agent_token_hash = token_hash(agent_token(node))
        node.save(update_fields=["agent_token_hash"])
    return cluster


def nodes(cluster) -> list[Node]:
    return list(cluster.nodes.order_by("index"))


def gpu(index: int, **figures) -> dict:
    return {
        "index": index,
        "uuid": f"GPU-{index}",
        "utilization_percent": 97,
        "memory_used_mib": 70000,
        "memory_total_mib": 81559,
        "temperature_c": 61,
        "power_w": 650.3,
        "power_limit_w": 700.0,
        "sm_clock_mhz": 1980,
        "throttle": ["sw_power_cap"],
        "ecc_corrected": 0,
        "ecc_uncorrected": 0,
        "retired_pages_pending": False,
        "remapped_rows_pending": False,
        **figures,
    }


HOST = {
    "cpu_percent": 12.5,
    "memory_used_mib": 20480,
    "memory_total_mib": 2064384,
    "disk_root_used_gib": 40.1,
    "disk_root_total_gib": 900.0,
    "disk_shared_used_gib": 1.2,
    "disk_shared_total_gib": 900.0,
    "network_rx_bytes": 123456789,
    "network_tx_bytes": 98765432,
}


def report(gpus: int = 8, **figures) -> dict:
    return {"gpus": [gpu(i, **figures) for i in range(gpus)], "node": HOST}


def post(client, node: Node, body, token: str | None = None):
    return client.post(
        f"/api/v1/agent/nodes/{node.pk}/metrics",
        body,
        content_type="application/json",
        headers={"authorization": f"Bearer {token or agent_token(node)}"},
    )


def stored() -> tuple[int, int]:
    return GpuSample.objects.count(), NodeSample.objects.count()


# --- the endpoint ---------------------------------------------------------------------------


# Outside a test's transaction, so that a BEGIN or a COMMIT the report sent would count too.
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("gpus", [1, 8])
def test_it_records_a_report_in_at_most_four_queries(
    owner, client, clock, gpus, django_assert_max_num_queries
):
    node = nodes(ready_cluster(owner.project))[0]
    body = report(gpus)
    # The node, its pace (clusters/telemetry/metrics.py take_report) and the two inserts.
    with django_assert_max_num_queries(4):
        response = post(client, node, body)
    assert response.status_code == 200, response.content
    assert response.json() == {"data": {"metrics_seconds": 15}}
    assert stored() == (gpus, 1)


def test_it_keeps_every_figure_and_leaves_what_is_absent_null(owner, client, clock):
    cluster = ready_cluster(owner.project)
    node = nodes(cluster)[1]
    # A driver answered [N/A] for GPU 1's power and temperature: the agent left them out.
    sparse = {"index": 1, "utilization_percent": 3}
    response = post(client, node, {"gpus": [gpu(0), sparse], "node": {"cpu_percent": 50}})
    assert response.status_code == 200

    first, second = GpuSample.objects.filter(node=node).order_by("index")
    assert first.at == NOW and first.utilization_percent == 97
    assert (first.memory_used_mib, first.memory_total_mib) == (70000, 81559)
    assert (first.temperature_c, first.power_w, first.power_limit_w) == (61, 650.3, 700.0)
    assert first.sm_clock_mhz == 1980 and first.ecc_uncorrected == 0
    assert first.retired_pages_pending is False
    assert metrics.throttle_names(first.throttle) == ["sw_power_cap"]
    assert second.utilization_percent == 3
    assert second.power_w is None and second.temperature_c is None and second.throttle is None
    host = NodeSample.objects.get(node=node)
    assert host.cpu_percent == 50 and host.memory_used_mib is None


def test_it_keeps_the_throttle_reasons_as_a_bitmask_and_reads_them_back(owner, client, clock):
    node = nodes(ready_cluster(owner.project))[0]
    reasons = ["hw_slowdown", "hw_thermal_slowdown", "sw_thermal_slowdown"]
    post(client, node, {"gpus": [gpu(0, throttle=[*reasons, "a_future_reason"])]})
    post(client, node, {"gpus": [gpu(1, throttle=[])]})
    masks = dict(GpuSample.objects.values_list("index", "throttle"))
    # Read back in THROTTLE_REASONS' order; a reason it does not know is not kept.
    assert metrics.throttle_names(masks[0]) == [
        "hw_slowdown",
        "sw_thermal_slowdown",
        "hw_thermal_slowdown",
    ]
    assert masks[1] == 0 and metrics.throttle_names(0) == []


def test_a_report_moves_the_metrics_version_not_the_clusters(owner, client, clock):
    cluster = ready_cluster(owner.project)
    node = nodes(cluster)[0]
    assert metrics.metrics_version(cluster.pk) == 0
    post(client, node, report(2))
    first = metrics.metrics_version(cluster.pk)
    post(client, node, report(2))
    assert first > 0 and metrics.metrics_version(cluster.pk) == first + 1
    before = cluster.version
    cluster.refresh_from_db()
    assert cluster.version == before


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"gpus": "0, 97"}, "gpus must be a list of objects"),
        ({"gpus": [{"utilization_percent": 5}]}, "gpus[0].index must be a whole number"),
        ({"gpus": [gpu(0), gpu(0)]}, "gpus[1].index 0 is listed twice"),
        ({"gpus": [gpu(0, utilization_percent=101)]}, "gpus[0].utilization_percent must be"),
        ({"gpus": [gpu(0, memory_used_mib=-1)]}, "gpus[0].memory_used_mib must be between 0"),
        ({"gpus": [gpu(0, power_w="650 W")]}, "gpus[0].power_w must be a number"),
        ({"gpus": [gpu(0, ecc_uncorrected=1.5)]}, "gpus[0].ecc_uncorrected must be a whole"),
        ({"gpus": [gpu(0, throttle="hw_slowdown")]}, "gpus[0].throttle must be a list"),
        ({"gpus": [gpu(0, retired_pages_pending="no")]}, "retired_pages_pending must be true"),
        ({"gpus": [gpu(i) for i in range(65)]}, "gpus lists 65 GPUs"),
        ({"gpus": [gpu(0)], "node": {"network_rx_bytes": -5}}, "node.network_rx_bytes must be"),
        ({"gpus": [gpu(0)], "node": [1]}, "node must be an object"),
    ],
)
def test_it_refuses_a_malformed_report_saying_what_and_keeps_nothing(
    owner, client, clock, body, message
):
    cluster = ready_cluster(owner.project)
    response = post(client, nodes(cluster)[0], body)
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["code"] == "invalid_report" and message in error["message"], error
    assert stored() == (0, 0)
    assert metrics.metrics_version(cluster.pk) == 0


def test_it_refuses_a_wrong_token_and_a_released_node_as_the_check_in_does(owner, client, clock):
    first, second = nodes(ready_cluster(owner.project))
    assert post(client, first, report(1), token="guess").status_code == 403
    assert post(client, first, report(1), token=agent_token(second)).json()["error"] == {
        "code": "bad_token",
        "message": "No node with this id has this token.",
    }
    missing = client.post(
        "/api/v1/agent/nodes/999999/metrics", report(1), content_type="application/json"
    )
    assert missing.status_code == 403
    Node.objects.filter(pk=first.pk).update(status=Node.Status.ENDED)
    released = post(client, first, report(1))
    assert released.status_code == 410 and released.json()["error"]["code"] == "node_released"
    assert stored() == (0, 0)


@pytest.mark.parametrize(
    ("cluster_status", "node_status"),
    [
        (Cluster.Status.INSTALLING, Node.Status.JOINED),
        (Cluster.Status.TERMINATING, Node.Status.JOINED),
        (Cluster.Status.READY, Node.Status.LOST),
    ],
)
def test_it_keeps_nothing_outside_a_ready_or_degraded_clusters_live_node(
    owner, client, clock, cluster_status, node_status
):
    cluster = ready_cluster(owner.project, status=cluster_status)
    node = nodes(cluster)[0]
    Node.objects.filter(pk=node.pk).update(status=node_status)
    response = post(client, node, report(2))
    assert response.status_code == 200
    assert response.json() == {"data": {"metrics_seconds": None}}
    assert stored() == (0, 0)


def test_a_degraded_clusters_node_records_too(owner, client, clock):
    node = nodes(ready_cluster(owner.project, status=Cluster.Status.DEGRADED))[0]
    assert post(client, node, report(2)).json() == {"data": {"metrics_seconds": 15}}
    assert stored() == (2, 1)


def test_the_check_in_tells_the_agent_how_often_to_report(owner, client, clock, settings):
    settings.RUNCRATE_METRICS_SECONDS = 20
    ready = nodes(ready_cluster(owner.project))[0]
    installing = nodes(ready_cluster(owner.project, status=Cluster.Status.INSTALLING))[0]
    answers = {}
    for node in (ready, installing):
        response = client.post(
            f"/api/v1/agent/nodes/{node.pk}/check-in",
            {"gpus": []},
            content_type="application/json",
            headers={"authorization": f"Bearer {agent_token(node)}"},
        )
        assert response.status_code == 200, response.content
        answers[node.pk] = response.json()["data"]["metrics_seconds"]
    assert answers == {ready.pk: 20, installing.pk: None}


# --- rollups and pruning --------------------------------------------------------------------


# The week's reports after its first hour: one every this many minutes (a bounded test).
EVERY = 30


def utilization(node_index: int, gpu_index: int, minute: int) -> int:
    """A figure that changes with every report, different on every GPU."""
    return (minute * 7 + node_index * 13 + gpu_index * 29) % 101


def send(cluster_nodes, minute: int, *, gpus: int = 2) -> None:
    for node in cluster_nodes:
        seconds = metrics.record(
            node_id=node.pk,
            token=agent_token(node),
            report={
                "gpus": [
                    {
                        "index": g,
                        "utilization_percent": utilization(node.index, g, minute),
                        "temperature_c": 40 + minute % 30,
                        "memory_used_mib": 1000 * (g + 1),
                        "power_w": 100.0 + g,
                    }
                    for g in range(gpus)
                ],
                "node": {"cpu_percent": minute % 100, "network_rx_bytes": 1000 * minute},
            },
        )
        assert seconds == 15


def test_a_simulated_week_stays_bounded_and_its_rollups_are_right(owner, clock):
    """Two nodes of two GPUs report every 15 s for an hour, then every half hour for the rest
    of a week, the beat's tasks running along the way as beat runs them: the raw rows never
    hold more than an hour, and the rollups hold the min, mean and max of what was sent."""
    cluster_nodes = nodes(ready_cluster(owner.project))
    for step in range(240):  # the first hour: every 15 s
        clock.move_to(NOW + timedelta(seconds=15 * step))
        send(cluster_nodes, minute=step // 4)
        if step % 4 == 3:
            clock.move_to(NOW + timedelta(seconds=15 * step + 5))
            tasks.roll_up_metrics_minutes()
    assert GpuSample.objects.count() == 2 * 2 * 240
    # Minute 5 of node-1's GPU 0: four reports of the same figure.
    five = GpuRollup.objects.get(
        node=cluster_nodes[1],
        index=0,
        resolution=Resolution.MINUTE,
        start=NOW + timedelta(minutes=5),
    )
    assert five.samples == 4
    assert five.utilization_min == five.utilization_max == utilization(1, 0, 5)

    most_raw = 0
    week = 7 * 24 * 60
    for minute in range(60, week, EVERY):
        clock.move_to(NOW + timedelta(minutes=minute))
        send(cluster_nodes, minute=minute)
        clock.move_to(NOW + timedelta(minutes=minute, seconds=30))
        tasks.roll_up_metrics_minutes()
        if minute % 60 == 60 - EVERY:  # the beat's hourly run, just after the hour
            clock.move_to(NOW + timedelta(minutes=minute + EVERY, seconds=5))
            tasks.roll_up_metrics_hours()
        if minute >= 180:  # the first hour's dense reports are past their keep
            most_raw = max(most_raw, GpuSample.objects.count())
    # An hour of raw rows at most (two or three reports of two GPUs on two nodes), whatever
    # the week sent.
    assert most_raw <= 2 * 2 * (60 // EVERY + 1)
    assert NodeSample.objects.count() <= 2 * (60 // EVERY + 1)
    # A minute row per report minute (the first hour's 60, then one a report), per GPU; but
    # the last report's: its minute had not ended when the beat last ran.
    reports = len(range(60, week, EVERY))
    minutes = GpuRollup.objects.filter(resolution=Resolution.MINUTE)
    assert minutes.count() == 2 * 2 * (60 + reports - 1)
    hours = GpuRollup.objects.filter(resolution=Resolution.HOUR)
    assert hours.count() == 2 * 2 * 7 * 24
    assert NodeRollup.objects.filter(resolution=Resolution.HOUR).count() == 2 * 7 * 24

    # Hour 30 of node-0's GPU 1: reports at minutes 1800 and 1830.
    sent = [utilization(0, 1, minute) for minute in range(1800, 1860, EVERY)]
    hour = hours.get(node=cluster_nodes[0], index=1, start=NOW + timedelta(hours=30))
    assert hour.samples == len(sent) == 2
    assert hour.utilization_min == min(sent) and hour.utilization_max == max(sent)
    assert hour.utilization_mean == pytest.approx(statistics.mean(sent))
    assert hour.memory_used_mean == pytest.approx(2000) and hour.power_max == 101.0
    # The first hour: 240 reports (four a minute), each minute weighted by its samples.
    first = hours.get(node=cluster_nodes[0], index=1, start=NOW)
    dense_sent = [utilization(0, 1, step // 4) for step in range(240)]
    assert first.samples == 240
    assert first.utilization_mean == pytest.approx(statistics.mean(dense_sent))
    assert (first.utilization_min, first.utilization_max) == (min(dense_sent), max(dense_sent))
    host_hour = NodeRollup.objects.get(
        node=cluster_nodes[0], resolution=Resolution.HOUR, start=NOW + timedelta(hours=30)
    )
    assert host_hour.samples == 2 and host_hour.cpu_min == min(1800 % 100, 1830 % 100)
    assert host_hour.network_rx_bytes == 1000 * 1830

    # Later, with nothing new sent, the minutes go after 14 days and the hours after 90.
    clock.move_to(NOW + timedelta(days=15))
    tasks.roll_up_metrics_minutes()
    tasks.roll_up_metrics_hours()
    assert GpuSample.objects.count() == 0 and NodeSample.objects.count() == 0
    first_day = timedelta(days=1, minutes=-1)
    assert minutes.earliest("start").start == NOW + timedelta(days=1)  # the first day's gone
    assert hours.count() == 2 * 2 * 7 * 24
    clock.move_to(NOW + timedelta(days=7 + 14, hours=1))
    tasks.roll_up_metrics_hours()
    assert not minutes.exists()
    assert not NodeRollup.objects.filter(resolution=Resolution.MINUTE).exists()
    clock.move_to(NOW + timedelta(days=90) + first_day)
    tasks.roll_up_metrics_hours()
    assert hours.count() == 2 * 2 * 6 * 24
    clock.move_to(NOW + timedelta(days=7 + 90, hours=1))
    tasks.roll_up_metrics_hours()
    assert not GpuRollup.objects.exists() and not NodeRollup.objects.exists()


def test_the_beat_rolls_up_every_minute_and_every_hour(settings):
    schedule = settings.CELERY_BEAT_SCHEDULE
    assert schedule["metrics-minutes"] == {
        "task": tasks.roll_up_metrics_minutes.name,
        "schedule": 60.0,
    }
    hours = schedule["metrics-hours"]
    assert hours == {"task": tasks.roll_up_metrics_hours.name, "schedule": 3600.0}


def rollup_rows():
    fields = [f.name for f in GpuRollup._meta.concrete_fields if f.name != "id"]
    gpu_rows = sorted(GpuRollup.objects.values_list(*fields))
    host_fields = [f.name for f in NodeRollup._meta.concrete_fields if f.name != "id"]
    return gpu_rows, sorted(NodeRollup.objects.values_list(*host_fields))


def test_a_rollup_run_twice_writes_the_same_rows_in_a_fixed_number_of_queries(owner, clock):
    for cluster in (ready_cluster(owner.project, size=3), ready_cluster(owner.project, size=1)):
        for minute in range(3):
            clock.move_to(NOW + timedelta(minutes=minute))
            send(nodes(cluster), minute=minute, gpus=8)
    clock.move_to(NOW + timedelta(minutes=3))
    with CaptureQueriesContext(connection) as queries:
        written = metrics.roll_up(Resolution.MINUTE)
    # Per table: its latest bucket, then one INSERT … SELECT for every node at once.
    assert len(queries) == 4
    assert written == 4 * 8 * 3 + 4 * 3
    once = rollup_rows()
    metrics.roll_up(Resolution.MINUTE)
    assert rollup_rows() == once
    clock.move_to(NOW + timedelta(hours=1))
    metrics.roll_up(Resolution.HOUR)
    hours = rollup_rows()
    metrics.roll_up(Resolution.HOUR)
    assert rollup_rows() == hours
    assert GpuRollup.objects.filter(resolution=Resolution.HOUR).count() == 4 * 8


def test_a_report_that_landed_after_its_minute_was_rolled_up_is_counted_next_time(owner, clock):
    node = nodes(ready_cluster(owner.project, size=1))
    send(node, minute=0)
    clock.move_to(NOW + timedelta(minutes=1))
    metrics.roll_up(Resolution.MINUTE)
    # A report stamped in minute 0 committed only now (a slow request).
    clock.move_to(NOW + timedelta(seconds=59))
    send(node, minute=1)
    clock.move_to(NOW + timedelta(minutes=2))
    metrics.roll_up(Resolution.MINUTE)
    row = GpuRollup.objects.get(index=0, resolution=Resolution.MINUTE, start=NOW)
    assert row.samples == 2
    sent = [utilization(0, 0, 0), utilization(0, 0, 1)]
    assert (row.utilization_min, row.utilization_max) == (min(sent), max(sent))


# --- reading a window -------------------------------------------------------------------------


def test_a_window_reads_latest_figures_and_series_in_five_queries_whatever_the_nodes(owner, clock):
    small, large = ready_cluster(owner.project, size=1), ready_cluster(owner.project, size=4)
    for minute in range(20):
        clock.move_to(NOW + timedelta(minutes=minute))
        send(nodes(small) + nodes(large), minute=minute)
    counts = []
    for cluster in (small, large):
        with CaptureQueriesContext(connection) as queries:
            read = metrics.window(cluster, "15m")
        counts.append(len(queries))
        assert len(read.nodes) == cluster.size
    assert counts == [5, 5]

    node_2 = read.nodes[2]
    assert node_2.node.name == "node-2" and node_2.reported_at == NOW + timedelta(minutes=19)
    assert [g.index for g in node_2.gpus] == [0, 1]
    assert node_2.gpus[1].utilization_percent == utilization(2, 1, 19)
    assert node_2.host is not None and node_2.host.network_rx_bytes == 19000
    # The last 15 minutes of raw rows: minutes 4 … 19 (the window's start included).
    assert [p.at for p in node_2.series if p.index == 0] == [
        NOW + timedelta(minutes=m) for m in range(4, 20)
    ]
    point = node_2.series[-1]
    assert point.utilization_percent == metrics.Span.of(utilization(2, 1, 19))
    assert [p.cpu_percent.mean for p in node_2.host_series][-1] == 19


def test_the_latest_figures_are_the_window_s_in_one_query_and_only_the_columns_asked(owner, clock):
    """`metrics.latest` (the Metrics tab's moved poll) reads in one statement what `window`
    reads of the latest figures: every field of every GPU (throttle reasons and flags as
    stored), each node's time with its node row's if later, and a node with no report."""
    cluster = ready_cluster(owner.project, size=3)
    node_0, node_1, _ = nodes(cluster)

    def store(node, at, gpus, *, host=False):
        rows, node_row = metrics.clean_report({"gpus": gpus, **({"node": HOST} if host else {})})
        metrics.store(node.pk, cluster.pk, gpus=rows, host=node_row, at=at)

    slow = gpu(1, throttle=["hw_slowdown"], retired_pages_pending=True)
    store(node_0, NOW, [gpu(0), slow])
    store(node_0, NOW + timedelta(seconds=15), [], host=True)  # its node row, later
    store(node_1, NOW - timedelta(minutes=5), [gpu(0, utilization_percent=12)])
    store(node_1, NOW, [gpu(0, utilization_percent=40)], host=True)

    whole = metrics.window(cluster, "15m")
    with CaptureQueriesContext(connection) as queries:
        read = metrics.latest(cluster.pk)
    assert len(queries) == 1
    assert [n.node.name for n in read.nodes] == ["node-0", "node-1", "node-2"]
    assert [n.gpus for n in read.nodes] == [n.gpus for n in whole.nodes]
    assert [n.reported_at for n in read.nodes] == [n.reported_at for n in whole.nodes] == [
        NOW + timedelta(seconds=15), NOW, None
    ]  # fmt: skip
    assert read.nodes[0].gpus[1].throttle == ["hw_slowdown"]
    assert read.nodes[0].gpus[1].retired_pages_pending is True
    assert read.nodes[1].gpus[0].utilization_percent == 40

    some = metrics.latest(cluster.pk, columns=("utilization_percent", "temperature_c"))
    asked = some.nodes[0].gpus[1]
    assert (asked.index, asked.utilization_percent, asked.temperature_c) == (1, 97, 61)
    assert asked.memory_used_mib is None and asked.throttle is None and asked.power_w is None


def test_the_longer_windows_read_the_rollups(owner, clock):
    cluster = ready_cluster(owner.project, size=2)
    for minute in range(0, 180, 10):
        clock.move_to(NOW + timedelta(minutes=minute))
        send(nodes(cluster), minute=minute)
        clock.move_to(NOW + timedelta(minutes=minute, seconds=30))
        tasks.roll_up_metrics_minutes()
    clock.move_to(NOW + timedelta(hours=3))
    tasks.roll_up_metrics_minutes()
    tasks.roll_up_metrics_hours()

    day = metrics.window(cluster, "24h")
    assert day.resolution_seconds == 60
    points = [p for p in day.nodes[0].series if p.index == 0]
    assert len(points) == 18 and points[0].at == NOW and points[0].samples == 1
    week = metrics.window(cluster, "7d")
    assert week.resolution_seconds == 3600
    hours = [p for p in week.nodes[1].series if p.index == 1]
    sent = [utilization(1, 1, minute) for minute in range(60, 120, 10)]
    assert [p.at for p in hours] == [NOW + timedelta(hours=h) for h in range(3)]
    assert hours[1].samples == 6
    assert hours[1].utilization_percent.min == min(sent)
    assert hours[1].utilization_percent.mean == pytest.approx(statistics.mean(sent))
    assert week.nodes[1].host_series[1].network_rx_bytes == 1000 * 110
    with pytest.raises(ValueError, match="window must be one of 15m, 1h, 24h, 7d"):
        metrics.window(cluster, "2d")
