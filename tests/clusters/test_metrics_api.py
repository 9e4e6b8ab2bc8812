"""GET /api/v1/clusters/{id}/metrics (issue 23, item 7): each live machine's health, its GPUs'
latest figures and the window's series, read through `metrics.window`; the windows, the
refusals, and a fixed number of queries whatever the node count."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from clusters import tasks
from clusters.models import Cluster
from clusters.telemetry import idle, metrics
from tests.clusters.front import ready_cluster

NOW = datetime(2026, 12, 7, 10, 0, tzinfo=UTC)


@pytest.fixture
def clock():
    with time_machine.travel(NOW, tick=False) as traveller:
        yield traveller


def utilization(node: int, gpu: int, minute: int) -> float:
    return float((node * 17 + gpu * 5 + minute * 3) % 101)


def report(cluster: Cluster, minute: int, *, gpus: int = 2) -> None:
    """Every node of `cluster` reports at NOW + minute, as the agent's endpoint stores it."""
    for node in cluster.nodes.order_by("index"):
        metrics.store(
            node.pk,
            cluster.pk,
            gpus=[
                {
                    "index": i,
                    "utilization_percent": utilization(node.index, i, minute),
                    "memory_used_mib": 1000 * minute,
                    "memory_total_mib": 81559,
                    "temperature_c": 40.0 + i,
                    "power_w": 300.0,
                    "power_limit_w": 700.0,
                    "sm_clock_mhz": 1980,
                    "throttle": 0b100,  # sw_power_cap
                    "ecc_corrected": 2,
                    "ecc_uncorrected": 0,
                    "retired_pages_pending": False,
                    "remapped_rows_pending": None,
                }
                for i in range(gpus)
            ],
            host={name: None for name in metrics.NODE_FIGURES} | {"cpu_percent": 10.0 + minute},
            at=timezone.now(),
        )


def get(person, cluster_id: int, query: str = ""):
    return person.api().get(f"/api/v1/clusters/{cluster_id}/metrics{query}")


def test_it_answers_each_nodes_latest_figures_health_and_series(owner, clock):
    cluster = ready_cluster(owner.project, size=2)
    cluster.health_problems = {
        "ecc:node-1:0": {"node": "node-1", "message": "node-1 GPU 0: 3 uncorrectable ECC errors."}
    }
    cluster.save(update_fields=["health_problems"])
    for minute in range(3):
        clock.move_to(NOW + timedelta(minutes=minute))
        report(cluster, minute)

    response = get(owner, cluster.pk)

    assert response.status_code == 200
    data = response.json()["data"]
    assert data["window"] == "15m" and data["resolution_seconds"] == 15
    assert data["end"] == "2026-12-07T10:02:00Z" and data["start"] == "2026-12-07T09:47:00Z"
    assert data["idle_since"] is None and data["idle_notice"] is None
    node_0, node_1 = data["nodes"]
    assert node_0["name"] == "node-0"
    assert node_0["health"] == {"status": "healthy", "problems": []}
    assert node_1["health"] == {
        "status": "unhealthy",
        "problems": ["node-1 GPU 0: 3 uncorrectable ECC errors."],
    }
    assert node_1["reported_at"] == "2026-12-07T10:02:00Z"
    gpu_1 = node_1["gpus"][1]
    assert gpu_1["index"] == 1
    assert gpu_1["utilization_percent"] == utilization(1, 1, 2)
    assert (gpu_1["memory_used_mib"], gpu_1["memory_total_mib"]) == (2000, 81559)
    assert gpu_1["temperature_c"] == 41.0 and gpu_1["power_w"] == 300.0
    assert gpu_1["throttle"] == ["sw_power_cap"] and gpu_1["ecc_corrected"] == 2
    assert gpu_1["remapped_rows_pending"] is None
    assert node_1["host"]["cpu_percent"] == 12.0 and node_1["host"]["disk_root_used_gib"] is None
    # A point per report and GPU, by time then GPU; a raw point's min, mean and max are its own.
    assert [(p["at"][11:16], p["index"]) for p in node_1["series"]] == [
        ("10:00", 0), ("10:00", 1), ("10:01", 0), ("10:01", 1), ("10:02", 0), ("10:02", 1),
    ]  # fmt: skip
    last = utilization(1, 1, 2)
    assert node_1["series"][-1]["utilization_percent"] == {"min": last, "mean": last, "max": last}
    assert node_1["series"][-1]["samples"] == 1
    assert [p["cpu_percent"]["mean"] for p in node_1["host_series"]] == [10.0, 11.0, 12.0]


def test_the_hour_reads_the_minutes_rollups(owner, clock):
    cluster = ready_cluster(owner.project, size=1)
    for second in (0, 15, 30, 45):
        clock.move_to(NOW + timedelta(seconds=second))
        report(cluster, minute=second // 15)
    clock.move_to(NOW + timedelta(minutes=1, seconds=5))
    tasks.roll_up_metrics_minutes()

    data = get(owner, cluster.pk, "?window=1h").json()["data"]

    assert data["window"] == "1h" and data["resolution_seconds"] == 60
    (point,) = [p for p in data["nodes"][0]["series"] if p["index"] == 0]
    sent = [utilization(0, 0, m) for m in range(4)]
    assert point["at"] == "2026-12-07T10:00:00Z" and point["samples"] == 4
    assert point["utilization_percent"]["min"] == min(sent)
    assert point["utilization_percent"]["max"] == max(sent)
    assert point["utilization_percent"]["mean"] == pytest.approx(sum(sent) / 4)


def test_it_shows_idle_since_and_the_notice_in_the_metrics_and_the_cluster(owner, clock):
    cluster = ready_cluster(owner.project, size=2, idle_since=NOW - timedelta(minutes=45))

    metrics_data = get(owner, cluster.pk).json()["data"]
    cluster_data = owner.api().get(f"/api/v1/clusters/{cluster.pk}").json()["data"]

    assert metrics_data["idle_since"] == "2026-12-07T09:15:00Z"
    # The page's words (clusters.telemetry.idle.notice_text): 2 machines of 8 GPUs, 45 minutes.
    assert metrics_data["idle_notice"] == idle.notice_text(cluster)
    assert metrics_data["idle_notice"].startswith("16 GPUs idle for 45 min, costing $")
    assert cluster_data["idle_since"] == "2026-12-07T09:15:00Z"
    # A node that has not reported yet: healthy, no figures, no points.
    assert metrics_data["nodes"][0] | {"health": None} == {
        "name": "node-0",
        "health": None,
        "reported_at": None,
        "gpus": [],
        "host": None,
        "series": [],
        "host_series": [],
    }


def test_the_clusters_machines_carry_the_same_health(owner):
    cluster = ready_cluster(owner.project, size=2)
    cluster.health_problems = {
        "gpu-missing:node-0": {"node": "node-0", "message": "node-0 reports 7 GPUs, not 8."}
    }
    cluster.save(update_fields=["health_problems"])

    machines = owner.api().get(f"/api/v1/clusters/{cluster.pk}").json()["data"]["machines"]
    listed = owner.api().get("/api/v1/clusters").json()["data"][0]["machines"]

    expected = [
        {"status": "unhealthy", "problems": ["node-0 reports 7 GPUs, not 8."]},
        {"status": "healthy", "problems": []},
    ]
    assert [m["health"] for m in machines] == expected
    assert [m["health"] for m in listed] == expected


@pytest.mark.parametrize("window", ["2d", "15M", "", "1h;drop"])
def test_it_refuses_another_window_with_a_clear_422(owner, window):
    cluster = ready_cluster(owner.project)

    response = get(owner, cluster.pk, f"?window={window}")

    assert response.status_code == 422
    error = response.json()["error"]
    assert error["code"] == "invalid_window"
    assert error["message"].startswith("window must be one of 15m, 1h, 24h, 7d, not ")


def test_a_stranger_and_an_unknown_id_get_404(owner, stranger, teammate):
    cluster = ready_cluster(owner.project)

    assert get(teammate, cluster.pk).status_code == 200
    for response in (get(stranger, cluster.pk), get(owner, cluster.pk + 1000)):
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "not_found"


def test_it_costs_the_same_queries_at_one_node_and_at_eight(owner, clock):
    idle_since = NOW - timedelta(hours=1)  # the notice is worded too
    small = ready_cluster(owner.project, size=2, idle_since=idle_since)
    large = ready_cluster(owner.project, size=8, idle_since=idle_since)
    for minute in range(3):
        clock.move_to(NOW + timedelta(minutes=minute))
        report(small, minute)
        report(large, minute, gpus=8)
    api = owner.api()
    api.get("/api/v1/me")  # the key's last_used_at, written at most once a minute, is now
    counts = []
    for cluster in (small, large):
        with CaptureQueriesContext(connection) as queries:
            response = api.get(f"/api/v1/clusters/{cluster.pk}/metrics")
        assert response.status_code == 200
        assert len(response.json()["data"]["nodes"]) == cluster.size
        assert response.json()["data"]["idle_notice"]
        counts.append(len(queries))
    assert counts[0] == counts[1]
    # The key's check, the cluster, and metrics.window's five.
    window_queries = 5
    assert counts[0] <= window_queries + 1 + 4


def test_the_openapi_document_describes_the_metrics(client, db):
    schema = client.get("/api/v1/openapi.json").json()

    operation = schema["paths"]["/api/v1/clusters/{cluster_id}/metrics"]["get"]
    (window,) = [p for p in operation["parameters"] if p["name"] == "window"]
    assert window["schema"]["enum"] == ["15m", "1h", "24h", "7d"]
    assert window["schema"]["default"] == "15m"
    node = schema["components"]["schemas"]["NodeMetricsOut"]["properties"]
    assert {"name", "health", "reported_at", "gpus", "host", "series"} <= node.keys()
    gpu = schema["components"]["schemas"]["GpuNowOut"]["properties"]
    assert {"utilization_percent", "memory_used_mib", "temperature_c", "power_w"} <= gpu.keys()
    machine = schema["components"]["schemas"]["MachineOut"]["properties"]
    assert machine["health"] == {"$ref": "#/components/schemas/HealthOut"}
