"""Who is told about a cluster (accounts/recipients.py, docs/notifications.md "Who is told"):
members only, read when the email goes out. A member removed from the project hears nothing
more about the clusters they created (a cluster's email carries every node's SSH command); the
owners are told instead. Each path that picks recipients asks the same rule."""

from datetime import timedelta

import pytest
from django.core import mail
from django.utils import timezone

from accounts.models import Membership
from clusters.lifecycle.stops import send_stop_emails
from clusters.models import Cluster, Event, Node
from clusters.notifications import send_pending_cluster_emails
from notifications import delivery
from notifications.endpoints import create_endpoint
from tests.conftest import _person
from tests.factories import ClusterFactory

Reason = Event.Reason
# One event of each kind of cluster email (Event.notification).
EMAILS = {
    "ready": Reason.READY,
    "idle": Reason.GPUS_IDLE,
    "lost": Reason.MACHINE_LOST,
    "unhealthy": Reason.NODE_UNHEALTHY,
    "volume": Reason.VOLUME_SYNC_FAILED,
}


def their_cluster(person) -> Cluster:
    return ClusterFactory(
        project=person.project,
        created_by=person.user,
        status=Cluster.Status.READY,
        ready_at=timezone.now(),
        machines=True,
        machines__status=Node.Status.JOINED,
        machines__step=Node.Step.DONE,
    )


def removed(person) -> None:
    Membership.objects.filter(user=person.user, project=person.project).delete()


@pytest.mark.parametrize("kind", sorted(EMAILS))
def test_a_removed_member_gets_no_cluster_email_the_owners_do(owner, teammate, kind):
    cluster = their_cluster(teammate)
    removed(teammate)
    event = Event.objects.create(cluster=cluster, reason=EMAILS[kind], message="Something.")
    assert event.notification == kind

    assert send_pending_cluster_emails() == 1

    [email] = mail.outbox
    assert email.to == [owner.user.email]


def test_a_member_still_in_the_project_is_told_about_their_cluster(owner, teammate):
    cluster = their_cluster(teammate)
    Event.objects.create(cluster=cluster, reason=Reason.READY, message="All ready.")

    send_pending_cluster_emails()

    [email] = mail.outbox
    assert email.to == [teammate.user.email]


def test_a_removed_member_gets_no_stop_email(owner, teammate):
    cluster = their_cluster(teammate)
    stayed = _person("stayed@example.com", project=owner.project)
    kept = their_cluster(stayed)
    removed(teammate)
    for stopped in (cluster, kept):
        Event.objects.create(cluster=stopped, reason=Reason.STOPPED_BALANCE, message="Stopped.")

    assert send_stop_emails() == 1

    [email] = mail.outbox
    assert sorted(email.to) == ["owner@example.com", "stayed@example.com"]


def test_a_removed_member_gets_no_switched_off_email(
    owner, teammate, settings, django_capture_on_commit_callbacks
):
    settings.DEBUG, settings.RUNCRATE_WEBHOOKS_ALLOW_PRIVATE = True, True  # a 127.0.0.1 URL
    endpoint = create_endpoint(
        project=owner.project,
        user=teammate.user,
        url="http://127.0.0.1:9/hooks",
        events=["cluster.ready"],
    )
    removed(teammate)
    endpoint.failing_since = timezone.now() - timedelta(days=4)
    endpoint.save(update_fields=["failing_since"])

    with django_capture_on_commit_callbacks(execute=True):
        assert delivery.switch_off_failing(now=timezone.now()) == [endpoint.pk]

    assert [message.to for message in mail.outbox] == [[owner.user.email]]
