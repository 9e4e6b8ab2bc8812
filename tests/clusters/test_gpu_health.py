"""GPU health (issue 23, item 4; clusters/telemetry/health.py, docs/metrics.md "GPU health"):
what the metrics reports show wrong with a node's GPUs marks it unhealthy as any health problem
does (one node_unhealthy event naming node, GPU and what, the "unhealthy" email, the cluster
degraded, up and billed) and clears it when the reports no longer show it; a healthy report
still costs three queries."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core import mail
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from billing.models import UsageRecord
from clusters import lifecycle
from clusters.models import Cluster, Event, Node
from clusters.notifications import recipients_for, send_pending_cluster_emails
from clusters.telemetry import health
from clusters.telemetry.agent_service import agent_check_in
from tests.clusters.lifecycle_kit import Sim, at, create, inventory, node
from tests.clusters.test_metrics_store import ready_cluster
from tests.clusters.test_metrics_store import report as healthy_report

BOOT = 180
Reason = Event.Reason


def ready(project, clock, *, nodes=2, gpus=8):
    """A ready cluster of the simulated data center, its agents checked in with `gpus` GPUs
    each (what acceptance counted), its ready email sent and forgotten."""
    machine_type = inventory(hosts=nodes + 1, boot_seconds=BOOT, gpus=gpus)
    with Sim() as sim:
        cluster = create(project, machine_type, nodes=nodes)
        sim.run_until(clock, at(BOOT * 2))
    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.READY
    assert len(node(cluster, 1).gpus) == gpus
    send_pending_cluster_emails()
    mail.outbox.clear()
    return cluster


def gpu(index: int, **figures) -> dict:
    return {
        "index": index,
        "utilization_percent": 97,
        "memory_used_mib": 70000,
        "memory_total_mib": 81559,
        "temperature_c": 61,
        "throttle": [],
        "ecc_uncorrected": 0,
        "retired_pages_pending": False,
        "remapped_rows_pending": False,
        **figures,
    }


def send(client, cluster, index, *, gpus=8, **of_gpu):
    """node-`index`'s metrics report of `gpus` GPUs, GPU i's figures changed by of_gpu[f"g{i}"]."""
    n = node(cluster, index)
    body = {"gpus": [gpu(i, **of_gpu.get(f"g{i}", {})) for i in range(gpus)]}
    with Sim():
        response = client.post(
            f"/api/v1/agent/nodes/{n.pk}/metrics",
            body,
            content_type="application/json",
            headers={"authorization": f"Bearer {lifecycle.agent_token(n)}"},
        )
    assert response.status_code == 200, response.content
    assert response.json()["data"]["metrics_seconds"] == 15


def accepted_gpus(count: int) -> list[dict]:
    """What a node's agent saw at acceptance (`Node.gpus`): `count` GPUs."""
    return [{"name": "H100", "memory_total_mib": 81559, "uuid": f"GPU-{i}"} for i in range(count)]


def events(cluster):
    return list(
        cluster.events.filter(reason__in=[Reason.NODE_UNHEALTHY, Reason.NODE_HEALTHY]).order_by(
            "at", "pk"
        )
    )


def billed(cluster):
    return set(UsageRecord.objects.filter(cluster=cluster).values_list("pk", "ended_at"))


@pytest.mark.parametrize(
    ("figures", "message"),
    [
        ({"ecc_uncorrected": 2}, "node-1 GPU 3: 2 uncorrectable ECC errors"),
        ({"ecc_uncorrected": 1}, "node-1 GPU 3: 1 uncorrectable ECC error"),
        (
            {"retired_pages_pending": True},
            "node-1 GPU 3: memory pages pending retirement (a GPU reset retires them)",
        ),
        (
            {"remapped_rows_pending": True},
            "node-1 GPU 3: memory rows pending remapping (a GPU reset remaps them)",
        ),
    ],
)
def test_a_gpu_fault_marks_its_node_unhealthy_once_naming_node_gpu_and_what(
    project, clock, client, figures, message
):
    cluster = ready(project, clock)
    before = billed(cluster)
    clock.shift(timedelta(seconds=30))
    send(client, cluster, 1, g3=figures)
    for _ in range(3):  # the same report again: announced once
        clock.shift(timedelta(seconds=15))
        send(client, cluster, 1, g3=figures)
        send(client, cluster, 0)

    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.DEGRADED
    assert (cluster.failure_reason, cluster.failure_node) == (Reason.NODE_UNHEALTHY, "node-1")
    assert cluster.failure_message == f"{message}."
    assert cluster.problems_of("node-1") == [message] and cluster.problems_of("node-0") == []
    [event] = events(cluster)
    assert event.node.name == "node-1" and event.message.startswith(f"{message}.")
    assert "keep running and billed" in event.message
    # The owner's email names the GPU and what; the cluster runs on, billed as before.
    assert send_pending_cluster_emails() == 1
    [email] = mail.outbox
    assert email.to == recipients_for(cluster) and len(email.to) == 1  # its owner
    assert email.subject == f"Cluster {cluster.name} is degraded: node-1 is unhealthy"
    assert message in email.body and "billed at" in email.body
    assert billed(cluster) == before
    assert set(cluster.nodes.values_list("status", flat=True)) == {Node.Status.JOINED}


def test_ecc_errors_gone_clear_it_with_a_healthy_event_and_the_cluster_is_ready(
    project, clock, client
):
    cluster = ready(project, clock)
    clock.shift(timedelta(seconds=30))
    send(client, cluster, 1, g3={"ecc_uncorrected": 2})
    clock.shift(timedelta(seconds=15))
    send(client, cluster, 1, g3={"ecc_uncorrected": 5})  # more: the message follows, no event
    cluster.refresh_from_db()
    assert cluster.failure_message == "node-1 GPU 3: 5 uncorrectable ECC errors."
    assert len(events(cluster)) == 1

    clock.shift(timedelta(seconds=15))
    send(client, cluster, 1)
    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.READY
    assert (cluster.failure_reason, cluster.health_problems) == ("", {})
    assert node(cluster, 1).gpu_health == {}
    unhealthy, healthy = events(cluster)
    assert healthy.reason == Reason.NODE_HEALTHY and healthy.node.name == "node-1"
    assert healthy.message == (
        "node-1 GPU 3 reports no uncorrectable ECC errors again. Every machine is healthy "
        "again: the cluster is ready."
    )
    assert healthy.notification is None
    # A new fault later is a new event and a new email.
    clock.shift(timedelta(seconds=15))
    send(client, cluster, 0, g1={"retired_pages_pending": True})
    assert [e.reason for e in events(cluster)] == [
        Reason.NODE_UNHEALTHY,
        Reason.NODE_HEALTHY,
        Reason.NODE_UNHEALTHY,
    ]
    assert events(cluster)[-1].node.name == "node-0"
    assert send_pending_cluster_emails() == 2


def test_a_slowdown_counts_only_once_it_lasted_more_than_a_minute(project, clock, client):
    cluster = ready(project, clock)
    slowed = {"throttle": ["hw_slowdown", "hw_thermal_slowdown"]}
    clock.shift(timedelta(seconds=30))
    first = timezone.now()
    send(client, cluster, 1, g0=slowed)
    clock.shift(timedelta(seconds=30))
    send(client, cluster, 1, g0=slowed)  # 30 s: nothing yet
    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.READY and events(cluster) == []
    kept = node(cluster, 1).gpu_health
    assert set(kept) == {"0:hw_slowdown", "0:hw_thermal_slowdown"}
    assert kept["0:hw_slowdown"]["since"] == first.isoformat()  # the server's clock

    clock.shift(timedelta(seconds=31))
    send(client, cluster, 1, g0=slowed)  # 61 s
    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.DEGRADED
    [event] = events(cluster)
    assert event.message.startswith(
        "node-1 GPU 0: hardware slowdown for 1 min. node-1 GPU 0: hardware thermal slowdown "
        "for 1 min."
    )
    clock.shift(timedelta(seconds=120))
    send(client, cluster, 1, g0=slowed)
    cluster.refresh_from_db()
    assert cluster.failure_message == (
        "node-1 GPU 0: hardware slowdown for 3 min. node-1 GPU 0: hardware thermal slowdown "
        "for 3 min."
    )
    assert len(events(cluster)) == 1

    clock.shift(timedelta(seconds=15))
    send(client, cluster, 1)
    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.READY
    assert events(cluster)[-1].message.startswith(
        "node-1 GPU 0: the hardware slowdown ended. node-1 GPU 0: the hardware thermal "
        "slowdown ended."
    )


def test_a_slowdown_that_stops_within_the_minute_starts_over(project, clock, client):
    cluster = ready(project, clock)
    slowed = {"throttle": ["sw_thermal_slowdown"]}
    clock.shift(timedelta(seconds=30))
    send(client, cluster, 1, g2=slowed)
    clock.shift(timedelta(seconds=45))
    send(client, cluster, 1)  # gone after 45 s
    assert node(cluster, 1).gpu_health == {}
    clock.shift(timedelta(seconds=15))
    send(client, cluster, 1, g2=slowed)
    clock.shift(timedelta(seconds=45))
    send(client, cluster, 1, g2=slowed)  # 45 s of the new one, 105 s since the first
    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.READY and events(cluster) == []


def test_a_power_cap_or_an_idle_gpu_is_no_fault(project, clock, client):
    cluster = ready(project, clock)
    capped = {"throttle": ["sw_power_cap", "gpu_idle", "applications_clocks_setting"]}
    for _ in range(6):
        clock.shift(timedelta(seconds=30))
        send(client, cluster, 1, g0=capped, g1={"ecc_corrected": 40})
    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.READY and events(cluster) == []
    assert node(cluster, 1).gpu_health == {}


def test_a_gpu_missing_from_the_reports_marks_the_node_until_it_is_back(project, clock, client):
    cluster = ready(project, clock)
    clock.shift(timedelta(seconds=30))
    send(client, cluster, 1, gpus=7)
    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.DEGRADED
    assert cluster.failure_message == "node-1 reports 7 GPUs, 8 at acceptance."
    [event] = events(cluster)
    assert event.node.name == "node-1"
    clock.shift(timedelta(seconds=15))
    send(client, cluster, 1)
    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.READY
    assert events(cluster)[-1].message.startswith("node-1 reports its 8 GPUs again.")


def test_a_gpu_problem_and_a_network_problem_are_judged_together(project, clock, client):
    """The check-in's judgement and the metrics' read the same conditions (one home): a network
    problem healed on the check-in leaves the GPU problem open, and the cluster degraded."""
    cluster = ready(project, clock)
    clock.shift(timedelta(seconds=30))
    send(client, cluster, 1, g3={"ecc_uncorrected": 2})
    n = node(cluster, 0)
    with Sim():
        agent_check_in(
            node=n.pk,
            token=lifecycle.agent_token(n),
            gpus=[],
            health={"peers": {"node-1": True}, "services": {"sshd": True}, "shared": None},
        )
    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.DEGRADED
    assert list(cluster.health_problems) == ["gpu:node-1:3:ecc_uncorrected"]


def test_gpu_conditions_read_a_report_and_ignore_what_the_driver_could_not_read():
    rows = [
        {"index": 0, "ecc_uncorrected": None, "throttle": None},
        {"index": 1, "ecc_uncorrected": 3, "remapped_rows_pending": True, "throttle": []},
        {"index": 2, "retired_pages_pending": None, "throttle": ["hw_power_brake_slowdown"]},
    ]
    found = health.gpu_conditions(rows, accepted=4)
    assert [(c.key, c.count) for c in found] == [
        ("1:ecc_uncorrected", 3),
        ("1:remapped_rows_pending", None),
        ("2:hw_power_brake_slowdown", None),
        ("missing", 3),
    ]
    assert health.gpu_conditions(rows[:1], accepted=0) == []  # nothing counted at acceptance


# Outside a test's transaction, so that a BEGIN or a COMMIT the report sent would count too.
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("gpus", [1, 8])
def test_a_healthy_report_of_an_accepted_node_is_still_four_queries(
    owner, client, gpus, django_assert_max_num_queries
):
    cluster = ready_cluster(owner.project)
    n = cluster.nodes.order_by("index").first()
    n.gpus = accepted_gpus(gpus)
    n.save(update_fields=["gpus"])
    # The node, its pace (clusters/telemetry/metrics.py take_report) and the two inserts.
    with django_assert_max_num_queries(4):
        response = client.post(
            f"/api/v1/agent/nodes/{n.pk}/metrics",
            healthy_report(gpus),
            content_type="application/json",
            headers={"authorization": f"Bearer {lifecycle.agent_token(n)}"},
        )
    assert response.status_code == 200, response.content
    n.refresh_from_db()
    assert n.gpu_health == {}


def test_the_page_names_the_gpu_problem_once_on_each_tab(project, clock, client):
    cluster = ready(project, clock)
    clock.shift(timedelta(seconds=30))
    send(client, cluster, 1, g3={"ecc_uncorrected": 2})
    browser = project_owner_client(project)
    message = "node-1 GPU 3: 2 uncorrectable ECC errors"
    machines = browser.get(f"/clusters/{cluster.pk}/machines/").content.decode()
    assert '<div class="note note-warn gpu-notice" role="status">' in machines
    assert f"GPU problem:</strong> {message}." in machines
    # The Overview's degraded banner says it already: once there.
    overview = browser.get(f"/clusters/{cluster.pk}/").content.decode()
    assert "gpu-notice" not in overview
    assert overview.count(message) == 1
    assert "A machine is unhealthy: node-1." in overview
    clock.shift(timedelta(seconds=15))
    send(client, cluster, 1)
    assert "gpu-notice" not in browser.get(f"/clusters/{cluster.pk}/machines/").content.decode()


def project_owner_client(project):
    from django.test import Client

    from accounts.models import Membership

    owner = Membership.objects.get(project=project, role=Membership.Role.OWNER).user
    browser = Client()
    browser.force_login(owner)
    return browser


def test_a_report_of_a_known_gpu_problem_costs_the_same_queries_whatever_the_size(owner, client):
    def queries_at(size: int) -> int:
        cluster = ready_cluster(owner.project, size=size)
        for n in cluster.nodes.all():
            n.gpus = accepted_gpus(8)
            n.save(update_fields=["gpus"])
        n = cluster.nodes.get(index=1)
        body = healthy_report(8, ecc_uncorrected=4)
        headers = {"authorization": f"Bearer {lifecycle.agent_token(n)}"}
        url = f"/api/v1/agent/nodes/{n.pk}/metrics"
        client.post(url, body, content_type="application/json", headers=headers)
        cluster.refresh_from_db()
        assert cluster.status == Cluster.Status.DEGRADED
        with CaptureQueriesContext(connection) as queries:
            client.post(url, body, content_type="application/json", headers=headers)
        return len(queries)

    # The report's four (its pace among them), the lock and the machines (in a savepoint
    # pair): nothing else is written.
    assert queries_at(2) == queries_at(5) == 8
