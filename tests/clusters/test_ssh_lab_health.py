"""Watching a ready cluster on the lab's real hosts (issue 18, D8): the agents add health reports
to their heartbeats; one node cut off from the private network (its rc0 down) makes the cluster
degraded naming it, with an email; once its rc0 is up again the cluster is ready again."""

from __future__ import annotations

import time

import pytest
from django.core import mail

from billing.models import UsageRecord
from clusters.models import Cluster, Event, Node
from clusters.notifications import send_pending_cluster_emails
from tests.clusters.lifecycle_kit import create
from tests.clusters.test_ssh_lab import (
    agent_logs,
    drive,
    machine_type,
    project_with,
    terminate_and_check,
)

pytestmark = [pytest.mark.lab, pytest.mark.django_db(transaction=True)]

HEALTH_SECONDS = 3  # the agents' interval here (RUNCRATE_HEALTH_SECONDS, in their agent.json)


def wait_until(cluster: Cluster, condition, seconds: float, what: str) -> None:
    """A bounded wait for the live dashboard (the agents' check-ins) to make `condition` true."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            cluster.refresh_from_db()
            events = "\n".join(f"  {e.reason}: {e.message}" for e in cluster.events.all())
            reports = "\n".join(f"  {n.name}: {n.health}" for n in cluster.nodes.all())
            raise AssertionError(
                f"{what}: not within {seconds} s; the cluster is {cluster.status}:\n{events}\n"
                f"{reports}\n{agent_logs(cluster)}"
            )
        time.sleep(0.5)


def test_a_node_cut_off_from_the_private_network_degrades_the_cluster_naming_it(
    fleet, user_key, settings
):
    lab = fleet
    settings.RUNCRATE_HEALTH_SECONDS = HEALTH_SECONDS
    cluster = create(project_with(user_key), machine_type("lab-h100x2-vm"), nodes=3, name="watch")
    drive(cluster, Cluster.Status.READY, Cluster.Status.FAILED)
    assert cluster.status == Cluster.Status.READY, cluster.failure_message
    node1 = cluster.nodes.select_related("host").get(index=1)
    assert (
        f'"health_seconds": {HEALTH_SECONDS}'
        in lab.exec(node1.host.name, "cat /etc/runcrate/agent.json").stdout
    )
    try:
        # Every agent reports, and all is well: every peer reached, sshd running, /shared
        # answering on the workers.
        def joined():
            return list(cluster.nodes.filter(status=Node.Status.JOINED))

        started = time.time()
        wait_until(
            cluster,
            lambda: all(n.health_at and n.health_at.timestamp() > started for n in joined()),
            60,
            "every agent reports its health",
        )
        for n in joined():
            assert all(n.health["peers"].values()) and n.health["services"] == {"sshd": True}, (
                n.health
            )
            if n.index:
                assert n.health["shared"]["answers"] is True, n.health
        cluster.refresh_from_db()
        assert cluster.status == Cluster.Status.READY
        assert not cluster.events.filter(reason=Event.Reason.NODE_UNHEALTHY).exists()
        send_pending_cluster_emails()  # the ready email
        mail.outbox.clear()

        lab.exec(node1.host.name, "ip link set rc0 down")

        def cut_off_named():
            cluster.refresh_from_db()
            return cluster.status == Cluster.Status.DEGRADED and (
                "node-1 cannot reach node-0, node-2 over the private network"
                in cluster.failure_message
            )

        wait_until(cluster, cut_off_named, 60, "the cluster is degraded naming node-1")
        assert (cluster.failure_reason, cluster.failure_node) == ("node_unhealthy", "node-1")
        first = cluster.events.filter(reason=Event.Reason.NODE_UNHEALTHY).first()
        assert first.node.name == "node-1"
        # Still billed, every machine up: nothing ends for our watcher.
        assert not UsageRecord.objects.filter(cluster=cluster, ended_at__isnull=False).exists()
        assert send_pending_cluster_emails() >= 1
        assert any("node-1 is unhealthy" in m.subject for m in mail.outbox), [
            m.subject for m in mail.outbox
        ]
        # Heartbeats go on (over eth0) without a new event for what is already known: each
        # event announced something new (the network, then maybe node-1's hung /shared).
        time.sleep(4 * HEALTH_SECONDS)
        cluster.refresh_from_db()
        unhealthy = cluster.events.filter(reason=Event.Reason.NODE_UNHEALTHY).count()
        assert 1 <= unhealthy <= len(cluster.health_problems), cluster.health_problems
        assert not cluster.events.filter(reason=Event.Reason.NODE_HEALTHY).exists()
        assert {p["node"] for p in cluster.health_problems.values()} == {"node-1"}

        lab.exec(node1.host.name, "ip link set rc0 up")

        def ready_again():
            cluster.refresh_from_db()
            return cluster.status == Cluster.Status.READY

        wait_until(cluster, ready_again, 150, "the cluster is ready again")
        healed = cluster.events.filter(reason=Event.Reason.NODE_HEALTHY).last()
        assert "the cluster is ready" in healed.message
        assert cluster.failure_reason == ""
    finally:
        lab.exec(node1.host.name, "ip link set rc0 up", check=False)
        terminate_and_check(lab, cluster)
