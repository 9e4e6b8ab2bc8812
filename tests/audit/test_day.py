"""The audit log read as the owner after a scripted day (issue 37): an invitation, a join, a
role change, an API key created and revoked, a cluster created, a worker added, a terminate, a
failed two-factor code and a budget change: each once, with who, the words, the object and what
changed. And the sign-ins: a wrong password and a right one."""

import re
from decimal import Decimal

import pytest
from django.core import mail
from django.test import Client
from django.utils import timezone
from django_otp.plugins.otp_totp.models import TOTPDevice

from accounts.models import ApiKey, Membership
from audit.models import Entry
from clusters import lifecycle
from clusters.models import Cluster, Node
from offers.models import Location
from tests.clusters.front import credit, machine_type_with_hosts, ssh_key
from tests.factories import LocationFactory, UserFactory

JSON = "application/json"
PASSWORD = "correct-horse-battery"


@pytest.fixture(autouse=True)
def _work_in_memory():
    with lifecycle.dispatching_to(lifecycle.CollectingDispatcher()) as dispatcher:
        yield dispatcher


@pytest.fixture
def offer(owner):
    ssh_key(owner.project)
    credit(owner.project, "5000.00")
    location: Location = LocationFactory(code="us-east-2", name="Columbus, Ohio")
    return machine_type_with_hosts(
        free=6, slug="use2-h100x8-vm", price_per_hour=Decimal("1.00"), location=location
    )


def _invite_and_join(owner, django_capture_on_commit_callbacks) -> Membership:
    with django_capture_on_commit_callbacks(execute=True):
        response = owner.api().post(
            "/api/v1/members", {"email": "dev@example.com", "role": "developer"}, JSON
        )
    assert response.status_code == 201, response.content
    link = re.search(r"(/accounts/invitations/[^/\s]+/)", mail.outbox[-1].body).group(1)
    invitee = Client()
    invitee.force_login(UserFactory(email="dev@example.com"))
    assert invitee.post(link).status_code == 302
    return Membership.objects.get(project=owner.project, user__email="dev@example.com")


def _cluster_day(owner) -> Cluster:
    api = owner.api()
    body = {"name": "devs", "offer_id": "use2-h100x8-vm", "nodes": 2, "software": "slurm"}
    response = api.post("/api/v1/clusters", body, JSON)
    assert response.status_code == 201, response.content
    cluster = Cluster.objects.get(name="devs")
    now = timezone.now()  # it came up: ready, every machine joined
    Cluster.objects.filter(pk=cluster.pk).update(
        status=Cluster.Status.READY, joined_at=now, ready_at=now
    )
    cluster.nodes.update(status=Node.Status.JOINED)
    response = api.post(f"/api/v1/clusters/{cluster.pk}/workers", {"count": 1}, JSON)
    assert response.status_code == 202, response.content
    assert api.post(f"/api/v1/clusters/{cluster.pk}/terminate").status_code == 202
    return cluster


def test_the_owners_log_after_a_day_has_every_action_once_in_words(
    owner, offer, django_capture_on_commit_callbacks
):
    membership = _invite_and_join(owner, django_capture_on_commit_callbacks)
    api, browser = owner.api(), owner.browser_client()
    response = api.patch(f"/api/v1/members/{membership.pk}", {"role": "manager"}, JSON)
    assert response.status_code == 200
    assert api.post("/api/v1/keys", {"name": "ci"}, JSON).status_code == 201
    ci = ApiKey.objects.get(name="ci")
    assert api.delete(f"/api/v1/keys/{ci.pk}").status_code == 204
    cluster = _cluster_day(owner)
    TOTPDevice.objects.create(user=owner.user, name="authenticator", confirmed=True)
    wrong = browser.post("/accounts/security/turn-off/", {"code": "000000"})
    assert wrong.status_code == 200 and TOTPDevice.objects.filter(user=owner.user).exists()
    budget = {"amount": "750.00"}
    assert api.put("/api/v1/environments/default/budget", budget, JSON).status_code == 200

    listed = owner.api().get("/api/v1/audit?limit=100").json()["data"]
    day = [(e["actor"], e["user"], e["summary"], e["object_name"], e["changes"]) for e in listed]
    owner_email, role = owner.user.email, {"role": {"before": None, "after": "developer"}}
    assert day[::-1] == [
        ("api_key", owner_email, "invited dev@example.com as developer", "dev@example.com", role),
        (
            "user",
            "dev@example.com",
            f"joined the project as developer (invited by {owner_email})",
            "dev@example.com",
            role,
        ),
        (
            "api_key",
            owner_email,
            "changed the role of dev@example.com to manager",
            "dev@example.com",
            {"role": {"before": "developer", "after": "manager"}},
        ),
        (
            "api_key",
            owner_email,
            "created API key `ci`",
            "ci",
            {"scopes": {"before": None, "after": sorted(ci.scopes)}},
        ),
        (
            "api_key",
            owner_email,
            "revoked API key `ci`",
            "ci",
            {"revoked": {"before": False, "after": True}},
        ),
        (
            "api_key",
            owner_email,
            f"created cluster `devs` (2 × 8×{offer.gpu.name}, Slurm) in Columbus, Ohio",
            "devs",
            {},
        ),
        (
            "api_key",
            owner_email,
            "added 1 worker to cluster `devs` (node-2)",
            "devs",
            {"machines": {"before": 2, "after": 3}},
        ),
        (
            "api_key",
            owner_email,
            "terminated cluster `devs`",
            "devs",
            {"status": {"before": "ready", "after": "terminating"}},
        ),
        ("user", owner_email, "failed a two-factor code", owner_email, {}),
        (
            "api_key",
            owner_email,
            "set the monthly budget of `default` to $750.00",
            "default",
            {"monthly_budget": {"before": None, "after": "750.00"}},
        ),
    ]
    outcomes = {e["summary"]: e["outcome"] for e in listed}
    assert outcomes["failed a two-factor code"] == "refused"
    assert set(outcomes.values()) == {"done", "refused"}
    # Every cluster entry names the cluster by id too, so the filter finds the day's three.
    by_cluster = api.get(f"/api/v1/audit?cluster={cluster.pk}").json()["data"]
    assert len(by_cluster) == 3
    # The page says the same, the cluster a link while it exists.
    page = browser.get("/audit/").content.decode()
    assert "revoked API key <code>ci</code>" in page
    assert f'<a href="/clusters/{cluster.pk}/">devs</a>' in page
    assert "<strong>role</strong>: developer → manager" in page


def test_a_wrong_password_and_a_sign_in_are_in_the_projects_log(owner):
    visitor = Client()
    wrong = visitor.post("/accounts/login/", {"username": owner.user.email, "password": "nope"})
    right = visitor.post("/accounts/login/", {"username": owner.user.email, "password": PASSWORD})

    assert (wrong.status_code, right.status_code) == (200, 302)
    entries = list(Entry.objects.filter(project=owner.project).order_by("pk"))
    assert [(e.summary, e.result, e.user, e.ip) for e in entries] == [
        ("failed to sign in (wrong password)", "refused", owner.user, "127.0.0.1"),
        ("signed in", "done", owner.user, "127.0.0.1"),
    ]


def test_a_member_removed_and_an_invitation_withdrawn_are_recorded(owner, teammate):
    membership = Membership.objects.get(user=teammate.user)

    assert owner.api().delete(f"/api/v1/members/{membership.pk}").status_code == 204

    entry = Entry.objects.get()
    assert (entry.summary, entry.object_name, entry.changes) == (
        f"removed {teammate.user.email}",
        teammate.user.email,
        {"role": {"before": "developer", "after": None}},
    )
