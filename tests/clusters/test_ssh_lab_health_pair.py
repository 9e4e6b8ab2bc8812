"""The machine cut off in a pair is the one named (issue 33, L6b), on the lab's real hosts: rc0
down on node-1 of a two-machine cluster. Both ends see the same broken link; the unhealthy
event, the cluster's failure and the email's subject name node-1, never node-0."""

from __future__ import annotations

import time

import pytest
from django.core import mail

from clusters.models import Cluster, Event, Node
from clusters.notifications import send_pending_cluster_emails
from tests.clusters.lifecycle_kit import create
from tests.clusters.test_ssh_lab import drive, machine_type, project_with, terminate_and_check
from tests.clusters.test_ssh_lab_health import HEALTH_SECONDS, wait_until

pytestmark = [pytest.mark.lab, pytest.mark.django_db(transaction=True)]


def test_rc0_down_on_node_1_of_a_pair_names_node_1(fleet, user_key, settings):
    lab = fleet
    settings.RUNCRATE_HEALTH_SECONDS = HEALTH_SECONDS
    cluster = create(project_with(user_key), machine_type("lab-h100x2-vm"), nodes=2, name="pair")
    drive(cluster, Cluster.Status.READY, Cluster.Status.FAILED)
    assert cluster.status == Cluster.Status.READY, cluster.failure_message
    node1 = cluster.nodes.select_related("host").get(index=1)
    try:
        started = time.time()
        wait_until(
            cluster,
            lambda: all(
                n.health_at and n.health_at.timestamp() > started
                for n in cluster.nodes.filter(status=Node.Status.JOINED)
            ),
            60,
            "every agent reports its health",
        )
        send_pending_cluster_emails()  # the ready email
        mail.outbox.clear()

        lab.exec(node1.host.name, "ip link set rc0 down")

        def degraded():
            cluster.refresh_from_db()
            return cluster.status == Cluster.Status.DEGRADED

        wait_until(cluster, degraded, 60, "the cluster is degraded")
        first = cluster.events.filter(reason=Event.Reason.NODE_UNHEALTHY).first()
        assert first.node.name == "node-1", first.message
        assert cluster.failure_node == "node-1", cluster.failure_message
        assert send_pending_cluster_emails() >= 1
        subjects = [m.subject for m in mail.outbox]
        assert subjects[0] == f"Cluster {cluster.name} is degraded: node-1 is unhealthy", subjects
        assert not any("node-0 is unhealthy" in s for s in subjects), subjects
    finally:
        lab.exec(node1.host.name, "ip link set rc0 up", check=False)
        terminate_and_check(lab, cluster)
