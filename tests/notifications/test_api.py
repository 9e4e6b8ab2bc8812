"""`/api/v1/webhooks`: add (the secret once), list, remove, test, the delivery log; within the
key's project, with the scopes of the rest of the API, and refusals as 422 with a code."""

import json

import pytest

from accounts.models import ApiKey, Membership
from notifications.models import Delivery, Endpoint
from notifications.signing import verify
from tests.factories import issue_key


def _post(person, **payload):
    return person.api().post("/api/v1/webhooks", payload, content_type="application/json")


@pytest.fixture
def production(settings):
    settings.DEBUG = False
    settings.RUNCRATE_WEBHOOKS_ALLOW_PRIVATE = True
    return settings


def test_it_adds_a_webhook_and_answers_the_secret_once(owner, production):
    response = _post(owner, url="https://127.0.0.1/hook", events=["cluster.ready"])

    assert response.status_code == 201
    data = response.json()["data"]
    endpoint = Endpoint.objects.get(project=owner.project)
    assert data["id"] == endpoint.pk
    assert data["kind"] == "webhook"
    assert data["events"] == ["cluster.ready"]
    assert data["active"] is True
    assert data["secret"] == endpoint.secret and endpoint.secret.startswith("whsec_")
    assert endpoint.created_by == owner.user

    listed = owner.api().get("/api/v1/webhooks").json()
    assert [row["id"] for row in listed["data"]] == [endpoint.pk]
    assert "secret" not in listed["data"][0]
    assert listed["meta"]["total"] == 1


def test_a_slack_channel_has_no_secret_to_show(owner, production):
    response = _post(
        owner, url="https://127.0.0.1/services/T/B/x", events=["cluster.failed"], kind="slack"
    )

    assert response.status_code == 201
    assert response.json()["data"]["secret"] is None


@pytest.mark.parametrize(
    ("payload", "code"),
    [
        ({"url": "https://127.0.0.1/h", "events": []}, "invalid_events"),
        ({"url": "https://127.0.0.1/h", "events": ["cluster.exploded"]}, "invalid_events"),
        (
            {"url": "https://127.0.0.1/h", "events": ["cluster.ready"], "kind": "sms"},
            "invalid_kind",
        ),
        ({"url": "http://127.0.0.1/h", "events": ["cluster.ready"]}, "url_not_https"),
        ({"url": "not a url", "events": ["cluster.ready"]}, "invalid_url"),
    ],
)
def test_it_refuses_what_it_cannot_send_with_422_and_changes_nothing(
    owner, production, payload, code
):
    response = _post(owner, **payload)

    assert response.status_code == 422
    assert response.json()["error"]["code"] == code
    assert not Endpoint.objects.exists()


@pytest.mark.parametrize("kind", ["webhook", "slack"])
@pytest.mark.parametrize(
    "address", ["2002:a9fe:a9fe::1", "2001:0:4136:e378:8000:63bf:5601:5601", "64:ff9b::a9fe:a9fe"]
)
def test_an_ipv6_form_carrying_an_ipv4_address_is_refused_for_webhook_and_slack(
    owner, production, kind, address
):
    production.RUNCRATE_WEBHOOKS_ALLOW_PRIVATE = False

    response = _post(owner, url=f"https://[{address}]/x", events=["cluster.ready"], kind=kind)

    assert response.status_code == 422
    assert response.json()["error"]["code"] == "url_private"
    assert "6to4, Teredo, NAT64" in response.json()["error"]["message"]
    assert not Endpoint.objects.exists()


def test_it_refuses_a_private_address_without_the_setting(owner, production):
    production.RUNCRATE_WEBHOOKS_ALLOW_PRIVATE = False

    response = _post(owner, url="https://10.0.0.8/hook", events=["cluster.ready"])

    assert response.status_code == 422
    assert response.json()["error"]["code"] == "url_private"
    assert "10.0.0.8" in response.json()["error"]["message"]
    assert not Endpoint.objects.exists()


def test_it_sends_a_signed_test_ping_and_logs_it(owner, receiver, local_webhooks):
    endpoint_id = _post(owner, url=receiver.url, events=["cluster.ready"]).json()["data"]["id"]
    endpoint = Endpoint.objects.get(pk=endpoint_id)

    response = owner.api().post(f"/api/v1/webhooks/{endpoint_id}/test")

    assert response.status_code == 201
    data = response.json()["data"]
    assert (data["type"], data["state"], data["last_status_code"]) == ("ping", "delivered", 200)
    [got] = receiver.received
    assert json.loads(got.body)["type"] == "ping"
    verify(endpoint.secret, got.headers["x-runcrate-signature"], got.body)
    log = owner.api().get(f"/api/v1/webhooks/{endpoint_id}/deliveries").json()
    assert [row["id"] for row in log["data"]] == [data["id"]]
    assert [attempt["status_code"] for attempt in log["data"][0]["tries"]] == [200]


def test_the_log_costs_the_same_queries_for_more_deliveries(
    owner, production, django_assert_num_queries
):
    endpoint_id = _post(owner, url="https://127.0.0.1/h", events=["cluster.ready"]).json()["data"][
        "id"
    ]
    client = owner.api()
    url = f"/api/v1/webhooks/{endpoint_id}/deliveries"

    def add(count: int) -> None:
        for _ in range(count):
            Delivery.objects.create(endpoint_id=endpoint_id, event_type="ping", body={})

    add(1)
    client.get(url)  # the key is cached after its first use
    # The key maker's role (read on every call), the endpoint, the count, the page, the tries.
    with django_assert_num_queries(5) as few:
        assert client.get(url).status_code == 200
    add(9)
    with django_assert_num_queries(len(few.captured_queries)):
        assert len(client.get(url).json()["data"]) == 10


def test_it_removes_a_webhook(owner, production):
    endpoint_id = _post(owner, url="https://127.0.0.1/h", events=["cluster.ready"]).json()["data"][
        "id"
    ]

    response = owner.api().delete(f"/api/v1/webhooks/{endpoint_id}")

    assert response.status_code == 204
    assert not Endpoint.objects.exists()


def test_a_stranger_gets_404_for_another_projects_webhook(owner, stranger, production):
    endpoint_id = _post(owner, url="https://127.0.0.1/h", events=["cluster.ready"]).json()["data"][
        "id"
    ]
    client = stranger.api()

    answers = [
        client.delete(f"/api/v1/webhooks/{endpoint_id}"),
        client.post(f"/api/v1/webhooks/{endpoint_id}/test"),
        client.get(f"/api/v1/webhooks/{endpoint_id}/deliveries"),
    ]

    assert [answer.status_code for answer in answers] == [404, 404, 404]
    assert {answer.json()["error"]["code"] for answer in answers} == {"not_found"}
    assert client.get("/api/v1/webhooks").json()["data"] == []
    assert Endpoint.objects.filter(pk=endpoint_id).exists()
    assert not Delivery.objects.exists()


def test_a_read_only_key_may_list_but_not_add_or_remove(owner, production):
    endpoint_id = _post(owner, url="https://127.0.0.1/h", events=["cluster.ready"]).json()["data"][
        "id"
    ]
    raw = issue_key(user=owner.user, project=owner.project, name="reader")
    ApiKey.objects.filter(name="reader").update(scopes=["read"])
    reader = {"authorization": f"Bearer {raw}"}
    client = owner.api()

    assert client.get("/api/v1/webhooks", headers=reader).status_code == 200
    added = client.post(
        "/api/v1/webhooks",
        {"url": "https://127.0.0.1/x", "events": ["cluster.ready"]},
        content_type="application/json",
        headers=reader,
    )
    removed = client.delete(f"/api/v1/webhooks/{endpoint_id}", headers=reader)

    assert (added.status_code, removed.status_code) == (403, 403)
    assert added.json()["error"]["code"] == "scope_missing"
    assert Endpoint.objects.count() == 1


def test_the_schema_documents_the_webhooks(owner):
    schema = owner.api().get("/api/v1/openapi.json").json()

    assert {
        "/api/v1/webhooks",
        "/api/v1/webhooks/{webhook_id}",
        "/api/v1/webhooks/{webhook_id}/test",
        "/api/v1/webhooks/{webhook_id}/deliveries",
    } <= set(schema["paths"])


def test_a_test_that_succeeds_switches_a_switched_off_endpoint_on_again(
    owner, receiver, local_webhooks
):
    endpoint_id = _post(owner, url=receiver.url, events=["cluster.ready"]).json()["data"]["id"]
    Endpoint.objects.filter(pk=endpoint_id).update(active=False)
    client = owner.api()

    receiver.status = 500
    failed = client.post(f"/api/v1/webhooks/{endpoint_id}/test").json()["data"]
    assert (failed["state"], failed["last_status_code"]) == ("failed", 500)
    assert Endpoint.objects.get(pk=endpoint_id).active is False

    receiver.status = 200
    passed = client.post(f"/api/v1/webhooks/{endpoint_id}/test").json()["data"]
    assert passed["state"] == "delivered"
    assert Endpoint.objects.get(pk=endpoint_id).active is True
    assert len(receiver.received) == 2


def test_a_developers_key_gets_403_role_forbidden_and_changes_nothing(owner, teammate, production):
    endpoint_id = _post(owner, url="https://127.0.0.1/h", events=["cluster.ready"]).json()["data"][
        "id"
    ]
    client = teammate.api()

    answers = [
        client.get("/api/v1/webhooks"),
        _post(teammate, url="https://127.0.0.1/x", events=["cluster.ready"]),
        client.delete(f"/api/v1/webhooks/{endpoint_id}"),
        client.post(f"/api/v1/webhooks/{endpoint_id}/test"),
        client.get(f"/api/v1/webhooks/{endpoint_id}/deliveries"),
    ]

    assert [answer.status_code for answer in answers] == [403] * 5
    assert {answer.json()["error"]["code"] for answer in answers} == {"role_forbidden"}
    assert "Only an owner or a manager" in answers[0].json()["error"]["message"]
    assert list(Endpoint.objects.values_list("pk", flat=True)) == [endpoint_id]
    assert not Delivery.objects.exists()


def test_a_managers_key_manages_webhooks(owner, teammate, production):
    Membership.objects.filter(user=teammate.user).update(role=Membership.Role.MANAGER)

    added = _post(teammate, url="https://127.0.0.1/x", events=["cluster.ready"])
    listed = teammate.api().get("/api/v1/webhooks")

    assert added.status_code == 201
    assert [row["id"] for row in listed.json()["data"]] == [added.json()["data"]["id"]]
