"""`--wait` waits for what was asked, whatever happens on the way: the machines `add-workers`
added (not only the cluster's status), and an API that stops answering for a while (a server
stopped and started again: its port refuses, then answers) without ending the wait."""

import contextlib
import socket
import threading
import time
from urllib.parse import urlparse

import pytest

from clusters import lifecycle
from clusters.models import Cluster
from tests.cli.kit import assert_no_traceback, ready_cluster, run_cli
from tests.clusters.lifecycle_kit import create, inventory

pytestmark = pytest.mark.django_db(transaction=True)


class Relay:
    """A TCP relay in front of the live server, on a port of its own, that the test can stop
    (every connection closed, the port refusing, as a server that went down) and start again
    on the same port. It counts the requests that went through it."""

    def __init__(self, upstream: str) -> None:
        parsed = urlparse(upstream)
        self.upstream = (parsed.hostname, parsed.port)
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.requests = 0
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._listener: socket.socket | None = None

    def start(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(16)
        listener.settimeout(0.05)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def stop(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            _close(sock)

    def _accept(self, listener: socket.socket) -> None:
        while self._listener is listener:
            try:
                client, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            client.settimeout(None)
            upstream = socket.create_connection(self.upstream)
            with self._lock:
                self._sockets += [client, upstream]
            threading.Thread(target=self._pipe, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, False), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket, asks: bool) -> None:
        try:
            while data := source.recv(65536):
                if asks:
                    with self._lock:
                        self.requests += data.count(b" /api/v1/")
                sink.sendall(data)
        except OSError:
            pass
        finally:
            _close(source)
            _close(sink)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):  # already shut by the other side
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


@pytest.fixture
def relay(live_server):
    relay = Relay(live_server.url)
    relay.start()
    yield relay
    relay.stop()


def test_add_workers_wait_returns_once_the_new_machines_joined(env, tmp_path, account, ticker):
    cluster = ready_cluster(account, ticker, hosts=3)

    result = run_cli(
        "clusters", "add-workers", "train", "--count", "1", "--yes", "--wait",
        env=env, tmp_path=tmp_path, drive=ticker,
    )  # fmt: skip

    assert result.code == 0, result.stderr
    assert [(m["name"], m["status"]) for m in result.json()["machines"]] == [
        ("node-0", "joined"),
        ("node-1", "joined"),
        ("node-2", "joined"),
    ]
    assert f"Cluster train (id {cluster.pk}) is ready with node-2" in result.stderr
    hostfile = run_cli("hostfile", "train", env=env, tmp_path=tmp_path)
    assert hostfile.stdout.splitlines() == [f"node-{i} slots=8" for i in range(3)]


def test_a_wait_after_add_workers_is_not_ready_while_a_machine_starts(
    env, tmp_path, account, ticker
):
    cluster = ready_cluster(account, ticker, hosts=3)
    lifecycle.add_workers(cluster=cluster, count=1)  # nothing ticks: node-2 stays starting

    result = run_cli("clusters", "wait", "train", "--timeout", "1", env=env, tmp_path=tmp_path)

    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.READY  # the cluster's own status says ready...
    assert result.code == 4  # ...but the wait is for every machine
    assert "is ready, but node-2 is still starting after 1 s" in result.stderr


def test_a_wait_outlives_the_api_going_away_and_coming_back(env, tmp_path, account, ticker, relay):
    cluster = create(account.project, inventory(hosts=2), name="patient")
    err = tmp_path / "cli.err"
    seen: dict[str, float] = {}

    def drive() -> None:
        """The API answers a few polls, is gone (the port refuses) until the wait said so and
        a second has passed, then answers again; the data center goes on all along."""
        if "down" not in seen and relay.requests >= 3:
            relay.stop()
            seen["down"] = time.monotonic()
        elif (
            "down" in seen
            and "up" not in seen
            and "goes on" in err.read_text()
            and time.monotonic() - seen["down"] > 1
        ):
            relay.start()
            seen["up"] = time.monotonic()
        if "down" in seen:
            ticker()

    result = run_cli(
        "clusters", "wait", "patient", "--timeout", "60",
        env={**env, "RUNCRATE_API_URL": relay.url}, tmp_path=tmp_path, drive=drive,
    )  # fmt: skip

    assert "up" in seen  # it was gone, and came back
    assert result.code == 0, result.stderr
    assert result.json()["status"] == "ready"
    assert (
        f"Lost the Runcrate API at {relay.url} (unreachable); cluster patient "
        f"(id {cluster.pk}) goes on."
    ) in result.stderr
    assert "The Runcrate API answers again; still waiting." in result.stderr
    assert f"Cluster patient (id {cluster.pk}) is ready" in result.stderr
    assert_no_traceback(result)


def test_an_api_gone_past_the_waits_limit_exits_6_and_the_cluster_goes_on(
    env, tmp_path, account, relay
):
    cluster = create(account.project, inventory(hosts=2), name="patient")

    def drive() -> None:
        if relay.requests >= 3:  # the name, the cluster, then the wait's first poll
            relay.stop()

    result = run_cli(
        "clusters", "wait", "patient", "--timeout", "3",
        env={**env, "RUNCRATE_API_URL": relay.url}, tmp_path=tmp_path, drive=drive,
    )  # fmt: skip

    assert result.code == 6
    assert result.json()["error"]["code"] == "unreachable"
    assert "Stopped waiting: the API did not answer again within 3 s" in result.stderr
    assert f"`runcrate clusters wait {cluster.pk}` to wait again" in result.stderr
    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.PROVISIONING
    assert_no_traceback(result)
