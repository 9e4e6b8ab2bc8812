"""What the GPUs are doing, on the lab's real hosts (issue 23): the agents of a ready cluster read
the stand-in `nvidia-smi` (lab/image/nvidia-smi answers `--query-gpu` with the figures the test
sets, `Lab.set_gpu_figures`) and post metrics reports to the live dashboard.

- the metrics API shows, within 30 s, the utilisation set on each stand-in GPU;
- an uncorrectable ECC count on one GPU of node-1 marks node-1 unhealthy, with an event naming
  node-1, the GPU and "ECC"; back to 0, it clears with another event, and the cluster is ready;
- with RUNCRATE_IDLE_GPU_MINUTES=1 and every GPU at 0 %, the idle notice (the beat's task, run
  here) writes the gpus_idle event and `idle_since`, and stops nothing.
"""

from __future__ import annotations

import time

import pytest
from django.test import Client

from accounts.models import SshKey
from billing.models import UsageRecord
from clusters.models import Cluster, Event, Node
from clusters.telemetry import idle
from tests.clusters.lifecycle_kit import create, new_project
from tests.clusters.test_ssh_lab import agent_logs, drive, machine_type, terminate_and_check
from tests.factories import issue_key

pytestmark = [pytest.mark.lab, pytest.mark.django_db(transaction=True)]

SECONDS = 3  # the agents' metrics and health intervals here (their check-ins' answers)


def wait_for(cluster: Cluster, condition, seconds: float, what: str):
    """A bounded wait for the live dashboard (the agents' reports) to make `condition` true;
    returns what it returned."""
    deadline = time.monotonic() + seconds
    while True:
        found = condition()
        if found:
            return found
        if time.monotonic() > deadline:
            cluster.refresh_from_db()
            events = "\n".join(f"  {e.reason}: {e.message}" for e in cluster.events.all())
            raise AssertionError(
                f"{what}: not within {seconds} s; the cluster is {cluster.status}:\n{events}\n"
                f"{agent_logs(cluster)}"
            )
        time.sleep(0.5)


def test_metrics_health_and_the_idle_notice_from_real_agents(fleet, user_key, settings):
    lab = fleet
    settings.RUNCRATE_METRICS_SECONDS = SECONDS
    settings.RUNCRATE_HEALTH_SECONDS = SECONDS
    settings.RUNCRATE_IDLE_GPU_MINUTES = 1
    user, project = new_project(keys=0)
    public = user_key.with_suffix(".pub").read_text().strip()
    SshKey.objects.create(project=project, name="mine", public_key=public, fingerprint="SHA256:x")
    api = Client(HTTP_AUTHORIZATION=f"Bearer {issue_key(user=user, project=project)}")
    cluster = create(project, machine_type("lab-h100x2-vm"), nodes=2, name="gauge")
    drive(cluster, Cluster.Status.READY, Cluster.Status.FAILED)
    assert cluster.status == Cluster.Status.READY, cluster.failure_message
    nodes = list(cluster.nodes.select_related("host").order_by("index"))
    busy = {n.name: {0: 40 + 10 * n.index, 1: 71 + 10 * n.index} for n in nodes}

    def set_figures(node: Node, figures: dict[int, dict[str, object]]) -> None:
        lab.set_gpu_figures(node.host.name, figures)

    def metrics() -> dict:
        answer = api.get(f"/api/v1/clusters/{cluster.pk}/metrics?window=15m")
        assert answer.status_code == 200, answer.content
        return {node["name"]: node for node in answer.json()["data"]["nodes"]}

    def utilisation() -> dict[str, dict[int, float]]:
        return {
            name: {gpu["index"]: gpu["utilization_percent"] for gpu in node["gpus"]}
            for name, node in metrics().items()
        }

    try:
        for node in nodes:
            set_figures(node, {i: {"utilization.gpu": u} for i, u in busy[node.name].items()})
        set_at = time.monotonic()
        wait_for(cluster, lambda: utilisation() == busy, 30, "the API shows what each GPU does")
        assert time.monotonic() - set_at <= 30
        assert all(node["health"]["status"] == "healthy" for node in metrics().values())

        # An uncorrectable ECC error on node-1's GPU 1: node-1 is unhealthy, naming the GPU.
        node1 = nodes[1]
        broken = {0: {"utilization.gpu": busy["node-1"][0]}}
        broken[1] = {
            "utilization.gpu": busy["node-1"][1],
            "ecc.errors.uncorrected.volatile.total": 2,
        }
        set_figures(node1, broken)

        def unhealthy_event():
            return cluster.events.filter(reason=Event.Reason.NODE_UNHEALTHY).last()

        event = wait_for(cluster, unhealthy_event, 60, "node-1 is marked unhealthy")
        assert event.node.name == "node-1", event.message
        assert "node-1" in event.message and "GPU 1" in event.message, event.message
        assert "ECC" in event.message, event.message
        health = metrics()["node-1"]["health"]
        assert health["status"] == "unhealthy" and any("ECC" in p for p in health["problems"])
        assert metrics()["node-0"]["health"]["status"] == "healthy"
        cluster.refresh_from_db()
        assert cluster.status in (Cluster.Status.READY, Cluster.Status.DEGRADED)
        assert not UsageRecord.objects.filter(cluster=cluster, ended_at__isnull=False).exists()

        # Back to 0: it clears, with another event.
        set_figures(node1, {i: {"utilization.gpu": u} for i, u in busy["node-1"].items()})

        def healed():
            return cluster.events.filter(reason=Event.Reason.NODE_HEALTHY, pk__gt=event.pk).last()

        cleared = wait_for(cluster, healed, 60, "node-1 is healthy again")
        assert "node-1" in cleared.message
        wait_for(
            cluster,
            lambda: metrics()["node-1"]["health"]["status"] == "healthy",
            30,
            "the API says node-1 is healthy",
        )
        cluster.refresh_from_db()
        assert cluster.status == Cluster.Status.READY

        # Every GPU at 0 % for a minute: the idle notice, and nothing stopped.
        assert cluster.idle_since is None
        for node in nodes:
            set_figures(node, {0: {"utilization.gpu": 0}, 1: {"utilization.gpu": 0}})
        wait_for(
            cluster,
            lambda: all(u == 0 for gpus in utilisation().values() for u in gpus.values()),
            30,
            "every GPU reads 0 %",
        )

        def noticed():
            idle.notice_idle()  # the beat's task, every minute in production
            cluster.refresh_from_db()
            return cluster.idle_since

        wait_for(cluster, noticed, 120, "the idle notice")
        idle_event = cluster.events.get(reason=Event.Reason.GPUS_IDLE)
        assert "idle" in idle_event.message
        assert cluster.status == Cluster.Status.READY
        assert cluster.nodes.filter(status=Node.Status.JOINED).count() == 2
        assert not UsageRecord.objects.filter(cluster=cluster, ended_at__isnull=False).exists()
        answer = api.get(f"/api/v1/clusters/{cluster.pk}").json()["data"]
        assert answer["idle_since"] is not None
        assert answer["status"] == "ready"
    finally:
        terminate_and_check(lab, cluster)
