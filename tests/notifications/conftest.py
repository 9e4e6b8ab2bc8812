"""A real HTTP receiver on 127.0.0.1 (a tiny http.server in a thread) that records what it is
sent and answers the status a test sets; and the settings every webhook test runs under."""

import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from clusters.models import Cluster, Event
from tests.factories import ClusterFactory, EventFactory


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Receiver:
    url: str
    status: int = 200
    received: list[Received] = field(default_factory=list)


@pytest.fixture
def receiver():
    state = Receiver(url="")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            length = int(self.headers.get("content-length", "0"))
            body = self.rfile.read(length)
            state.received.append(
                Received(
                    path=self.path,
                    headers={key.lower(): value for key, value in self.headers.items()},
                    body=body,
                )
            )
            self.send_response(state.status)
            self.send_header("content-length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}/hooks/runcrate"
    yield state
    server.shutdown()
    server.server_close()


@pytest.fixture
def local_webhooks(settings):
    """A receiver on 127.0.0.1 over http: what DEBUG and the private-address setting allow."""
    settings.DEBUG = True
    settings.RUNCRATE_WEBHOOKS_ALLOW_PRIVATE = True
    settings.SITE_URL = "http://testserver"
    return settings


def ready_event(project, name: str = "train-1", **fields) -> Event:
    cluster = ClusterFactory(project=project, status=Cluster.Status.READY, name=name)
    return EventFactory(
        cluster=cluster, reason=Event.Reason.READY, message="All 2 machines are ready.", **fields
    )


def serve(
    answer: Callable[[socket.socket], None], accepted: list[float] | None = None
) -> Iterator[str]:
    """A TCP server on 127.0.0.1 that reads a request and calls `answer(conn)` in a thread of
    its own; yields its URL. `accepted` gets the time.monotonic() of each connection taken."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)

    def take() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            if accepted is not None:
                accepted.append(time.monotonic())
            conn.recv(65536)
            threading.Thread(target=answer, args=(conn,), daemon=True).start()

    threading.Thread(target=take, daemon=True).start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}/hook"
    listener.close()


def trickle(conn: socket.socket) -> None:
    """A receiver that never gives a whole answer: a header line every 0.5 s, well inside any
    per-read timeout."""
    try:
        conn.sendall(b"HTTP/1.1 200 OK\r\n")
        while True:
            conn.sendall(b"x-wait: 1\r\n")
            time.sleep(0.5)
    except OSError:
        conn.close()
