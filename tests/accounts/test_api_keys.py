"""API keys on the account page: created with a name, shown once, kept as a hash, revoked."""

import re

import time_machine
from django.utils import timezone

from accounts.models import ApiKey, hash_api_key

KEY = re.compile(r"rc_live_[A-Za-z0-9_-]{43}")


def _create(client, name="laptop CLI", **headers):
    return client.post("/accounts/api-keys/", {"name": name}, headers=headers)


def test_it_shows_the_new_key_once_and_keeps_only_its_hash(owner):
    client = owner.browser_client()

    response = _create(client)

    assert response.status_code == 200
    assert "no-store" in response["Cache-Control"]
    raw = KEY.search(response.content.decode()).group()
    key = ApiKey.objects.get(name="laptop CLI")
    assert key.project == owner.project
    assert key.user == owner.user
    assert key.key_hash == hash_api_key(raw)
    assert key.prefix == raw[:12]
    assert raw not in "".join(str(value) for value in ApiKey.objects.values_list())
    later = client.get("/accounts/").content.decode()
    assert raw not in later
    assert f"{key.prefix}…" in later


def test_it_answers_htmx_with_the_keys_section_only(owner):
    response = _create(owner.browser_client(), hx_request="true")

    content = response.content.decode()
    assert content.lstrip().startswith('<section id="api-keys"')
    assert KEY.search(content)
    assert "<html" not in content


def test_it_makes_keys_that_work_as_bearer_tokens(owner, client):
    raw = KEY.search(_create(owner.browser_client()).content.decode()).group()

    response = client.get("/api/v1/me", headers={"authorization": f"Bearer {raw}"})

    assert response.status_code == 200
    assert response.json()["data"]["email"] == owner.user.email
    assert response.json()["data"]["api_key"]["name"] == "laptop CLI"


def test_it_refuses_a_key_without_a_name(owner):
    response = _create(owner.browser_client(), name="  ")

    assert "This field is required." in response.content.decode()
    assert not KEY.search(response.content.decode())
    assert ApiKey.objects.filter(project=owner.project).count() == 1  # the fixture's key


def test_it_lists_name_prefix_created_and_last_used(owner):
    key = ApiKey.objects.get(project=owner.project)

    content = owner.browser_client().get("/accounts/").content.decode()
    assert key.name in content
    assert f"{key.prefix}…" in content
    assert "never" in content

    ApiKey.objects.filter(pk=key.pk).update(last_used_at=timezone.now())
    content = owner.browser_client().get("/accounts/").content.decode()
    assert "never" not in content
    assert "now" in content


def test_it_asks_before_revoking_without_javascript(owner):
    key = ApiKey.objects.get(project=owner.project)

    response = owner.browser_client().get(f"/accounts/api-keys/{key.pk}/revoke/")

    assert response.status_code == 200
    assert f"Revoke the API key &#x27;{key.name}&#x27;?" in response.content.decode()
    key.refresh_from_db()
    assert key.is_active


def test_it_revokes_a_key_and_the_api_refuses_it_from_then_on(owner):
    key = ApiKey.objects.get(project=owner.project)
    assert owner.api().get("/api/v1/me").status_code == 200

    with time_machine.travel("2030-01-02 03:04:05Z", tick=False):
        response = owner.browser_client().post(f"/accounts/api-keys/{key.pk}/revoke/")

    assert response["Location"] == "/accounts/#api-keys"
    key.refresh_from_db()
    assert key.revoked_at.isoformat() == "2030-01-02T03:04:05+00:00"
    refused = owner.api().get("/api/v1/me")
    assert refused.status_code == 401
    assert refused.json()["error"]["code"] == "unauthenticated"
    assert "revoked" in owner.browser_client().get("/accounts/").content.decode()


def test_it_keeps_the_first_revocation_time(owner):
    key = ApiKey.objects.get(project=owner.project)
    with time_machine.travel("2030-01-02 03:04:05Z", tick=False):
        client = owner.browser_client()
        client.post(f"/accounts/api-keys/{key.pk}/revoke/")

    with time_machine.travel("2030-01-05 00:00:00Z", tick=False):
        client.post(f"/accounts/api-keys/{key.pk}/revoke/", headers={"hx-request": "true"})

    key.refresh_from_db()
    assert key.revoked_at.isoformat() == "2030-01-02T03:04:05+00:00"


def test_it_answers_an_htmx_revoke_with_the_keys_section(owner):
    key = ApiKey.objects.get(project=owner.project)

    response = owner.browser_client().post(
        f"/accounts/api-keys/{key.pk}/revoke/", headers={"hx-request": "true"}
    )

    content = response.content.decode()
    assert content.lstrip().startswith('<section id="api-keys"')
    assert f"API key &#x27;{key.name}&#x27; revoked." in content


def test_it_lists_a_teammates_key_with_who_made_it(owner, teammate):
    content = owner.browser_client().get("/accounts/").content.decode()

    assert "by teammate@example.com" in content


def test_it_sets_scopes_and_limits_from_the_account_page(owner):
    client = owner.browser_client()
    page = client.get("/accounts/").content.decode()
    assert 'name="scopes" value="billing"' in page and 'name="max_usd_per_hour"' in page
    assert "csrfmiddlewaretoken" in page

    response = client.post(
        "/accounts/api-keys/",
        {
            "name": "agent",
            "access": "scoped",
            "scopes": ["read", "create"],
            "max_machines_per_cluster": "4",
            "max_usd_per_hour": "10",
        },
    )

    assert response.status_code == 200
    key = ApiKey.objects.get(name="agent")
    assert key.granted_scopes == ["read", "create"]
    assert key.max_machines_per_cluster == 4 and str(key.max_usd_per_hour) == "10.00"
    assert KEY.search(response.content.decode())
    listed = client.get("/accounts/").content.decode()
    assert "≤ 4 machines per cluster" in listed and "≤ $10.00 per hour" in listed


def test_it_refuses_a_narrowed_key_without_scopes_or_with_a_bad_limit(owner):
    client = owner.browser_client()

    no_scope = client.post("/accounts/api-keys/", {"name": "agent", "access": "scoped"})
    bad_limit = client.post(
        "/accounts/api-keys/",
        {"name": "agent", "max_usd_per_hour": "-5"},
        headers={"hx-request": "true"},
    )

    assert "Give the key at least one scope" in no_scope.content.decode()
    assert "The most USD per hour is more than 0" in bad_limit.content.decode()
    assert not KEY.search(no_scope.content.decode() + bad_limit.content.decode())
    assert not ApiKey.objects.filter(name="agent").exists()


def test_the_account_page_links_the_api_docs_that_are_served(owner):
    client = owner.browser_client()
    html = client.get("/accounts/").content.decode()
    assert '<a href="/api/v1/docs">API docs</a>' in html
    assert '<a href="/api/v1/openapi.json">OpenAPI schema</a>' in html
    assert client.get("/api/v1/docs").status_code == 200
