"""runcrate/api.py's bearer authentication, through the accounts endpoints."""

from datetime import timedelta

import time_machine
from django.test import Client
from django.utils import timezone

from accounts.keys import revoke_api_key
from accounts.models import ApiKey

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
