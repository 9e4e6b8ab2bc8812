"""The dashboard's page of a project's channels, /notifications/: the list with each channel's
state, adding one (a webhook's secret shown once), a test, removing one, and each one's
delivery log; owners and managers only: a developer gets 403, a stranger's channel is 404."""

import json
from datetime import UTC, datetime, timedelta

import pytest
import time_machine

from accounts.models import Membership
from audit.models import Entry
from notifications import endpoints
from notifications.models import EVENT_TYPES, Attempt, Delivery, Endpoint
from notifications.views import NEW_ENDPOINT_SESSION_KEY

NOW = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
READY = ["cluster.ready"]


@pytest.fixture
def production(settings):
    """https only, as outside DEBUG, with the tests' receivers on 127.0.0.1 allowed."""
    settings.DEBUG = False
    settings.RUNCRATE_WEBHOOKS_ALLOW_PRIVATE = True
    return settings


def _endpoint(person, url: str = "https://127.0.0.1/hook", **fields) -> Endpoint:
    defaults = {"events": ["cluster.ready"], "created_by": person.user}
    return Endpoint.objects.create(project=person.project, url=url, **{**defaults, **fields})


def _delivery(endpoint: Endpoint, *, tries: list[tuple[int | None, str]] = (), **fields):
    delivery = Delivery.objects.create(
        endpoint=endpoint, event_type=fields.pop("event_type", "cluster.ready"), body={}, **fields
    )
    for minutes, (status_code, error) in enumerate(tries):
        Attempt.objects.create(
            delivery=delivery,
            at=delivery.created_at + timedelta(minutes=minutes),
            status_code=status_code,
            error=error,
        )
    return delivery


def test_it_lists_the_projects_channels_with_their_state(
    owner, stranger, django_assert_num_queries
):
    working = _endpoint(owner, events=["cluster.ready", "cluster.failed"])
    _delivery(working, created_at=NOW, tries=[(500, "answered 500"), (200, "")])
    failing = _endpoint(owner, "https://127.0.0.1/failing", failing_since=NOW)
    _delivery(failing, created_at=NOW, tries=[(None, "ConnectTimeout: timed out")])
    switched_off = _endpoint(owner, "https://127.0.0.1/off", active=False, failing_since=NOW)
    _endpoint(stranger, "https://127.0.0.1/theirs")
    client = owner.browser_client()
    client.get("/notifications/")  # warm the session

    # Session, user, the project with the user's role, the endpoints with their last success
    # and failure, the top bar's balance.
    with django_assert_num_queries(5):
        response = client.get("/notifications/")
    for index in range(5):
        more = _endpoint(owner, f"https://127.0.0.1/more-{index}")
        _delivery(more, created_at=NOW, tries=[(200, "")])
    with django_assert_num_queries(5):  # not one more for more channels or attempts
        client.get("/notifications/")

    assert response.status_code == 200
    shown = {endpoint.pk: endpoint for endpoint in response.context["endpoints"]}
    assert list(shown) == [working.pk, failing.pk, switched_off.pk]
    assert shown[working.pk].last_success_at == NOW + timedelta(minutes=1)
    assert shown[working.pk].last_failure_at == NOW
    assert (shown[failing.pk].last_success_at, shown[failing.pk].last_failure_at) == (None, NOW)
    body = response.content.decode()
    assert "https://127.0.0.1/failing" in body and "theirs" not in body
    assert "cluster.failed" in body
    assert "switched off at" in body and "2026-03-05 09:00:00" in body  # failing since + 3 days
    assert "Switched off after failing for 3 days" in body
    assert f'action="/notifications/{working.pk}/test/"' in body
    assert f'href="/notifications/{working.pk}/remove/"' in body
    assert f'href="/notifications/{working.pk}/"' in body


def test_it_says_what_channels_are_for_when_there_are_none(owner):
    response = owner.browser_client().get("/notifications/")

    body = response.content.decode()
    assert "No channels yet." in body
    for event_type in EVENT_TYPES:  # every event type is a checkbox of the form
        assert f'value="{event_type}"' in body


def test_it_shortens_a_long_url(owner):
    slack_token = "abcdefghijklmnopqrstuvwx"
    _endpoint(
        owner, f"https://hooks.slack.com/services/T0000000/B0000000/{slack_token}", kind="slack"
    )

    body = owner.browser_client().get("/notifications/").content.decode()

    assert "https://hooks.slack.com/services/T0000000/B0000000/abcdefgh…" in body
    assert "abcdefghi" not in body


def test_it_adds_a_webhook_and_shows_its_secret_once(owner, production):
    client = owner.browser_client()

    response = client.post(
        "/notifications/add/",
        {
            "kind": "webhook",
            "url": "https://127.0.0.1/hook",
            "events": ["cluster.ready", "billing.low_balance"],
        },
    )

    endpoint = Endpoint.objects.get(project=owner.project)
    assert (response.status_code, response["Location"]) == (302, "/notifications/")
    assert endpoint.kind == "webhook" and endpoint.created_by == owner.user
    assert endpoint.events == ["cluster.ready", "billing.low_balance"]
    assert endpoint.secret not in json.dumps(dict(client.session))  # only its id is kept there
    assert Entry.objects.get().action == "notifications:add"

    shown = client.get("/notifications/")
    assert shown.context["new_endpoint"] == endpoint
    assert endpoint.secret in shown.content.decode()
    assert "X-Runcrate-Signature" in shown.content.decode()
    assert "no-cache" in shown["Cache-Control"]
    assert "Signed webhook added" in shown.content.decode()

    reloaded = client.get("/notifications/")
    assert reloaded.context["new_endpoint"] is None
    assert endpoint.secret not in reloaded.content.decode()


def test_it_adds_a_slack_channel_with_no_secret_to_show(owner, production):
    client = owner.browser_client()

    response = client.post(
        "/notifications/add/",
        {"kind": "slack", "url": "https://127.0.0.1/services/T/B/x", "events": ["cluster.failed"]},
        follow=True,
    )

    endpoint = Endpoint.objects.get(project=owner.project)
    assert endpoint.kind == "slack" and endpoint.events == ["cluster.failed"]
    assert response.context["new_endpoint"] is None
    assert endpoint.secret not in response.content.decode()
    assert NEW_ENDPOINT_SESSION_KEY not in client.session


@pytest.mark.parametrize(
    ("payload", "field", "words"),
    [
        ({"url": "http://127.0.0.1/h", "events": ["cluster.ready"]}, "url", "must be https://"),
        ({"url": "not a url", "events": ["cluster.ready"]}, "url", "is not an http(s) URL"),
        ({"url": "", "events": ["cluster.ready"]}, "url", "1 to 2000 characters"),
        ({"url": "https://127.0.0.1/h"}, "events", "one or more of cluster.ready"),
        ({"url": "https://127.0.0.1/h", "events": ["cluster.exploded"]}, "events", "valid choice"),
        ({"url": "https://127.0.0.1/h", "events": READY, "kind": "sms"}, "kind", "valid choice"),
        ({"url": "https://127.0.0.1/h", "events": READY, "kind": ""}, "kind", "webhook or slack"),
    ],
)
def test_a_refused_channel_shows_why_on_its_field_and_creates_nothing(
    owner, production, payload, field, words
):
    response = owner.browser_client().post("/notifications/add/", {"kind": "webhook", **payload})

    assert response.status_code == 422
    errors = response.context["form"].errors
    assert list(errors) == [field]
    assert words in errors[field][0]
    assert words in response.content.decode()
    assert not Endpoint.objects.exists()


def test_a_private_address_is_refused_by_name(owner, production):
    production.RUNCRATE_WEBHOOKS_ALLOW_PRIVATE = False

    response = owner.browser_client().post(
        "/notifications/add/",
        {"kind": "webhook", "url": "https://10.0.0.8/hook", "events": ["cluster.ready"]},
    )

    assert response.status_code == 422
    assert "10.0.0.8" in response.context["form"].errors["url"][0]
    assert not Endpoint.objects.exists()


def test_the_21st_channel_is_refused_for_the_whole_form(owner, production):
    for index in range(endpoints.MAX_ENDPOINTS):
        _endpoint(owner, f"https://127.0.0.1/{index}")

    response = owner.browser_client().post(
        "/notifications/add/",
        {"kind": "webhook", "url": "https://127.0.0.1/one-more", "events": ["cluster.ready"]},
    )

    assert response.status_code == 422
    assert "at most 20 endpoints" in response.context["form"].non_field_errors()[0]
    assert Endpoint.objects.count() == endpoints.MAX_ENDPOINTS


def test_send_test_posts_a_signed_ping_and_shows_it_in_the_log(owner, receiver, local_webhooks):
    endpoint = _endpoint(owner, receiver.url)
    client = owner.browser_client()

    response = client.post(f"/notifications/{endpoint.pk}/test/", follow=True)

    assert response.redirect_chain == [(f"/notifications/{endpoint.pk}/", 302)]
    [got] = receiver.received
    assert json.loads(got.body)["type"] == "ping"
    ping = Delivery.objects.get(endpoint=endpoint)
    assert (ping.event_type, ping.state, ping.last_status_code) == ("ping", "delivered", 200)
    assert [delivery.pk for delivery in response.context["page"].object_list] == [ping.pk]
    assert "Test delivered: the endpoint answered 200." in response.content.decode()


def test_a_failed_test_says_why_and_is_retried(owner, receiver, local_webhooks):
    endpoint = _endpoint(owner, receiver.url)
    receiver.status = 503

    with time_machine.travel(NOW, tick=False):
        response = owner.browser_client().post(f"/notifications/{endpoint.pk}/test/", follow=True)

    ping = Delivery.objects.get(endpoint=endpoint)
    assert (ping.state, ping.attempts) == ("pending", 1)
    assert ping.next_try_at == NOW + timedelta(minutes=1)
    body = response.content.decode()
    assert "Test not delivered: answered 503." in body
    assert "Retrying" in body and "2026-03-02 09:01:00" in body


def test_remove_asks_first_then_removes_the_channel_and_its_log(owner, production):
    endpoint = _endpoint(owner)
    _delivery(endpoint, tries=[(200, "")])
    client = owner.browser_client()

    confirm = client.get(f"/notifications/{endpoint.pk}/remove/")
    assert confirm.status_code == 200
    assert f'<form method="post" action="/notifications/{endpoint.pk}/remove/"' in (
        confirm.content.decode()
    )
    assert Endpoint.objects.filter(pk=endpoint.pk).exists()  # a GET removes nothing

    response = client.post(f"/notifications/{endpoint.pk}/remove/", follow=True)

    assert response.redirect_chain == [("/notifications/", 302)]
    assert not Endpoint.objects.exists() and not Delivery.objects.exists()
    assert "Signed webhook removed: https://127.0.0.1/hook" in response.content.decode()
    assert Entry.objects.get().action == "notifications:remove"


def test_the_log_shows_each_delivery_newest_first_with_its_attempts(
    owner, django_assert_num_queries
):
    endpoint = _endpoint(owner)
    delivered = _delivery(
        endpoint,
        created_at=NOW,
        state="delivered",
        delivered_at=NOW + timedelta(minutes=1),
        tries=[(500, "answered 500"), (200, "")],
    )
    retrying = _delivery(
        endpoint,
        created_at=NOW + timedelta(hours=1),
        next_attempt_at=NOW + timedelta(hours=1, minutes=5),
        attempts=1,
        tries=[(None, "ConnectTimeout: timed out")],
    )
    failed = _delivery(
        endpoint,
        event_type="cluster.failed",
        created_at=NOW + timedelta(hours=2),
        state="failed",
        tries=[(404, "answered 404")],
    )
    client = owner.browser_client()
    url = f"/notifications/{endpoint.pk}/"
    client.get(url)  # warm the session

    # Session, user, the project with the role, the endpoint, the count, the page, its
    # attempts, the top bar's balance.
    with django_assert_num_queries(8):
        response = client.get(url)
    for _ in range(10):
        _delivery(endpoint, created_at=NOW - timedelta(days=1), tries=[(200, ""), (200, "")])
    with django_assert_num_queries(8):  # not one more for more deliveries or attempts
        client.get(url)

    rows = [delivery.pk for delivery in response.context["page"].object_list]
    assert rows == [failed.pk, retrying.pk, delivered.pk]
    body = response.content.decode()
    assert "Failed" in body and ">404</span>" in body
    assert "Retrying" in body and "Next at" in body and "2026-03-02 10:05:00" in body
    assert "ConnectTimeout: timed out" in body
    assert "Delivered" in body and ">500</span>" in body and ">200</span>" in body


def test_the_log_is_paginated_by_50(owner):
    endpoint = _endpoint(owner)
    oldest = _delivery(endpoint, created_at=NOW - timedelta(days=1))
    Delivery.objects.bulk_create(
        Delivery(endpoint=endpoint, event_type="ping", body={}, created_at=NOW) for _ in range(50)
    )
    client = owner.browser_client()

    first = client.get(f"/notifications/{endpoint.pk}/")
    second = client.get(f"/notifications/{endpoint.pk}/?page=2")

    assert len(first.context["page"].object_list) == 50
    assert [delivery.pk for delivery in second.context["page"].object_list] == [oldest.pk]
    assert "Page 2 of 2" in second.content.decode()


def test_an_empty_log_says_what_it_is_for(owner):
    endpoint = _endpoint(owner)

    body = owner.browser_client().get(f"/notifications/{endpoint.pk}/").content.decode()

    assert "Nothing sent here yet." in body
    assert f'action="/notifications/{endpoint.pk}/test/"' in body


def test_a_developer_is_refused_every_page_and_changes_nothing(owner, teammate, production):
    endpoint = _endpoint(owner)
    client = teammate.browser_client()

    answers = [
        client.get("/notifications/"),
        client.get(f"/notifications/{endpoint.pk}/"),
        client.get(f"/notifications/{endpoint.pk}/remove/"),
        client.post(
            "/notifications/add/",
            {"kind": "webhook", "url": "https://127.0.0.1/x", "events": ["cluster.ready"]},
        ),
        client.post(f"/notifications/{endpoint.pk}/test/"),
        client.post(f"/notifications/{endpoint.pk}/remove/"),
    ]

    assert [answer.status_code for answer in answers] == [403] * 6
    assert "Only an owner or a manager may manage webhooks" in answers[0].content.decode()
    assert list(Endpoint.objects.values_list("pk", flat=True)) == [endpoint.pk]
    assert not Delivery.objects.exists()
    assert "/notifications/" not in client.get("/accounts/").content.decode()


def test_a_manager_manages_the_channels(owner, teammate, production):
    Membership.objects.filter(user=teammate.user).update(role=Membership.Role.MANAGER)
    client = teammate.browser_client()

    added = client.post(
        "/notifications/add/",
        {"kind": "webhook", "url": "https://127.0.0.1/x", "events": ["cluster.ready"]},
    )

    assert added.status_code == 302
    assert Endpoint.objects.get().created_by == teammate.user
    assert client.get("/notifications/").status_code == 200


def test_another_projects_channel_is_a_404(owner, stranger, production):
    theirs = _endpoint(stranger)
    _delivery(theirs)
    client = owner.browser_client()

    answers = [
        client.get(f"/notifications/{theirs.pk}/"),
        client.get(f"/notifications/{theirs.pk}/remove/"),
        client.post(f"/notifications/{theirs.pk}/test/"),
        client.post(f"/notifications/{theirs.pk}/remove/"),
    ]

    assert [answer.status_code for answer in answers] == [404] * 4
    assert Endpoint.objects.filter(pk=theirs.pk).exists()
    assert Delivery.objects.filter(endpoint=theirs).count() == 1
    assert client.get("/notifications/").context["endpoints"] == []


def test_the_account_page_links_the_channels_for_who_may_manage_them(owner, teammate):
    link = '<a href="/notifications/">Webhooks and Slack</a>'

    assert link in owner.browser_client().get("/accounts/").content.decode()
    assert link not in teammate.browser_client().get("/accounts/").content.decode()
