"""Nothing a host sends can hold the dashboard (issue 33, item 7): `Session.run` bounds every
command by an absolute deadline and a byte cap that the dashboard enforces while it reads, never
the host's own `timeout` or `tail` (the tenant is root: those are theirs).

The host here is a real SSH server on 127.0.0.1 (paramiko's server side, in a thread), which
answers each command the way a hostile tenant's host would: a trickle of one byte every 0.2 s
that never ends, a flood without end, a command that never reads its stdin."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import paramiko
import pytest

from clusters.machines import session as ssh_session
from clusters.machines import ssh
from clusters.machines.base import INSTALL_SECONDS, DriverError, InstallPlan, PlanNode
from tests.clusters.lifecycle_kit import create, inventory, node


@dataclass
class Host:
    port: int
    host_key: str
    sent: dict[str, int] = field(default_factory=dict)  # command -> bytes it sent


class _Server(paramiko.ServerInterface):
    def __init__(self, host: Host) -> None:
        self.host = host

    def check_channel_request(self, kind, chanid):
        return paramiko.OPEN_SUCCEEDED if kind == "session" else paramiko.OPEN_FAILED_UNKNOWN

    def check_auth_publickey(self, username, key):
        return paramiko.AUTH_SUCCESSFUL

    def get_allowed_auths(self, username):
        return "publickey"

    def check_channel_exec_request(self, channel, command):
        # As sshd does, the command starts once the request is answered (paramiko answers
        # after this returns): a command that closed its channel first would be a server bug.
        threading.Timer(0.2, self._answer, args=(channel, command.decode())).start()
        return True

    def _answer(self, channel: paramiko.Channel, command: str) -> None:
        sent = 0
        try:
            if command == "trickle":
                while not channel.closed:
                    sent += channel.send(b"x")
                    time.sleep(0.2)
            elif command == "flood":
                chunk = b"y" * 65536
                while not channel.closed and sent < 400 * 1024 * 1024:
                    sent += channel.send(chunk)
            elif command == "deaf":  # never reads its stdin, never ends
                while not channel.closed:
                    time.sleep(0.1)
            elif command == "quick":
                sent += channel.send(b"hello\n")
                channel.send_exit_status(3)
        except (OSError, EOFError, paramiko.SSHException):
            pass
        finally:
            self.host.sent[command] = sent
            # The dashboard may have closed the connection first (the cap, the deadline).
            with contextlib.suppress(OSError, EOFError, paramiko.SSHException):
                channel.close()


@pytest.fixture
def host(tmp_path, settings) -> Iterator[Host]:
    settings.RUNCRATE_SSH_KEY_FILE = tmp_path / "operator" / "id_ed25519"
    server_key = paramiko.Ed25519Key.from_private_key_file(_new_key(tmp_path / "host_key"))
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    the_host = Host(
        port=listener.getsockname()[1],
        host_key=f"{server_key.get_name()} {server_key.get_base64()}",
    )
    transports: list[paramiko.Transport] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            transport = paramiko.Transport(conn)
            transport.add_server_key(server_key)
            transport.start_server(server=_Server(the_host))
            transports.append(transport)

    threading.Thread(target=serve, daemon=True).start()
    yield the_host
    stop.set()
    listener.close()
    for transport in transports:
        transport.close()


def _new_key(path) -> str:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    private, _ = ssh_session.openssh_pair(Ed25519PrivateKey.generate(), "test-host")
    path.write_text(private)
    return str(path)


def session(host: Host):
    return ssh_session.connect(
        address="127.0.0.1", port=host.port, user="root", host_key=host.host_key, name="lab-x"
    )


def test_a_command_that_trickles_forever_ends_at_the_deadline_saying_so(host):
    started = time.monotonic()
    with session(host) as s, pytest.raises(DriverError) as refused:
        s.run("trickle", timeout=2)
    # Each byte comes well inside any per-read timeout: only an absolute deadline ends it.
    assert time.monotonic() - started < 15
    assert "trickle did not finish within 2 seconds; the dashboard closed it" in str(
        refused.value.message
    )


def test_an_error_names_the_command_as_the_caller_does(host):
    with session(host) as s, pytest.raises(DriverError) as refused:
        s.run("trickle", timeout=2, name="the read of the bootstrap log")
    assert refused.value.message == (
        f"127.0.0.1:{host.port}: the read of the bootstrap log did not finish within 2 seconds; "
        "the dashboard closed it"
    )


def test_a_command_that_floods_is_cut_at_the_cap_and_memory_stays_bounded(host):
    tracemalloc.start()
    try:
        with session(host) as s, pytest.raises(DriverError) as refused:
            s.run("flood", timeout=60, max_bytes=1024 * 1024)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "flood printed more than 1 MiB; the dashboard stopped reading it" in (
        refused.value.message
    )
    # The channel was closed at the cap: the host could not send its 400 MB.
    for _ in range(100):
        if "flood" in host.sent:
            break
        time.sleep(0.05)
    assert host.sent["flood"] < 64 * 1024 * 1024
    assert peak < 24 * 1024 * 1024


def test_a_command_that_never_reads_its_stdin_ends_at_the_deadline(host):
    with session(host) as s, pytest.raises(DriverError) as refused:
        # More than an SSH window (2 MiB): the write itself would wait for ever.
        s.run("deaf", stdin="z" * (8 * 1024 * 1024), timeout=2)
    assert "deaf did not finish within 2 seconds" in refused.value.message


def test_a_command_that_ends_gives_its_status_and_output(host):
    with session(host) as s:
        assert s.run("quick", timeout=10) == (3, "hello\n")


def test_a_volume_sync_gets_a_deadline_from_the_volumes_size():
    from clusters.machines import storage
    from clusters.models import Volume

    small, large, huge = (storage.sync_seconds(Volume(size_gb=g)) for g in (10, 100, 10_000))
    assert small == storage.SYNC_SECONDS_BASE + 10 * storage.SYNC_SECONDS_PER_GB
    assert small < large < huge
    assert huge == storage.SYNC_SECONDS_MAX


@pytest.mark.django_db
def test_an_installer_may_run_as_long_as_the_install_step_allows(project, monkeypatch, settings):
    """An install on a real GPU host takes minutes: its installer runs under the install step's
    own deadline, never a plain command's shorter one, so the dashboard never cuts an install
    the step would have waited for."""
    settings.RUNCRATE_SSH_COMMAND_SECONDS = 600.0
    cluster = create(project, inventory(hosts=2), software="slurm")
    head = node(cluster, 0)
    ran: list[tuple[str, float | None]] = []

    @contextmanager
    def host_session(host):
        class Session:
            where = "203.0.113.7:22"

            def upload(self, files, directory):
                pass

            def run(self, command, *, stdin=None, timeout=None, max_bytes=None):
                ran.append((command, timeout))
                return 0, "runcrate: ok\n"

        yield Session()

    monkeypatch.setattr(ssh, "host_session", host_session)
    monkeypatch.setattr(ssh.SshDriver, "start", lambda self, node, **kwargs: {})  # tested apart
    plan = InstallPlan(
        cluster_name=cluster.name,
        software="slurm",
        gpus_per_machine=8,
        boot_seconds=180,
        nodes=[PlanNode("node-0", head.private_ip, 8, is_head=True)],
        node_plans={"node-0": {}},
        agent_tokens={"node-0": "token"},
    )
    assert ssh.SshDriver().install(head, plan=plan).ok
    (installer,) = [t for c, t in ran if c == f"sh {ssh.SOFTWARE_INCOMING}/install-slurm.sh"]
    assert installer == INSTALL_SECONDS > settings.RUNCRATE_SSH_COMMAND_SECONDS
