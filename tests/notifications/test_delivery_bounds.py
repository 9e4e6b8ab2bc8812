"""A receiver is someone else's (issue 33, item 2): one attempt has a whole deadline, from the
connect to the last byte (notifications.delivery.TIMEOUT), however the receiver drips its bytes,
and reads at most MAX_ANSWER_BYTES of what it answers. The receivers here are real sockets on
127.0.0.1: one that sends a header line every 0.5 s without end, one that answers 200 and then
floods its body."""

import socket
import time
from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.utils import timezone

from notifications import delivery, outbox
from notifications.endpoints import create_endpoint
from notifications.models import Delivery
from notifications.tasks import run_notifications
from tests.notifications.conftest import ready_event, serve, trickle


def _flood(conn: socket.socket) -> None:
    try:
        conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 1000000000\r\n\r\n")
        chunk = b"z" * 65536
        total = 0
        while total < 1_000_000_000:
            conn.sendall(chunk)
            total += len(chunk)
    except OSError:
        conn.close()


@pytest.fixture
def trickler() -> Iterator[str]:
    yield from serve(trickle)


@pytest.fixture
def flooder() -> Iterator[str]:
    yield from serve(_flood)


def _endpoint(person, url):
    return create_endpoint(
        project=person.project, user=person.user, url=url, events=["cluster.ready"]
    )


def test_a_receiver_that_trickles_its_headers_ends_the_attempt_at_its_deadline(
    owner, trickler, local_webhooks, monkeypatch
):
    monkeypatch.setattr(delivery, "TIMEOUT", 2.0)
    _endpoint(owner, trickler)
    ready_event(owner.project)
    started = time.monotonic()

    done = run_notifications()

    # Every line comes well inside a per-read timeout: only the whole deadline ends it.
    assert time.monotonic() - started < 10
    assert done["delivered"] == 0
    [sent] = Delivery.objects.all()
    assert sent.state == Delivery.State.PENDING  # retried later, like any failure
    assert sent.last_error == "no whole answer within 2 seconds"


def test_a_receiver_that_floods_its_answer_is_read_only_up_to_the_cap(
    owner, flooder, local_webhooks
):
    _endpoint(owner, flooder)
    ready_event(owner.project)

    done = run_notifications()

    assert done["delivered"] == 1  # its 200 counts; the gigabyte after it is never read
    [sent] = Delivery.objects.all()
    assert sent.state == Delivery.State.DELIVERED


def test_deliveries_run_on_their_own_queue_never_the_ticks(settings):
    route = settings.CELERY_TASK_ROUTES["notifications.tasks.send_notifications"]
    assert route == {"queue": "notifications"}
    assert settings.CELERY_BEAT_SCHEDULE["clusters-tick"].get("options", {}).get("queue") in (
        None,
        settings.CELERY_TASK_DEFAULT_QUEUE,
    )
    assert route["queue"] != settings.CELERY_TASK_DEFAULT_QUEUE


def _closed_port_url() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}/hook"  # nothing listens there


def test_an_endpoint_that_failed_gets_no_other_attempt_in_the_same_pass(
    owner, receiver, local_webhooks
):
    dead = _endpoint(owner, _closed_port_url())
    _endpoint(owner, receiver.url)
    for name in ("train-1", "train-2", "train-3"):
        ready_event(owner.project, name=name)

    done = run_notifications()

    # The dead receiver cost the pass one attempt, not three; the live one got all three.
    assert done["delivered"] == 3
    assert len(receiver.received) == 3
    to_dead = Delivery.objects.filter(endpoint=dead)
    assert sorted(to_dead.values_list("attempts", flat=True)) == [0, 0, 1]
    assert to_dead.filter(state=Delivery.State.PENDING).count() == 3  # all retried later


def test_a_pass_starts_no_attempt_after_its_time(
    owner, trickler, receiver, local_webhooks, monkeypatch
):
    monkeypatch.setattr(delivery, "TIMEOUT", 1.0)
    slow = _endpoint(owner, trickler)
    _endpoint(owner, receiver.url)
    ready_event(owner.project)
    outbox.plan_deliveries(now=timezone.now())
    # The trickler's delivery is the older, so it goes first and takes its whole 1 s deadline:
    # past the pass's 0.5 s, so the delivery behind it waits for the next pass.
    Delivery.objects.filter(endpoint=slow).update(
        next_attempt_at=timezone.now() - timedelta(minutes=1)
    )

    delivery.send_due(seconds=0.5)

    assert receiver.received == []
    waiting = Delivery.objects.exclude(endpoint=slow).get()
    assert (waiting.state, waiting.attempts) == (Delivery.State.PENDING, 0)
    assert Delivery.objects.get(endpoint=slow).attempts == 1
