"""The ssh driver pins each host's key (clusters/machines/ssh.py `connect`): against a local
paramiko SSH server on 127.0.0.1 (a thread, a random port, its own host key), a connection
whose pinned key is another one is refused before anything is sent, with a message naming both
fingerprints, and a connection whose pinned key is the server's logs in and runs a command."""

from __future__ import annotations

import io
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import paramiko
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from clusters.machines.base import DriverError
from clusters.machines.session import connect, operator_public_key


def ed25519_key() -> paramiko.PKey:
    pem = (
        Ed25519PrivateKey.generate()
        .private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.OpenSSH,
            serialization.NoEncryption(),
        )
        .decode()
    )
    return paramiko.Ed25519Key.from_private_key(io.StringIO(pem))


def rsa_key() -> paramiko.PKey:
    return paramiko.RSAKey.generate(2048)


def public_line(key: paramiko.PKey) -> str:
    """The key as the inventory's `Host.host_key` holds it."""
    return f"{key.get_name()} {key.get_base64()}"


@dataclass
class Seen:
    """What the server was asked: logins tried, commands run."""

    logins: list[str] = field(default_factory=list)
    commands: list[str] = field(default_factory=list)


class _Server(paramiko.ServerInterface):
    def __init__(self, operator: str, seen: Seen) -> None:
        self.operator = operator
        self.seen = seen
        self.command: bytes | None = None
        self.asked = threading.Event()

    def get_allowed_auths(self, username: str) -> str:
        return "publickey"

    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
        self.seen.logins.append(username)
        if public_line(key) == self.operator:
            return paramiko.AUTH_SUCCESSFUL
        return paramiko.AUTH_FAILED

    def check_channel_request(self, kind: str, chanid: int) -> int:
        if kind == "session":
            return paramiko.OPEN_SUCCEEDED
        return paramiko.OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED

    def check_channel_exec_request(self, channel, command: bytes) -> bool:
        self.command = command
        self.seen.commands.append(command.decode())
        self.asked.set()
        return True


class SshServer:
    """An SSH server on 127.0.0.1 with `host_key`; each command it is given is answered with
    "ran: <command>" and exit status 0."""

    def __init__(self, host_key: paramiko.PKey, operator: str) -> None:
        self.host_key = host_key
        self.operator = operator
        self.seen = Seen()
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(4)
        self.listener.settimeout(0.2)
        self.port = self.listener.getsockname()[1]
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._transports: list[paramiko.Transport] = []

    def __enter__(self) -> SshServer:
        self._spawn(self._accept)
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for transport in self._transports:
            transport.close()
        for thread in self._threads:
            thread.join(timeout=10)
        self.listener.close()

    def _spawn(self, target, *args) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                sock, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self._spawn(self._serve, sock)

    def _serve(self, sock: socket.socket) -> None:
        transport = paramiko.Transport(sock)
        self._transports.append(transport)
        transport.add_server_key(self.host_key)
        server = _Server(self.operator, self.seen)
        try:
            transport.start_server(server=server)
        except (paramiko.SSHException, EOFError, OSError):
            return  # the client hung up (it refused our key)
        channel = transport.accept(timeout=10)
        if channel is None or not server.asked.wait(timeout=10):
            return
        channel.sendall(b"ran: " + (server.command or b""))
        channel.send_exit_status(0)
        channel.close()


@pytest.fixture
def operator(settings, tmp_path) -> str:
    settings.RUNCRATE_SSH_KEY_FILE = tmp_path / "ssh" / "id_ed25519"
    settings.RUNCRATE_SSH_CONNECT_SECONDS = 5.0
    settings.RUNCRATE_SSH_COMMAND_SECONDS = 5.0
    return " ".join(operator_public_key().split()[:2])


@pytest.fixture(params=["ed25519", "rsa"])
def server(request, operator) -> Iterator[SshServer]:
    key = ed25519_key() if request.param == "ed25519" else rsa_key()
    with SshServer(key, operator) as running:
        yield running


def connect_to(server: SshServer, pinned: str):
    return connect(
        address="127.0.0.1", port=server.port, user="root", host_key=pinned, name="gpu-host-1"
    )


def test_it_connects_and_runs_commands_on_a_host_offering_its_pinned_key(server):
    with connect_to(server, public_line(server.host_key)) as session:
        status, output = session.run("hostname")

    assert (status, output) == (0, "ran: hostname")
    assert server.seen.logins == ["root"]
    assert server.seen.commands == ["hostname"]


@pytest.mark.parametrize("pinned_kind", ["ed25519", "rsa"])
def test_it_refuses_a_host_offering_another_key_than_the_pinned_one(server, pinned_kind):
    # The same type as the server's key (a key that differs) and another type (no key of the
    # type the server offers is pinned): both refused.
    pinned = ed25519_key() if pinned_kind == "ed25519" else rsa_key()

    with pytest.raises(DriverError) as refused, connect_to(server, public_line(pinned)):
        pass

    assert refused.value.reason == "host_key_mismatch"
    assert refused.value.message == (
        f"gpu-host-1 (127.0.0.1:{server.port}) offered host key "
        f"{server.host_key.fingerprint}, not the pinned {pinned.fingerprint}; nothing was run "
        "on it."
    )
    assert public_line(server.host_key) in refused.value.output
    # Refused before logging in: the operator's key was never offered, nothing ran.
    assert server.seen == Seen()


def test_it_never_connects_to_a_host_without_a_pinned_key(server):
    with pytest.raises(DriverError) as refused, connect_to(server, ""):
        pass

    assert refused.value.reason == "host_key_mismatch"
    assert "no pinned host key" in refused.value.message
    assert server.seen == Seen()


def test_a_host_whose_name_finds_no_pinned_key_is_refused_not_trusted(server, monkeypatch):
    # paramiko asks the missing-host-key policy only when it knows no key for the host's name.
    # The driver always pins under the name paramiko looks up, so make that lookup miss: the
    # policy must refuse the key offered, never add or accept it (AutoAddPolicy, WarningPolicy).
    monkeypatch.setattr("clusters.machines.session._known_name", lambda address, port: "elsewhere")

    with pytest.raises(DriverError) as refused, connect_to(server, public_line(server.host_key)):
        pass

    assert refused.value.reason == "host_key_mismatch"
    assert f"offered host key {server.host_key.fingerprint}" in refused.value.message
    assert server.seen == Seen()
