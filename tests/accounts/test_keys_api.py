"""POST, GET and DELETE /api/v1/keys: keys made, listed and revoked over the API, by a key with
every scope and no limits only; another project's key is a 404."""

from decimal import Decimal

import pytest
from django.test import Client

from accounts import keys
from accounts.models import ApiKey, hash_api_key

URL = "/api/v1/keys"


def bearer(raw: str) -> Client:
    return Client(headers={"authorization": f"Bearer {raw}"})


def create(client, **body):
    return client.post(URL, {"name": "agent", **body}, content_type="application/json")


def test_it_creates_a_narrowed_key_and_shows_it_once(owner):
    response = create(
        owner.api(), scopes=["read", "create"], max_machines_per_cluster=4, max_usd_per_hour="10"
    )

    assert response.status_code == 201
    data = response.json()["data"]
    key = ApiKey.objects.get(pk=data["id"])
    assert key.project == owner.project and key.user == owner.user
    assert key.key_hash == hash_api_key(data["key"])
    assert key.granted_scopes == ["read", "create"]
    assert key.max_machines_per_cluster == 4 and key.max_usd_per_hour == Decimal("10.00")
    assert data["scopes"] == ["read", "create"]
    assert data["max_machines_per_cluster"] == 4
    assert data["max_usd_per_hour"] == "10.00"
    assert data["created_by"] == owner.user.email and data["revoked_at"] is None
    me = bearer(data["key"]).get("/api/v1/me").json()["data"]["api_key"]
    assert me["name"] == "agent" and me["scopes"] == ["read", "create"]
    assert me["max_usd_per_hour"] == "10.00"


def test_it_gives_every_scope_when_none_is_asked(owner):
    data = create(owner.api()).json()["data"]

    assert data["scopes"] == ["read", "create", "terminate", "billing"]
    assert data["max_machines_per_cluster"] is None and data["max_usd_per_hour"] is None


@pytest.mark.parametrize(
    ("body", "code", "named"),
    [
        ({"scopes": []}, "invalid_scope", "at least one scope"),
        ({"scopes": ["read", "admin"]}, "invalid_scope", "'admin'"),
        ({"max_machines_per_cluster": 0}, "invalid_limit", "machines per cluster"),
        ({"max_usd_per_hour": "0"}, "invalid_limit", "USD per hour"),
        ({"max_usd_per_hour": "10.005"}, "invalid_limit", "2 decimals"),
        ({"name": " "}, "invalid_name", "name"),
        ({"max_usd_per_hour": "lots"}, "invalid_request", "max_usd_per_hour"),
    ],
)
def test_it_refuses_bad_scopes_and_limits_clearly(owner, body, code, named):
    response = create(owner.api(), **body)

    assert response.status_code == 422
    error = response.json()["error"]
    assert error["code"] == code
    assert named in error["message"]
    assert ApiKey.objects.filter(project=owner.project).count() == 1


@pytest.mark.parametrize(
    "narrowing",
    [
        {"scopes": ["read", "create", "terminate"]},
        {"max_usd_per_hour": "100.00"},
        {"max_machines_per_cluster": 8},
    ],
)
def test_it_lets_only_a_full_key_manage_keys(owner, narrowing):
    _, raw = keys.issue_api_key(user=owner.user, project=owner.project, name="agent", **narrowing)
    agent = bearer(raw)
    full = ApiKey.objects.exclude(name="agent").get(project=owner.project)

    for response in (
        create(agent, name="wider"),
        agent.get(URL),
        agent.delete(f"{URL}/{full.pk}"),
    ):
        assert response.status_code == 403
        error = response.json()["error"]
        assert error["code"] == "scope_missing"
        assert "every scope" in error["message"] and "no limits" in error["message"]
    full.refresh_from_db()
    assert full.is_active
    assert not ApiKey.objects.filter(name="wider").exists()


def test_it_lists_the_projects_keys_without_their_secrets(owner, teammate, stranger):
    keys.issue_api_key(user=owner.user, project=owner.project, name="agent", scopes=["read"])
    revoked, _ = keys.issue_api_key(user=owner.user, project=owner.project, name="old")
    keys.revoke_api_key(key=revoked)

    response = owner.api().get(URL)

    assert response.status_code == 200
    body = response.json()
    names = [key["name"] for key in body["data"]]
    assert sorted(names) == ["agent", "old", "test", "test"]  # the owner's and teammate's
    assert names[-1] == "old"  # working keys first
    assert body["meta"] == {"total": 4, "limit": 100, "offset": 0}
    assert all("key" not in key and "key_hash" not in key for key in body["data"])
    assert stranger.key not in response.content.decode()
    assert body["data"][-1]["revoked_at"] is not None


def test_it_revokes_a_key_at_once(owner):
    key, raw = keys.issue_api_key(user=owner.user, project=owner.project, name="agent")
    assert bearer(raw).get("/api/v1/me").status_code == 200

    response = owner.api().delete(f"{URL}/{key.pk}")

    assert response.status_code == 204
    key.refresh_from_db()
    assert key.revoked_at is not None
    refused = bearer(raw).get("/api/v1/me")
    assert refused.status_code == 401
    assert refused.json()["error"]["code"] == "unauthenticated"
    assert owner.api().delete(f"{URL}/{key.pk}").status_code == 204  # already revoked: the same


def test_it_answers_404_for_a_strangers_key(owner, stranger):
    theirs = ApiKey.objects.get(project=stranger.project)

    response = owner.api().delete(f"{URL}/{theirs.pk}")

    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"
    theirs.refresh_from_db()
    assert theirs.is_active
    assert stranger.api().get("/api/v1/me").status_code == 200


def test_it_lists_keys_in_a_fixed_number_of_queries(owner, django_assert_num_queries):
    for index in range(5):
        keys.issue_api_key(user=owner.user, project=owner.project, name=f"key-{index}")
    client = owner.api()
    client.get(URL)  # last_used_at written and the key kept: the next call finds it cached

    # The page (users joined) and the count.
    with django_assert_num_queries(2):
        assert client.get(URL).status_code == 200
