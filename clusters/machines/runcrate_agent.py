#!/usr/bin/env python3
"""The Runcrate cluster agent: one stdlib-only file copied to every node (DESIGN.md "The agent").

For as long as it runs, it:

1. Checks in with the dashboard (`POST {url}/api/v1/agent/nodes/{id}/check-in`, with the node's
   token as `Authorization: Bearer`), reporting its GPUs (nvidia-smi's CSV), its WireGuard public
   key and its hostname. The check-in is also the heartbeat: every `heartbeat_seconds` once the
   node has joined, every 5 s while it is starting.
2. After every answer, makes the WireGuard interface's peers the answer's list (`wg set`), and
   the firewall's set of addresses WireGuard's port accepts (`wg_peers` in the nftables table
   `inet runcrate` the bootstrap made) their endpoints. Where `wg`, `nft`, the interface or the
   table is missing (tests, simulations) it says so once and goes on.
3. While the node is `starting` in step `network`, every peer knows it (`peers_ready`)
   and it is this node's turn (`measure_turn`: the dashboard's schedule pairs the nodes so
   that no two measurements share a link, in waves as many at once as the location's fabric
   carries, `measure_peer` naming this node's peer), tests the
   private network: it TCP-connects to each peer's probe port, retrying unreachable peers for
   ~20 s; measures latency and bandwidth to its peer (the head where the dashboard names none;
   iperf3 where the peer runs it, else its own timed TCP stream to the peer's sink); and
   reports it all (`POST .../network`).
   A measurement that fails is reported as nulls with the reason; it never holds the report up.
4. On every node (the head only, for a dashboard that names no `measure_peer`), serves a
   bandwidth sink on private_ip:bandwidth_port for its whole life (and
   `iperf3 -s` on port 7078 where iperf3 is installed), binding again until the address exists.
5. While the dashboard's answers carry `metrics_seconds` (a ready or degraded cluster), sends
   a metrics report that often (`POST .../metrics`): each GPU's figures from nvidia-smi's
   `--query-gpu` CSV (METRICS_QUERY) and the node's CPU, memory, disks and private-network
   bytes from /proc and statvfs. A report refused or unanswered is logged and the next one goes
   at the next interval; a dashboard without the endpoint (404) gets none.

It stops (exit 1) when the dashboard answers 403, 404 or 410 (a wrong token, an unknown node, a
released node); it retries every 5 s on network errors and 5xx answers; a 422 (a report the
dashboard refused) is logged with the dashboard's message and sent again at the next interval.
It logs one line per change, never the token.

Configuration comes from /etc/runcrate/agent.json (lowercase keys) and the environment
(which wins: RUNCRATE_URL, RUNCRATE_NODE_ID, RUNCRATE_NODE_TOKEN, and RUNCRATE_AGENT_ + the
key in capitals for the others, e.g. RUNCRATE_AGENT_INTERFACE):

    runcrate_url         the dashboard, e.g. https://clusters.runcrate.example
    runcrate_node_id     this node's id
    runcrate_node_token  this node's token (never logged)
    interface            the WireGuard interface the bootstrap made (default rc0)
    probe_port           the TCP port each peer is tested on (default 22: sshd)
    bandwidth_port       the head's bandwidth sink (default 7077)
    heartbeat_seconds    between check-ins once joined (default 30)
    health_seconds       between health reports on a ready cluster (default 120)
    private_ip           this node's private address, e.g. 10.77.0.1
    is_head              whether this node is the head (also true when private_ip is the head's)

Usage:
    runcrate_agent.py          run in the foreground (under systemd)
    runcrate_agent.py --once   one check-in (and the network test if due), then exit
    runcrate_agent.py --network-test --head 10.77.0.1 [--seconds 3]
                               measure latency and bandwidth to the head as at join (iperf3
                               where the head runs it, else the TCP stream to its sink), print
                               one JSON line and exit (1 when no bandwidth was measured); needs
                               no configuration (the dashboard's network test runs it)
    runcrate_agent.py --daemon --pidfile /run/runcrate-agent.pid
                      --log-file /var/log/runcrate-agent.log
                               detach (hosts without systemd); does nothing (exit 0) when the
                               pidfile names a running agent; the pidfile goes at exit

It needs Python 3.10 or later (Ubuntu 22.04's python3) and nothing outside the standard library.
"""

from __future__ import annotations

import argparse
import atexit
import ipaddress
import json
import logging
import math
import os
import shutil
import signal
import socket
import socketserver
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CONFIG_FILE = Path("/etc/runcrate/agent.json")
NVIDIA_SMI = [
    "nvidia-smi",
    "--query-gpu=name,memory.total,uuid,driver_version",
    "--format=csv,noheader,nounits",
]
PROBE_PORT = 22  # every node runs sshd on its private address
PROBE_TIMEOUT = 3.0
BANDWIDTH_PORT = 7077
IPERF3_PORT = 7078
HEARTBEAT_SECONDS = 30.0
HEALTH_SECONDS = 120.0  # between health reports on a ready cluster (RUNCRATE_HEALTH_SECONDS)
SHARED_SECONDS = 5.0  # how long /shared may take to list before it counts as hung
RETRY_SECONDS = 5.0
MIN_CHECK_IN_SECONDS = 0.5  # however soon the dashboard asks (its answer's check_in_seconds)
REAPPLY_SECONDS = 30.0  # an unchanged list of WireGuard peers is applied whole again this often
STOP_CODES = (403, 404, 410)  # a wrong token, an unknown node, a released node
LATENCY_SAMPLES = 5
STREAM_CHUNK = bytes(64 * 1024)
CONFIG_KEYS = (
    "runcrate_url",
    "runcrate_node_id",
    "runcrate_node_token",
    "interface",
    "probe_port",
    "bandwidth_port",
    "heartbeat_seconds",
    "health_seconds",
    "private_ip",
    "is_head",
    "shared_mount",
    "shared_identity",
)

log = logging.getLogger("runcrate-agent")


# --- configuration ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    """How this node's agent behaves, beyond whom it talks to."""

    interface: str | None = "rc0"
    probe_port: int = PROBE_PORT
    bandwidth_port: int = BANDWIDTH_PORT
    heartbeat_seconds: float = HEARTBEAT_SECONDS
    health_seconds: float = HEALTH_SECONDS
    private_ip: str | None = None
    is_head: bool = False
    # A worker mounts the head's folder here (/shared) before its network test; None: no mount
    # (the head, containers). The identity is the cluster's own SSH key, for sshfs.
    shared_mount: str | None = None
    shared_identity: str | None = None
    # Not read from the configuration; tests shorten them.
    iperf3_port: int = IPERF3_PORT
    retry_seconds: float = RETRY_SECONDS  # between check-ins while starting, and after errors
    reach_seconds: float = 20.0  # how long unreachable peers are tried again
    stream_seconds: float = 1.0  # how long the TCP stream to the head's sink sends
    stall_seconds: float = 10.0  # when the sink drops a client that sends nothing
    # How often the sink tries to bind its private address until WireGuard has made it, and
    # how long a measurement waits for its peer's sink to listen (it binds as soon as it can).
    sink_bind_seconds: float = 0.5
    sink_wait_seconds: float = 15.0


@dataclass(frozen=True)
class Config:
    url: str
    node_id: str
    token: str = field(repr=False)
    settings: Settings = Settings()


def env_name(key: str) -> str:
    """The environment variable for a configuration key: RUNCRATE_URL for runcrate_url, and
    RUNCRATE_AGENT_INTERFACE for interface (never a bare INTERFACE a host may already have)."""
    return key.upper() if key.startswith("runcrate_") else f"RUNCRATE_AGENT_{key.upper()}"


def load_config(environ: dict[str, str] | None = None, path: Path | None = None) -> Config:
    """The configuration file's values, overridden by the environment's."""
    environ = dict(os.environ if environ is None else environ)
    path = CONFIG_FILE if path is None else path
    values: dict[str, Any] = {}
    if path.exists():
        values = {key.lower(): value for key, value in json.loads(path.read_text()).items()}
    for key in CONFIG_KEYS:
        if environ.get(env_name(key)):
            values[key] = environ[env_name(key)]
    for key in ("runcrate_url", "runcrate_node_id", "runcrate_node_token"):
        if not values.get(key):
            raise SystemExit(f"runcrate-agent: {key.upper()} is not set (environment or {path}).")
    settings = Settings(
        interface=_text(values, "interface", "rc0"),
        probe_port=_number(values, "probe_port", PROBE_PORT, int),
        bandwidth_port=_number(values, "bandwidth_port", BANDWIDTH_PORT, int),
        heartbeat_seconds=_number(values, "heartbeat_seconds", HEARTBEAT_SECONDS, float),
        health_seconds=_number(values, "health_seconds", HEALTH_SECONDS, float),
        private_ip=_text(values, "private_ip", None),
        is_head=_boolean(values, "is_head"),
        shared_mount=_text(values, "shared_mount", None),
        shared_identity=_text(values, "shared_identity", None),
    )
    return Config(
        url=str(values["runcrate_url"]),
        node_id=str(values["runcrate_node_id"]),
        token=str(values["runcrate_node_token"]),
        settings=settings,
    )


def _text(values: dict[str, Any], key: str, default: str | None) -> str | None:
    value = values.get(key, default)
    return str(value) if value else None


def _number(values: dict[str, Any], key: str, default: float, kind: type) -> Any:
    try:
        number = kind(values.get(key, default))
    except (TypeError, ValueError):
        raise SystemExit(f"runcrate-agent: {key} must be a number, not {values[key]!r}.") from None
    if number <= 0:
        raise SystemExit(f"runcrate-agent: {key} must be positive, not {number}.")
    return number


def _boolean(values: dict[str, Any], key: str) -> bool:
    value = values.get(key, False)
    if isinstance(value, bool):
        return value
    if str(value).strip().lower() in ("1", "true", "yes", "on"):
        return True
    if str(value).strip().lower() in ("", "0", "false", "no", "off"):
        return False
    raise SystemExit(f"runcrate-agent: {key} must be true or false, not {value!r}.")


# --- what the node reports about itself ------------------------------------------------------


def run_command(command: list[str], timeout: float = 30) -> str | None:
    """The command's output, or None when it is missing, fails or hangs."""
    try:
        done = subprocess.run(  # noqa: S603 (our own command lines, no shell)
            command, capture_output=True, text=True, timeout=timeout, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout


def read_gpus() -> str:
    """nvidia-smi's CSV; empty on a machine without it (the dashboard then sees 0 GPUs)."""
    return run_command(NVIDIA_SMI, timeout=60) or ""


def wireguard_public_key(interface: str | None) -> str | None:
    if interface is None or shutil.which("wg") is None:
        return None
    return (run_command(["wg", "show", interface, "public-key"]) or "").strip() or None


def wireguard_peers(interface: str | None) -> set[str] | None:
    """The public keys of the interface's peers; None without `wg` or without the interface."""
    if interface is None or shutil.which("wg") is None:
        return None
    output = run_command(["wg", "show", interface, "peers"])
    return None if output is None else set(output.split())


def set_wireguard_peers(
    interface: str, peers: list[dict[str, Any]], present: set[str]
) -> tuple[list[str], list[str]]:
    """Make the interface's peers (`present`, their keys) exactly `peers`: the keys it removed and
    the names of the peers it failed to set. Setting a peer that is already there changes
    nothing, so every answer is applied whole."""
    listed, failed = set(), []
    for peer in peers:
        key = peer.get("public_key")
        if not key or not peer.get("allowed_ip"):
            continue
        listed.add(key)
        command = ["wg", "set", interface, "peer", key]
        if peer.get("endpoint"):
            command += ["endpoint", peer["endpoint"]]
        command += ["allowed-ips", peer["allowed_ip"], "persistent-keepalive", "25"]
        if run_command(command) is None:
            failed.append(str(peer.get("name", key)))
    removed = sorted(present - listed)
    for key in removed:
        run_command(["wg", "set", interface, "peer", key, "remove"])
    return removed, failed


# The node's firewall (bootstrap.sh): WireGuard's port accepts only the addresses in these sets.
FIREWALL_TABLE = "inet runcrate"
FIREWALL_SETS = {4: "wg_peers", 6: "wg_peers6"}


def endpoint_address(endpoint: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The address of a WireGuard endpoint ("203.0.113.7:51820", "[2001:db8::1]:51820"); None
    for a name or anything else that is not an address."""
    host = endpoint.rpartition(":")[0].strip("[]")
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def firewall_peers_script(peers: list[dict[str, Any]]) -> str:
    """The nft commands that make the firewall's peer sets exactly the peers' endpoint addresses,
    in one transaction (`nft -f -`): no moment with the set empty."""
    found: dict[int, set[str]] = {4: set(), 6: set()}
    for peer in peers:
        address = endpoint_address(str(peer.get("endpoint") or ""))
        if address is not None:
            found[address.version].add(str(address))
    lines = []
    for version, name in FIREWALL_SETS.items():
        lines.append(f"flush set {FIREWALL_TABLE} {name}")
        if found[version]:
            elements = ", ".join(sorted(found[version]))
            lines.append(f"add element {FIREWALL_TABLE} {name} {{ {elements} }}")
    return "\n".join(lines) + "\n"


def set_firewall_peers(peers: list[dict[str, Any]]) -> str | None:
    """Make the firewall's WireGuard peer sets the peers' endpoints; None when done, else why not
    (no nft, or no runcrate table: a host without the bootstrap's firewall)."""
    if shutil.which("nft") is None:
        return "no nft"
    if run_command(["nft", "list", "set", *FIREWALL_TABLE.split(), FIREWALL_SETS[4]]) is None:
        return f"no firewall table {FIREWALL_TABLE}"
    command = ["nft", "-f", "-"]
    try:
        subprocess.run(  # noqa: S603 (our own command line, no shell)
            command,
            input=firewall_peers_script(peers),
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
    except subprocess.CalledProcessError as error:
        return f"nft refused the peers: {error.stderr.strip()}"
    except (OSError, subprocess.SubprocessError) as error:
        return f"nft failed: {error}"
    return None


# --- testing the private network -------------------------------------------------------------


def probe(address: str, port: int = PROBE_PORT, timeout: float = PROBE_TIMEOUT) -> bool:
    """Whether a TCP connection to address:port opens within `timeout`."""
    try:
        with socket.create_connection((address, port), timeout=timeout):
            return True
    except OSError:
        return False


def reach_peers(peers: dict[str, str], port: int, *, within: float) -> dict[str, bool]:
    """Peer name -> whether its port opened. A peer that has not configured us yet refuses for a
    moment, so the unreachable ones are tried again, about once a second, for `within` seconds."""
    deadline = time.monotonic() + within
    reached = dict.fromkeys(sorted(peers), False)
    while True:
        for name in [name for name, ok in reached.items() if not ok]:
            reached[name] = probe(peers[name], port)
        left = deadline - time.monotonic()
        if all(reached.values()) or left <= 0:
            return reached
        time.sleep(min(1.0, left))


def connect_seconds(address: str, port: int, timeout: float = PROBE_TIMEOUT) -> float:
    """How long a TCP connection to address:port takes to open: one round trip."""
    started = time.perf_counter()
    with socket.create_connection((address, port), timeout=timeout):
        return time.perf_counter() - started


def measure_latency(address: str, port: int) -> float:
    """The median of a few TCP connects' round trips, in milliseconds."""
    samples = [connect_seconds(address, port) for _ in range(LATENCY_SAMPLES)]
    return round(statistics.median(samples) * 1000, 3)


def iperf3_bandwidth(address: str, port: int = IPERF3_PORT) -> float | None:
    """Mbit/s the head's `iperf3 -s` received in 2 s, or None when iperf3 fails (it serves one
    client at a time, so a busy head refuses)."""
    output = run_command(["iperf3", "-c", address, "-p", str(port), "-t", "2", "-J"], timeout=15)
    try:
        bits = json.loads(output or "")["end"]["sum_received"]["bits_per_second"]
    except (ValueError, KeyError, TypeError):
        return None
    return round(bits / 1e6, 1)


def stream_bandwidth(
    address: str, port: int, *, seconds: float = 1.0, timeout: float = 10.0
) -> float:
    """Mbit/s of a timed TCP stream to the head's sink: zero-filled 64 KiB buffers for `seconds`,
    then the sink's count of what it received, from the first send to its reply."""
    with socket.create_connection((address, port), timeout=timeout) as stream:
        started = time.monotonic()
        while time.monotonic() - started < seconds:
            stream.sendall(STREAM_CHUNK)
        stream.shutdown(socket.SHUT_WR)
        reply = _read_line(stream)
        elapsed = time.monotonic() - started
    if not reply.isdigit() or int(reply) == 0:
        raise ValueError(f"the sink answered {reply!r}, not a byte count")
    return round(8 * int(reply) / elapsed / 1e6, 1)


def _read_line(connection: socket.socket) -> str:
    reply = b""
    while not reply.endswith(b"\n") and len(reply) < 64:
        chunk = connection.recv(64)
        if not chunk:
            break
        reply += chunk
    return reply.decode("ascii", "replace").strip()


def measure_bandwidth(head: str, settings: Settings) -> tuple[float, str]:
    """Mbit/s to the head and how it was measured: iperf3 where the head runs it, else our own
    TCP stream to its sink. A peer's sink listens once its WireGuard address exists, which may
    be a moment after the dashboard lets this node measure to it: its port is waited for, up to
    `sink_wait_seconds` (a peer measured in the first round may have had no time)."""
    reach_peers({"peer": head}, settings.bandwidth_port, within=settings.sink_wait_seconds)
    if shutil.which("iperf3") and probe(head, settings.iperf3_port):
        mbit = iperf3_bandwidth(head, settings.iperf3_port)
        if mbit is not None:
            return mbit, "iperf3"
    mbit = stream_bandwidth(head, settings.bandwidth_port, seconds=settings.stream_seconds)
    return mbit, "tcp-stream"


def is_mounted(path: str) -> bool:
    return os.path.ismount(path)


def mount_shared(path: str, head: str, identity: str | None) -> tuple[str | None, str | None]:
    """Mount the head's `path` on the same path here, over the private network: NFS where this
    kernel has an NFS client and the head exports it, else sshfs with the cluster's own key
    (docs/drivers.md, "/shared"). (how, None) once mounted, or (None, why not)."""
    if is_mounted(path):
        return _mounted_by(path), None
    os.makedirs(path, exist_ok=True)
    errors = []
    filesystems = (
        Path("/proc/filesystems").read_text() if Path("/proc/filesystems").exists() else ""
    )
    if "\tnfs4\n" in filesystems and shutil.which("mount.nfs4"):
        command = ["mount", "-t", "nfs4", "-o", "soft,timeo=50,retrans=2", f"{head}:{path}", path]
        done = _run_for(command, 30)
        if done is None and is_mounted(path):
            return "nfs", None
        errors.append(f"nfs: {done}")
    if shutil.which("sshfs"):
        options = [
            "StrictHostKeyChecking=yes",
            "UserKnownHostsFile=/etc/ssh/ssh_known_hosts",
            "BatchMode=yes",
            "ConnectTimeout=10",
            "ServerAliveInterval=15",
            "ServerAliveCountMax=3",
            "reconnect",
            "allow_other",
        ]
        if identity:
            options.append(f"IdentityFile={identity}")
        done = _run_for(["sshfs", "-o", ",".join(options), f"root@{head}:{path}", path], 30)
        if done is None and is_mounted(path):
            return "sshfs", None
        errors.append(f"sshfs: {done or 'it exited but nothing is mounted'}")
    else:
        errors.append("sshfs is not installed")
    return None, "; ".join(errors)


def _run_for(command: list[str], timeout: float) -> str | None:
    """None when `command` succeeded, else what went wrong (its last words)."""
    try:
        done = subprocess.run(  # noqa: S603 (our own command lines, no shell)
            command, capture_output=True, text=True, timeout=timeout
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return str(error)
    if done.returncode == 0:
        return None
    words = (done.stderr or done.stdout).strip().splitlines()
    return f"exit {done.returncode}: {words[-1] if words else 'no output'}"


def _mounted_by(path: str) -> str:
    for line in Path("/proc/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) > 2 and fields[1] == path:
            return (
                "sshfs"
                if "sshfs" in fields[2]
                else "nfs"
                if fields[2].startswith("nfs")
                else fields[2]
            )
    return "unknown"


def machine_facts(meminfo: Path = Path("/proc/meminfo")) -> dict[str, Any]:
    """The machine's own vCPUs (those this process may run on) and memory (MemTotal, MiB),
    reported with the acceptance measurement: the dashboard compares them with what the
    machine type sells (clusters/lifecycle/rules.py `machine_problem`). null where unread."""
    try:
        vcpus: int | None = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        vcpus = os.cpu_count()
    memory = memory_mib(meminfo)
    return {"vcpus": vcpus, "memory_mib": memory[1] if memory else None}


def unmeasured(error: str | None = None) -> dict[str, Any]:
    return {"latency_ms": None, "bandwidth_mbit": None, "method": None, "error": error}


def measure_acceptance(head: str | None, settings: Settings) -> dict[str, Any]:
    """Latency and bandwidth to the head; whatever fails is null, and `error` says why."""
    if head is None:
        return unmeasured("the dashboard named no head")
    acceptance, errors = unmeasured(), []
    try:
        acceptance["latency_ms"] = measure_latency(head, settings.probe_port)
    except OSError as error:
        errors.append(f"latency to {head}:{settings.probe_port}: {error}")
    try:
        acceptance["bandwidth_mbit"], acceptance["method"] = measure_bandwidth(head, settings)
    except (OSError, ValueError) as error:
        errors.append(f"bandwidth to {head}:{settings.bandwidth_port}: {error}")
    acceptance["error"] = "; ".join(errors) or None
    return acceptance


# --- the head's side of the measurement ------------------------------------------------------


class _SinkHandler(socketserver.BaseRequestHandler):
    """Reads until the client shuts its side, then answers how many bytes came."""

    server: _SinkServer

    def handle(self) -> None:
        self.request.settimeout(self.server.stall_seconds)
        received = 0
        try:
            while chunk := self.request.recv(256 * 1024):
                received += len(chunk)
            self.request.sendall(f"{received}\n".encode())
        except OSError:  # a timeout included: a client that stalls is dropped
            return


class _SinkServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], stall_seconds: float) -> None:
        self.stall_seconds = stall_seconds
        super().__init__(address, _SinkHandler)


class Sink:
    """The head's bandwidth sink on address:port, served from a daemon thread, a thread per
    client. The private address appears only once WireGuard is up, so it binds again every
    `retry_seconds` until it can, then calls `when_bound`."""

    def __init__(
        self,
        address: str,
        port: int,
        *,
        stall_seconds: float = 10.0,
        retry_seconds: float = RETRY_SECONDS,
        when_bound: Callable[[], None] | None = None,
    ) -> None:
        self.address = address
        self.port = port
        self.stall_seconds = stall_seconds
        self.retry_seconds = retry_seconds
        self.when_bound = when_bound
        self.bound = threading.Event()
        self._stopping = threading.Event()
        self._server: _SinkServer | None = None

    def start(self) -> Sink:
        threading.Thread(target=self._serve, name="runcrate-sink", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._server is not None:
            self._server.shutdown()

    def _serve(self) -> None:
        server = self._bind()
        if server is None:
            return
        with server:
            self._server = server
            self.bound.set()
            log.info("serving the bandwidth sink on %s:%s", self.address, self.port)
            if self.when_bound is not None:
                self.when_bound()
            server.serve_forever(poll_interval=0.5)

    def _bind(self) -> _SinkServer | None:
        said = False
        while not self._stopping.is_set():
            try:
                return _SinkServer((self.address, self.port), self.stall_seconds)
            except OSError as error:
                if not said:
                    log.info(
                        "cannot serve on %s:%s yet (%s); retrying", self.address, self.port, error
                    )
                    said = True
                self._stopping.wait(self.retry_seconds)
        return None


def start_iperf3_server(address: str, port: int = IPERF3_PORT) -> None:
    """`iperf3 -s` on the head, detached (-D), where iperf3 is installed."""
    if shutil.which("iperf3") is None:
        return
    command = ["iperf3", "-s", "-B", address, "-p", str(port), "-D"]
    try:  # no pipes: the detached server would hold them open
        subprocess.run(  # noqa: S603 (our own command line, no shell)
            command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError) as error:
        log.warning("iperf3 -s on %s:%s did not start: %s", address, port, error)
        return
    log.info("started iperf3 -s on %s:%s", address, port)


# --- the health of a ready node ---------------------------------------------------------------


def probe_all(
    peers: dict[str, str], port: int, *, timeout: float = PROBE_TIMEOUT, attempts: int = 2
) -> dict[str, bool]:
    """Peer name -> whether its port opened, every peer probed at once (so a node cut off from
    all of them answers in `attempts` × `timeout`, not that times the peers); a peer that fails
    is tried again once, a second later."""
    reached = dict.fromkeys(sorted(peers), False)
    for attempt in range(attempts):
        names = [name for name, ok in reached.items() if not ok]
        if not names:
            break
        if attempt:
            time.sleep(1.0)
        results: dict[str, bool] = {}
        threads = [
            threading.Thread(
                target=_probe_into, args=(results, name, peers[name], port, timeout), daemon=True
            )
            for name in names
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout + 1.0)
        reached |= {name: results.get(name, False) for name in names}
    return reached


def _probe_into(results: dict[str, bool], name: str, address: str, port: int, timeout: float):
    results[name] = probe(address, port, timeout)


def running_processes(proc: Path = Path("/proc")) -> set[str]:
    """The names of the processes running here: each one's command name and the file name of
    its first argument (so `/usr/local/bin/k3s server` counts as k3s); zombies are not."""
    names: set[str] = set()
    for entry in proc.iterdir() if proc.is_dir() else ():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            argv = (entry / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
        except OSError:  # it ended meanwhile
            continue
        command, _, rest = stat.partition(" (")[2].rpartition(") ")
        if rest[:1] == "Z":
            continue
        names.add(command)
        if argv:
            names.add(os.path.basename(argv.split()[0]) if argv.split() else "")
    names.discard("")
    return names


def mounted(path: str, mounts: Path = Path("/proc/mounts")) -> bool:
    """Whether something is mounted on `path`, from the mount table: no stat of `path`, which
    a hung mount would never answer."""
    try:
        lines = mounts.read_text().splitlines()
    except OSError:
        return False
    return any(len(fields) > 1 and fields[1] == path for fields in map(str.split, lines))


# Children listing a hung /shared that did not die when killed (a mount in uninterruptible
# sleep): reaped once they end, and while any is left no other is started.
_STUCK: list[subprocess.Popen] = []


def answers_within(path: str, seconds: float = SHARED_SECONDS) -> tuple[bool, str | None]:
    """Whether listing `path` finishes within `seconds`, in a child process (a hung mount hangs
    whoever lists it, never this agent), and why not."""
    _STUCK[:] = [child for child in _STUCK if child.poll() is None]
    if _STUCK:
        return False, f"an earlier listing of {path} still hangs"
    code = "import os, sys; os.listdir(sys.argv[1])"
    try:
        child = subprocess.Popen(  # noqa: S603 (our own command line, no shell)
            [sys.executable, "-c", code, path],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
    except OSError as error:
        return False, str(error)
    try:
        _, stderr = child.communicate(timeout=seconds)
    except subprocess.TimeoutExpired:
        child.kill()
        _STUCK.append(child)
        return False, f"listing it took more than {seconds:g} s"
    if child.returncode != 0:
        words = stderr.decode(errors="replace").strip().splitlines()
        return False, words[-1] if words else f"exit {child.returncode}"
    return True, None


def shared_health(path: str) -> dict[str, Any]:
    """Whether /shared is mounted here and answers."""
    if not mounted(path):
        return {"path": path, "mounted": False, "answers": None, "error": None}
    answers, why = answers_within(path)
    return {"path": path, "mounted": True, "answers": answers, "error": why}


def check_health(request: dict[str, Any], settings: Settings) -> dict[str, Any]:
    """The health report the dashboard's `health` asks for: the peers it lists reached on the
    probe port over the private network, whether each service it names runs here, and (where
    this node mounts it) whether /shared answers. Bounded: a few seconds whatever is wrong."""
    peers = {str(k): str(v) for k, v in (request.get("peers") or {}).items()}
    running = running_processes()
    report: dict[str, Any] = {
        "peers": probe_all(peers, settings.probe_port),
        "services": {str(name): str(name) in running for name in request.get("services") or []},
        "shared": shared_health(settings.shared_mount) if settings.shared_mount else None,
    }
    up = interface_up(settings.interface)
    if up is not None:
        report["interface_up"] = up
    return report


def interface_up(interface: str | None, sys_net: Path = Path("/sys/class/net")) -> bool | None:
    """Whether this node's private network interface is up (IFF_UP in its flags); None where it
    has none. Two machines that cannot reach each other look the same from either end: the one
    whose interface is down is the one cut off."""
    if interface is None:
        return None
    try:
        flags = int((sys_net / interface / "flags").read_text().strip(), 16)
    except (OSError, ValueError):
        return None
    return bool(flags & 0x1)


# --- metrics: what the GPUs and the node are doing ------------------------------------------

# The figures a metrics report asks nvidia-smi for, by the names `nvidia-smi --help-query-gpu`
# documents, in the order parse_metrics reads them back. Drivers from 535 on document the clock
# reasons as clocks_event_reasons.* (clocks_throttle_reasons.* being the older names), and a
# driver fails the whole query over one field it does not know: so a driver that refuses a query
# is asked the next one of METRICS_QUERIES, once, and that one is kept.
THROTTLE_REASONS = (
    "hw_slowdown",
    "hw_thermal_slowdown",
    "sw_thermal_slowdown",
    "hw_power_brake_slowdown",
    "sw_power_cap",
)
# clocks_*_reasons.active is a bit mask (NVML's nvmlClocksEventReason* values).
THROTTLE_BITS = {
    "hw_slowdown": 0x08,
    "hw_thermal_slowdown": 0x40,
    "sw_thermal_slowdown": 0x20,
    "hw_power_brake_slowdown": 0x80,
    "sw_power_cap": 0x04,
}
BASIC_METRICS_QUERY = (
    "index",
    "uuid",
    "utilization.gpu",
    "memory.used",
    "memory.total",
    "temperature.gpu",
    "power.draw",
    "power.limit",
    "clocks.sm",
)
_HEALTH_QUERY = (
    "ecc.errors.corrected.volatile.total",
    "ecc.errors.uncorrected.volatile.total",
    "retired_pages.pending",
    "remapped_rows.pending",
)


def _reasons_query(prefix: str) -> tuple[str, ...]:
    return (f"{prefix}.active", *(f"{prefix}.{reason}" for reason in THROTTLE_REASONS))


METRICS_QUERY = (*BASIC_METRICS_QUERY, *_reasons_query("clocks_event_reasons"), *_HEALTH_QUERY)
METRICS_QUERY_BEFORE_535 = (
    *BASIC_METRICS_QUERY,
    *_reasons_query("clocks_throttle_reasons"),
    *_HEALTH_QUERY,
)
METRICS_QUERIES = (METRICS_QUERY, METRICS_QUERY_BEFORE_535, BASIC_METRICS_QUERY)
UNKNOWN_FIELD = "is not a valid field to query"  # what nvidia-smi says of a field it lacks


def _whole(text: str) -> int:
    number = float(text)
    if not number.is_integer():
        raise ValueError(f"{text!r} is not a whole number")
    return int(number)


def _finite(text: str) -> float:
    number = float(text)
    if number != number or number in (float("inf"), float("-inf")):
        raise ValueError(f"{text!r} is not a figure")
    return number


def _yes_no(text: str) -> bool:
    if text.lower() not in ("yes", "no"):
        raise ValueError(f"{text!r} is neither Yes nor No")
    return text.lower() == "yes"


# nvidia-smi field -> (the report's key, how its text reads).
GPU_FIELDS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "uuid": ("uuid", str),
    "utilization.gpu": ("utilization_percent", _whole),
    "memory.used": ("memory_used_mib", _whole),
    "memory.total": ("memory_total_mib", _whole),
    "temperature.gpu": ("temperature_c", _whole),
    "power.draw": ("power_w", _finite),
    "power.limit": ("power_limit_w", _finite),
    "enforced.power.limit": ("power_limit_w", _finite),
    "clocks.sm": ("sm_clock_mhz", _whole),
    "clocks.current.sm": ("sm_clock_mhz", _whole),
    "ecc.errors.corrected.volatile.total": ("ecc_corrected", _whole),
    "ecc.errors.uncorrected.volatile.total": ("ecc_uncorrected", _whole),
    "retired_pages.pending": ("retired_pages_pending", _yes_no),
    "remapped_rows.pending": ("remapped_rows_pending", _yes_no),
}


def _answered_value(text: str) -> str | None:
    """The field's text, or None where the driver gives no figure: [N/A], [Not Supported], N/A,
    empty, or any other bracketed word ([Unknown Error], [GPU requires reset])."""
    text = text.strip()
    if not text or text.startswith("[") or text.upper() == "N/A":
        return None
    return text


def parse_metrics(csv_text: str, fields: tuple[str, ...] = METRICS_QUERY) -> list[dict[str, Any]]:
    """One dict per GPU (the metrics report's shape) from nvidia-smi's `--query-gpu=fields
    --format=csv,noheader,nounits`. A figure the driver does not give is left out; a line that is
    not one GPU's (a wrong count of values, no index) is skipped. Never raises."""
    gpus = []
    for line in csv_text.splitlines():
        values = [value.strip() for value in line.split(",")]
        if len(values) != len(fields):
            continue
        row = dict(zip(fields, values, strict=True))
        try:
            gpu: dict[str, Any] = {"index": int(row.get("index", ""))}
        except ValueError:
            continue
        for name, text in row.items():
            value = _answered_value(text)
            if value is None or name not in GPU_FIELDS:
                continue
            key, read = GPU_FIELDS[name]
            try:
                gpu[key] = read(value)
            except ValueError:
                continue
        throttle = _throttle(row)
        if throttle is not None:
            gpu["throttle"] = throttle
        gpus.append(gpu)
    return gpus


def _throttle(row: dict[str, str]) -> list[str] | None:
    """The active reasons among THROTTLE_REASONS: from the reasons' own fields (Active / Not
    Active), else from the active bit mask; None when neither could be read."""
    for prefix in ("clocks_event_reasons", "clocks_throttle_reasons"):
        states = {
            reason: (_answered_value(row.get(f"{prefix}.{reason}", "")) or "").lower()
            for reason in THROTTLE_REASONS
        }
        if any(state in ("active", "not active") for state in states.values()):
            return [reason for reason in THROTTLE_REASONS if states[reason] == "active"]
    for prefix in ("clocks_event_reasons", "clocks_throttle_reasons"):
        mask = _answered_value(row.get(f"{prefix}.active", ""))
        if mask is None:
            continue
        try:
            bits = int(mask, 16)
        except ValueError:
            continue
        return [reason for reason in THROTTLE_REASONS if bits & THROTTLE_BITS[reason]]
    return None


def query_nvidia_smi(fields: tuple[str, ...], timeout: float = 30) -> tuple[str | None, str]:
    """nvidia-smi's CSV for `fields` (None when it fails), and what it said when it failed."""
    command = ["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"]
    try:
        done = subprocess.run(  # noqa: S603 (our own command line, no shell)
            command, capture_output=True, text=True, timeout=timeout
        )
    except (OSError, subprocess.SubprocessError) as error:
        return None, str(error)
    if done.returncode != 0:
        return None, f"{done.stdout}\n{done.stderr}".strip()
    return done.stdout, ""


class GpuMetrics:
    """Reads the GPUs' figures for each metrics report, remembering which of METRICS_QUERIES
    this driver answers (the first one it does not refuse for an unknown field)."""

    def __init__(self, queries: tuple[tuple[str, ...], ...] = METRICS_QUERIES) -> None:
        self.queries = list(queries)

    @property
    def fields(self) -> tuple[str, ...]:
        return self.queries[0]

    def read(self) -> list[dict[str, Any]]:
        """The GPUs' figures; none without nvidia-smi or when it fails (no GPU, no driver)."""
        if shutil.which("nvidia-smi") is None:
            return []
        while True:
            output, complaint = query_nvidia_smi(self.fields)
            if output is not None:
                return parse_metrics(output, self.fields)
            if UNKNOWN_FIELD not in complaint or len(self.queries) == 1:
                return []
            refused = self.queries.pop(0)
            log.info(
                "nvidia-smi does not know a field of the metrics query (%s); asking for %d "
                "figures instead of %d",
                complaint.splitlines()[0],
                len(self.fields),
                len(refused),
            )


@dataclass(frozen=True)
class CpuReading:
    """/proc/stat's CPU line: jiffies spent busy and in all, since boot."""

    busy: int
    total: int


def read_cpu(stat: Path) -> CpuReading | None:
    try:
        line = stat.read_text().splitlines()[0]
        # user nice system idle iowait irq softirq steal (guest time is counted in user's)
        ticks = [int(value) for value in line.split()[1:9]]
    except (OSError, IndexError, ValueError):
        return None
    if not line.startswith("cpu ") or len(ticks) < 4:
        return None
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
    return CpuReading(busy=sum(ticks) - idle, total=sum(ticks))


def cpu_percent(before: CpuReading | None, after: CpuReading | None) -> float | None:
    """The share of CPU time spent busy between two readings."""
    if before is None or after is None or after.total <= before.total:
        return None
    busy = min(max(after.busy - before.busy, 0), after.total - before.total)
    return round(100 * busy / (after.total - before.total), 1)


def memory_mib(meminfo: Path) -> tuple[int, int] | None:
    """(used, total) MiB: used is what is not available (MemAvailable, or on kernels without it
    MemFree + Buffers + Cached)."""
    try:
        kib = {
            name: int(rest.split()[0])
            for name, _, rest in (line.partition(":") for line in meminfo.read_text().splitlines())
            if rest.split()
        }
    except (OSError, ValueError):
        return None
    if "MemTotal" not in kib:
        return None
    available = kib.get("MemAvailable")
    if available is None:
        available = kib.get("MemFree", 0) + kib.get("Buffers", 0) + kib.get("Cached", 0)
    return (kib["MemTotal"] - available) // 1024, kib["MemTotal"] // 1024


def disk_gib(path: str) -> tuple[float, float] | None:
    """(used, total) GiB of the filesystem holding `path`, as df counts them."""
    try:
        figures = os.statvfs(path)
    except OSError:
        return None
    gib = figures.f_frsize / 2**30
    used = (figures.f_blocks - figures.f_bfree) * gib
    return round(used, 1), round(figures.f_blocks * gib, 1)


# Threads asking a hung /shared for its figures: while one is left, no other is started.
_STATVFS_STUCK: list[threading.Thread] = []


def disk_gib_within(path: str, seconds: float = SHARED_SECONDS) -> tuple[float, float] | None:
    """disk_gib of a network mount, in a thread given `seconds`: a hung mount hangs the thread,
    never the agent (None then, and while it still hangs)."""
    _STATVFS_STUCK[:] = [thread for thread in _STATVFS_STUCK if thread.is_alive()]
    if _STATVFS_STUCK:
        return None
    found: list[tuple[float, float] | None] = []
    thread = threading.Thread(
        target=lambda: found.append(disk_gib(path)), name="runcrate-statvfs", daemon=True
    )
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        _STATVFS_STUCK.append(thread)
        return None
    return found[0] if found else None


def network_bytes(net_dev: Path, interface: str) -> tuple[int, int] | None:
    """(received, sent) bytes since the interface came up, from /proc/net/dev."""
    try:
        lines = net_dev.read_text().splitlines()
    except OSError:
        return None
    for line in lines[2:]:
        name, _, counters = line.partition(":")
        values = counters.split()
        if name.strip() == interface and len(values) >= 9:
            try:
                return int(values[0]), int(values[8])
            except ValueError:
                return None
    return None


def node_metrics(
    previous: CpuReading | None,
    *,
    interface: str | None,
    shared: str | None,
    proc: Path = Path("/proc"),
    root: str = "/",
) -> tuple[dict[str, Any], CpuReading | None]:
    """The node's part of a metrics report, and this CPU reading (the next report's `previous`;
    the CPU's share is over the time between the two). A figure that cannot be read is left out:
    the CPU's in the first report, /shared's where it is not mounted, the network's without the
    interface."""
    reading = read_cpu(proc / "stat")
    node: dict[str, Any] = {}
    busy = cpu_percent(previous, reading)
    if busy is not None:
        node["cpu_percent"] = busy
    memory = memory_mib(proc / "meminfo")
    if memory is not None:
        node["memory_used_mib"], node["memory_total_mib"] = memory
    disk = disk_gib(root)
    if disk is not None:
        node["disk_root_used_gib"], node["disk_root_total_gib"] = disk
    if shared and mounted(shared, proc / "mounts"):
        disk = disk_gib_within(shared)
        if disk is not None:
            node["disk_shared_used_gib"], node["disk_shared_total_gib"] = disk
    moved = network_bytes(proc / "net/dev", interface) if interface else None
    if moved is not None:
        node["network_rx_bytes"], node["network_tx_bytes"] = moved
    return node, reading


# --- the agent -------------------------------------------------------------------------------


def network_test_due(state: dict[str, Any]) -> bool:
    # A dashboard that does not say whether the peers are ready is taken to mean they are; one
    # that does not say whose turn it is to measure (`measure_turn`: the nodes measure in
    # rounds, in pairs that never share a link), that it is ours.
    ready = state.get("peers_ready", True) is True
    turn = state.get("measure_turn", True) is True
    return state["status"] == "starting" and state["step"] == "network" and ready and turn


class Agent:
    """One node's agent: talks to the dashboard as `node_id` with `token`."""

    def __init__(
        self,
        url: str,
        node_id: str,
        token: str,
        *,
        settings: Settings | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not url.startswith(("https://", "http://")):
            raise SystemExit(f"runcrate-agent: RUNCRATE_URL must be an http(s) URL, not {url!r}.")
        self.base = f"{url.rstrip('/')}/api/v1/agent/nodes/{node_id}"
        self.token = token
        self.settings = settings or Settings()
        self.sink: Sink | None = None
        self._status = "starting"
        self._peer_starting = False
        self._soon: float | None = None  # the last answer's check_in_seconds
        self._gpus_sent = False  # a check-in with nvidia-smi's GPUs was answered
        self._applied: tuple[str, float] | None = None  # the WireGuard peers last applied, when
        self._said: dict[str, str] = {}
        self._health: dict[str, Any] | None = None  # what the last answer asked to check
        self._health_at: float | None = None  # when the last health report went (monotonic)
        # The loop's clock and its wait (tests move time instead of sleeping through it).
        self._clock = clock
        self._sleep = sleep
        # Metrics: every `metrics_seconds` the last answer gave (None: send none), from the time
        # the last report went; off for good once the dashboard does not know the endpoint.
        self._metrics_seconds: float | None = None
        self._metrics_at: float | None = None
        self._metrics_off = False
        self._cpu: CpuReading | None = None
        self._gpu_metrics = GpuMetrics()

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """Send a report whose answer is the node's state (check-in, network test)."""
        state = self._request(path, body)
        self._answered(state)
        return state

    def _request(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST `body` to the node's `path`; the answer's data."""
        request = urllib.request.Request(  # noqa: S310 (the scheme is checked in __init__)
            f"{self.base}/{path}",
            data=json.dumps(body).encode(),
            method="POST",
            headers={
                "Authorization": f"Bearer {self.token}",
                "Content-Type": "application/json",
                "User-Agent": "runcrate-agent/2",
            },
        )
        with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310
            return json.loads(response.read())["data"]

    def _note(self, topic: str, message: str) -> None:
        """Log `message` unless it is what was last said about `topic`: one line per change."""
        if self._said.get(topic) != message:
            self._said[topic] = message
            log.info("%s", message)

    def _answered(self, state: dict[str, Any]) -> None:
        """What every answer of the dashboard leads to."""
        self._status = state["status"]
        # A peer joining (a worker being added) needs this node's WireGuard peer soon.
        self._peer_starting = bool(state.get("peer_starting"))
        # Sooner while this node waits to measure in step `network` (null or absent: as usual).
        soon = state.get("check_in_seconds")
        self._soon = float(soon) if isinstance(soon, (int, float)) and soon > 0 else None
        health = state.get("health")
        self._health = health if isinstance(health, dict) else None
        self._set_metrics_seconds(state.get("metrics_seconds"))
        self._note("state", f"{state['node']} is {state['status']} (step {state['step']})")
        if "wireguard" in state:
            self.apply_wireguard(state["wireguard"]["peers"])

    def apply_wireguard(self, peers: list[dict[str, Any]]) -> None:
        interface = self.settings.interface
        present = wireguard_peers(interface)
        if interface is None or present is None:
            self._note("wireguard", f"no wg or no WireGuard interface {interface}; no peers set")
            return
        if self._still_applied(peers, present):
            return
        removed, failed = set_wireguard_peers(interface, peers, present)
        # WireGuard's port accepts exactly these peers' addresses, kept with the peers.
        endpoints = sorted({str(p["endpoint"]) for p in peers if p.get("endpoint")})
        why_not = set_firewall_peers(peers)
        # Applied (or no firewall to apply to): the same answer runs nothing for a while.
        done = not failed and (why_not is None or why_not.startswith("no "))
        self._applied = (json.dumps(peers, sort_keys=True), self._clock()) if done else None
        if why_not is None:
            self._note("firewall", f"firewall: WireGuard accepts {', '.join(endpoints) or 'none'}")
        else:
            self._note("firewall", f"firewall: peers not set ({why_not})")
        names = ", ".join(sorted(str(p.get("name")) for p in peers if p.get("public_key")))
        message = f"WireGuard {interface} peers: {names or 'none'}"
        if removed:
            self._said.pop("wireguard", None)  # a removal is always worth a line
            message += f"; removed {len(removed)}"
        if failed:
            message += f"; wg set failed for {', '.join(failed)}"
        self._note("wireguard", message)

    def _still_applied(self, peers: list[dict[str, Any]], present: set[str]) -> bool:
        """Whether the answer lists the peers applied last, less than REAPPLY_SECONDS ago, and
        the interface has exactly their keys: then nothing is run (`wg set` a peer and `nft` twice
        an answer, every second while waiting to measure, took the CPU the measurement of
        another pair needed). Every REAPPLY_SECONDS the answer is applied whole again."""
        if self._applied is None:
            return False
        listed, applied_at = self._applied
        keys = {p["public_key"] for p in peers if p.get("public_key") and p.get("allowed_ip")}
        return (
            listed == json.dumps(peers, sort_keys=True)
            and present == keys
            and self._clock() - applied_at < REAPPLY_SECONDS
        )

    def check_in(self) -> dict[str, Any]:
        # The dashboard records the GPUs of a node's first check-in only (step `agent`): once
        # one was answered, the others say none, and nvidia-smi (a second on some machines)
        # is not run for every heartbeat, nor every second while waiting to measure.
        gpus: dict[str, Any] = {"gpus": []} if self._gpus_sent else {"nvidia_smi": read_gpus()}
        body = gpus | {
            "wireguard_public_key": wireguard_public_key(self.settings.interface),
            "hostname": socket.gethostname(),
        }
        if not self.health_due():
            state = self._post("check-in", body)
            self._gpus_sent = True
            return state
        self._health_at = self._clock()
        report = check_health(self._health or {}, self.settings)
        self._note("health", _describe_health(report))
        try:
            state = self._post("check-in", body | {"health": report})
            self._gpus_sent = True
            return state
        except urllib.error.HTTPError as error:
            if error.code != 422:
                raise
            # A report it cannot take never costs the heartbeat: sent again without it.
            self._note("dashboard", f"the dashboard refused a health report: {_why(error)}")
            state = self._post("check-in", body)
            self._gpus_sent = True
            return state

    def health_due(self) -> bool:
        """The last answer asks for health reports (a ready cluster) and one is due."""
        if self._health is None or self._status != "joined":
            return False
        last = self._health_at
        return last is None or self._clock() - last >= self.settings.health_seconds

    def own_address(self, state: dict[str, Any]) -> str | None:
        return self.settings.private_ip or state.get("private_ip")

    def is_head(self, state: dict[str, Any]) -> bool:
        head = state.get("head") or {}
        mine = self.own_address(state)
        return self.settings.is_head or (mine is not None and head.get("private_ip") == mine)

    def test_network(self, state: dict[str, Any]) -> dict[str, Any]:
        """Reach every peer, measure the way to the head, report both; the dashboard's answer."""
        settings = self.settings
        reachability = reach_peers(
            state["peers"], settings.probe_port, within=settings.reach_seconds
        )
        head = (state.get("head") or {}).get("private_ip")
        # The peer the dashboard's schedule names for this node's round (`measure_peer`);
        # a dashboard from before the rounds names none: a worker measures to the head.
        peer = (state.get("measure_peer") or {}).get("private_ip")
        if peer is None and self.is_head(state):
            acceptance = unmeasured()  # nothing to measure the way to
        else:
            acceptance = measure_acceptance(peer or head, settings)
        if settings.shared_mount and head and not self.is_head(state):
            how, why = mount_shared(settings.shared_mount, head, settings.shared_identity)
            acceptance |= {"shared": how, "shared_error": why}
        acceptance |= machine_facts()
        self._note("network", _describe(reachability, acceptance))
        return self._post("network", {"reachability": reachability, "acceptance": acceptance})

    def run_once(self) -> dict[str, Any]:
        """One check-in, and the network test when it is due: --once."""
        state = self.check_in()
        if network_test_due(state):
            state = self.test_network(state)
        return state

    def serve_if_head(self, state: dict[str, Any]) -> None:
        """Start the sink (once; it lives as long as the agent): on the head, and on every node
        of a dashboard that measures in rounds (`measure_peer` in its answers), where any node
        may be the peer another measures to."""
        address = self.own_address(state)
        rounds = "measure_peer" in state
        if self.sink is not None or address is None or not (rounds or self.is_head(state)):
            return
        port = self.settings.iperf3_port
        self.sink = Sink(
            address,
            self.settings.bandwidth_port,
            stall_seconds=self.settings.stall_seconds,
            retry_seconds=self.settings.sink_bind_seconds,
            when_bound=lambda: start_iperf3_server(address, port),
        ).start()

    def next_check_in_seconds(self) -> float:
        soon = self._status == "starting" or self._peer_starting
        wait = self.settings.retry_seconds if soon else self.settings.heartbeat_seconds
        if self._soon is not None:
            wait = min(wait, max(self._soon, MIN_CHECK_IN_SECONDS))
        if self._health is not None:
            # A health report due before the next heartbeat goes with its own check-in (the
            # first one at once: the cluster just became ready).
            last = self._health_at
            due = 0.0 if last is None else last + self.settings.health_seconds - self._clock()
            wait = min(wait, max(due, 1.0))
        return wait

    def run(self) -> int:
        """Check in until the dashboard says to stop, and send metrics between check-ins while
        the dashboard asks for them; the exit status."""
        self.serve_if_head({})  # a head that its configuration names serves before it checks in
        check_in_at = self._clock()
        while True:
            if self._clock() >= check_in_at:
                wait = self.check_in_turn()
                if wait is None:
                    return 1
                check_in_at = self._clock() + wait
            if self.metrics_due_in() == 0:
                self.send_metrics()
            pause = check_in_at - self._clock()
            metrics_in = self.metrics_due_in()
            if metrics_in is not None:
                pause = min(pause, metrics_in)
            self._sleep(max(pause, 0.0))

    def check_in_turn(self) -> float | None:
        """One check-in (and the network test when due): how long until the next one, or None
        when the dashboard says to stop."""
        try:
            state = self.check_in()
            self.serve_if_head(state)
            if network_test_due(state):
                self.test_network(state)
        except urllib.error.HTTPError as error:
            if error.code in STOP_CODES:
                log.error("stopping: the dashboard answered %s (%s)", error.code, _why(error))
                return None
            return self._after_refusal(error)
        except (OSError, ValueError, KeyError, TypeError) as error:
            # OSError includes urllib's URLError; the others: an answer we cannot read.
            self._note("dashboard", f"no answer from the dashboard ({error!r}); retrying")
            return self.settings.retry_seconds
        if self._said.pop("dashboard", None) is not None:
            log.info("the dashboard answers again")
        return self.next_check_in_seconds()

    # --- metrics

    def _set_metrics_seconds(self, value: Any) -> None:
        """Send metrics every `value` seconds from now on (the first at once); None or anything
        but a positive number: send none."""
        valid = isinstance(value, int | float) and not isinstance(value, bool) and value > 0
        self._metrics_seconds = float(value) if valid else None

    def metrics_due_in(self) -> float | None:
        """Seconds until the next metrics report (0: due now); None while none is to be sent."""
        if self._metrics_off or self._metrics_seconds is None:
            return None
        if self._metrics_at is None:
            return 0.0
        return max(self._metrics_at + self._metrics_seconds - self._clock(), 0.0)

    def metrics_report(self) -> dict[str, Any]:
        """The GPUs' and the node's figures now (docs/lifecycle.md, "Metrics")."""
        node, self._cpu = node_metrics(
            self._cpu, interface=self.settings.interface, shared=self.settings.shared_mount
        )
        return {"gpus": self._gpu_metrics.read(), "node": node}

    def send_metrics(self) -> None:
        """Send one metrics report. A refusal or no answer is logged (once) and the next report
        goes at the next interval; a 404 (a dashboard without the endpoint) stops metrics."""
        self._metrics_at = self._clock()
        try:
            answer = self._request("metrics", self.metrics_report())
        except urllib.error.HTTPError as error:
            if error.code == 404:
                self._metrics_off = True
                log.info("the dashboard takes no metrics (404: %s); sending none", _why(error))
                return
            wait = _retry_after(error) if error.code == 429 else None
            if wait is not None and self._metrics_seconds is not None:
                # Too soon for the dashboard: the next report waits as long as it asks, or the
                # interval, whichever is longer.
                self._metrics_at = self._clock() + max(wait - self._metrics_seconds, 0.0)
            self._note("metrics", f"the dashboard refused metrics: {error.code} ({_why(error)})")
            return
        except (OSError, ValueError, KeyError, TypeError) as error:
            self._note("metrics", f"metrics not sent: no answer from the dashboard ({error!r})")
            return
        if isinstance(answer, dict) and "metrics_seconds" in answer:
            self._set_metrics_seconds(answer["metrics_seconds"])
        if self._metrics_seconds is not None:
            self._note("metrics", f"sending metrics every {self._metrics_seconds:g} s")

    def _after_refusal(self, error: urllib.error.HTTPError) -> float:
        """Log the dashboard's refusal; how long to wait before the next try."""
        if error.code == 422:  # a report it cannot take: sent again, as it then is, next time
            self._note("dashboard", f"the dashboard refused a report: {_why(error)}")
            return self.next_check_in_seconds()
        self._note("dashboard", f"the dashboard answered {error.code} ({_why(error)}); retrying")
        return self.settings.retry_seconds


def _retry_after(error: urllib.error.HTTPError) -> float | None:
    """The seconds a refusal's `Retry-After` asks to wait (at most an hour), or None."""
    try:
        seconds = float(error.headers.get("Retry-After", ""))
    except (TypeError, ValueError):
        return None
    return min(seconds, 3600.0) if math.isfinite(seconds) and seconds > 0 else None


def _why(error: urllib.error.HTTPError) -> str:
    """The dashboard's message in its error envelope, else the HTTP reason."""
    try:
        return str(json.loads(error.read())["error"]["message"])
    except (OSError, ValueError, KeyError, TypeError):
        return str(error.reason)


def _describe_health(report: dict[str, Any]) -> str:
    """One line for the log (written when it changes): what is wrong, or that nothing is."""
    wrong = [f"cannot reach {name}" for name, ok in report["peers"].items() if not ok]
    wrong += [f"{name} is not running" for name, ok in report["services"].items() if not ok]
    shared = report.get("shared") or {}
    if shared.get("mounted") and not shared.get("answers"):
        wrong.append(f"{shared['path']} does not answer ({shared.get('error')})")
    return f"health: {'; '.join(wrong) if wrong else 'every peer reached, every service running'}"


def _describe(reachability: dict[str, bool], acceptance: dict[str, Any]) -> str:
    unreached = sorted(name for name, reached in reachability.items() if not reached)
    line = f"network test: reached {len(reachability) - len(unreached)}/{len(reachability)} peers"
    if unreached:
        line += f" (not {', '.join(unreached)})"
    if acceptance["latency_ms"] is not None:
        line += f"; head {acceptance['latency_ms']} ms"
    if acceptance["bandwidth_mbit"] is not None:
        line += f", {acceptance['bandwidth_mbit']} Mbit/s by {acceptance['method']}"
    if acceptance["error"]:
        line += f"; {acceptance['error']}"
    return line


# --- running as a daemon ---------------------------------------------------------------------


def running_agent(pidfile: Path) -> int | None:
    """The pid that `pidfile` names, when that process is alive and runs this agent."""
    try:
        pid = int(pidfile.read_text().strip())
        command_line = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return None
    return pid if Path(__file__).name.encode() in command_line else None


def daemonize(pidfile: Path, log_file: Path) -> None:
    """Detach (fork, setsid, fork), write the pidfile and send all output to `log_file`. Returns
    in the daemon; the caller's process exits once the pidfile is written, so whoever started us
    can read it at once."""
    pidfile, log_file = pidfile.absolute(), log_file.absolute()  # the daemon works from /
    ready_read, ready_write = os.pipe()
    if os.fork() > 0:
        os.close(ready_write)
        with os.fdopen(ready_read) as ready:
            os._exit(0 if ready.read() == "ok" else 1)
    os.close(ready_read)
    os.setsid()
    if os.fork() > 0:
        os._exit(0)
    os.chdir("/")
    pid = os.getpid()
    pidfile.write_text(f"{pid}\n")
    atexit.register(_remove_pidfile, pidfile, pid)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))  # so atexit runs
    with open(os.devnull) as nothing, open(log_file, "a") as output:
        os.dup2(nothing.fileno(), 0)
        os.dup2(output.fileno(), 1)
        os.dup2(output.fileno(), 2)
    os.write(ready_write, b"ok")
    os.close(ready_write)


def _remove_pidfile(pidfile: Path, pid: int) -> None:
    try:
        if pidfile.read_text().strip() == str(pid):
            pidfile.unlink()
    except OSError:
        return


def parse_arguments(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="runcrate_agent.py", description="The Runcrate agent.")
    parser.add_argument("--once", action="store_true", help="check in once, then exit")
    parser.add_argument("--daemon", action="store_true", help="detach (hosts without systemd)")
    parser.add_argument("--pidfile", type=Path, default=Path("/run/runcrate-agent.pid"))
    parser.add_argument("--log-file", type=Path, default=Path("/var/log/runcrate-agent.log"))
    parser.add_argument(
        "--network-test", action="store_true", help="measure the way to --head, print JSON"
    )
    parser.add_argument("--head", help="the head's private address (with --network-test)")
    parser.add_argument("--seconds", type=_test_seconds, default=3.0, help="stream length")
    parser.add_argument("--port", type=int, default=BANDWIDTH_PORT, help="the head's sink")
    parser.add_argument("--iperf3-port", type=int, default=IPERF3_PORT)
    parser.add_argument("--probe-port", type=int, default=PROBE_PORT, help="for the latency")
    arguments = parser.parse_args(argv)
    if arguments.network_test and not arguments.head:
        parser.error("--network-test needs --head ADDRESS")
    return arguments


def _test_seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds") from None
    if not 0 < seconds <= 60:
        raise argparse.ArgumentTypeError(f"{value} is not between 0 and 60 seconds")
    return seconds


def network_test(arguments: argparse.Namespace) -> int:
    """--network-test: the acceptance measurement to the head, for as long as asked, as one
    JSON line on stdout; exit 1 when there is no bandwidth figure (the line says why)."""
    settings = Settings(
        probe_port=arguments.probe_port,
        bandwidth_port=arguments.port,
        iperf3_port=arguments.iperf3_port,
        stream_seconds=arguments.seconds,
    )
    report = {"head": arguments.head, **measure_acceptance(arguments.head, settings)}
    print(json.dumps(report), flush=True)
    return 0 if report["bandwidth_mbit"] is not None else 1


def main(argv: list[str]) -> int:
    arguments = parse_arguments(argv)
    if arguments.network_test:
        return network_test(arguments)
    config = load_config()
    agent = Agent(config.url, config.node_id, config.token, settings=config.settings)
    if arguments.daemon:
        pid = running_agent(arguments.pidfile)
        if pid is not None:
            print(f"runcrate-agent: already running (pid {pid})", file=sys.stderr)
            return 0
        daemonize(arguments.pidfile, arguments.log_file)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s runcrate-agent: %(message)s", stream=sys.stderr
    )
    if arguments.once:
        return run_once(agent)
    return agent.run()


def run_once(agent: Agent) -> int:
    try:
        agent.run_once()
    except urllib.error.HTTPError as error:
        log.error("the dashboard answered %s (%s)", error.code, _why(error))
        return 1
    except (OSError, ValueError, KeyError, TypeError) as error:
        log.error("no answer from the dashboard (%r)", error)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
