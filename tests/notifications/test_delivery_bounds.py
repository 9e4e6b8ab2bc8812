"""A receiver is someone else's (issue 33, item 2): one attempt has a whole deadline, from the
connect to the last byte (notifications.delivery.TIMEOUT), however the receiver drips its bytes,
and reads at most MAX_ANSWER_BYTES of what it answers. The receivers here are real sockets on
127.0.0.1: one that sends a header line every 0.5 s without end, one that answers 200 and then
floods its body."""

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from notifications import delivery
from notifications.endpoints import create_endpoint
from notifications.models import Delivery
from notifications.tasks import run_notifications
from tests.notifications.conftest import ready_event


def _serve(answer) -> Iterator[str]:
    """A TCP server on 127.0.0.1 that reads a request and calls `answer(conn)`; its URL."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    sent: list[int] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            conn.recv(65536)
            threading.Thread(target=answer, args=(conn, sent), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}/hook"
    listener.close()


def _trickle(conn: socket.socket, sent: list[int]) -> None:
    try:
        conn.sendall(b"HTTP/1.1 200 OK\r\n")
        while True:
            conn.sendall(b"x-wait: 1\r\n")  # a header line every 0.5 s: never a whole answer
            time.sleep(0.5)
    except OSError:
        conn.close()


def _flood(conn: socket.socket, sent: list[int]) -> None:
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
    yield from _serve(_trickle)


@pytest.fixture
def flooder() -> Iterator[str]:
    yield from _serve(_flood)


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
