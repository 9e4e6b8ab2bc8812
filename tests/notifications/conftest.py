"""A real HTTP receiver on 127.0.0.1 (a tiny http.server in a thread) that records what it is
sent and answers the status a test sets; and the settings every webhook test runs under."""

import threading
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
