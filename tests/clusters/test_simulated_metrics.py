"""The simulated data center's figures (issue 23, item 7; clusters/telemetry/simulated_metrics.py):
every
live node of a ready or degraded cluster on the simulated driver reports a plausible, changing,
deterministic report through the agent's path; nothing for real machines or other clusters."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from clusters import tasks
from clusters.models import Cluster, GpuSample, Node, NodeSample
from clusters.telemetry import metrics, simulated_metrics
from clusters.telemetry.simulated_metrics import BUSY_SECONDS, CYCLE_SECONDS, busy, utilization
from offers.models import Host
from tests.factories import ClusterFactory, GpuModelFactory, MachineTypeFactory

NOW = datetime(2026, 12, 7, 10, 0, tzinfo=UTC)


@pytest.fixture
def clock():
    with time_machine.travel(NOW, tick=False) as traveller:
        yield traveller


def cluster_of(
    project, *, size=2, status=Cluster.Status.READY, gpus=8, nodes=Node.Status.JOINED
) -> Cluster:
    """A cluster of H100 machines (700 W, 80 GiB) on the simulated driver, joined an hour ago."""
    machine_type = MachineTypeFactory(gpu=GpuModelFactory(), gpus_per_machine=gpus)
    return ClusterFactory(
        project=project,
        machine_type=machine_type,
        size=size,
        status=status,
        joined_at=timezone.now() - timedelta(hours=1),
        machines=True,
        machines__status=nodes,
        machines__step=Node.Step.DONE,
    )


def busy_moment(node_id: int) -> datetime:
    """The start of the node's first busy spell after NOW: a minute busy after one quiet, so
    the two minutes the test reports from it are all busy, whatever the node's id shifts its
    cycle by (quiet_moment: the first quiet minute after a given moment)."""
    moment = NOW + timedelta(minutes=1)
    while not (busy(node_id, moment) and not busy(node_id, moment - timedelta(minutes=1))):
        moment += timedelta(minutes=1)
    return moment


def quiet_moment(node_id: int, after: datetime = NOW) -> datetime:
    moment = after
    while busy(node_id, moment):
        moment += timedelta(minutes=1)
    return moment


def test_it_reports_every_live_node_of_a_ready_or_degraded_simulated_cluster(owner, clock):
    ready = cluster_of(owner.project, size=3)
    degraded = cluster_of(owner.project, size=2, status=Cluster.Status.DEGRADED)
    cluster_of(owner.project, size=2, status=Cluster.Status.INSTALLING)
    cluster_of(owner.project, size=2, status=Cluster.Status.TERMINATED, nodes=Node.Status.ENDED)
    lost = degraded.nodes.get(index=1)
    lost.status = Node.Status.FAILED
    lost.save(update_fields=["status"])

    assert simulated_metrics.report() == 4

    reported = set(GpuSample.objects.values_list("node_id", flat=True))
    assert reported == {*ready.nodes.values_list("pk", flat=True), degraded.nodes.get(index=0).pk}
    assert GpuSample.objects.count() == 4 * 8 and NodeSample.objects.count() == 4
    assert set(GpuSample.objects.values_list("at", flat=True)) == {NOW}


def test_it_reports_nothing_for_real_machines(owner, clock):
    cluster = cluster_of(owner.project, size=2)
    Host.objects.filter(nodes__cluster=cluster).update(driver=Host.Driver.SSH)

    assert simulated_metrics.report() == 0
    assert not GpuSample.objects.exists() and not NodeSample.objects.exists()


def test_the_figures_are_the_node_and_the_clocks_and_pass_the_agents_checks(owner, clock):
    cluster = cluster_of(owner.project, size=1, gpus=4)
    node = cluster.nodes.get()
    moment = busy_moment(node.pk)
    clock.move_to(moment)

    simulated_metrics.report()

    read = metrics.window(cluster, "15m").nodes[0]
    assert [g.index for g in read.gpus] == [0, 1, 2, 3]
    for gpu in read.gpus:
        assert gpu.utilization_percent == utilization(node.pk, gpu.index, moment)
        assert 80 <= gpu.utilization_percent <= 100
        assert gpu.memory_total_mib == 80 * 1024
        assert gpu.memory_used_mib is not None and gpu.memory_used_mib > 0.85 * 80 * 1024
        assert gpu.power_limit_w == 700.0
        assert gpu.power_w is not None and 0.7 * 700 < gpu.power_w <= 700
        assert gpu.temperature_c is not None and 65 < gpu.temperature_c < 85
        assert gpu.ecc_uncorrected == 0 and gpu.retired_pages_pending is False
        assert "gpu_idle" not in (gpu.throttle or [])
    # Bytes moved since the cluster joined (an hour before NOW), at the simulated rate.
    moved = int((moment - (NOW - timedelta(hours=1))).total_seconds()) * 120_000_000
    assert read.host is not None and read.host.network_rx_bytes == moved


def test_it_uses_the_gpus_the_check_in_counted_and_their_memory(owner, clock):
    cluster = cluster_of(owner.project, size=1, gpus=8)
    node = cluster.nodes.get()
    node.gpus = [{"name": "NVIDIA H100", "memory_total_mib": 81559} for _ in range(7)]
    node.save(update_fields=["gpus"])

    simulated_metrics.report()

    rows = GpuSample.objects.filter(node=node).order_by("index")
    assert [row.index for row in rows] == list(range(7))
    assert {row.memory_total_mib for row in rows} == {81559}


def test_the_figures_change_with_the_clock_and_follow_utilisation(owner, clock):
    cluster = cluster_of(owner.project, size=1, gpus=2)
    node = cluster.nodes.get()
    start = busy_moment(node.pk)
    for second in range(0, 120, 15):
        clock.move_to(start + timedelta(seconds=second))
        simulated_metrics.report()
    quiet = quiet_moment(node.pk, after=start + timedelta(minutes=2))
    clock.move_to(quiet)
    simulated_metrics.report()

    rows = list(GpuSample.objects.filter(node=node, index=0).order_by("at"))
    busy_rows, quiet_row = rows[:-1], rows[-1]
    assert len({row.utilization_percent for row in busy_rows}) > 4  # it moves
    assert quiet_row.utilization_percent is not None and quiet_row.utilization_percent < 5
    assert all(quiet_row.power_w < row.power_w for row in busy_rows)  # type: ignore[operator]
    assert all(quiet_row.temperature_c < row.temperature_c for row in busy_rows)  # type: ignore[operator]
    assert all(quiet_row.memory_used_mib < row.memory_used_mib for row in busy_rows)  # type: ignore[operator]
    assert metrics.throttle_names(quiet_row.throttle) == ["gpu_idle"]
    hottest = max(busy_rows, key=lambda row: row.utilization_percent or 0)
    coolest = min(busy_rows, key=lambda row: row.utilization_percent or 0)
    assert hottest.power_w > coolest.power_w  # type: ignore[operator]
    # The network counter only grows.
    counters = list(NodeSample.objects.filter(node=node).order_by("at").values_list(
        "network_rx_bytes", flat=True
    ))  # fmt: skip
    assert counters == sorted(counters) and counters[0] < counters[-1]


def test_a_nodes_quiet_spell_is_shorter_than_the_idle_notice(owner, settings):
    settings.RUNCRATE_IDLE_GPU_MINUTES = 30
    assert (CYCLE_SECONDS - BUSY_SECONDS) / 60 < settings.RUNCRATE_IDLE_GPU_MINUTES
    quiet = [not busy(1, NOW + timedelta(minutes=minute)) for minute in range(CYCLE_SECONDS // 60)]
    assert 0 < sum(quiet) < settings.RUNCRATE_IDLE_GPU_MINUTES


def test_the_machines_of_a_cluster_do_not_move_in_step(owner, clock):
    cluster = cluster_of(owner.project, size=4)
    ids = list(cluster.nodes.values_list("pk", flat=True))
    states = {
        tuple(busy(pk, NOW + timedelta(minutes=m)) for pk in ids)
        for m in range(CYCLE_SECONDS // 60)
    }
    assert len(states) > 2


@pytest.mark.parametrize("size", [1, 4])
def test_it_finds_the_nodes_in_one_query_and_stores_each_through_metrics_store(owner, clock, size):
    cluster_of(owner.project, size=size)

    with CaptureQueriesContext(connection) as queries:
        assert simulated_metrics.report() == size

    # One read of the nodes, then metrics.store's two (its GPU rows, its node's row) a node.
    assert len(queries) == 1 + 2 * size


def test_the_beat_task_reports_as_often_as_an_agent(owner, clock, settings):
    cluster_of(owner.project, size=2)

    entry = settings.CELERY_BEAT_SCHEDULE["simulated-metrics"]
    assert entry["task"] == tasks.simulate_metrics.name
    assert entry["schedule"] == settings.RUNCRATE_METRICS_SECONDS
    assert tasks.simulate_metrics() == 2
    assert NodeSample.objects.count() == 2
