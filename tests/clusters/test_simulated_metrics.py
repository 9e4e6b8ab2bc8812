"""The simulated data center's figures (issue 23, item 7; issue 37; clusters/telemetry/
simulated_metrics.py): every live node of a ready or degraded cluster on the simulated driver
reports a deterministic report through the agent's path, idle as its empty queue says (nothing
runs on a machine no one can log in to); nothing for real machines or other clusters."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from clusters import tasks
from clusters.machines.base import LogKind
from clusters.machines.simulated import SimulatedDriver
from clusters.models import Cluster, GpuSample, Node, NodeSample
from clusters.telemetry import metrics, simulated_metrics
from clusters.telemetry.simulated_metrics import utilization
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


def test_a_fresh_cluster_reads_idle_and_passes_the_agents_checks(owner, clock):
    # Joined a minute ago, nothing in its queue: idle from its first report, as nvidia-smi
    # reads an idle GPU (issue 37: not 90% busy with 74 of 80 GiB used).
    cluster = cluster_of(owner.project, size=1, gpus=4)
    Cluster.objects.filter(pk=cluster.pk).update(joined_at=NOW - timedelta(minutes=1))
    node = cluster.nodes.get()

    simulated_metrics.report()

    read = metrics.window(cluster, "15m").nodes[0]
    assert [g.index for g in read.gpus] == [0, 1, 2, 3]
    for gpu in read.gpus:
        assert gpu.utilization_percent == utilization(node.pk, gpu.index, NOW) == 0.0
        assert gpu.memory_total_mib == 80 * 1024
        assert gpu.memory_used_mib is not None and gpu.memory_used_mib < 100
        assert gpu.power_limit_w == 700.0
        assert gpu.power_w is not None and gpu.power_w <= 0.15 * 700
        assert gpu.temperature_c is not None and 28 < gpu.temperature_c < 36
        assert gpu.ecc_uncorrected == 0 and gpu.retired_pages_pending is False
        assert gpu.throttle == ["gpu_idle"]
    assert read.host is not None and read.host.cpu_percent is not None
    assert read.host.cpu_percent < 5
    # A few KB a second since it joined, not a training job's 120 MB/s.
    assert read.host.network_rx_bytes == 60 * 2_000


def test_it_uses_the_gpus_the_check_in_counted_and_their_memory(owner, clock):
    cluster = cluster_of(owner.project, size=1, gpus=8)
    node = cluster.nodes.get()
    node.gpus = [{"name": "NVIDIA H100", "memory_total_mib": 81559} for _ in range(7)]
    node.save(update_fields=["gpus"])

    simulated_metrics.report()

    rows = GpuSample.objects.filter(node=node).order_by("index")
    assert [row.index for row in rows] == list(range(7))
    assert {row.memory_total_mib for row in rows} == {81559}


def test_an_idle_gpu_drifts_with_the_clock_and_stays_idle(owner, clock):
    cluster = cluster_of(owner.project, size=1, gpus=2)
    node = cluster.nodes.get()
    for minute in range(0, 36, 3):
        clock.move_to(NOW + timedelta(minutes=minute))
        simulated_metrics.report()

    rows = list(GpuSample.objects.filter(node=node, index=0).order_by("at"))
    assert len(rows) == 12
    assert {row.utilization_percent for row in rows} == {0.0}
    assert {row.memory_used_mib for row in rows} == {4}
    temperatures = [row.temperature_c or 0.0 for row in rows]
    assert len(set(temperatures)) > 4  # it moves, a little
    assert max(temperatures) - min(temperatures) <= 3.0
    # The network counter only grows.
    counters = list(NodeSample.objects.filter(node=node).order_by("at").values_list(
        "network_rx_bytes", flat=True
    ))  # fmt: skip
    assert counters == sorted(counters) and counters[0] < counters[-1]


def test_the_simulated_queue_and_the_figures_agree(owner, clock):
    # What the Logs tab reads of a simulated Slurm cluster says nothing runs, and so do the
    # figures: an empty queue, every node idle in sinfo, no GPU above 0%.
    cluster = cluster_of(owner.project, size=2)
    Cluster.objects.filter(pk=cluster.pk).update(software="slurm")
    node = cluster.nodes.select_related("cluster__machine_type").get(index=0)
    driver = SimulatedDriver()
    queue = driver._log_text(node, LogKind.SLURM_QUEUE, now=NOW, head_ip="10.77.0.1")
    nodes = driver._log_text(node, LogKind.SLURM_NODES, now=NOW, head_ip="10.77.0.1")

    simulated_metrics.report()

    assert len(queue.strip().splitlines()) == 1  # the header alone
    assert nodes.count(" idle ") == 2
    assert set(GpuSample.objects.values_list("utilization_percent", flat=True)) == {0.0}


def test_the_beat_task_reports_as_often_as_an_agent(owner, clock, settings):
    cluster_of(owner.project, size=2)

    entry = settings.CELERY_BEAT_SCHEDULE["simulated-metrics"]
    assert entry["task"] == tasks.simulate_metrics.name
    assert entry["schedule"] == settings.RUNCRATE_METRICS_SECONDS
    assert tasks.simulate_metrics() == 2
    assert NodeSample.objects.count() == 2


# --- one batch for every node (issue 38, item 4) -------------------------------------------------


@pytest.mark.parametrize("size", [2, 64])
def test_it_stores_every_node_s_report_in_the_same_queries_at_2_and_64_nodes(owner, clock, size):
    """Issue 38: the run costs the nodes' query and `metrics.store_many`'s two inserts, not
    1 + 2 queries a node; each cluster's metrics version moves (the pages' poll redraws)."""
    cluster = cluster_of(owner.project, size=size)
    before = metrics.metrics_version(cluster.pk)

    with CaptureQueriesContext(connection) as queries:
        assert simulated_metrics.report() == size

    assert len(queries) == 3, [q["sql"][:80] for q in queries.captured_queries]
    assert GpuSample.objects.count() == size * 8 and NodeSample.objects.count() == size
    assert set(NodeSample.objects.values_list("node_id", flat=True)) == set(
        cluster.nodes.values_list("pk", flat=True)
    )
    assert metrics.metrics_version(cluster.pk) != before


def test_the_batch_writes_what_one_report_at_a_time_writes(owner, clock, monkeypatch):
    """`store_many` and `store` keep the same rows; a batch past STORE_PARAMETERS is cut into
    several statements, none of its rows lost."""
    first, second = cluster_of(owner.project, size=2), cluster_of(owner.project, size=3)
    nodes = [*first.nodes.order_by("index"), *second.nodes.order_by("index")]
    gpus = [{"index": i, "utilization_percent": 10.0 * i} for i in range(8)]
    host = {"cpu_percent": 12.5, "memory_used_mib": 2048}
    cleaned = [metrics.clean_report({"gpus": gpus, "node": host}) for _ in nodes]
    versions = {c.pk: metrics.metrics_version(c.pk) for c in (first, second)}

    monkeypatch.setattr(metrics, "STORE_PARAMETERS", 100)  # a few GPU rows a statement
    with CaptureQueriesContext(connection) as queries:
        metrics.store_many(
            [metrics.Report(n.pk, n.cluster_id, g, h) for n, (g, h) in zip(nodes, cleaned)],
            at=NOW,
        )
    assert len(queries) > 2  # cut: 40 GPU rows of ~15 columns are more than 100 parameters

    kept = sorted(GpuSample.objects.values_list("node_id", "index", "utilization_percent"))
    assert kept == sorted((n.pk, i, 10.0 * i) for n in nodes for i in range(8))
    assert sorted(NodeSample.objects.values_list("node_id", "cpu_percent")) == sorted(
        (n.pk, 12.5) for n in nodes
    )
    assert all(metrics.metrics_version(pk) != v for pk, v in versions.items())

    GpuSample.objects.all().delete()
    NodeSample.objects.all().delete()
    for node, (g, h) in zip(nodes, cleaned):
        metrics.store(node.pk, node.cluster_id, gpus=g, host=h, at=NOW)
    assert sorted(GpuSample.objects.values_list("node_id", "index", "utilization_percent")) == kept
