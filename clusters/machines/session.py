"""An SSH session to one host, on the dashboard's terms: the host's key pinned (a host that
answers with another key is refused, `HostKeyMismatch`), every command under an absolute
deadline and a byte cap that the dashboard enforces while it reads (`Session.run`: the channel
is closed when either is reached, saying which), SFTP uploads that wait a bounded time for each
answer. The drivers (`ssh.py`) and the storage host's syncs (`storage.py`) both talk through it,
so neither imports the other for it.
"""

from __future__ import annotations

import base64
import binascii
import logging
import shlex
import time
from contextlib import contextmanager
from pathlib import Path

import paramiko
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.conf import settings

from clusters.machines.base import DriverError

log = logging.getLogger(__name__)
READ_CHUNK = 64 * 1024
SFTP_REPLY_SECONDS = 30  # the most one SFTP request of an upload may wait for its answer


# --- the operator's key ---------------------------------------------------------------------


def operator_key_file() -> Path:
    """The operator's private key, made (ed25519, mode 0600) the first time it is needed."""
    path = Path(settings.RUNCRATE_SSH_KEY_FILE)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        private, public = openssh_pair(Ed25519PrivateKey.generate(), "runcrate-operator")
        tmp = path.with_suffix(".tmp")
        tmp.touch(mode=0o600)
        tmp.write_text(private)
        tmp.rename(path)
        path.with_suffix(".pub").write_text(public + "\n")
    return path


def operator_public_key() -> str:
    key = paramiko.Ed25519Key.from_private_key_file(str(operator_key_file()))
    return f"{key.get_name()} {key.get_base64()} runcrate-operator"


def openssh_pair(key: Ed25519PrivateKey, comment: str) -> tuple[str, str]:
    """(private key in OpenSSH format, public key line) of `key`."""
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    ).decode()
    public = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    return private, f"{public.decode()} {comment}"


# --- connections ------------------------------------------------------------------------------


class _Pinned(paramiko.MissingHostKeyPolicy):
    """Refuses any key that is not the pinned one, and remembers what the host offered."""

    def missing_host_key(self, client, hostname, key) -> None:
        raise HostKeyMismatch(hostname, key)


class HostKeyMismatch(paramiko.SSHException):
    """No pinned key of the type the host offered; `key` is what it offered, as on paramiko's
    BadHostKeyException (a pinned key of the same type that differs)."""

    def __init__(self, hostname: str, key: paramiko.PKey) -> None:
        super().__init__(f"{hostname} offered a host key that is not pinned")
        self.hostname = hostname
        self.key = key


def _fingerprint(key: paramiko.PKey) -> str:
    return key.fingerprint  # "SHA256:…", as ssh-keygen -l prints it


def _known_name(address: str, port: int) -> str:
    return address if port == 22 else f"[{address}]:{port}"


def _pinned_key(host_key: str) -> paramiko.PKey:
    kind, _, data = host_key.partition(" ")
    try:
        raw = base64.b64decode(data.strip(), validate=True)
    except binascii.Error as error:
        raise ValueError(f"not base64: {error}") from None
    return paramiko.PKey.from_type_string(kind, raw)


class Session:
    """One SSH connection to a host: run commands, upload files."""

    def __init__(self, client: paramiko.SSHClient, where: str) -> None:
        self.client = client
        self.where = where

    def run(
        self,
        command: str,
        *,
        stdin: str | None = None,
        timeout: float | None = None,
        max_bytes: int | None = None,
        name: str | None = None,
    ) -> tuple[int, str]:
        """Run `command`; returns (exit status, stdout + stderr).

        The host is a tenant's (root on it: every program it runs may be theirs), so the
        dashboard bounds the command itself, while it reads: `timeout` is an absolute deadline
        for the whole command (stdin written, every byte read, the exit status), and
        `max_bytes` the most output it reads. At either the channel is closed and DriverError
        says which; a host that trickles one byte a minute or prints without end holds a
        worker thread for `timeout` at most and its memory for `max_bytes` at most. `name` is
        what the errors call the command (its first word unless given)."""
        timeout = timeout or settings.RUNCRATE_SSH_COMMAND_SECONDS
        cap = max_bytes or settings.RUNCRATE_SSH_OUTPUT_BYTES
        deadline = time.monotonic() + timeout
        name = name or (command.split()[0] if command.split() else "the command")
        channel = None
        try:
            transport = self.client.get_transport()
            if transport is None or not transport.is_active():
                raise paramiko.SSHException("the session is closed")
            channel = transport.open_session(timeout=_left(deadline))
            channel.set_combine_stderr(True)
            channel.settimeout(_left(deadline))
            channel.exec_command(command)
            if stdin is not None:
                _send_stdin(channel, stdin, deadline=deadline)
            output = _read_bounded(channel, deadline=deadline, cap=cap)
            if output is None:
                raise DriverError(
                    f"{self.where}: {name} printed more than {_size(cap)}; the dashboard "
                    "stopped reading it and closed the command"
                )
            while not channel.exit_status_ready():
                if not channel.status_event.wait(min(_left(deadline), 1.0)) and _late(deadline):
                    raise TimeoutError
            status = channel.recv_exit_status()
        except TimeoutError:
            raise DriverError(
                f"{self.where}: {name} did not finish within {timeout:.0f} seconds; the "
                "dashboard closed it"
            ) from None
        except (paramiko.SSHException, OSError) as error:
            raise DriverError(f"{self.where}: the connection broke: {error}") from None
        finally:
            if channel is not None:
                channel.close()
        return status, output.decode(errors="replace")

    def upload(self, files: dict[str, tuple[str, int]], directory: str) -> None:
        """Write `files` (name -> (content, mode)) into `directory`, made mode 0700 first."""
        status, output = self.run(
            f"rm -rf {shlex.quote(directory)} && mkdir -p -m 700 {shlex.quote(directory)}"
        )
        if status != 0:
            raise DriverError(f"{self.where}: cannot write {directory}: {output.strip()}")
        sftp = self.client.open_sftp()
        try:
            # Each write waits for its answer at most this long: a host that stops answering
            # fails the upload instead of holding the worker.
            sftp.get_channel().settimeout(SFTP_REPLY_SECONDS)
            for name, (content, mode) in files.items():
                path = f"{directory}/{name}"
                with sftp.open(path, "w") as handle:
                    handle.chmod(mode)
                    handle.write(content.encode())
        finally:
            sftp.close()


def _left(deadline: float) -> float:
    """Seconds until `deadline`; TimeoutError once it has passed."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError
    return left


def _late(deadline: float) -> bool:
    return time.monotonic() >= deadline


def _send_stdin(channel: paramiko.Channel, stdin: str, *, deadline: float) -> None:
    """Write `stdin` to the command and close it, by the deadline; a command that ended without
    reading all of it is no error here (its output says why)."""
    channel.settimeout(_left(deadline))
    try:
        channel.sendall(stdin.encode())
        channel.shutdown_write()
    except TimeoutError:
        raise
    except (paramiko.SSHException, OSError):
        pass  # the command ended without reading all of it: its output says why


def _read_bounded(channel: paramiko.Channel, *, deadline: float, cap: int) -> bytes | None:
    """Everything `channel` prints until its end, read by the dashboard against `deadline`
    (TimeoutError past it) and `cap` (None once more than `cap` bytes came: the rest is never
    read, so memory stays bounded whatever the host sends)."""
    chunks: list[bytes] = []
    total = 0
    while True:
        channel.settimeout(min(_left(deadline), 1.0))
        try:
            data = channel.recv(READ_CHUNK)
        except TimeoutError:
            continue  # nothing yet: the deadline is checked again above
        if not data:
            return b"".join(chunks)
        total += len(data)
        if total > cap:
            return None
        chunks.append(data)


def _size(count: int) -> str:
    return f"{count // (1024 * 1024)} MiB" if count >= 1024 * 1024 else f"{count // 1024} KiB"


@contextmanager
def connect(*, address: str, port: int, user: str, host_key: str, name: str):
    """An SSH session to a host whose key must be `host_key`; DriverError when it cannot be
    had (with reason `host_key_mismatch` for a key that does not match)."""
    where = f"{address}:{port}"
    if not host_key:
        raise DriverError(
            f"{name} has no pinned host key in the inventory; it is never connected to.",
            reason="host_key_mismatch",
        )
    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(_Pinned())
    try:
        pinned = _pinned_key(host_key)
    except (ValueError, paramiko.SSHException) as error:
        raise DriverError(
            f"{name}'s pinned host key cannot be read ({error}).", reason="host_key_mismatch"
        ) from None
    client.get_host_keys().add(_known_name(address, port), pinned.get_name(), pinned)
    _log_in(client, address=address, port=port, user=user, name=name, key=(pinned, host_key))
    try:
        yield Session(client, where)
    finally:
        client.close()


def _log_in(
    client: paramiko.SSHClient,
    *,
    address: str,
    port: int,
    user: str,
    name: str,
    key: tuple[paramiko.PKey, str],
) -> None:
    """Log in to the host with the operator's key, the host proving the pinned `key` (read,
    and as the inventory writes it); on any failure the client is closed and DriverError says
    why (`host_key_mismatch` for a key that does not match)."""
    where = f"{address}:{port}"
    pinned, host_key = key
    timeout = settings.RUNCRATE_SSH_CONNECT_SECONDS
    try:
        client.connect(
            address,
            port=port,
            username=user,
            key_filename=str(operator_key_file()),
            timeout=timeout,
            banner_timeout=timeout,
            auth_timeout=timeout,
            look_for_keys=False,
            allow_agent=False,
        )
    except (HostKeyMismatch, paramiko.BadHostKeyException) as mismatch:
        client.close()
        offered = mismatch.key
        raise DriverError(
            f"{name} ({where}) offered host key {_fingerprint(offered)}, not the pinned "
            f"{_fingerprint(pinned)}; nothing was run on it.",
            reason="host_key_mismatch",
            output=f"offered: {offered.get_name()} {offered.get_base64()}\npinned:  {host_key}",
        ) from None
    except paramiko.AuthenticationException:
        client.close()
        raise DriverError(
            f"could not log in to {where} as {user}: the operator's key is not authorised there "
            "(add `manage.py operator_ssh_key` to its authorized_keys)"
        ) from None
    except TimeoutError:
        client.close()
        raise DriverError(f"could not connect to {where}: timed out") from None
    except paramiko.ssh_exception.NoValidConnectionsError as error:
        client.close()
        reasons = {e.strerror or str(e) for e in error.errors.values()} or {str(error)}
        raise DriverError(
            f"could not connect to {where}: {'; '.join(sorted(reasons)).lower()}"
        ) from None
    except (OSError, paramiko.SSHException) as error:
        client.close()
        reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
        raise DriverError(f"could not connect to {where}: {reason.lower()}") from None
