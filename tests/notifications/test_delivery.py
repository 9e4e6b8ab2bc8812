"""Deliveries reach a real receiver on 127.0.0.1: signed, retried with growing waits when it
fails, given up after 24 hours, and the endpoint switched off after 3 days of failures."""

import json
from datetime import UTC, datetime, timedelta

import time_machine
from django.core import mail

from notifications import delivery, outbox
from notifications.endpoints import create_endpoint
from notifications.models import Attempt, Delivery, Endpoint
from notifications.signing import verify
from notifications.tasks import run_notifications
from tests.notifications.conftest import ready_event

START = datetime(2030, 5, 6, 7, 0, tzinfo=UTC)


def _endpoint(person, url, **fields) -> Endpoint:
    return create_endpoint(
        project=person.project, user=person.user, url=url, events=["cluster.ready"], **fields
    )


def test_it_posts_the_ready_event_with_a_signature_that_verifies(owner, receiver, local_webhooks):
    with time_machine.travel(START, tick=False):
        endpoint = _endpoint(owner, receiver.url)
        event = ready_event(owner.project)
        done = run_notifications()

    assert done == {"planned": 1, "delivered": 1, "switched_off": 0}
    [got] = receiver.received
    assert got.path == "/hooks/runcrate"
    assert got.headers["content-type"] == "application/json"
    assert verify(
        endpoint.secret, got.headers["x-runcrate-signature"], got.body, now=int(START.timestamp())
    ) == int(START.timestamp())
    body = json.loads(got.body)
    assert body["type"] == "cluster.ready"
    assert body["created"] == int(START.timestamp())
    assert body["data"]["cluster"]["id"] == event.cluster.pk
    assert body["data"]["cluster"]["name"] == "train-1"
    assert body["data"]["cluster"]["status"] == "ready"
    assert body["data"]["message"] == "All 2 machines are ready."
    sent = Delivery.objects.get(endpoint=endpoint)
    assert (sent.state, sent.attempts, sent.last_status_code) == ("delivered", 1, 200)
    assert sent.event == event


def test_it_retries_a_failing_endpoint_at_growing_intervals(owner, receiver, local_webhooks):
    receiver.status = 500
    with time_machine.travel(START, tick=False) as clock:
        endpoint = _endpoint(owner, receiver.url)
        ready_event(owner.project)
        run_notifications()
        # Each step: just before the retry is due nothing is sent; at it, one more attempt.
        for wait in [1, 2, 4, 8]:
            clock.shift(timedelta(minutes=wait) - timedelta(seconds=1))
            run_notifications()
            clock.shift(timedelta(seconds=1))
            run_notifications()

    assert len(receiver.received) == 5
    tries = list(Attempt.objects.filter(delivery__endpoint=endpoint).order_by("at"))
    gaps = [(b.at - a.at) / timedelta(minutes=1) for a, b in zip(tries, tries[1:], strict=False)]
    assert gaps == [1, 2, 4, 8]
    assert {attempt.status_code for attempt in tries} == {500}
    sent = Delivery.objects.get(endpoint=endpoint)
    assert (sent.state, sent.attempts, sent.last_status_code) == ("pending", 5, 500)
    assert sent.next_attempt_at == tries[-1].at + timedelta(minutes=16)
    endpoint.refresh_from_db()
    assert endpoint.failing_since == START

    # The log the API shows: every attempt with its status code.
    log = owner.api().get(f"/api/v1/webhooks/{endpoint.pk}/deliveries").json()
    [entry] = log["data"]
    assert entry["attempts"] == 5
    assert [attempt["status_code"] for attempt in entry["tries"]] == [500] * 5
    assert entry["state"] == "pending"


def test_it_caps_the_wait_at_an_hour_and_gives_up_after_24_hours():
    assert [delivery.retry_delay(n) / timedelta(minutes=1) for n in range(1, 9)] == [
        1,
        2,
        4,
        8,
        16,
        32,
        60,
        60,
    ]


def test_a_delivery_fails_after_24_hours_of_failures(owner, receiver, local_webhooks):
    receiver.status = 503
    with time_machine.travel(START, tick=False) as clock:
        endpoint = _endpoint(owner, receiver.url)
        ready_event(owner.project)
        run_notifications()
        for _ in range(40):
            clock.shift(timedelta(hours=1))
            run_notifications()

    sent = Delivery.objects.get(endpoint=endpoint)
    assert sent.state == "failed"
    last = sent.last_attempt_at
    assert last is not None and last <= START + timedelta(hours=24)
    assert len(receiver.received) == sent.attempts


def test_it_delivers_on_a_retry_once_the_receiver_answers(owner, receiver, local_webhooks):
    receiver.status = 502
    with time_machine.travel(START, tick=False) as clock:
        endpoint = _endpoint(owner, receiver.url)
        ready_event(owner.project)
        run_notifications()
        receiver.status = 204
        clock.shift(timedelta(minutes=1))
        run_notifications()
        clock.shift(timedelta(hours=2))
        run_notifications()

    sent = Delivery.objects.get(endpoint=endpoint)
    assert (sent.state, sent.attempts, sent.last_status_code) == ("delivered", 2, 204)
    assert len(receiver.received) == 2
    endpoint.refresh_from_db()
    assert endpoint.failing_since is None


def test_an_endpoint_failing_for_3_days_is_switched_off_with_an_email(
    owner, receiver, local_webhooks, django_capture_on_commit_callbacks
):
    receiver.status = 500
    with time_machine.travel(START, tick=False) as clock:
        endpoint = _endpoint(owner, receiver.url)
        ready_event(owner.project)
        run_notifications()
        clock.shift(timedelta(days=3) - timedelta(minutes=1))
        assert delivery.switch_off_failing(now=START + timedelta(days=3, minutes=-1)) == []
        clock.shift(timedelta(minutes=1))
        ready_event(owner.project, name="train-2")
        with django_capture_on_commit_callbacks(execute=True):
            done = run_notifications()

    assert done["switched_off"] == 1
    endpoint.refresh_from_db()
    assert endpoint.active is False
    assert not Delivery.objects.filter(endpoint=endpoint, state="pending").exists()
    [message] = mail.outbox
    assert message.to == [owner.user.email]
    assert endpoint.url in message.body
    # Switched off, it is sent nothing more.
    sent_before = len(receiver.received)
    with time_machine.travel(START + timedelta(days=4), tick=False):
        ready_event(owner.project, name="train-3")
        assert run_notifications() == {"planned": 0, "delivered": 0, "switched_off": 0}
    assert len(receiver.received) == sent_before


def test_a_slack_channel_gets_mrkdwn_text_and_no_signature(owner, receiver, local_webhooks):
    with time_machine.travel(START, tick=False):
        _endpoint(owner, receiver.url, kind="slack")
        event = ready_event(owner.project)
        run_notifications()

    [got] = receiver.received
    assert "x-runcrate-signature" not in got.headers
    assert json.loads(got.body) == {
        "text": f"*Cluster <http://testserver/clusters/{event.cluster.pk}/|train-1> is ready*\n"
        "All 2 machines are ready."
    }


def test_two_workers_never_send_the_same_attempt(owner, receiver, local_webhooks):
    with time_machine.travel(START, tick=False):
        _endpoint(owner, receiver.url)
        ready_event(owner.project)
        outbox.plan_deliveries(now=START)
        [first] = delivery.due(now=START)
        [second] = delivery.due(now=START)
        assert delivery.attempt(first, now=START) is not None
        assert delivery.attempt(second, now=START) is None

    assert len(receiver.received) == 1
