"""runcrate/api.py's bearer authentication, through the accounts endpoints."""

from datetime import timedelta

import time_machine
from django.core.cache import cache
from django.test import Client
from django.utils import timezone

from accounts.keys import revoke_api_key
from accounts.models import ApiKey, Membership
from tests.factories import ClusterFactory

UNAUTHENTICATED = "unauthenticated"


def _assert_unauthenticated(response):
    assert response.status_code == 401
    body = response.json()
    assert set(body) == {"error"}
    assert body["error"]["code"] == UNAUTHENTICATED
    assert "Bearer" in body["error"]["message"]


def test_it_answers_who_the_key_belongs_to(owner):
    response = owner.api().get("/api/v1/me")

    assert response.status_code == 200
    data = response.json()["data"]
    assert data["email"] == owner.user.email
    assert data["project"] == {
        "id": owner.project.pk,
        "name": owner.project.name,
        "environments": ["default"],
    }
    assert data["api_key"]["prefix"].startswith("rc_live_")


def test_it_refuses_a_request_without_a_key(db):
    _assert_unauthenticated(Client().get("/api/v1/ssh-keys"))


def test_it_refuses_an_unknown_or_malformed_key(owner):
    for token in ("rc_live_" + "x" * 43, owner.key[:-1], "sk_live_whatever", ""):
        _assert_unauthenticated(
            Client(headers={"authorization": f"Bearer {token}"}).get("/api/v1/ssh-keys")
        )


def test_it_refuses_a_revoked_key(owner):
    revoke_api_key(key=ApiKey.objects.get(project=owner.project))

    _assert_unauthenticated(owner.api().get("/api/v1/ssh-keys"))


def test_it_refuses_the_key_of_a_deactivated_user(owner):
    owner.user.is_active = False
    owner.user.save()

    _assert_unauthenticated(owner.api().get("/api/v1/me"))


def test_it_does_not_accept_a_browser_session_for_the_api(owner):
    _assert_unauthenticated(owner.browser_client().get("/api/v1/me"))


def test_it_records_when_a_key_was_last_used_to_the_minute(owner):
    key = ApiKey.objects.get(project=owner.project)
    start = timezone.now()
    with time_machine.travel(start, tick=False):
        owner.api().get("/api/v1/me")
    key.refresh_from_db()
    assert key.last_used_at == start

    with time_machine.travel(start + timedelta(seconds=30), tick=False):
        owner.api().get("/api/v1/me")
    key.refresh_from_db()
    assert key.last_used_at == start, "within a minute, a read stays a read"

    with time_machine.travel(start + timedelta(minutes=2), tick=False):
        owner.api().get("/api/v1/me")
    key.refresh_from_db()
    assert key.last_used_at == start + timedelta(minutes=2)


def test_it_keeps_a_failed_authentication_from_touching_any_key(owner):
    Client(headers={"authorization": "Bearer rc_live_unknown"}).get("/api/v1/me")

    assert ApiKey.objects.get(project=owner.project).last_used_at is None


def test_it_refuses_the_key_of_a_user_removed_from_the_project(owner, teammate):
    api = teammate.api()
    assert api.get("/api/v1/me").status_code == 200

    Membership.objects.filter(project=owner.project, user=teammate.user).delete()
    response = api.get("/api/v1/clusters")

    assert response.status_code == 401
    error = response.json()["error"]
    assert error["code"] == UNAUTHENTICATED
    assert "teammate@example.com's, who is no longer a member of the project" in error["message"]
    assert owner.api().get("/api/v1/me").status_code == 200


def test_it_refuses_a_key_for_a_project_its_user_left_for_another(owner, teammate, stranger):
    # Still a member somewhere else: the key was made for the project the user left.
    Membership.objects.create(project=stranger.project, user=teammate.user)
    Membership.objects.filter(project=owner.project, user=teammate.user).delete()

    assert teammate.api().get("/api/v1/me").status_code == 401


def test_it_shows_a_removed_member_none_of_the_projects_pages(owner, teammate):
    cluster = ClusterFactory(project=owner.project, name="shared-work")
    browser = teammate.browser_client()
    assert browser.get(f"/clusters/{cluster.pk}/").status_code == 200

    Membership.objects.filter(project=owner.project, user=teammate.user).delete()

    assert browser.get(f"/clusters/{cluster.pk}/").status_code == 404
    # In no project at all: a 404 that says so, never an error page.
    for path in ("/clusters/", "/storage/", "/billing/", "/billing/environments/"):
        response = browser.get(path)
        assert response.status_code == 404, path
    assert browser.get("/accounts/").status_code == 200  # the password and log-out stay


def test_it_checks_the_membership_in_the_query_that_finds_the_key(
    teammate, django_assert_num_queries
):
    api = teammate.api()
    api.get("/api/v1/me")  # last_used_at written: later calls within the minute only read
    cache.clear()  # the key is looked up again, not found in the cache

    with django_assert_num_queries(2):  # the key (with its membership), the environments
        assert api.get("/api/v1/me").status_code == 200


def test_a_call_that_also_brings_a_session_acts_with_the_key_s_role(owner, teammate):
    """A browser's session cookie beside a bearer key: the page's context (the session user's
    project and role) is dropped, so the role asked is the key's user's, read from the row."""
    from django.test import RequestFactory

    from accounts import permissions
    from accounts.api_auth import ApiKeyAuth
    from accounts.projects import context_for

    request = RequestFactory().get("/api/v1/me")
    request.user = owner.user
    request.project_context = context_for(owner.user)
    request.project = request.project_context.project

    ApiKeyAuth("read").authenticate(request, teammate.key)

    assert request.project_context is None and request.user == teammate.user
    assert permissions.request_role(request) == Membership.Role.DEVELOPER
