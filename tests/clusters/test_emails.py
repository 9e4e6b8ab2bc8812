"""Cluster emails from the event outbox: ready, failed and degraded, each sent exactly once."""

import pytest
from django.core import mail
from django.utils import timezone

from clusters import notifications
from clusters.models import Cluster, Event, Node
from clusters.notifications import send_event_email, send_pending_cluster_emails
from tests.factories import ClusterFactory, EventFactory, LocationFactory, MachineTypeFactory


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    settings.SITE_URL = "https://runcrate.example"


def ready_cluster(owner, **fields) -> Cluster:
    now = timezone.now()
    defaults = {
        "project": owner.project,
        "created_by": owner.user,
        "name": "train",
        "status": Cluster.Status.READY,
        "joined_at": now,
        "ready_at": now,
        "machines": True,
        "machines__status": Node.Status.JOINED,
        "machines__step": Node.Step.DONE,
    }
    return ClusterFactory(**{**defaults, **fields})


def failed_cluster(owner) -> tuple[Cluster, Event]:
    cluster = ClusterFactory(
        project=owner.project,
        created_by=owner.user,
        name="train",
        size=3,
        status=Cluster.Status.FAILED,
        failure_reason=Event.Reason.AGENT_TIMEOUT,
        failure_node="node-2",
        failure_step=Node.Step.AGENT,
        failure_message="node-2's agent did not check in within 3 minutes.",
        machines=True,
    )
    event = EventFactory(
        cluster=cluster,
        node=cluster.nodes.get(index=2),
        step=Node.Step.AGENT,
        reason=Event.Reason.AGENT_TIMEOUT,
        message="node-2's agent did not check in within 3 minutes. The cluster failed.",
    )
    return cluster, event


def test_it_sends_the_ready_email_once_with_how_to_connect_to_node_0(owner):
    gateway = LocationFactory(ssh_gateway="gw.us-east-2.runcrate.net:22")
    cluster = ready_cluster(owner, machine_type=MachineTypeFactory(location=gateway))
    event = EventFactory(cluster=cluster, reason=Event.Reason.READY, message="Ready.")

    assert send_pending_cluster_emails() == 1
    assert send_pending_cluster_emails() == 0

    assert len(mail.outbox) == 1
    message = mail.outbox[0]
    assert message.to == ["owner@example.com"]
    assert message.subject == "Cluster train is ready"
    assert f"ssh -J c{cluster.pk}@gw.us-east-2.runcrate.net:22 root@node-0" in message.body
    assert f"https://runcrate.example/clusters/{cluster.pk}/" in message.body
    html = message.alternatives[0][0]
    assert f"c{cluster.pk}@gw.us-east-2.runcrate.net:22 root@node-0" in html
    event.refresh_from_db()
    assert event.emailed_at is not None


def test_it_names_the_node_step_and_reason_in_the_failed_email(owner):
    cluster, _ = failed_cluster(owner)

    assert send_pending_cluster_emails() == 1

    message = mail.outbox[0]
    assert message.subject == "Cluster train failed to start (node-2, agent check-in)"
    assert "Machine: node-2" in message.body
    assert "Step:    agent check-in" in message.body
    assert "Reason:  agent_timeout" in message.body
    assert "did not check in within 3 minutes" in message.body
    assert "nothing was billed" in message.body
    assert f"https://runcrate.example/clusters/{cluster.pk}/" in message.body


def test_it_sends_the_degraded_email_with_retry_and_terminate_links(owner):
    cluster = ready_cluster(
        owner,
        status=Cluster.Status.DEGRADED,
        software=Cluster.Software.SLURM,
        ready_at=None,
        failure_reason=Event.Reason.INSTALL_FAILED,
        failure_node="node-1",
        failure_step=Node.Step.INSTALL,
        failure_message="sinfo shows node-1 down.",
    )
    EventFactory(
        cluster=cluster,
        node=cluster.nodes.get(index=1),
        step=Node.Step.INSTALL,
        reason=Event.Reason.INSTALL_FAILED,
        message="Installing Slurm failed on node-1.",
    )

    assert send_pending_cluster_emails() == 1

    message = mail.outbox[0]
    assert message.subject == "Cluster train is degraded: Slurm did not install"
    assert "Machine: node-1" in message.body and "sinfo shows node-1 down." in message.body
    assert f"https://runcrate.example/clusters/{cluster.pk}/terminate/" in message.body
    assert "billed at $40.00 per hour" in message.body


def test_it_tells_the_owner_when_a_volume_could_not_be_synced_back(owner):
    cluster = ready_cluster(owner, status=Cluster.Status.TERMINATED)
    EventFactory(
        cluster=cluster,
        node=cluster.nodes.get(index=0),
        reason=Event.Reason.VOLUME_SYNC_FAILED,
        message="Volume data could not be synced back from /shared/volume on node-0 (refused).",
    )

    assert send_pending_cluster_emails() == 1

    message = mail.outbox[0]
    assert message.subject == "Cluster train: a volume could not be synced back"
    assert "Volume data could not be synced back from /shared/volume on node-0" in message.body
    assert "cluster started, whole: nothing of them was lost" in message.body
    assert message.alternatives  # and its HTML part


def test_it_sends_nothing_for_progress_events(owner):
    cluster = ready_cluster(owner)
    for reason in (Event.Reason.CREATED, Event.Reason.MACHINE_RUNNING, Event.Reason.JOINED):
        EventFactory(cluster=cluster, reason=reason)

    assert send_pending_cluster_emails() == 0
    assert mail.outbox == []


def test_it_never_sends_twice_when_two_workers_hold_the_same_pending_event(owner):
    _, event = failed_cluster(owner)
    first_worker_copy = Event.objects.get(pk=event.pk)
    second_worker_copy = Event.objects.get(pk=event.pk)

    sent = send_event_email(event=first_worker_copy) + send_event_email(event=second_worker_copy)

    assert sent == 1
    assert len(mail.outbox) == 1


def test_it_gives_the_claim_back_when_sending_fails_and_sends_on_the_next_run(owner, monkeypatch):
    _, event = failed_cluster(owner)

    def broken(**kwargs):
        raise ConnectionError("the mail server is down")

    monkeypatch.setattr(notifications, "send_templated", broken)
    assert send_pending_cluster_emails() == 0
    event.refresh_from_db()
    assert event.emailed_at is None

    monkeypatch.undo()
    assert send_pending_cluster_emails() == 1
    assert len(mail.outbox) == 1


def test_it_writes_to_the_project_owners_when_the_creator_is_gone(owner, teammate):
    cluster, _ = failed_cluster(owner)
    cluster.created_by = None
    cluster.save()

    send_pending_cluster_emails()

    assert mail.outbox[0].to == ["owner@example.com"]


def test_it_runs_from_the_celery_task_and_beat(settings):
    from config.celery import app

    assert "clusters.notifications" in settings.CELERY_IMPORTS
    entry = settings.CELERY_BEAT_SCHEDULE["cluster-emails"]
    assert entry["task"] == "clusters.notifications.send_cluster_emails_task"
    assert entry["task"] in app.tasks
