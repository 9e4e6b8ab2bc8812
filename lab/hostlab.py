"""The host lab: real Linux hosts on one machine, for testing the ssh driver (docs/lab.md).

Each host is its own network, UTS, mount and PID namespace with a writable root (an overlay on a
cached Debian 12 image), its own sshd, host key and hostname. The hosts sit on the bridge
`rclab0` (172.30.77.0/24) and reach nothing beyond it: packages come from the apt mirror the lab
serves on the bridge address. `up()` is idempotent and cheap when the lab is up already;
`down()` removes everything but the cached image and the hosts' keys.

Stdlib only, Linux only, root only. Nothing here contacts any address but the bridge's, except
debootstrap and apt on the machine, which fetch from deb.debian.org once, to build the cache.
"""
# Every command run here is a fixed tool with arguments made here, not a shell line.
# ruff: noqa: S603, S607

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

BRIDGE = "rclab0"
BRIDGE_ADDRESS = "172.30.77.1"
SUBNET = "172.30.77.0/24"
MIRROR_PORT = 8799  # the lab's apt mirror, served on BRIDGE_ADDRESS
APT_MIRROR = f"http://{BRIDGE_ADDRESS}:{MIRROR_PORT}/debian"
PIP_INDEX_URL = f"http://{BRIDGE_ADDRESS}:{MIRROR_PORT}/simple/"

GATEWAY_NAME = "lab-gw"
GATEWAY_ADDRESS = "172.30.77.10"
# The locations' storage host: volumes' files live in STORAGE_PATH there, synced over SSH.
STORAGE_NAME = "lab-store"
STORAGE_ADDRESS = "172.30.77.9"
STORAGE_PATH = "/srv/runcrate/volumes"
SUITE = "bookworm"
DEBIAN_URL = "http://deb.debian.org/debian"
BASE_PACKAGES = (
    "openssh-server",
    "python3",
    "iproute2",
    "iptables",
    "procps",
    "iputils-ping",
    "ca-certificates",
    "tini",
    "kmod",
    "rsync",
)
# Left out of the image on purpose: the product's bootstrap installs them from the mirror
# (sshfs for /shared where the kernel has no NFS); Slurm and munge for clusters with software
# `slurm` (clusters/machines/software/host/install-slurm.sh), python3-venv for Ray's virtualenv,
# nftables for each node's firewall (bootstrap.sh). The
# mirror's stamp names these lists: changing one rebuilds the mirror once in the cache.
MIRROR_PACKAGES = (
    "nftables",
    "wireguard-go",
    "wireguard-tools",
    "iperf3",
    "sshfs",
    "slurm-wlm",
    "munge",
    "python3-venv",
)
# Taken from the next Debian release, not SUITE's (its `Depends` hold on bookworm): wireguard-go
# 0.0.20231211 passes whole TCP segments through the TUN device (its offloads), where
# bookworm's 0.0.20220316 moves one packet a syscall. The lab's fabric is userspace WireGuard on
# the machine's two CPUs (the kernel has no module), so this is what every lab link carries:
# measured here, iperf3 -t 2 through wireguard-go between two namespaces, 592-638 Mbit/s with
# bookworm's and 1,766-2,047 with this one; three pairs at once 161-177 each against 458-582.
NEWER_PACKAGES = {"wireguard-go": "trixie"}
# The Python packages the lab's simple index serves (PIP_INDEX_URL), as the hosts' Python (3.11,
# x86_64) installs them: Ray for clusters with software `ray` (install-ray.sh). Kept equal to
# clusters.machines.software.RAY_REQUIREMENT (a test says so).
PYPI_PACKAGES = ("ray[default]==2.60.0",)
PYPI_PLATFORM = ("--python-version", "3.11", "--platform", "manylinux2014_x86_64")
LAB_LINK_MBIT = 200  # the lab's machine types' expected link (acceptance wants a share of it)
# How many acceptance measurements the lab's fabric carries at once (its locations'
# `measurements_at_once`, docs/lifecycle.md "Acceptance before billing"): every lab "link" is
# the same two CPUs running two wireguard-go processes and iperf3 a stream. With bookworm's
# wireguard-go (one packet a syscall) they carried about 350 Mbit/s in all, and the lab declared
# one: two at once measured a healthy node under twice the 50 Mbit/s minimum beside CI's load.
# With NEWER_PACKAGES' wireguard-go, iperf3 -t 2 between disjoint pairs of namespaces moved 1,766
# Mbit/s alone, 830-853 each two at once, 458-582 three, 257-344 five; `python -m bench.labtime`
# measured every node of a 10-node round (five pairs at once) at 229-609 Mbit/s (load 2-4), and
# the 8-node acceptance test passed beside `stress-ng --cpu 2`. Five is a whole round of ten
# nodes (docs/inventory.md, "Measurements at once").
LAB_MEASUREMENTS_AT_ONCE = 5
DEFAULT_GPU_MODEL = "NVIDIA H100 80GB HBM3"
DEFAULT_GPU_MEMORY_MIB = 81559
DEFAULT_GPU_COUNT = 2
MAX_HOSTS = 60
# What root in a host may not do, because it would change the machine: set its clock, load
# modules, raw I/O, clear its kernel log, process accounting, wake alarms, LSM policy.
DROPPED_CAPS = (
    "-sys_time,-sys_module,-sys_rawio,-syslog,-sys_pacct,-wake_alarm,-mac_admin,-mac_override"
)
# The machine's ports a host may open on the bridge address: the mirror and the dashboard
# (`HOST=172.30.77.1 make run`, PORT 8000 by default). RUNCRATE_LAB_OPEN_PORTS changes the range.
DEFAULT_OPEN_PORTS = "8000-8999"

REPO = Path(__file__).resolve().parent.parent
IMAGE_FILES = Path(__file__).resolve().parent / "image"
# Points at the lab directory in use, whatever RUNCRATE_VAR_DIR says: there is one lab a machine.
ANCHOR = Path("/run/runcrate-lab")
# Every process that called up() holds a shared lock on this file until it exits, so that a
# test about to take the lab down can tell whether someone else is using it (never deleted).
USERS_LOCK = Path("/run/runcrate-lab.users.lock")
NETNS_PREFIX = "rclab-"
VETH_PREFIX = "rcl-"
NFT_TABLE = "rclab"
# Kept even after `down`: what is sent to a lab address while the bridge is gone fails here
# instead of leaving by the machine's default route.
GUARD_ROUTE = ["unreachable", SUBNET, "metric", "4242"]
HOST_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Tools the lab runs on the machine, and the Debian package of each (installed when missing).
RUNTIME_TOOLS = {
    "ip": "iproute2",
    "nsenter": "util-linux",
    "unshare": "util-linux",
    "pivot_root": "util-linux",
    "mount": "mount",
    "mknod": "coreutils",
    "ssh-keygen": "openssh-client",
    "nft": "nftables",
}
BUILD_TOOLS = {
    "debootstrap": "debootstrap",
    "apt-ftparchive": "apt-utils",
    "gpg": "gnupg",
    "gpg-agent": "gnupg",
    "gpgconf": "gnupg",
}


class LabError(RuntimeError):
    """The lab could not do what was asked; the message says why."""


class LabUnavailable(LabError):
    """The lab cannot run on this machine (see unavailable_reason())."""


class LabExecError(subprocess.CalledProcessError):
    """A command run in a host by Lab.exec(check=True) exited non-zero."""

    def __init__(self, host: str, result: subprocess.CompletedProcess[str]):
        super().__init__(result.returncode, result.args, result.stdout, result.stderr)
        self.host = host

    def __str__(self) -> str:
        tail = (self.stderr or self.stdout or "").strip()[-2000:]
        return f"in {self.host}: {self.cmd[-1]!r} exited with status {self.returncode}: {tail}"


@dataclass(frozen=True)
class LabHost:
    name: str
    address: str
    port: int
    user: str
    host_key: str  # "ssh-ed25519 AAAA..." (no comment)


# --- paths and state --------------------------------------------------------------------------


def _env_lab_dir() -> Path:
    """RUNCRATE_LAB_DIR, else $RUNCRATE_VAR_DIR/lab (the suite's pytest-xdist workers each have a
    var folder of their own and one lab between them: tests/workers.py names it for them)."""
    if os.environ.get("RUNCRATE_LAB_DIR"):
        return Path(os.environ["RUNCRATE_LAB_DIR"]).resolve()
    return Path(os.environ.get("RUNCRATE_VAR_DIR") or REPO / "var").resolve() / "lab"


def _lab_dir() -> Path:
    """The lab directory in use: the one a running lab was made in (whatever RUNCRATE_VAR_DIR
    says now: the bridge and addresses are the machine's, so there is one lab a machine), else
    $RUNCRATE_VAR_DIR/lab."""
    with contextlib.suppress(OSError):
        target = (ANCHOR / "lab").resolve(strict=True)
        state = _read_state(target)
        if state and any(_running(r) for r in state.get("hosts", {}).values()):
            return target
    return _env_lab_dir()


def cache_dir() -> Path:
    """Where the image, the mirror and its key are kept across `down` (RUNCRATE_LAB_CACHE)."""
    return Path(os.environ.get("RUNCRATE_LAB_CACHE") or _env_lab_dir() / "cache").resolve()


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _read_state(lab_dir: Path) -> dict | None:
    try:
        return json.loads((lab_dir / "state.json").read_text())
    except (OSError, ValueError):
        return None


def _write_state(lab_dir: Path, state: dict) -> None:
    path = lab_dir / "state.json"
    tmp = path.with_name(f".state.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(state, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)


def _write_anchor(lab_dir: Path) -> None:
    ANCHOR.mkdir(parents=True, exist_ok=True)
    link = ANCHOR / "lab"
    tmp = ANCHOR / f".lab.{os.getpid()}"
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    tmp.symlink_to(lab_dir)
    tmp.replace(link)


_users_handle = None


def _hold_users_lock() -> None:
    global _users_handle
    if _users_handle is None:
        _users_handle = open(USERS_LOCK, "a")  # noqa: SIM115 (held until the process exits)
    fcntl.flock(_users_handle, fcntl.LOCK_SH)


def others_using() -> bool:
    """Whether another process has called up() and is still running (it may be using the lab:
    a test should not take the lab down from under it)."""
    if _users_handle is not None:
        fcntl.flock(_users_handle, fcntl.LOCK_UN)
    try:
        with open(USERS_LOCK, "a") as probe:
            try:
                fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(probe, fcntl.LOCK_UN)
            return False
    except OSError:
        return False
    finally:
        if _users_handle is not None:
            fcntl.flock(_users_handle, fcntl.LOCK_SH)


# --- processes --------------------------------------------------------------------------------


def _run(
    args: list[str],
    *,
    check: bool = True,
    input: str | None = None,
    timeout: float | None = 120,
    env: dict | None = None,
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        args,
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        stdin=None if input is not None else subprocess.DEVNULL,
    )
    if check and result.returncode != 0:
        detail = (result.stderr or result.stdout).strip()[-3000:]
        raise LabError(f"{' '.join(args)} exited with status {result.returncode}: {detail}")
    return result


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in clock ticks) of a process, or None if there is none."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return fields[0], int(fields[19])


def _proc_start(pid: int) -> int | None:
    stat = _proc_stat(pid)
    return stat[1] if stat else None


def _alive(pid: int | None, start: int | None) -> bool:
    if not pid:
        return False
    stat = _proc_stat(pid)
    return stat is not None and stat[1] == start and stat[0] not in ("Z", "X")


def _kill(pid: int | None, start: int | None, sig: int = signal.SIGKILL) -> None:
    if _alive(pid, start):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def _wait_gone(pid: int | None, start: int | None, timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while _alive(pid, start):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def _pids_in_netns(netns: str) -> list[int]:
    try:
        inode = os.stat(f"/run/netns/{netns}").st_ino
    except OSError:
        return []
    want = f"net:[{inode}]"
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{entry}/ns/net") == want:
                    pids.append(int(entry))
    return pids


# Popen objects of the launchers this process started, so that they are reaped.
_LAUNCHERS: dict[str, subprocess.Popen] = {}


def _reap() -> None:
    for name, launcher in list(_LAUNCHERS.items()):
        if launcher.poll() is not None:
            del _LAUNCHERS[name]


# --- the machine's tools ----------------------------------------------------------------------


def _missing(tools: dict[str, str]) -> list[str]:
    return sorted({pkg for tool, pkg in tools.items() if shutil.which(tool) is None})


def _ensure_tools(tools: dict[str, str]) -> None:
    packages = _missing(tools)
    if not packages:
        return
    if shutil.which("apt-get") is None:
        raise LabUnavailable(f"the lab needs {', '.join(packages)} and there is no apt-get")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    install = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages]
    if _run(install, check=False, env=env, timeout=900).returncode != 0:
        _run(["apt-get", "update", "-qq"], env=env, timeout=900)
        _run(install, env=env, timeout=900)


def unavailable_reason() -> str | None:
    """None when the lab can start here; otherwise why not (tests skip with it)."""
    if os.environ.get("RUNCRATE_LAB", "").lower() in ("0", "off", "no", "false"):
        return "the host lab is turned off here (RUNCRATE_LAB=off)"
    if not sys.platform.startswith("linux"):
        return "the host lab needs Linux (network, mount and PID namespaces)"
    if os.geteuid() != 0:
        return "the host lab needs root (it makes network namespaces, a bridge and mounts)"
    can_install = shutil.which("apt-get") is not None
    missing = _missing(RUNTIME_TOOLS)
    if missing and not can_install:
        return f"the host lab needs {', '.join(missing)} and there is no apt-get to install them"
    if not _base_ready(cache_dir()) and shutil.which("debootstrap") is None and not can_install:
        return "the host lab needs debootstrap to build its image, and there is no apt-get"
    try:
        filesystems = Path("/proc/filesystems").read_text()
    except OSError:
        filesystems = ""
    if "overlay" not in filesystems:
        subprocess.run(["modprobe", "-q", "overlay"], capture_output=True, check=False)
        with contextlib.suppress(OSError):
            filesystems = Path("/proc/filesystems").read_text()
        if "overlay" not in filesystems:
            return "the host lab needs overlayfs, which this kernel does not have"
    if shutil.which("ip"):
        probe = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
        if probe.returncode != 0:
            return f"`ip netns` does not work here: {probe.stderr.strip()}"
        routes = subprocess.run(
            ["ip", "-4", "-o", "route", "show", "to", "match", GATEWAY_ADDRESS],
            capture_output=True,
            text=True,
        ).stdout
        for line in routes.splitlines():
            if line.split()[:1] in (["default"], ["unreachable"]):
                continue
            if f"dev {BRIDGE}" not in line:
                return f"{SUBNET} is already routed on this machine: {line.strip()}"
    return None


# --- the cache: image, key, mirror, lab layer -------------------------------------------------


def _base_name() -> str:
    spec = json.dumps({"suite": SUITE, "packages": BASE_PACKAGES, "version": 1})
    return f"base-{SUITE}-{hashlib.sha256(spec.encode()).hexdigest()[:10]}"


def _base_ready(cache: Path) -> bool:
    return (cache / _base_name() / "etc/os-release").exists()


def _mountpoints_under(path: Path) -> list[str]:
    found = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            point = line.split()[4].replace("\\040", " ")
            if point == str(path) or point.startswith(f"{path}/"):
                found.append(point)
    return found


def _remove_tree(path: Path) -> None:
    """rm -rf that never follows a mount out of the tree (unmounting what is under it first)."""
    if not path.exists() and not path.is_symlink():
        return
    for point in sorted(_mountpoints_under(path), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True, check=False)
    subprocess.run(["rm", "-rf", "--one-file-system", str(path)], check=False)


def _ensure_base(cache: Path) -> Path:
    """The debootstrapped Debian root: built once, into a temporary folder renamed when whole."""
    base = cache / _base_name()
    if _base_ready(cache):
        return base
    _ensure_tools(BUILD_TOOLS)
    tmp = cache / f"{base.name}.tmp-{os.getpid()}"
    _remove_tree(tmp)
    log = cache / "debootstrap.log"
    print(f"lab: building the Debian {SUITE} image (once) into {base}...", file=sys.stderr)
    with open(log, "w") as out:
        # In a private mount namespace, so that nothing debootstrap mounts outlives it.
        result = subprocess.run(
            [
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "debootstrap",
                "--variant=minbase",
                f"--include={','.join(BASE_PACKAGES)}",
                SUITE,
                str(tmp),
                DEBIAN_URL,
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            timeout=1800,
            check=False,
        )
    if result.returncode != 0:
        _remove_tree(tmp)
        tail = log.read_text()[-2000:]
        raise LabError(f"debootstrap failed (status {result.returncode}; {log}):\n{tail}")
    # Whatever identifies the machine that built it goes: host keys, sources, resolver, name.
    for key in (tmp / "etc/ssh").glob("ssh_host_*"):
        key.unlink()
    (tmp / "etc/apt/sources.list").write_text(
        "# runcrate lab image: no package source; a location's apt_mirror is added by the\n"
        "# bootstrap (the lab's mirror: deb http://172.30.77.1:8799/debian bookworm main)\n"
    )
    for leftover in ("etc/resolv.conf", "etc/hostname", "etc/machine-id"):
        with contextlib.suppress(FileNotFoundError):
            (tmp / leftover).unlink()
    for folder in ("var/lib/apt/lists", "var/cache/apt/archives"):
        for item in (tmp / folder).glob("*"):
            if item.is_file():
                item.unlink()
    for item in (tmp / "var/cache/apt").glob("*.bin"):
        item.unlink()
    tmp.rename(base)
    return base


def _gpg(cache: Path, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
    home = cache / "gnupg"
    return _run(["gpg", "--homedir", str(home), "--batch", "--quiet", *args], input=input)


def _ensure_key(cache: Path) -> tuple[str, bytes]:
    """The lab mirror's signing key, made once: (fingerprint, public key in binary form)."""
    home = cache / "gnupg"
    home.mkdir(mode=0o700, exist_ok=True)
    home.chmod(0o700)

    def fingerprint() -> str | None:
        listing = _gpg(cache, "--with-colons", "--list-secret-keys").stdout
        for line in listing.splitlines():
            if line.startswith("fpr:"):
                return line.split(":")[9]
        return None

    fpr = fingerprint()
    if fpr is None:
        _gpg(
            cache,
            "--passphrase",
            "",
            "--pinentry-mode",
            "loopback",
            "--quick-gen-key",
            "Runcrate lab mirror <lab-mirror@runcrate.invalid>",
            "ed25519",
            "sign",
            "never",
        )
        fpr = fingerprint()
        if fpr is None:
            raise LabError(f"gpg made no key in {home}")
    public = subprocess.run(
        ["gpg", "--homedir", str(home), "--batch", "--export", fpr],
        capture_output=True,
        check=True,
    ).stdout
    return fpr, public


def _stop_gpg_agent(cache: Path) -> None:
    subprocess.run(
        ["gpgconf", "--homedir", str(cache / "gnupg"), "--kill", "gpg-agent"],
        capture_output=True,
        check=False,
    )


def _ensure_mirror(cache: Path, base: Path, fpr: str) -> Path:
    """A signed apt repository of MIRROR_PACKAGES and what they need that the image lacks."""
    mirror = cache / "mirror"
    stamp_text = json.dumps(
        {
            "base": base.name,
            "packages": MIRROR_PACKAGES,
            "newer": NEWER_PACKAGES,
            "pypi": PYPI_PACKAGES,
            "key": fpr,
        }
    )
    stamp = mirror / ".built"
    if stamp.is_file() and stamp.read_text() == stamp_text:
        return mirror
    _ensure_tools(BUILD_TOOLS)
    print("lab: building the lab's apt mirror (once)...", file=sys.stderr)
    tmp = cache / f"mirror.tmp-{os.getpid()}"
    _remove_tree(tmp)
    work = cache / f"apt.tmp-{os.getpid()}"
    _remove_tree(work)
    for sub in ("lists/partial", "archives/partial", "state", "cache"):
        (work / sub).mkdir(parents=True)
    keyring = Path("/usr/share/keyrings/debian-archive-keyring.gpg")
    if not keyring.exists():
        keyring = base / "usr/share/keyrings/debian-archive-keyring.gpg"
    suites = [SUITE, *sorted(set(NEWER_PACKAGES.values()))]
    (work / "sources.list").write_text(
        "".join(f"deb [signed-by={keyring}] {DEBIAN_URL} {suite} main\n" for suite in suites)
    )
    # SUITE's packages unless one is named with its release (`wireguard-go/trixie`).
    wanted = [
        f"{name}/{NEWER_PACKAGES[name]}" if name in NEWER_PACKAGES else name
        for name in MIRROR_PACKAGES
    ]
    # The machine's apt, resolving against the image's dpkg status: it fetches exactly the
    # packages, dependencies included, that a host lacks.
    apt = [
        "apt-get",
        "-q",
        "-o",
        f"Dir::State::status={base}/var/lib/dpkg/status",
        "-o",
        f"Dir::State={work}/state",
        "-o",
        f"Dir::State::Lists={work}/lists",
        "-o",
        f"Dir::Cache={work}/cache",
        "-o",
        f"Dir::Cache::archives={work}/archives",
        "-o",
        f"Dir::Etc::sourcelist={work}/sources.list",
        "-o",
        "Dir::Etc::sourceparts=-",
        "-o",
        "APT::Architecture=amd64",
        "-o",
        "APT::Architectures::=amd64",
        "-o",
        f"APT::Default-Release={SUITE}",
        "-o",
        "Debug::NoLocking=1",
    ]
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    try:
        _run([*apt, "update"], env=env, timeout=900)
        _run(
            [*apt, "install", "-y", "--download-only", "--no-install-recommends", *wanted],
            env=env,
            timeout=900,
        )
        debian = tmp / "debian"
        pool = debian / "pool/main"
        pool.mkdir(parents=True)
        debs = sorted((work / "archives").glob("*.deb"))
        if not debs:
            raise LabError("apt downloaded no package for the lab's mirror")
        for deb in debs:
            shutil.move(str(deb), pool / deb.name)
        binary = debian / f"dists/{SUITE}/main/binary-amd64"
        binary.mkdir(parents=True)
        # apt-ftparchive names files relative to where it runs.
        packages = subprocess.run(
            ["apt-ftparchive", "packages", "pool/main"],
            cwd=debian,
            capture_output=True,
            text=True,
            check=True,
        )
        (binary / "Packages").write_text(packages.stdout)
        subprocess.run(["gzip", "-9nk", str(binary / "Packages")], check=True)
        release_opts = []
        for key, value in (
            ("Origin", "runcrate-lab"),
            ("Label", "runcrate-lab"),
            ("Suite", SUITE),
            ("Codename", SUITE),
            ("Architectures", "amd64"),
            ("Components", "main"),
            ("Description", "The runcrate host lab's mirror"),
        ):
            release_opts += ["-o", f"APT::FTPArchive::Release::{key}={value}"]
        release = subprocess.run(
            ["apt-ftparchive", *release_opts, "release", f"dists/{SUITE}"],
            cwd=debian,
            capture_output=True,
            text=True,
            check=True,
        )
        dists = debian / f"dists/{SUITE}"
        (dists / "Release").write_text(release.stdout)
        sign = ["--pinentry-mode", "loopback", "--passphrase", "", "--yes", "--local-user", fpr]
        _gpg(cache, *sign, "--clearsign", "-o", str(dists / "InRelease"), str(dists / "Release"))
        _gpg(cache, *sign, "-abs", "-o", str(dists / "Release.gpg"), str(dists / "Release"))
        (debian / "runcrate-lab.gpg").write_bytes(_ensure_key(cache)[1])
        _build_simple_index(tmp)
        (tmp / ".built").write_text(stamp_text)
        old = cache / f"mirror.old-{os.getpid()}"
        if mirror.exists():
            mirror.rename(old)
        tmp.rename(mirror)
        _remove_tree(old)
    finally:
        _stop_gpg_agent(cache)
        _remove_tree(work)
        _remove_tree(tmp)
    return mirror


def _build_simple_index(mirror: Path) -> None:
    """PYPI_PACKAGES and what they need, downloaded once as wheels for the hosts' Python, served
    as a PEP 503 simple index under /simple/ (the files under /pypi/)."""
    files = mirror / "pypi"
    files.mkdir()
    # The machine's own pip configuration (constraints, local wheel folders) is not the hosts'.
    env = dict(os.environ, PIP_CONFIG_FILE=os.devnull)
    _run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check"]
        + ["--only-binary=:all:", *PYPI_PLATFORM, "--dest", str(files), *PYPI_PACKAGES],
        env=env,
        timeout=900,
    )
    projects: dict[str, list[Path]] = {}
    for wheel in sorted(files.glob("*.whl")):
        name = re.sub(r"[-_.]+", "-", wheel.name.split("-")[0]).lower()
        projects.setdefault(name, []).append(wheel)
    if not projects:
        raise LabError(f"pip downloaded nothing for the lab's index ({', '.join(PYPI_PACKAGES)})")
    simple = mirror / "simple"
    simple.mkdir()
    page = (
        "<!DOCTYPE html>\n<html><head><title>runcrate lab: {}</title></head><body>\n{}"
        "</body></html>\n"
    )
    links = "".join(f'<a href="{name}/">{name}</a>\n' for name in sorted(projects))
    (simple / "index.html").write_text(page.format("simple index", links))
    for name, wheels in projects.items():
        (simple / name).mkdir()
        anchors = "".join(
            f'<a href="../../pypi/{wheel.name}#sha256='
            f'{hashlib.sha256(wheel.read_bytes()).hexdigest()}">{wheel.name}</a>\n'
            for wheel in wheels
        )
        (simple / name / "index.html").write_text(page.format(name, anchors))


def gpu_figures_text(figures: dict[int, dict[str, object]]) -> str:
    """The stand-in nvidia-smi's figures file (lab/image/nvidia-smi): one `INDEX,FIELD=VALUE,…`
    line per GPU."""
    lines = []
    for index, fields in sorted(figures.items()):
        pairs = []
        for name, value in fields.items():
            text = str(value)
            if not re.fullmatch(r"[a-z][a-z0-9_.]*", name) or re.search(r"[,=\n\r]", text):
                raise ValueError(f"not a figure for the stand-in nvidia-smi: {name}={text!r}")
            pairs.append(f"{name}={text}")
        lines.append(",".join([str(int(index)), *pairs]) + "\n")
    return "".join(lines)


def _layer_files(public_key: bytes) -> dict[str, tuple[bytes, int]]:
    """What the lab adds on top of the Debian image: path -> (content, mode)."""

    def image(name: str) -> bytes:
        return (IMAGE_FILES / name).read_bytes()

    gpus = f"{DEFAULT_GPU_MODEL},{DEFAULT_GPU_MEMORY_MIB},{DEFAULT_GPU_COUNT}\n".encode()
    return {
        "usr/local/bin/nvidia-smi": (image("nvidia-smi"), 0o755),
        "usr/local/sbin/rclab-init": (image("rclab-init"), 0o755),
        "etc/ssh/sshd_config.d/runcrate-lab.conf": (image("sshd_config"), 0o644),
        "etc/apt/trusted.gpg.d/runcrate-lab.gpg": (public_key, 0o644),
        "etc/runcrate-lab/gpus": (gpus, 0o644),
        "etc/runcrate-lab/README": (image("README"), 0o644),
        "etc/resolv.conf": (
            b"# runcrate lab host: no DNS; the lab reaches nothing by name\n",
            0o644,
        ),
    }


def _ensure_layer(cache: Path, public_key: bytes) -> Path:
    files = _layer_files(public_key)
    digest = hashlib.sha256()
    for path in sorted(files):
        content, mode = files[path]
        digest.update(f"{path}\0{mode}\0{len(content)}\0".encode() + content)
    layer = cache / "layers" / digest.hexdigest()[:12]
    if layer.is_dir():
        return layer
    tmp = layer.with_name(f"{layer.name}.tmp-{os.getpid()}")
    _remove_tree(tmp)
    for path, (content, mode) in files.items():
        target = tmp / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
        target.chmod(mode)
    tmp.rename(layer)
    return layer


def _prepare_cache(cache: Path) -> tuple[Path, Path, Path]:
    """(base image, lab layer, mirror), building whatever is missing."""
    cache.mkdir(parents=True, exist_ok=True)
    with _locked(cache / "lock"):
        base = _ensure_base(cache)
        try:
            fpr, public = _ensure_key(cache)
            mirror = _ensure_mirror(cache, base, fpr)
        finally:
            _stop_gpg_agent(cache)
        layer = _ensure_layer(cache, public)
    return base, layer, mirror


# --- the network ------------------------------------------------------------------------------


def _open_ports() -> str:
    ports = os.environ.get("RUNCRATE_LAB_OPEN_PORTS", DEFAULT_OPEN_PORTS).replace(" ", "")
    if not re.fullmatch(r"\d+(-\d+)?(,\d+(-\d+)?)*", ports):
        raise LabError(f"RUNCRATE_LAB_OPEN_PORTS must be like 8000-8999,9100, not {ports!r}")
    return ", ".join(sorted({*ports.split(","), str(MIRROR_PORT)}))


def _ensure_network() -> None:
    _run(["ip", "route", "replace", *GUARD_ROUTE])
    if not Path(f"/sys/class/net/{BRIDGE}").exists():
        _run(["ip", "link", "add", BRIDGE, "type", "bridge"])
    with contextlib.suppress(OSError):
        Path(f"/proc/sys/net/ipv6/conf/{BRIDGE}/disable_ipv6").write_text("1")
    _run(["ip", "addr", "replace", f"{BRIDGE_ADDRESS}/24", "dev", BRIDGE])
    _run(["ip", "link", "set", BRIDGE, "up"])
    # Nothing from the bridge goes anywhere but the bridge (no forwarding out, no NAT), and of
    # the machine itself the hosts reach only the mirror and the dashboard's ports.
    rules = f"""
add table inet {NFT_TABLE}
delete table inet {NFT_TABLE}
table inet {NFT_TABLE} {{
    chain forward {{
        type filter hook forward priority -10; policy accept;
        iifname "{BRIDGE}" oifname != "{BRIDGE}" drop
        oifname "{BRIDGE}" iifname != "{BRIDGE}" drop
    }}
    chain input {{
        type filter hook input priority -10; policy accept;
        iifname "{BRIDGE}" ct state established,related accept
        iifname "{BRIDGE}" ip protocol icmp accept
        iifname "{BRIDGE}" ip daddr {BRIDGE_ADDRESS} tcp dport {{ {_open_ports()} }} accept
        iifname "{BRIDGE}" drop
    }}
}}
"""
    _run(["nft", "-f", "-"], input=rules)


def _netns(name: str) -> str:
    return f"{NETNS_PREFIX}{name}"


def _veth(name: str) -> str:
    return f"{VETH_PREFIX}{name}"[:15]


def _mac(name: str) -> str:
    digest = hashlib.sha256(f"rclab-{name}".encode()).digest()
    return "02:" + ":".join(f"{b:02x}" for b in digest[:5])


def _teardown_netns(name: str) -> None:
    netns = _netns(name)
    for pid in _pids_in_netns(netns):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    subprocess.run(["ip", "link", "del", _veth(name)], capture_output=True, check=False)
    subprocess.run(["ip", "netns", "del", netns], capture_output=True, check=False)


def _setup_netns(name: str, address: str) -> None:
    _teardown_netns(name)
    netns, veth = _netns(name), _veth(name)
    _run(["ip", "netns", "add", netns])
    _run(
        ["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0"]
        + ["address", _mac(name), "netns", netns]
    )
    _run(["ip", "link", "set", veth, "master", BRIDGE, "up"])
    _run(["ip", "-n", netns, "addr", "add", f"{address}/24", "dev", "eth0"])
    _run(["ip", "-n", netns, "link", "set", "lo", "up"])
    _run(["ip", "-n", netns, "link", "set", "eth0", "up"])


def _mirror_ok() -> bool:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(f"{APT_MIRROR}/dists/{SUITE}/InRelease", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def _mirror_server_pids() -> list[int]:
    """Processes that are the lab's mirror server, found by their command line."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
                wanted = (b"http.server", BRIDGE_ADDRESS.encode(), str(MIRROR_PORT).encode())
                if all(word in argv for word in wanted):
                    found.append(int(entry))
    return found


def _ensure_mirror_server(state: dict, lab_dir: Path, mirror: Path) -> None:
    record = state.get("mirror") or {}
    if _alive(record.get("pid"), record.get("start")) and _mirror_ok():
        return
    _kill(record.get("pid"), record.get("start"))
    for pid in _mirror_server_pids():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    with open(lab_dir / "mirror.log", "a") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "http.server", "--bind", BRIDGE_ADDRESS]
            + ["--directory", str(mirror), str(MIRROR_PORT)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd="/",
        )
    _LAUNCHERS["mirror"] = server
    state["mirror"] = {"pid": server.pid, "start": _proc_start(server.pid)}
    (lab_dir / "mirror.pid").write_text(f"{server.pid}\n")
    deadline = time.monotonic() + 15
    while not _mirror_ok():
        if server.poll() is not None or time.monotonic() > deadline:
            log_tail = (lab_dir / "mirror.log").read_text()[-1500:]
            raise LabError(f"the lab's mirror did not start on {APT_MIRROR}:\n{log_tail}")
        time.sleep(0.05)


# --- hosts ------------------------------------------------------------------------------------

# Runs as PID 1 of the host's new PID namespace, in its network namespace and a new mount and UTS
# namespace, still with the machine's root: it mounts the host's root and enters it.
SETUP = r"""
set -eu
root=$1 name=$2 lower=$3 upper=$4 work=$5 drop=$6
mount -t overlay overlay -o "lowerdir=$lower,upperdir=$upper,workdir=$work" "$root"
hostname=$(head -n 1 "$root/etc/hostname" 2>/dev/null || true)
printf '%s' "${hostname:-$name}" > /proc/sys/kernel/hostname
echo 1 > /proc/sys/net/ipv6/conf/default/disable_ipv6
echo 1 > /proc/sys/net/ipv6/conf/eth0/disable_ipv6
mount -t proc -o nosuid,nodev,noexec proc "$root/proc"
mount --bind "$root/proc/sys" "$root/proc/sys"
mount -o remount,bind,ro "$root/proc/sys"
mount --bind "$root/proc/sys/net" "$root/proc/sys/net"
mount -o remount,bind,rw "$root/proc/sys/net"
if [ -e "$root/proc/sysrq-trigger" ]; then
  mount --bind "$root/proc/sysrq-trigger" "$root/proc/sysrq-trigger"
  mount -o remount,bind,ro "$root/proc/sysrq-trigger"
fi
mount -t sysfs -o ro,nosuid,nodev,noexec sysfs "$root/sys"
mount -t tmpfs -o nosuid,mode=0755,size=1m dev "$root/dev"
for node in null:1:3 zero:1:5 full:1:7 random:1:8 urandom:1:9 tty:5:0; do
  file=${node%%:*} numbers=${node#*:}
  mknod -m 0666 "$root/dev/$file" c "${numbers%:*}" "${numbers#*:}"
done
mkdir -p "$root/dev/pts" "$root/dev/shm" "$root/dev/net"
mknod -m 0666 "$root/dev/net/tun" c 10 200
mknod -m 0666 "$root/dev/fuse" c 10 229
mount -t devpts -o newinstance,nosuid,noexec,ptmxmode=0666,mode=0620,gid=5 devpts "$root/dev/pts"
ln -s pts/ptmx "$root/dev/ptmx"
mount -t tmpfs -o nosuid,nodev,mode=1777 shm "$root/dev/shm"
ln -s /proc/self/fd "$root/dev/fd"
ln -s /proc/self/fd/0 "$root/dev/stdin"
ln -s /proc/self/fd/1 "$root/dev/stdout"
ln -s /proc/self/fd/2 "$root/dev/stderr"
mount -t tmpfs -o nosuid,nodev,mode=0755 run "$root/run"
cd "$root"
mkdir -p .rclab-oldroot
pivot_root . .rclab-oldroot
cd /
umount -l /.rclab-oldroot
rmdir /.rclab-oldroot
exec /usr/bin/setpriv --bounding-set "$drop" --inh-caps -all -- \
  /usr/bin/tini -- /usr/local/sbin/rclab-init
"""


def _host_dirs(lab_dir: Path, name: str) -> dict[str, Path]:
    host = lab_dir / "hosts" / name
    return {
        "host": host,
        "upper": host / "upper",
        "work": host / "work",
        "root": host / "root",
        "console": host / "console.log",
        "keys": lab_dir / "keys" / name,
    }


def _host_key(lab_dir: Path, name: str) -> str:
    """The host's ed25519 key, made at its first start and kept (also across `down`)."""
    keys = _host_dirs(lab_dir, name)["keys"]
    private = keys / "ssh_host_ed25519_key"
    if not private.exists():
        keys.mkdir(parents=True, exist_ok=True)
        keys.chmod(0o700)
        tmp = keys / f".new.{os.getpid()}"
        for stale in (tmp, tmp.with_name(tmp.name + ".pub")):
            with contextlib.suppress(FileNotFoundError):
                stale.unlink()
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "", "-f", str(tmp)])
        tmp.with_name(tmp.name + ".pub").replace(keys / "ssh_host_ed25519_key.pub")
        tmp.replace(private)
    kind, blob = (keys / "ssh_host_ed25519_key.pub").read_text().split()[:2]
    return f"{kind} {blob}"


def _write(path: Path, content: str | bytes, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, str):
        content = content.encode()
    path.write_bytes(content)
    path.chmod(mode)


def _prepare_upper(lab_dir: Path, name: str, address: str, keys: list[str], gpus: bool) -> None:
    """Write the host's own files into its overlay's upper folder (the host is not running)."""
    dirs = _host_dirs(lab_dir, name)
    upper = dirs["upper"]
    fresh = not upper.exists()
    for folder in ("upper", "work", "root"):
        dirs[folder].mkdir(parents=True, exist_ok=True)
    if fresh:
        _write(upper / "etc/hostname", f"{name}\n")
        _write(
            upper / "etc/hosts",
            f"127.0.0.1\tlocalhost\n::1\t\tlocalhost ip6-localhost ip6-loopback\n"
            f"ff02::1\t\tip6-allnodes\nff02::2\t\tip6-allrouters\n{address}\t{name}\n",
        )
        machine_id = hashlib.sha256(f"runcrate-lab:{name}".encode()).hexdigest()[:32]
        _write(upper / "etc/machine-id", f"{machine_id}\n", 0o444)
        if not gpus:
            _write(upper / "etc/runcrate-lab/gpus", f"# {name} has no GPU\n")
    # The host key: copied in at every start, so that it is the same after a reset.
    _host_key(lab_dir, name)
    for suffix, mode in (("", 0o600), (".pub", 0o644)):
        source = dirs["keys"] / f"ssh_host_ed25519_key{suffix}"
        _write(upper / f"etc/ssh/ssh_host_ed25519_key{suffix}", source.read_bytes(), mode)
    ssh = upper / "root/.ssh"
    (upper / "root").mkdir(mode=0o700, exist_ok=True)
    ssh.mkdir(mode=0o700, exist_ok=True)
    authorized = ssh / "authorized_keys"
    lines = authorized.read_text().splitlines() if authorized.exists() else []
    lines += [key for key in keys if key not in lines]
    _write(authorized, "".join(f"{line}\n" for line in lines), 0o600)


def _start_host(
    lab_dir: Path, layer: Path, base: Path, name: str, address: str, keys: list[str], role: str
) -> dict:
    """Start a host that is not running (its overlay kept as it is): returns its record."""
    dirs = _host_dirs(lab_dir, name)
    _prepare_upper(lab_dir, name, address, keys, gpus=role == "gpu")
    if role == "storage":
        (dirs["upper"] / STORAGE_PATH.lstrip("/")).mkdir(mode=0o700, parents=True, exist_ok=True)
    for path in (dirs["root"], dirs["upper"], dirs["work"], layer, base):
        if re.search(r"[,:\s]", str(path)):
            raise LabError(f"the lab cannot mount an overlay from {path}: no , : or space, please")
    _setup_netns(name, address)
    lower = f"{layer}:{base}"
    with open(dirs["console"], "a") as console:
        console.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} starting {name}\n")
        console.flush()
        launcher = subprocess.Popen(
            ["nsenter", f"--net=/run/netns/{_netns(name)}", "unshare", "--mount", "--uts"]
            + ["--pid", "--fork", "--kill-child", "--propagation", "private"]
            + ["/bin/sh", "-c", SETUP, "rclab-setup", str(dirs["root"]), name, lower]
            + [str(dirs["upper"]), str(dirs["work"]), DROPPED_CAPS],
            stdin=subprocess.DEVNULL,
            stdout=console,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd="/",
            env={"PATH": HOST_PATH, "LANG": "C.UTF-8"},
        )
    _LAUNCHERS[name] = launcher
    deadline = time.monotonic() + 10
    while not (children := _children(launcher.pid)):
        if launcher.poll() is not None or time.monotonic() > deadline:
            raise LabError(f"{name} did not start:\n{_console_tail(lab_dir, name)}")
        time.sleep(0.005)
    init = children[0]
    return {
        "name": name,
        "address": address,
        "role": role,
        "init_pid": init,
        "init_start": _proc_start(init),
        "launcher_pid": launcher.pid,
        "launcher_start": _proc_start(launcher.pid),
        "lower": lower,
        "host_key": _host_key(lab_dir, name),
    }


def _console_tail(lab_dir: Path, name: str) -> str:
    with contextlib.suppress(OSError):
        return _host_dirs(lab_dir, name)["console"].read_text()[-2000:]
    return ""


def _sshd_answers(address: str, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((address, 22), timeout=timeout) as conn:
            conn.settimeout(timeout)
            return conn.recv(8).startswith(b"SSH-")
    except OSError:
        return False


def _wait_ready(lab_dir: Path, record: dict, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not _sshd_answers(record["address"]):
        if not _alive(record["init_pid"], record["init_start"]):
            tail = _console_tail(lab_dir, record["name"])
            raise LabError(f"{record['name']} stopped while starting; its console says:\n{tail}")
        if time.monotonic() > deadline:
            tail = _console_tail(lab_dir, record["name"])
            raise LabError(f"{record['name']}'s sshd did not answer in {timeout:.0f} s:\n{tail}")
        time.sleep(0.02)


def _running(record: dict | None) -> bool:
    return (
        record is not None
        and _alive(record.get("init_pid"), record.get("init_start"))
        and Path(f"/run/netns/{_netns(record['name'])}").exists()
    )


def _stop_host(record: dict) -> None:
    """Stop everything in a host (killing its PID 1 kills its PID namespace) and its network."""
    _kill(record.get("init_pid"), record.get("init_start"))
    _kill(record.get("launcher_pid"), record.get("launcher_start"))
    _wait_gone(record.get("init_pid"), record.get("init_start"))
    _teardown_netns(record["name"])
    launcher = _LAUNCHERS.pop(record["name"], None)
    if launcher is not None and launcher.pid == record.get("launcher_pid"):
        with contextlib.suppress(subprocess.TimeoutExpired):
            launcher.wait(timeout=5)
    _wait_gone(record.get("launcher_pid"), record.get("launcher_start"), timeout=2)
    _reap()


def _exec(record: dict, command: str, *, timeout: float, input: str | None):
    args = ["nsenter", "-t", str(record["init_pid"]), "-m", "-u", "-n", "-p", "-r", "-w"]
    args += ["/usr/bin/setpriv", "--bounding-set", DROPPED_CAPS, "--", "/bin/sh", "-c", command]
    env = {
        "PATH": HOST_PATH,
        "HOME": "/root",
        "USER": "root",
        "LOGNAME": "root",
        "SHELL": "/bin/sh",
        "LANG": "C.UTF-8",
        "TERM": "dumb",
    }
    process = subprocess.Popen(
        args,
        stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        out, err = process.communicate(input, timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        raise subprocess.TimeoutExpired(args, timeout, out, err) from None
    return subprocess.CompletedProcess(args, process.returncode, out, err)


# Index -1 is the storage host, 0 the gateway, 1.. the GPU hosts.
STORAGE_INDEX = -1


def _host_name(index: int) -> str:
    if index == STORAGE_INDEX:
        return STORAGE_NAME
    return GATEWAY_NAME if index == 0 else f"lab-{index}"


def _host_address(index: int) -> str:
    return STORAGE_ADDRESS if index == STORAGE_INDEX else f"172.30.77.{10 + index}"


def _host_role(index: int) -> str:
    return {STORAGE_INDEX: "storage", 0: "gateway"}.get(index, "gpu")


def _lab_host(record: dict) -> LabHost:
    return LabHost(record["name"], record["address"], 22, "root", record["host_key"])


# --- the lab ----------------------------------------------------------------------------------


@dataclass
class Lab:
    hosts: list[LabHost]  # the GPU hosts, in order: lab-1 (172.30.77.11), lab-2, ...
    gateway: LabHost | None  # lab-gw (172.30.77.10): sshd only, a location's SSH gateway
    # lab-store (172.30.77.9): sshd and rsync, the locations' storage host (volumes' files)
    storage: LabHost | None = None
    lab_dir: Path = field(repr=False, default_factory=_lab_dir)

    def host(self, name: str) -> LabHost:
        others = [host for host in (self.gateway, self.storage) if host is not None]
        for host in [*self.hosts, *others]:
            if name in (host.name, host.address):
                return host
        raise LabError(f"no host {name!r} in this lab")

    def _record(self, host: str) -> dict:
        name = self.host(host).name
        state = _read_state(self.lab_dir) or {}
        record = state.get("hosts", {}).get(name)
        if not _running(record):
            raise LabError(f"{name} is not running (python -m lab status; up() starts it)")
        return record

    def exec(
        self,
        host: str,
        command: str,
        *,
        check: bool = True,
        timeout: float = 60,
        input: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run `sh -c command` inside the host (its namespaces and root), as root."""
        result = _exec(self._record(host), command, timeout=timeout, input=input)
        if check and result.returncode != 0:
            raise LabExecError(self.host(host).name, result)
        return result

    def set_gpus(self, host: str, *, model: str, memory_mib: int, count: int) -> None:
        """What the host's stand-in nvidia-smi prints from now on (count 0: no GPU)."""
        if not model or re.search(r"[,\n\r]", model):
            raise ValueError(f"a GPU model is a name without commas or newlines, not {model!r}")
        if not 0 <= count <= 64 or memory_mib <= 0:
            raise ValueError("count must be 0 to 64 and memory_mib positive")
        self.exec(
            host,
            "mkdir -p /etc/runcrate-lab && cat > /etc/runcrate-lab/gpus",
            input=f"{model},{int(memory_mib)},{int(count)}\n",
        )

    def set_gpu_figures(self, host: str, figures: dict[int, dict[str, object]]) -> None:
        """The figures the host's stand-in nvidia-smi answers from now on, per GPU index and
        nvidia-smi field, e.g. {0: {"utilization.gpu": 97}}; every figure not named takes the
        stand-in's default ({}: all defaults)."""
        self.exec(
            host,
            "mkdir -p /etc/runcrate-lab && cat > /etc/runcrate-lab/gpu-figures",
            input=gpu_figures_text(figures),
        )

    def inventory(
        self,
        *,
        location: str = "lab",
        gateway_location: str = "lab-gw",
        gpu_slug: str = "lab-h100",
        gpu_name: str = "H100 SXM 80GB",
        memory_gib: int = 80,
        gpus_per_machine: int = 2,
        boot_seconds: int = 30,
        gateway_hosts: int = 0,
    ) -> dict:
        """An inventory document (docs/inventory.md) for these hosts, all ssh-driven."""
        if not 0 <= gateway_hosts <= len(self.hosts):
            raise ValueError(f"gateway_hosts must be 0 to {len(self.hosts)}")
        if gateway_hosts and self.gateway is None:
            raise ValueError("gateway_hosts needs the gateway: up(..., gateway=True)")
        kind = gpu_slug.removeprefix("lab-")
        direct_type = f"{location}-{kind}x{gpus_per_machine}-vm"
        gateway_type = f"{gateway_location}-{kind}x{gpus_per_machine}-vm"
        common = {
            "country": "US",
            "capacity_reporting": "count",
            "apt_mirror": APT_MIRROR,
            "pip_index_url": PIP_INDEX_URL,
            "reimage": reimage_command(),
            "measurements_at_once": LAB_MEASUREMENTS_AT_ONCE,
        }
        if self.storage is not None:
            common |= {
                "storage_host": f"{self.storage.address}:{self.storage.port}",
                "storage_host_key": self.storage.host_key,
                "storage_path": STORAGE_PATH,
            }
        locations = [
            {
                "code": location,
                "name": "Runcrate lab (this machine)",
                **common,
                "ssh_gateway": None,
            }
        ]
        machine_type = {
            "gpu": gpu_slug,
            "gpus_per_machine": gpus_per_machine,
            "machine_kind": "vm",
            "price_per_hour": "2.00",
            "boot_seconds": boot_seconds,
            # The hosts share this machine's cores, and WireGuard runs in userspace here
            # (wireguard-go): a healthy lab link moves 100-1,000 Mbit/s, not a data center's.
            "link_mbit": LAB_LINK_MBIT,
        }
        machine_types = [{"slug": direct_type, "location": location, **machine_type}]
        if self.gateway is not None:
            locations.append(
                {
                    "code": gateway_location,
                    "name": "Runcrate lab behind its SSH gateway",
                    **common,
                    "ssh_gateway": f"{self.gateway.address}:{self.gateway.port}",
                    "ssh_gateway_host_key": self.gateway.host_key,
                }
            )
            machine_types.append(
                {"slug": gateway_type, "location": gateway_location, **machine_type}
            )
        split = len(self.hosts) - gateway_hosts
        hosts = [
            {
                "name": host.name,
                "machine_type": direct_type if i < split else gateway_type,
                "driver": "ssh",
                "address": host.address,
                "port": host.port,
                "user": host.user,
                "host_key": host.host_key,
            }
            for i, host in enumerate(self.hosts)
        ]
        return {
            "gpu_models": [{"slug": gpu_slug, "name": gpu_name, "memory_gib": memory_gib}],
            "locations": locations,
            "machine_types": machine_types,
            "hosts": hosts,
        }

    def reset(self, host: str) -> None:
        """Put a host back as `up` made it: everything in it stopped, its overlay wiped, its
        network namespace made anew; same address and host key."""
        self._restart(host, wipe=True)

    def stop(self, host: str) -> None:
        """Like pulling the plug: every process in the host stopped and its network gone, so
        nothing of it answers; `reset` (or `restart`) brings it back."""
        name = self.host(host).name
        with _locked(self.lab_dir / "lock"):
            record = (_read_state(self.lab_dir) or {}).get("hosts", {}).get(name)
            if record is None:
                raise LabError(f"{name} is not in the lab's state; run up() again")
            _stop_host(record)

    def restart(self, host: str) -> None:
        """Like a reboot: every process in the host stopped, its files kept, started again."""
        self._restart(host, wipe=False)

    def _restart(self, host: str, *, wipe: bool) -> None:
        name = self.host(host).name
        with _locked(self.lab_dir / "lock"):
            state = _read_state(self.lab_dir) or {}
            record = state.get("hosts", {}).get(name)
            if record is None:
                raise LabError(f"{name} is not in the lab's state; run up() again")
            _stop_host(record)
            dirs = _host_dirs(self.lab_dir, name)
            if wipe:
                _remove_tree(dirs["upper"])
                _remove_tree(dirs["work"])
            base = Path(record["lower"].split(":")[1])
            layer = Path(record["lower"].split(":")[0])
            new = _start_host(
                self.lab_dir,
                layer,
                base,
                name,
                record["address"],
                state.get("authorized_keys", []),
                record.get("role", "gpu"),
            )
            state["hosts"][name] = new
            _write_state(self.lab_dir, state)
            _wait_ready(self.lab_dir, new)


def reimage_command() -> str:
    """The inventory's `reimage` for the lab's hosts (docs/inventory.md): `python -m lab
    reimage` with the host the dashboard names in RUNCRATE_HOST_NAME, run by this Python from
    this checkout, so it works from any folder the machines worker runs in."""
    root = shlex.quote(str(Path(__file__).resolve().parent.parent))
    python = shlex.quote(sys.executable)
    return f'cd {root} && {python} -m lab reimage "$RUNCRATE_HOST_NAME"'


# Adds the key read from stdin to root's authorized_keys in a running host, unless it is there.
ADD_KEY = (
    "key=$(cat); mkdir -p -m 700 /root/.ssh; touch /root/.ssh/authorized_keys; "
    'grep -qxF "$key" /root/.ssh/authorized_keys '
    "|| printf '%s\\n' \"$key\" >> /root/.ssh/authorized_keys; chmod 600 /root/.ssh/authorized_keys"
)


def _check_key(key: str) -> str:
    key = key.strip()
    parts = key.split()
    if "\n" in key or len(parts) < 2 or not parts[0].startswith(("ssh-", "ecdsa-", "sk-")):
        raise ValueError(f"authorized_key must be one OpenSSH public key line, not {key[:40]!r}")
    return key


def up(
    count: int = 3,
    *,
    authorized_key: str,
    gateway: bool = True,
    storage: bool = True,
    first: int = 1,
) -> Lab:
    """Bring up COUNT GPU hosts from lab-FIRST on (lab-1..lab-COUNT by default), and lab-gw and
    lab-store: hosts already up are kept, and get `authorized_key` added; the lab's other hosts
    are left as they are (two users of one lab, each on GPU hosts of its own, share the gateway
    and the storage host). The first call builds the cache (a few minutes, needs Debian's
    package servers); later ones take a second or two, and nothing when all is up."""
    reason = unavailable_reason()
    if reason:
        raise LabUnavailable(reason)
    key = _check_key(authorized_key)
    if first < 1 or not 0 <= count <= MAX_HOSTS - first + 1:
        raise ValueError(f"the hosts must be lab-1 to lab-{MAX_HOSTS}: count 0 or more from 1 on")
    _hold_users_lock()
    lab_dir = _lab_dir()
    lab_dir.mkdir(parents=True, exist_ok=True)
    _ensure_tools(RUNTIME_TOOLS)
    with _locked(lab_dir / "lock"):
        state = _read_state(lab_dir) or {}
        records = state.get("hosts", {})
        if not any(_running(r) for r in records.values()):
            state["cache"] = str(cache_dir())
        cache = Path(state["cache"])
        base, layer, mirror = _prepare_cache(cache)
        state.update(version=1, lab_dir=str(lab_dir), hosts=records)
        keys = state.setdefault("authorized_keys", [])
        new_key = key not in keys
        if new_key:
            keys.append(key)
        _ensure_network()
        _ensure_mirror_server(state, lab_dir, mirror)
        _write_state(lab_dir, state)
        _write_anchor(lab_dir)
        wanted = [STORAGE_INDEX] if storage else []
        wanted += ([0] if gateway else []) + list(range(first, first + count))
        started = []
        for index in wanted:
            name = _host_name(index)
            record = records.get(name)
            if _running(record):
                if new_key:
                    _exec(record, ADD_KEY, timeout=30, input=f"{key}\n")
                continue
            if record is not None:
                _stop_host(record)
            role = _host_role(index)
            record = _start_host(lab_dir, layer, base, name, _host_address(index), keys, role)
            records[name] = record
            _write_state(lab_dir, state)
            started.append(record)
        for record in started:
            _wait_ready(lab_dir, record)
    lab = _lab_from(lab_dir, state)
    lab.hosts = [lab.host(_host_name(i)) for i in range(first, first + count)]
    if not gateway:
        lab.gateway = None
    if not storage:
        lab.storage = None
    return lab


def _lab_from(lab_dir: Path, state: dict) -> Lab:
    records = state.get("hosts", {})
    gpu = sorted(
        (r for r in records.values() if r.get("role") == "gpu" and _running(r)),
        key=lambda r: int(r["name"].rsplit("-", 1)[1]),
    )
    gw, store = records.get(GATEWAY_NAME), records.get(STORAGE_NAME)
    return Lab(
        hosts=[_lab_host(r) for r in gpu],
        gateway=_lab_host(gw) if _running(gw) else None,
        storage=_lab_host(store) if _running(store) else None,
        lab_dir=lab_dir,
    )


def current() -> Lab | None:
    """The lab that is up now (every running host), or None."""
    lab_dir = _lab_dir()
    state = _read_state(lab_dir)
    if not state:
        return None
    lab = _lab_from(lab_dir, state)
    return lab if lab.hosts or lab.gateway or lab.storage else None


def down() -> None:
    """Remove everything the lab made but its cache, its hosts' keys and the guard route;
    idempotent, and best effort after a crash (what a lost state file no longer names is found
    by its names)."""
    if os.geteuid() != 0:
        raise LabError("down() needs root, as up() did")
    lab_dirs = {_lab_dir(), _env_lab_dir()}
    with contextlib.suppress(OSError):
        lab_dirs.add((ANCHOR / "lab").resolve(strict=True))
    killed = []
    for lab_dir in lab_dirs:
        state = _read_state(lab_dir) or {}
        for record in state.get("hosts", {}).values():
            _kill(record.get("init_pid"), record.get("init_start"))
            _kill(record.get("launcher_pid"), record.get("launcher_start"))
            killed.append((record.get("init_pid"), record.get("init_start")))
        mirror = state.get("mirror") or {}
        _kill(mirror.get("pid"), mirror.get("start"))
    for pid, start in killed:
        _wait_gone(pid, start, timeout=5)
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for line in listing.splitlines():
        netns = line.split()[0] if line.split() else ""
        if netns.startswith(NETNS_PREFIX):
            _teardown_netns(netns.removeprefix(NETNS_PREFIX))
    for pid in _mirror_server_pids():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    for line in links.splitlines():
        link = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        if link.startswith(VETH_PREFIX):
            subprocess.run(["ip", "link", "del", link], capture_output=True, check=False)
    subprocess.run(["nft", "delete", "table", "inet", NFT_TABLE], capture_output=True, check=False)
    subprocess.run(["ip", "link", "del", BRIDGE], capture_output=True, check=False)
    for lab_dir in lab_dirs:
        with _locked(lab_dir / "lock") if lab_dir.exists() else contextlib.nullcontext():
            _remove_tree(lab_dir / "hosts")
            for leftover in ("state.json", "mirror.pid"):
                with contextlib.suppress(FileNotFoundError):
                    (lab_dir / leftover).unlink()
    _remove_tree(ANCHOR)
    _reap()
