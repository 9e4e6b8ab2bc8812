"""What a host is, read by the product itself, and whether it is what it was.

A tenant is root on their nodes, so nothing the host would run can be trusted to say it is
clean: a replaced `sh`, `pgrep` or `grep` lies. The dashboard reads files, `/proc` and package
lists through the SFTP channel with its own code (paramiko; parsing here, on the dashboard) and
compares them with the **baseline** recorded when staff registered the host freshly imaged
(`clusters/machines/hosts.py`, docs/inventory.md "Reimage before reuse"):

- the installed packages (`/var/lib/dpkg/status`: name and version);
- the users (`/etc/passwd`), every user's `authorized_keys` (hashed here);
- every entry under `CONTENT_TREES` (by lstat: a link by its target, never followed), each
  regular file by mode, owner, size and sha256: `/etc`, `/root`, `/home`, `/usr/local`, `/opt`,
  the temporary folders, `/var/spool/cron`, `/var/lib`, and the system's programs and libraries
  (`/usr/bin`, `/usr/sbin`, `/usr/lib`, `/usr/lib64`, `/usr/libexec`; `/bin` and friends);
- the listening sockets (`/proc/net/tcp`, `tcp6`, `udp`, `udp6`) and the programs running
  (`/proc/PID/exe`);
- any process of a cluster, found by its credentials (never a pristine host's, whatever its
  baseline says): one whose command line names a cluster key (`…/.ssh/runcrate_cluster`, as
  sshfs's `ssh … -oIdentityFile=…` child does), one holding such a key open, one with a TCP
  socket to or from the private network (`/proc/PID/cmdline`, `/proc/PID/fd`, `/proc/net/tcp`);
  the same rule as the wipe's (clusters/machines/software/host/cluster-processes.sh).

The one command it runs is the image's own `sha256sum`, for the contents (gigabytes cannot
cross SFTP in seconds), and only once the dashboard has hashed, itself, everything that
program's answers depend on (`trust`: the program, the login shell, their loader and
libraries, the loader's cache and preload list, what sshd, PAM and bash read into the session)
and found it as the baseline has it, with no program running that the baseline had not
(`distrust`). Otherwise the host is already not pristine, and the report says why.

What it cannot see, and does not claim: a kernel the tenant changed, or an sshd or
sftp-server that lies (the channel itself). The reimage is the guarantee; this verification
proves that a reimage happened and left nothing behind.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import posixpath
import re
import shlex
import stat
import struct
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import paramiko

from clusters import models

if TYPE_CHECKING:
    from offers.models import Host

VERSION = 2  # of what `read` returns: a baseline of another version is recorded anew (`outdated`)
# Paths on the host (never this machine's own /tmp). Every regular file under them is compared by
# type, mode, owner, size and sha256: the trees a tenant could leave something in, the system's
# programs and libraries (a same-size `pgrep` with its time restored by `touch -r` is another
# sha256), and the state under /var/lib. /bin, /sbin, /lib and /lib64 are links into /usr on a
# merged image (then only the link is compared) and trees of their own on an older one.
CONTENT_TREES = (  # noqa: S108
    "/etc",
    "/root",
    "/home",
    "/usr/local",
    "/opt",
    "/tmp",  # noqa: S108
    "/var/tmp",  # noqa: S108
    "/var/spool/cron",
    "/var/lib",
    "/usr/bin",
    "/usr/sbin",
    "/usr/lib",
    "/usr/lib64",
    "/usr/libexec",
    "/bin",
    "/sbin",
    "/lib",
    "/lib64",
)
# Files that differ on every boot of a healthy host, or that the product's own connection
# makes: never a tenant's leftover. (/tmp/systemd-private-*: systemd's per-service folders.)
# Nothing under /var/lib: on the lab nothing there changed between two reads of an untouched
# host, nor across a reset (docs/inventory.md).
VOLATILE_PREFIXES = ("/tmp/systemd-private-", "/etc/ssh/ssh_host_")  # noqa: S108
# The programs our own verification session runs on the host.
OWN_SESSION = frozenset({"/usr/lib/openssh/sftp-server", "/usr/libexec/sftp-server"})
SOCKET_TABLES = ("tcp", "tcp6", "udp", "udp6")
TCP_LISTEN = "0A"
UDP_UNCONNECTED = "07"
# Bounds on the read, so nothing a host holds can stall the dashboard (docs/inventory.md): a
# file the reader opens must be a regular file by lstat first (never a link, FIFO or device);
# each read takes at most READ_CAP bytes of it, all of them at most TOTAL_CAP; every SFTP reply
# must come within REPLY_SECONDS (the channel's timeout, set by the caller), and the whole read
# ends by its deadline (DEADLINE_SECONDS unless the caller gives one), the host's own hashing
# included (each of its commands gets what is left of it).
READ_CAP = 32 * 1024 * 1024  # dpkg's status file is a few MB on a large image
KEYS_CAP = 1024 * 1024  # an authorized_keys file
TOTAL_CAP = 4 * 1024 * 1024 * 1024
REPLY_SECONDS = 20.0
DEADLINE_SECONDS = 600.0
SHOWN = 200  # differences listed; the count says how many more
CLUSTER_KEY = "/.ssh/runcrate_cluster"  # where bootstrap.sh puts every cluster's key
PRIVATE_NETWORK = ipaddress.ip_network(models.PRIVATE_NETWORK)

# --- the host's own hashing, and what it depends on ---------------------------------------------
# The contents are hashed on the host by the image's sha256sum (SFTP cannot carry gigabytes in
# seconds), but only once the dashboard has read, over SFTP with its own hashing, everything that
# program's answers depend on and found it as the baseline has it ("the trust", `trust`): the
# program, the login shell sshd runs it through, their ELF interpreter and every library they
# load (by every name the loader could take it from), the loader's cache and preload list, what
# sshd, PAM and bash read into the session (environment files, bash's rc files, ~/.ssh/rc),
# PAM's modules, and the kernel's binfmt_misc handlers. Otherwise no content the host hashed is
# believed: files are compared by type, mode, owner and size, and the report says why.
TOOL = "/usr/bin/sha256sum"
TRUST_FILES = (
    "/etc/ld.so.preload",
    "/etc/ld.so.cache",
    "/etc/environment",
    "/etc/default/locale",
    "/etc/security/pam_env.conf",
    "/etc/bash.bashrc",
    "/etc/profile",
    "/etc/nsswitch.conf",
    "/etc/ssh/sshd_config",
    "/etc/ssh/sshrc",
)
TRUST_FOLDERS = (  # every file in them
    "/etc/pam.d",
    "/etc/ssh/sshd_config.d",
    "/usr/lib/x86_64-linux-gnu/security",
    "/usr/lib/aarch64-linux-gnu/security",
    "/usr/lib/security",
    "/usr/lib64/security",
)
HOME_FILES = (  # in the login user's home: what bash, sshd and pam_env read for a command
    ".bashrc",
    ".bash_profile",
    ".bash_login",
    ".profile",
    ".bash_aliases",
    ".pam_environment",
    ".ssh/environment",
    ".ssh/rc",
)
# Where the loader looks for a library after the ld.so.cache (whose own paths are candidates too).
LIBRARY_DIRS = (
    "/lib/x86_64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu",
    "/lib/aarch64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/lib64",
    "/usr/lib64",
    "/lib",
    "/usr/lib",
)
BINFMT = "/proc/sys/fs/binfmt_misc"
TRUST_CAP = 16 * 1024 * 1024  # a file of the trust read whole; bigger is never trusted
TRUST_MOST = 400  # entries of the trust; more (a library closure gone wild) is never trusted
NEVER_TRUSTED = "never trusted"
LINK_HOPS = 40
# The host's hashing: HASHERS commands at a time on the session, each naming at most
# BATCH_COMMAND bytes of quoted paths (Linux takes at most 128 KiB for one argument, and sshd
# hands the command to the shell as one) and at most BATCH_BYTES of content, unless one file is
# bigger.
HASHERS = 4
BATCH_COMMAND = 96 * 1024
BATCH_BYTES = 512 * 1024 * 1024
_HASH = re.compile(r"[0-9a-f]{64}")


class Run(Protocol):
    """How the reader runs a command on the host: the ssh driver's bounded Session.run."""

    def __call__(
        self, command: str, *, timeout: float, max_bytes: int, name: str
    ) -> tuple[int, str]: ...


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


def read(
    sftp: paramiko.SFTPClient,
    *,
    run: Run,
    user: str = "root",
    baseline: dict | None = None,
    seconds: float = DEADLINE_SECONDS,
) -> dict:
    """The host as the product sees it now: a JSON-able dict (what a baseline stores). Raises
    Unverified when it cannot be read within `seconds` or the byte caps. A file it must read
    that is not a regular file (a link, a FIFO, a device) is never opened: it is named under
    "irregular", which a pristine host has none of.

    In this order: what the host's own hashing depends on (`trust`, read and hashed here), the
    running programs, and the walk of every tree (lstat, over SFTP); then, only when `distrust`
    finds no reason against it (`baseline` None: staff vouch for a freshly imaged host), the
    contents are hashed on the host with `run` (`user`'s login shell runs it), and the trust is
    read again to be sure nothing moved meanwhile. Otherwise the reasons are under
    "distrusted" and no content is claimed ("?")."""
    bounds = _Bounds(seconds)
    irregular: dict[str, str] = {}
    passwd = _text(sftp, "/etc/passwd", bounds=bounds, irregular=irregular)
    trusted_before = trust(sftp, passwd, user=user, bounds=bounds)
    programs = sorted(_programs(sftp, bounds=bounds))
    cluster_processes = sorted(_cluster_processes(sftp, bounds=bounds, irregular=irregular))
    listing: dict[str, str] = {}
    sizes: dict[str, int] = {}
    for tree in CONTENT_TREES:
        _walk(sftp, tree, listing, sizes, bounds=bounds)
    status = _text(sftp, "/var/lib/dpkg/status", bounds=bounds, irregular=irregular)
    now = {
        "version": VERSION,
        "packages": _packages(status),
        "users": sorted(_users(passwd)),
        "authorized_keys": _authorized_keys(sftp, passwd, bounds=bounds, irregular=irregular),
        "sockets": sorted(_sockets(sftp, bounds=bounds, irregular=irregular)),
        "programs": programs,
        "cluster_processes": cluster_processes,
        "irregular": irregular,
        "trust": trusted_before,
    }
    reasons = distrust(baseline, now)
    contents: dict[str, str] = {}
    if not reasons:
        contents = hash_on_host(run, sizes, bounds=bounds)
        if trust(sftp, passwd, user=user, bounds=bounds) != trusted_before:
            reasons = ["what the host's sha256sum depends on changed while it ran"]
            contents = {}
    now["distrusted"] = reasons
    now["files"] = {
        path: f"{entry} {contents.get(path, '?')}" if path in sizes else entry
        for path, entry in listing.items()
    }
    return now


def outdated(baseline: dict) -> Difference | None:
    """A baseline that an older version of this reader recorded (it read less) cannot be
    compared with: staff record it anew (never a flood of "added", never a silent pass)."""
    version = baseline.get("version")
    if version == VERSION:
        return None
    return Difference(
        "baseline",
        f"the baseline was recorded by an older check (version {version}, now {VERSION}) that "
        "read less of the host: reimage the host, then Record baseline again",
    )


def distrust(baseline: dict | None, now: dict) -> list[str]:
    """Why the host's own hashing may not be believed, from what the dashboard read itself:
    what it depends on differs from the baseline, a program the baseline had not is running (it
    could tamper with the hashing as it runs), or a cluster's process is. [] when it may be;
    always [] with no baseline (staff vouch for a freshly imaged host, recording it)."""
    if baseline is None:
        return []
    reasons = []
    then, trust_now = baseline.get("trust", {}), now.get("trust", {})
    for key in sorted(set(then) | set(trust_now)):
        if key not in then:
            reasons.append(f"{key} is new ({trust_now[key]})")
        elif key not in trust_now:
            reasons.append(f"{key} is gone")
        elif then[key] != trust_now[key]:
            reasons.append(f"{key} is not what it was")
        elif NEVER_TRUSTED in trust_now[key]:
            reasons.append(f"{key}: {trust_now[key]}")
    for program in sorted(set(now.get("programs", ())) - set(baseline.get("programs", ()))):
        reasons.append(f"{program} is running, which the baseline had not")
    if now.get("cluster_processes"):
        reasons.append("a cluster's process is running")
    return reasons


def differences(baseline: dict, now: dict) -> list[Difference]:
    """What `now` has that `baseline` had not, or has changed, most telling first."""
    old = outdated(baseline)
    if old:
        return [old]
    found: list[Difference] = []
    if now.get("distrusted"):
        found.append(
            Difference(
                "trust",
                "the host's own sha256sum was not trusted, so files were compared by type, "
                "mode, owner and size only: " + "; ".join(now["distrusted"][:20]),
            )
        )
    found += [
        Difference("process", f"process {entry}") for entry in now.get("cluster_processes", ())
    ]
    for path, what in sorted(now.get("irregular", {}).items()):
        found.append(Difference("file", f"{path} is {what}, not a regular file: not read"))
    found += _access_differences(baseline, now)
    found += _package_differences(baseline.get("packages", {}), now["packages"])
    found += _file_differences(baseline.get("files", {}), now["files"])
    return found


def _access_differences(baseline: dict, now: dict) -> list[Difference]:
    """Who and what can reach the host now that could not: users, authorized keys, listening
    sockets, running programs."""
    found: list[Difference] = []
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
    return found


def _package_differences(packages_then: dict, packages_now: dict) -> list[Difference]:
    """The packages installed, upgraded or downgraded, and removed."""
    found: list[Difference] = []
    for name, version in sorted(packages_now.items()):
        if name not in packages_then:
            found.append(Difference("package", f"package {name} {version} was installed"))
        elif packages_then[name] != version:
            found.append(
                Difference("package", f"package {name} is {version}, not {packages_then[name]}")
            )
    for name in sorted(set(packages_then) - set(packages_now)):
        found.append(Difference("package", f"package {name} was removed"))
    return found


def _file_differences(files_then: dict, files_now: dict) -> list[Difference]:
    """The files added, changed and removed."""
    found: list[Difference] = []
    for path, entry in sorted(files_now.items()):
        if path not in files_then:
            found.append(Difference("file", f"{path} was added"))
        elif not _same(files_then[path], entry):
            found.append(Difference("file", f"{path} changed"))
    for path in sorted(set(files_then) - set(files_now)):
        found.append(Difference("file", f"{path} was removed"))
    return found


def _same(then: str, now: str) -> bool:
    """Whether a file's entry is as it was; a content not known now ("?": the host's hashing
    not trusted) leaves type, mode, owner and size to compare."""
    if now.endswith(" ?") and then.startswith("f "):
        return then.rsplit(" ", 1)[0] == now.rsplit(" ", 1)[0]
    return then == now


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
    sizes: dict[str, int],
    *,
    bounds: _Bounds,
) -> None:
    """Every entry under `top` by lstat (the listing's attributes): a link by its target, never
    followed; a regular file by mode, owner and size, and into `sizes` for its content. A top
    that is a link (/lib on a merged image) is that link only."""
    bounds.check()
    try:
        top_mode = sftp.lstat(top).st_mode or 0
    except OSError as error:
        if isinstance(error, TimeoutError):
            raise
        return  # a tree the host does not have (no /opt): the same in the baseline
    if stat.S_ISLNK(top_mode):
        files[top] = f"l {_readlink(sftp, top)}"
        return
    if not stat.S_ISDIR(top_mode):
        files[top] = f"o {stat.S_IMODE(top_mode):04o}"
        return
    _walk_folder(sftp, top, files, sizes, bounds=bounds)


def _walk_folder(
    sftp: paramiko.SFTPClient,
    top: str,
    files: dict[str, str],
    sizes: dict[str, int],
    *,
    bounds: _Bounds,
) -> None:
    bounds.check()
    try:
        entries = sftp.listdir_attr(top)
    except OSError as error:
        if isinstance(error, TimeoutError):
            raise
        return
    except UnicodeDecodeError:  # paramiko decodes names as UTF-8, strictly
        raise Unverified(f"a name in {top} is not UTF-8: it cannot be compared") from None
    for entry in sorted(entries, key=lambda e: e.filename):
        path = f"{top.rstrip('/')}/{entry.filename}"
        if path.startswith(VOLATILE_PREFIXES):
            continue
        mode = entry.st_mode or 0
        owner = f"{entry.st_uid}:{entry.st_gid}"
        bits = f"{stat.S_IMODE(mode):04o}"
        if stat.S_ISLNK(mode):
            files[path] = f"l {_readlink(sftp, path)}"
        elif stat.S_ISDIR(mode):
            files[path] = f"d {bits} {owner}"
            _walk_folder(sftp, path, files, sizes, bounds=bounds)
        elif stat.S_ISREG(mode):
            size = entry.st_size or 0
            files[path] = f"f {bits} {owner} {size}"
            sizes[path] = size
        else:
            files[path] = f"o {bits} {owner}"  # a socket, fifo or device node


def _readlink(sftp: paramiko.SFTPClient, path: str) -> str:
    try:
        return sftp.readlink(path) or "?"
    except OSError as error:
        if isinstance(error, TimeoutError):
            raise
        return "?"


# --- the host's own hashing ---------------------------------------------------------------------


def hash_on_host(run: Run, sizes: dict[str, int], *, bounds: _Bounds) -> dict[str, str]:
    """{path: sha256, or "unreadable"} of every file in `sizes`, hashed on the host by TOOL in
    batches, HASHERS at a time, each under what is left of the read's deadline and capped to
    the bytes its answer can take. Only ever called once `distrust` found nothing."""
    found: dict[str, str] = {}
    with ThreadPoolExecutor(max_workers=HASHERS) as pool:
        for answer in pool.map(lambda batch: _hash_batch(run, batch, bounds), _batches(sizes)):
            found.update(answer)
    return found


def _batches(sizes: dict[str, int]) -> list[list[str]]:
    """The paths in batches of at most BATCH_COMMAND bytes of command and BATCH_BYTES of
    content (a bigger file alone), the most content first, so the HASHERS end together."""
    batches: list[list[str]] = []
    batch: list[str] = []
    length = content = 0
    for path in sorted(sizes):
        quoted = len(shlex.quote(path).encode()) + 1
        if batch and (length + quoted > BATCH_COMMAND or content + sizes[path] > BATCH_BYTES):
            batches.append(batch)
            batch, length, content = [], 0, 0
        batch.append(path)
        length += quoted
        content += sizes[path]
    if batch:
        batches.append(batch)
    return sorted(batches, key=lambda b: -sum(sizes[p] for p in b))


def _hash_batch(run: Run, batch: list[str], bounds: _Bounds) -> dict[str, str]:
    bounds.check()
    command = f"exec {TOOL} --zero -- {' '.join(shlex.quote(p) for p in batch)} 2>/dev/null"
    _, output = run(
        command,
        timeout=max(bounds.deadline - time.monotonic(), 0.001),
        max_bytes=sum(67 + len(p.encode()) for p in batch) + 1024,
        name="the host's sha256sum",
    )
    return parse_hashes(output, batch)


def parse_hashes(output: str, batch: list[str]) -> dict[str, str]:
    """sha256sum --zero's answer for `batch`: records `HASH  PATH\0` in the order asked, a file
    it could not read left out ("unreadable"). A path cannot hold NUL, so no name can forge a
    record; anything else is Unverified."""
    found = dict.fromkeys(batch, "unreadable")
    records = output.split("\0")
    if records[-1] != "":
        raise Unverified("the host's sha256sum answered something that is not its records")
    position = 0
    for record in records[:-1]:
        digest, mark, path = record[:64], record[64:66], record[66:]
        try:
            position = batch.index(path, position)
        except ValueError:
            position = -1
        if not _HASH.fullmatch(digest) or mark not in ("  ", " *") or position < 0:
            raise Unverified("the host's sha256sum answered something that is not its records")
        found[path] = digest
        position += 1
    return found


# --- what the host's hashing depends on ---------------------------------------------------------


def trust(sftp: paramiko.SFTPClient, passwd: str, *, user: str, bounds: _Bounds) -> dict[str, str]:
    """Everything TOOL's answers depend on, read and hashed by the dashboard over SFTP:
    {path or what: "RESOLVED MODE OWNER SHA256", "absent", "RESOLVED is a FIFO", …}. Links are
    followed as the loader, PAM and bash would (the value names where they led)."""
    found: dict[str, str] = {}
    asked = _Asked(sftp, bounds)
    home, shell = _login(passwd, user)
    found["the login shell"] = f"{user}: {shell}"
    for path in TRUST_FILES + tuple(f"{home.rstrip('/')}/{name}" for name in HOME_FILES):
        found[path] = _trust_file(asked, path)[0]
    for folder in TRUST_FOLDERS:
        found.update(_trust_folder(asked, folder))
    _trust_programs(asked, (TOOL, shell), found)
    found["binfmt_misc"] = _binfmt(sftp, bounds)
    return found


class _Asked:
    """One trust read's questions to the host, each asked once: a path's lstat, a link's
    target, a file's contents. Resolving a library's path asks about every folder on the way,
    and the same folders lead to most libraries: asked again, they were two SFTP round trips
    in three of the read. `read` makes a second trust read, which asks everything anew."""

    def __init__(self, sftp: paramiko.SFTPClient, bounds: _Bounds) -> None:
        self.sftp, self.bounds = sftp, bounds
        self.files: dict[str, tuple[str, bytes | None]] = {}  # by the path links led to
        self._lstat: dict[str, paramiko.SFTPAttributes | None] = {}
        self._link: dict[str, str | None] = {}

    def lstat(self, path: str) -> paramiko.SFTPAttributes | None:
        """The path's own attributes (a link's, not its target's); None when it cannot be read."""
        if path not in self._lstat:
            self.bounds.check()
            self._lstat[path] = self._answer(self.sftp.lstat, path)
        return self._lstat[path]

    def readlink(self, path: str) -> str | None:
        if path not in self._link:
            self.bounds.check()
            self._link[path] = self._answer(lambda at: self.sftp.readlink(at) or "", path)
        return self._link[path]

    @staticmethod
    def _answer(ask, path: str):
        try:
            return ask(path)
        except OSError as error:
            if isinstance(error, TimeoutError):
                raise
            return None


def _trust_folder(asked: _Asked, folder: str) -> dict[str, str]:
    """A folder TOOL's answers depend on: where it leads and what it holds, and each file in
    it."""
    found: dict[str, str] = {}
    real, mode = _resolve(asked, folder)
    if real is None or not stat.S_ISDIR(mode):
        found[f"folder {folder}"] = "absent" if real is None else f"{real} is not a folder"
        return found
    try:
        names = sorted(asked.sftp.listdir(real))
    except OSError as error:
        if isinstance(error, TimeoutError):
            raise
        found[f"folder {folder}"] = f"{real} is unreadable"
        return found
    found[f"folder {folder}"] = f"{real}: {' '.join(names)}"
    for name in names:
        path = f"{folder}/{name}"
        found[path] = _trust_file(asked, path)[0]
    return found


def _trust_programs(asked: _Asked, programs: tuple[str, ...], found: dict[str, str]) -> None:
    """Add to `found` the programs and every library they load, transitively: the
    interpreter and needed libraries of each ELF program, searched as the loader would."""
    by_name = _libraries_by_name(asked)
    queue = list(programs)
    while queue:
        path = queue.pop(0)
        if path in found and path not in programs:
            continue
        if len(found) > TRUST_MOST:
            found["the libraries"] = f"more than {TRUST_MOST} files to check: {NEVER_TRUSTED}"
            break
        value, data = _trust_file(asked, path)
        found[path] = value
        if data is None:
            continue
        program = elf_program(data)
        if program is None:
            if path in programs:
                found[path] = f"{value} (not an ELF program the dashboard reads: {NEVER_TRUSTED})"
            continue
        queue += _loaded_by(program, value, by_name)


def _libraries_by_name(asked: _Asked) -> dict[str, list[str]]:
    """Every path the (verified) ld.so.cache names is a candidate for a library of that
    name."""
    by_name: dict[str, list[str]] = {}
    library_cache = _trust_file(asked, "/etc/ld.so.cache")[1] or b""
    for entry in library_cache.split(b"\0"):
        if entry.startswith(b"/"):
            text = entry.decode(errors="replace")
            by_name.setdefault(posixpath.basename(text), []).append(text)
    return by_name


def _loaded_by(
    program: tuple[str | None, list[str], list[str]], value: str, by_name: dict[str, list[str]]
) -> list[str]:
    """The paths an ELF program (its interpreter, needed libraries and search path) may load,
    where its trusted `value` says it lives."""
    interpreter, needed, search = program
    origin = posixpath.dirname(value.split(" ", 1)[0])
    folders = [d.replace("$ORIGIN", origin) for d in search] + list(LIBRARY_DIRS)
    paths = [interpreter] if interpreter else []
    for name in needed:
        if "/" in name:
            paths.append(name)
        else:
            paths += [f"{d.rstrip('/')}/{name}" for d in folders] + by_name.get(name, [])
    return paths


def _login(passwd: str, user: str) -> tuple[str, str]:
    """(home, shell) of `user` in /etc/passwd; sshd runs every command through that shell."""
    for line in passwd.splitlines():
        parts = line.split(":")
        if len(parts) >= 7 and parts[0] == user:
            return parts[5] or "/", parts[6] or "/bin/sh"
    return "/root", "/bin/sh"


def _resolve(asked: _Asked, path: str) -> tuple[str | None, int]:
    """Where `path` leads, every link followed component by component (by lstat and readlink:
    nothing is opened), and the mode of what is there; (None, 0) when nothing is there, or
    the links go round."""
    parts = [p for p in path.split("/") if p]
    done, mode, hops = "", 0, 0
    while parts:
        name = parts.pop(0)
        if name == ".":
            continue
        if name == "..":
            done = posixpath.dirname(done) if done not in ("", "/") else ""
            done = "" if done == "/" else done
            continue
        candidate = f"{done}/{name}"
        attributes = asked.lstat(candidate)
        if attributes is None:
            return None, 0
        mode = attributes.st_mode or 0
        if stat.S_ISLNK(mode):
            hops += 1
            target = asked.readlink(candidate) if hops <= LINK_HOPS else None
            if target is None:
                return None, 0
            if target.startswith("/"):
                done = ""
            parts = [p for p in target.split("/") if p] + parts
            continue
        done = candidate
    return done or "/", mode


def _trust_file(asked: _Asked, path: str) -> tuple[str, bytes | None]:
    """("RESOLVED MODE OWNER SHA256", its bytes) of the file `path` leads to, read whole by the
    dashboard (at most TRUST_CAP); ("absent", None), ("RESOLVED is not a regular file", None)
    and such otherwise: only a regular file is opened."""
    real, mode = _resolve(asked, path)
    if real is None:
        return "absent", None
    if not stat.S_ISREG(mode):
        return f"{real} is {'a folder' if stat.S_ISDIR(mode) else 'not a regular file'}", None
    if real not in asked.files:
        asked.files[real] = _trust_read(asked, real)
    return asked.files[real]


def _trust_read(asked: _Asked, real: str) -> tuple[str, bytes | None]:
    """The regular file at `real` (no link on the way: `_resolve` found it) read and hashed."""
    attributes = asked.lstat(real)  # _resolve's answer, not a new question
    if attributes is None:  # never, after _resolve: for the type
        return f"{real} is unreadable", None
    mode, size = attributes.st_mode or 0, attributes.st_size or 0
    if size > TRUST_CAP:
        return f"{real} is over {TRUST_CAP} bytes: {NEVER_TRUSTED}", None
    try:
        # Its reads asked at once (paramiko's prefetch), not one 32 KiB round trip after another.
        data = _capped(asked.sftp, real, TRUST_CAP, asked.bounds, prefetch=size)
    except OSError as error:
        if isinstance(error, TimeoutError):
            raise
        return f"{real} is unreadable", None
    owner = f"{attributes.st_uid}:{attributes.st_gid}"
    return f"{real} {stat.S_IMODE(mode):04o} {owner} {hashlib.sha256(data).hexdigest()}", data


def _binfmt(sftp: paramiko.SFTPClient, bounds: _Bounds) -> str:
    """The kernel's binfmt_misc handlers by name: one could run any program through another."""
    bounds.check()
    try:
        names = sftp.listdir(BINFMT)
    except OSError as error:
        if isinstance(error, TimeoutError):
            raise
        return "not mounted"
    return " ".join(sorted(set(names) - {"register", "status"})) or "none"


def elf_program(data: bytes) -> tuple[str | None, list[str], list[str]] | None:
    """(interpreter, needed libraries, RPATH and RUNPATH folders) of a 64-bit ELF file, as its
    program headers and dynamic section give them; None when `data` is not one this reads."""
    if len(data) < 64 or data[:4] != b"\x7fELF" or data[4] != 2 or data[5] not in (1, 2):
        return None
    order = "<" if data[5] == 1 else ">"
    try:
        (phoff,) = struct.unpack_from(f"{order}Q", data, 0x20)
        phentsize, phnum = struct.unpack_from(f"{order}HH", data, 0x36)
        interpreter, dynamic, loads = None, None, []
        for index in range(phnum):
            kind, _, offset, vaddr, _, filesz, _, _ = struct.unpack_from(
                f"{order}IIQQQQQQ", data, phoff + index * phentsize
            )
            if kind == 3:  # PT_INTERP
                interpreter = data[offset : offset + filesz].split(b"\0")[0].decode()
            elif kind == 2:  # PT_DYNAMIC
                dynamic = (offset, filesz)
            elif kind == 1:  # PT_LOAD
                loads.append((vaddr, offset, filesz))
        if dynamic is None:
            return interpreter, [], []
        entries = []
        for at in range(dynamic[0], dynamic[0] + dynamic[1], 16):
            tag, value = struct.unpack_from(f"{order}qQ", data, at)
            if tag == 0:  # DT_NULL
                break
            entries.append((tag, value))
        strtab = next(value for tag, value in entries if tag == 5)  # DT_STRTAB
        base = next(
            offset + strtab - vaddr
            for vaddr, offset, size in loads
            if vaddr <= strtab < vaddr + size
        )

        def text(at: int) -> str:
            return data[base + at : data.index(b"\0", base + at)].decode()

        needed = [text(value) for tag, value in entries if tag == 1]  # DT_NEEDED
        search = [
            folder
            for tag, value in entries
            if tag in (15, 29)  # DT_RPATH, DT_RUNPATH
            for folder in text(value).split(":")
            if folder
        ]
    except (struct.error, StopIteration, ValueError, UnicodeDecodeError):
        return None
    return interpreter, needed, search


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
