"""What a host is, read by the product itself over SFTP, and whether it is what it was.

A tenant is root on their nodes, so nothing the host would run can be trusted to say it is
clean: a replaced `sh`, `pgrep` or `grep` lies. This module never runs a command on the host.
It reads files, `/proc` and package lists through the SFTP channel with the dashboard's own
code (paramiko; the hashing and parsing happen here, on the dashboard) and compares them with
the **baseline** recorded when staff registered the host freshly imaged
(`clusters/hosts.py`, docs/inventory.md "Reimage before reuse"):

- the installed packages (`/var/lib/dpkg/status`: name and version);
- the users (`/etc/passwd`, `/etc/shadow`, `/etc/group`), every user's `authorized_keys`;
- every file under the trees a tenant could leave something in, with its mode, owner and
  sha256: `/etc` (cron, systemd units, sudoers, ld.so.preload, sshd's configuration…),
  `/root`, `/home`, `/usr/local`, `/opt`, `/tmp`, `/var/tmp`, `/var/spool/cron`;
- the system's programs (`/usr/bin`, `/usr/sbin`, `/usr/lib/systemd`) with their mode,
  owner and sha256, like the trees above;
- the listening sockets (`/proc/net/tcp`, `tcp6`, `udp`, `udp6`) and the programs running
  (`/proc/PID/exe`);
- any process of a cluster, found by its credentials (never a pristine host's, whatever its
  baseline says): one whose command line names a cluster key (`…/.ssh/runcrate_cluster`, as
  sshfs's `ssh … -oIdentityFile=…` child does), one holding such a key open, one with a TCP
  socket to or from the private network (`/proc/PID/cmdline`, `/proc/PID/fd`, `/proc/net/tcp`);
  the same rule as the wipe's (clusters/software/host/cluster-processes.sh).

What it cannot see, and does not claim: a kernel the tenant changed, or an sshd or
sftp-server that lies (the channel itself). The reimage is the guarantee; this verification
proves that a reimage happened and left nothing behind.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import re
import stat
import subprocess
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import paramiko

from clusters import models

if TYPE_CHECKING:
    from offers.models import Host

# Paths on the host, read over SFTP (never this machine's own /tmp).
HASHED_TREES = (  # noqa: S108
    "/etc",
    "/root",
    "/home",
    "/usr/local",
    "/opt",
    "/tmp",  # noqa: S108
    "/var/tmp",  # noqa: S108
    "/var/spool/cron",
)
# The system's programs, by content too: a same-size `pgrep` with its time restored by
# `touch -r` is a different sha256.
PROGRAM_TREES = ("/usr/bin", "/usr/sbin", "/usr/lib/systemd")
# Files that differ on every boot of a healthy host, or that the product's own connection
# makes: never a tenant's leftover. (/tmp/systemd-private-*: systemd's per-service folders.)
VOLATILE_PREFIXES = ("/tmp/systemd-private-", "/etc/ssh/ssh_host_")  # noqa: S108
LARGEST_HASHED = 64 * 1024 * 1024  # bigger files under the hashed trees: mode, size and time
# The programs our own verification session runs on the host.
OWN_SESSION = frozenset({"/usr/lib/openssh/sftp-server", "/usr/libexec/sftp-server"})
SOCKET_TABLES = ("tcp", "tcp6", "udp", "udp6")
TCP_LISTEN = "0A"
UDP_UNCONNECTED = "07"
# Bounds on the read, so nothing a host holds can stall the dashboard (docs/inventory.md): a
# file the reader opens must be a regular file by lstat first (never a link, FIFO or device);
# each read takes at most READ_CAP bytes of it, all of them at most TOTAL_CAP; every SFTP reply
# must come within REPLY_SECONDS (the channel's timeout, set by the caller), and the whole read
# ends by its deadline (DEADLINE_SECONDS unless the caller gives one).
READ_CAP = 32 * 1024 * 1024  # dpkg's status file is a few MB on a large image
KEYS_CAP = 1024 * 1024  # an authorized_keys file
TOTAL_CAP = 4 * 1024 * 1024 * 1024
REPLY_SECONDS = 20.0
DEADLINE_SECONDS = 600.0
SHOWN = 200  # differences listed; the count says how many more
CLUSTER_KEY = "/.ssh/runcrate_cluster"  # where bootstrap.sh puts every cluster's key
PRIVATE_NETWORK = ipaddress.ip_network(models.PRIVATE_NETWORK)


class Unverified(Exception):
    """The read could not finish within its bounds (deadline or byte cap): the host is not
    verified, and says why."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class _Bounds:
    """The deadline and the bytes left of one read of a host."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.deadline = time.monotonic() + seconds
        self.left = TOTAL_CAP

    def check(self) -> None:
        if time.monotonic() >= self.deadline:
            raise Unverified(f"the read of the host did not finish within {self.seconds:.0f} s")

    def take(self, count: int) -> None:
        self.left -= count
        if self.left < 0:
            raise Unverified(f"the host holds more than {TOTAL_CAP} bytes to read")


@dataclass(frozen=True)
class Difference:
    what: str  # "file", "package", "user", "socket", "process", "authorized_keys"
    message: str


def read(sftp: paramiko.SFTPClient, *, seconds: float = DEADLINE_SECONDS) -> dict:
    """The host as the product sees it now: a JSON-able dict (what a baseline stores). Raises
    Unverified when it cannot be read within `seconds` or the byte caps. A file it must read
    that is not a regular file (a link, a FIFO, a device) is never opened: it is named under
    "irregular", which a pristine host has none of."""
    bounds = _Bounds(seconds)
    irregular: dict[str, str] = {}
    files: dict[str, str] = {}
    for tree in HASHED_TREES:
        _walk(sftp, tree, files, hashed=True, bounds=bounds)
    for tree in PROGRAM_TREES:
        _walk(sftp, tree, files, hashed=True, bounds=bounds)
    passwd = _text(sftp, "/etc/passwd", bounds=bounds, irregular=irregular)
    status = _text(sftp, "/var/lib/dpkg/status", bounds=bounds, irregular=irregular)
    return {
        "version": 1,
        "files": files,
        "packages": _packages(status),
        "users": sorted(_users(passwd)),
        "authorized_keys": _authorized_keys(sftp, passwd, bounds=bounds, irregular=irregular),
        "sockets": sorted(_sockets(sftp, bounds=bounds, irregular=irregular)),
        "programs": sorted(_programs(sftp, bounds=bounds)),
        "cluster_processes": sorted(_cluster_processes(sftp, bounds=bounds, irregular=irregular)),
        "irregular": irregular,
    }


def differences(baseline: dict, now: dict) -> list[Difference]:
    """What `now` has that `baseline` had not, or has changed, most telling first."""
    found: list[Difference] = [
        Difference("process", f"process {entry}") for entry in now.get("cluster_processes", ())
    ]
    for path, what in sorted(now.get("irregular", {}).items()):
        found.append(Difference("file", f"{path} is {what}, not a regular file: not read"))
    for user in sorted(set(now["users"]) - set(baseline.get("users", ()))):
        found.append(Difference("user", f"a user {user} that was not there"))
    for user in sorted(set(baseline.get("users", ())) - set(now["users"])):
        found.append(Difference("user", f"user {user} is gone"))
    keys_then = baseline.get("authorized_keys", {})
    for path, digest in sorted(now["authorized_keys"].items()):
        if keys_then.get(path) != digest:
            found.append(Difference("authorized_keys", f"{path} is not what it was"))
    for entry in sorted(set(now["sockets"]) - set(baseline.get("sockets", ()))):
        found.append(Difference("socket", f"something listens on {entry}"))
    for program in sorted(set(now["programs"]) - set(baseline.get("programs", ()))):
        found.append(Difference("process", f"{program} is running"))
    packages_then = baseline.get("packages", {})
    for name, version in sorted(now["packages"].items()):
        if name not in packages_then:
            found.append(Difference("package", f"package {name} {version} was installed"))
        elif packages_then[name] != version:
            found.append(
                Difference("package", f"package {name} is {version}, not {packages_then[name]}")
            )
    for name in sorted(set(packages_then) - set(now["packages"])):
        found.append(Difference("package", f"package {name} was removed"))
    files_then = baseline.get("files", {})
    for path, entry in sorted(now["files"].items()):
        if path not in files_then:
            found.append(Difference("file", f"{path} was added"))
        elif files_then[path] != entry:
            found.append(Difference("file", f"{path} changed"))
    for path in sorted(set(files_then) - set(now["files"])):
        found.append(Difference("file", f"{path} was removed"))
    return found


def report(found: list[Difference]) -> str:
    """`differences` for staff: one per line, at most SHOWN, and how many more."""
    lines = [d.message for d in found[:SHOWN]]
    if len(found) > SHOWN:
        lines.append(f"… and {len(found) - SHOWN} more differences.")
    return "\n".join(lines)


# --- reading ------------------------------------------------------------------------------------


def _walk(
    sftp: paramiko.SFTPClient,
    top: str,
    files: dict[str, str],
    *,
    hashed: bool,
    bounds: _Bounds,
) -> None:
    bounds.check()
    try:
        entries = sftp.listdir_attr(top)
    except OSError:
        return  # a tree the host does not have (no /opt): the same in the baseline
    for entry in sorted(entries, key=lambda e: e.filename):
        path = f"{top.rstrip('/')}/{entry.filename}"
        if path.startswith(VOLATILE_PREFIXES):
            continue
        mode = entry.st_mode or 0
        owner = f"{entry.st_uid}:{entry.st_gid}"
        bits = f"{stat.S_IMODE(mode):04o}"
        if stat.S_ISLNK(mode):
            try:
                files[path] = f"l {sftp.readlink(path)}"
            except OSError:
                files[path] = "l ?"
        elif stat.S_ISDIR(mode):
            files[path] = f"d {bits} {owner}"
            _walk(sftp, path, files, hashed=hashed, bounds=bounds)
        elif stat.S_ISREG(mode):
            size = entry.st_size or 0
            if hashed and size <= LARGEST_HASHED:
                files[path] = f"f {bits} {owner} {_sha256(sftp, path, size, bounds)}"
            else:
                files[path] = f"f {bits} {owner} {size} {entry.st_mtime}"
        else:
            files[path] = f"o {bits} {owner}"  # a socket, fifo or device node


def _sha256(sftp: paramiko.SFTPClient, path: str, size: int, bounds: _Bounds) -> str:
    """The sha256 of a file the walk found regular (by lstat: the directory listing's). A FIFO
    swapped in since the listing blocks the open on the host; the channel's timeout and the
    deadline bound that (SFTP has no O_NONBLOCK)."""
    bounds.check()
    try:
        data = _capped(sftp, path, LARGEST_HASHED, bounds, prefetch=size)
    except OSError as error:
        if isinstance(error, TimeoutError):
            raise
        return f"unreadable ({error.strerror or error})"
    return hashlib.sha256(data).hexdigest()


def _capped(
    sftp: paramiko.SFTPClient, path: str, cap: int, bounds: _Bounds, *, prefetch: int = 0
) -> bytes:
    """At most `cap` bytes of `path` (more is an Unverified: a file that grew past its cap)."""
    with sftp.open(path, "rb") as handle:
        if prefetch:
            handle.prefetch(prefetch)
        chunks, got = [], 0
        while True:
            bounds.check()
            chunk = handle.read(min(1024 * 1024, cap + 1 - got))
            if not chunk:
                break
            got += len(chunk)
            bounds.take(len(chunk))
            if got > cap:
                raise Unverified(f"{path} holds more than the {cap} bytes it may")
            chunks.append(chunk)
    return b"".join(chunks)


def regular(sftp: paramiko.SFTPClient, path: str) -> str | None:
    """None when `path` is a regular file or absent (by lstat: a link is not followed), else
    what it is ("a link to /dev/zero", "a FIFO", "a device", "a socket", "a folder")."""
    try:
        mode = sftp.lstat(path).st_mode or 0
    except OSError as error:
        if isinstance(error, TimeoutError):
            raise
        return None
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISLNK(mode):
        try:
            return f"a link to {sftp.readlink(path)}"
        except OSError:
            return "a link"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISDIR(mode):
        return "a folder"
    return "not a file"


def _text(
    sftp: paramiko.SFTPClient,
    path: str,
    *,
    bounds: _Bounds,
    irregular: dict[str, str],
) -> str:
    """The text of a regular file, at most READ_CAP bytes; "" when absent or unreadable. A file
    that is not regular is never opened: it goes into `irregular`."""
    bounds.check()
    what = regular(sftp, path)
    if what:
        irregular[path] = what
        return ""
    try:
        return _capped(sftp, path, READ_CAP, bounds).decode(errors="replace")
    except OSError as error:
        if isinstance(error, TimeoutError):
            raise
        return ""


def _packages(status: str) -> dict[str, str]:
    """Installed packages from dpkg's status file: {name (with :arch where given): version}."""
    installed = {}
    for paragraph in status.split("\n\n"):
        fields = {}
        for line in paragraph.splitlines():
            key, sep, value = line.partition(": ")
            if sep and not line.startswith(" "):
                fields[key] = value.strip()
        if fields.get("Status", "").endswith(" installed") and "Package" in fields:
            name = fields["Package"]
            if fields.get("Architecture") not in (None, "all", "amd64", "arm64"):
                name = f"{name}:{fields['Architecture']}"
            installed[name] = fields.get("Version", "")
    return installed


def _users(passwd: str) -> set[str]:
    return {line.split(":", 1)[0] for line in passwd.splitlines() if ":" in line}


def _authorized_keys(
    sftp: paramiko.SFTPClient, passwd: str, *, bounds: _Bounds, irregular: dict[str, str]
) -> dict[str, str]:
    """{path: sha256} of every user's authorized_keys and authorized_keys2 that exists."""
    homes = {"/root"}
    for line in passwd.splitlines():
        parts = line.split(":")
        if len(parts) >= 6 and parts[5].startswith("/"):
            homes.add(parts[5].rstrip("/") or "/")
    found = {}
    for home in sorted(homes):
        for name in ("authorized_keys", "authorized_keys2"):
            path = f"{home.rstrip('/')}/.ssh/{name}"
            bounds.check()
            what = regular(sftp, path)
            if what:
                irregular[path] = what
                found[path] = what
                continue
            try:
                data = _capped(sftp, path, KEYS_CAP, bounds)
            except OSError as error:
                if isinstance(error, TimeoutError):
                    raise
                continue
            found[path] = hashlib.sha256(data).hexdigest()
    return found


def _sockets(sftp: paramiko.SFTPClient, *, bounds: _Bounds, irregular: dict[str, str]) -> set[str]:
    """Listening TCP and unconnected UDP sockets: "tcp 0.0.0.0:22", "udp6 [::]:5353"."""
    found = set()
    for table in SOCKET_TABLES:
        text = _text(sftp, f"/proc/net/{table}", bounds=bounds, irregular=irregular)
        found |= listening(table, text)
    return found


def listening(table: str, text: str) -> set[str]:
    """The listening sockets of one /proc/net table (`tcp`, `tcp6`, `udp`, `udp6`) as the
    kernel writes it."""
    found = set()
    for line in text.splitlines()[1:]:
        parts = line.split()
        if len(parts) < 4:
            continue
        if parts[3] != (TCP_LISTEN if table.startswith("tcp") else UDP_UNCONNECTED):
            continue
        address, _, port = parts[1].partition(":")
        try:
            found.add(f"{table} {_address(address)}:{int(port, 16)}")
        except ValueError:
            continue
    return found


def _address(hex_address: str) -> str:
    raw = bytes.fromhex(hex_address)
    if len(raw) == 4:
        return ".".join(str(b) for b in reversed(raw))
    # IPv6 in /proc is four 32-bit words, each in host (little-endian) order.
    words = [raw[i : i + 4][::-1] for i in range(0, 16, 4)]
    return f"[{ipaddress.IPv6Address(b''.join(words))}]"


def _programs(sftp: paramiko.SFTPClient, *, bounds: _Bounds) -> set[str]:
    """The executables of the running processes (kernel threads have none), but our own
    session's. A program whose file was replaced or deleted since it started reads
    "PATH (deleted)": never one of the baseline's."""
    found: set[str] = set()
    try:
        pids = [name for name in sftp.listdir("/proc") if name.isdigit()]
    except OSError:
        return found
    for pid in pids:
        bounds.check()
        try:
            exe = sftp.readlink(f"/proc/{pid}/exe")
        except OSError:
            continue  # a kernel thread, or a process that ended meanwhile
        if exe and exe not in OWN_SESSION:
            found.add(exe)
    return found


def _cluster_processes(
    sftp: paramiko.SFTPClient, *, bounds: _Bounds, irregular: dict[str, str]
) -> list[str]:
    """Every process of a cluster still running ("812 uses a cluster's key: ssh -i …"), read
    from /proc, but our own session's."""
    private = private_sockets(_text(sftp, "/proc/net/tcp", bounds=bounds, irregular=irregular))
    found: list[str] = []
    try:
        pids = [name for name in sftp.listdir("/proc") if name.isdigit()]
    except OSError:
        return found
    for pid in sorted(pids, key=int):
        bounds.check()
        try:
            if sftp.readlink(f"/proc/{pid}/exe") in OWN_SESSION:
                continue
            cmdline_path = f"/proc/{pid}/cmdline"
            what = regular(sftp, cmdline_path)
            if what:
                irregular[cmdline_path] = what
                continue
            cmdline = _capped(sftp, cmdline_path, KEYS_CAP, bounds)
            fds = [sftp.readlink(f"/proc/{pid}/fd/{fd}") for fd in sftp.listdir(f"/proc/{pid}/fd")]
        except OSError as error:
            if isinstance(error, TimeoutError):
                raise
            continue  # a kernel thread, or a process that ended meanwhile
        why = cluster_process(cmdline, fds, private)
        if why:
            command = cmdline.replace(b"\0", b" ").decode(errors="replace").strip()
            found.append(f"{pid} {why}: {command[:300]}")
    return found


def cluster_process(cmdline: bytes, fds: list[str], private: set[str]) -> str | None:
    """Why a process with this command line and these open files (`/proc/PID/fd` links) is a
    cluster's, or None. `private`: the socket inodes on the private network."""
    if not cmdline:
        return None  # a kernel thread or a zombie
    if CLUSTER_KEY.encode() in cmdline:
        return "uses a cluster's key"
    if any(CLUSTER_KEY in target for target in fds):
        return "holds a cluster's key open"
    if any(target.removeprefix("socket:[").removesuffix("]") in private for target in fds):
        return "is connected over the private network"
    return None


def private_sockets(text: str) -> set[str]:
    """The inodes ("4711") of /proc/net/tcp's sockets with either end on the private network,
    listening or not."""
    found = set()
    for line in text.splitlines()[1:]:
        parts = line.split()
        if len(parts) < 10 or parts[9] == "0":
            continue
        try:
            ends = [ipaddress.ip_address(_address(p.partition(":")[0])) for p in parts[1:3]]
        except ValueError:
            continue
        if any(end in PRIVATE_NETWORK for end in ends):
            found.add(parts[9])
    return found


# --- the reimage --------------------------------------------------------------------------------

_NEW_KEY = re.compile(r"^(?:runcrate: )?host_key=(ssh-[a-z0-9-]+ [A-Za-z0-9+/=]+)\s*$", re.M)


class ReimageFailed(Exception):
    def __init__(self, message: str, output: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.output = output


def run_reimage(host: Host, *, command: str, timeout: float) -> str | None:
    """Run the operator's reimage command for `host` (docs/inventory.md) and return the new
    host key it printed (a line `host_key=ssh-ed25519 AAAA…`), or None when it kept its key.
    Raises ReimageFailed when it exits non-zero or outlives `timeout`. The command is the
    operator's own, from the inventory, run by /bin/sh; the host goes in its environment."""
    environment = {
        **os.environ,
        "RUNCRATE_HOST_NAME": host.name,
        "RUNCRATE_HOST_ADDRESS": host.address,
        "RUNCRATE_HOST_PORT": str(host.port),
    }
    try:
        done = subprocess.run(  # noqa: S602 (the operator's own command, from the inventory)
            command,
            shell=True,
            env=environment,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as error:
        output = _decoded(error.stdout) + _decoded(error.stderr)
        raise ReimageFailed(
            f"the reimage of {host.name} did not finish within {timeout:.0f} seconds", output
        ) from None
    except OSError as error:
        raise ReimageFailed(f"the reimage of {host.name} could not start: {error}") from None
    output = (done.stdout or "") + (done.stderr or "")
    if done.returncode != 0:
        last = output.strip().splitlines()[-1:] or ["no output"]
        raise ReimageFailed(
            f"the reimage of {host.name} failed (exit status {done.returncode}): {last[0][:200]}",
            output[-20_000:],
        )
    found = _NEW_KEY.findall(done.stdout or "")
    return found[-1] if found else None


def _decoded(data: bytes | str | None) -> str:
    if data is None:
        return ""
    return data if isinstance(data, str) else data.decode(errors="replace")
