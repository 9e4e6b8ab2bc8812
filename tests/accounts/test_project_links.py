"""A project's email links act in that project (runcrate/emails.py `project_url`,
accounts/middleware.py): a member of several projects who chose another in the top bar lands in
the email's project, not on a 404; a link naming a project they are not in changes nothing."""

import re

import pytest
from django.core import mail

from accounts.models import Membership
from accounts.projects import SESSION_KEY, create_project
from clusters.models import Event
from clusters.notifications import send_pending_cluster_emails
from tests.clusters.test_emails import ready_cluster
from tests.factories import EventFactory


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def test_a_cluster_emails_link_opens_the_cluster_whatever_project_the_reader_chose(owner):
    cluster = ready_cluster(owner)
    EventFactory(cluster=cluster, reason=Event.Reason.READY, message="Ready.")
    other = create_project(owner=owner.user, name="Side project")
    client = owner.browser_client()
    assert client.post("/accounts/project/", {"project": other.pk}).status_code == 302
    assert client.get(f"/clusters/{cluster.pk}/").status_code == 404  # acting in the other

    send_pending_cluster_emails()
    link = re.search(r"https?://[^/\s]+(/clusters/\d+/\?project=\d+)", mail.outbox[0].body)
    assert link, mail.outbox[0].body
    opened = client.get(link.group(1))

    assert opened.status_code == 200
    assert opened.context["cluster"] == cluster
    assert client.session[SESSION_KEY] == owner.project.pk  # switched, as the top bar would
    assert client.get(f"/clusters/{cluster.pk}/").status_code == 200


def test_a_link_naming_a_project_the_reader_is_not_in_changes_nothing(owner, stranger):
    theirs = ready_cluster(stranger, created_by=stranger.user)
    client = owner.browser_client()

    answer = client.get(f"/clusters/{theirs.pk}/?project={stranger.project.pk}")
    bad = client.get("/clusters/?project=not-a-number")

    assert answer.status_code == 404
    assert SESSION_KEY not in client.session
    assert bad.status_code == 200
    assert not Membership.objects.filter(user=owner.user, project=stranger.project).exists()
