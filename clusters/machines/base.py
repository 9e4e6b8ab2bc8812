"""The driver interface the lifecycle talks to, and the values it returns.

The lifecycle calls `observe` inside its transaction, so it must be cheap: it reads what the
driver already knows (its `driver_state`, the clock), never opens a connection. `start`,
`install`, `check` and `stop` are slow work; the lifecycle runs them in per-node tasks under a
lease, outside any transaction; so is `network_test`, run by its own task for the whole cluster.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING

from clusters.connect import RAY_DASHBOARD_PORT

if TYPE_CHECKING:
    from clusters.models import Cluster, Node


class MachineState(StrEnum):
    BOOTING = "booting"
    RUNNING = "running"
    FAILED = "failed"
    GONE = "gone"


class CheckState(StrEnum):
    READY = "ready"
    PENDING = "pending"  # not yet: check again later, until the install deadline
    FAILED = "failed"


@dataclass(frozen=True)
class Observation:
    state: MachineState
    since: datetime | None = None  # when the machine reached this state, where known
    message: str = ""
    # Where users reach a running machine over SSH; "" where it has no address of its own (its
    # location's SSH gateway reaches it) or the driver does not know it yet.
    public_address: str = ""
    # The SSH port at that address, and the host's pinned key (for users' known_hosts; "" where
    # the driver pins none).
    public_port: int = 22
    host_key: str = ""
    # For a failure: the Event reason to fail with ("" means machine_failed / machine_gone).
    reason: str = ""


@dataclass(frozen=True)
class PlanNode:
    name: str
    private_ip: str
    gpus: int
    is_head: bool
    installed_at: datetime | None = None


@dataclass(frozen=True)
class InstallPlan:
    """What an install or a check needs to know about the whole cluster."""

    cluster_name: str
    software: str
    gpus_per_machine: int
    boot_seconds: int
    nodes: list[PlanNode] = field(default_factory=list)
    # Each node's plan (`clusters.connect.node_plan`) by node name: what the driver applies.
    node_plans: dict[str, dict] = field(default_factory=dict)
    # Each node's agent token by node name, given with the node plans: a driver that applies
    # a plan again (the bootstrap before an install) hands the agent the same token.
    agent_tokens: dict[str, str] = field(default_factory=dict)

    @property
    def head(self) -> PlanNode:
        return next(n for n in self.nodes if n.is_head)


# How long an install may take: the lifecycle's install step waits this long (at least
# RUNCRATE_MIN_STEP_SECONDS) for the software to be ready before the cluster is degraded
# (`install_timeout`, clusters/lifecycle/steps/install.py); a driver's installer runs no longer.
INSTALL_SECONDS = 15 * 60


@dataclass(frozen=True)
class InstallResult:
    ok: bool
    output: str = ""


@dataclass(frozen=True)
class CheckResult:
    """The software's own verdict for every node, from the real check's output."""

    state: CheckState
    ready_nodes: frozenset[str] = frozenset()
    problems: dict[str, str] = field(default_factory=dict)  # node name -> why not ready
    output: str = ""


@dataclass(frozen=True)
class NetworkTestResult:
    """What a network test measured between a cluster's machines (docs/lifecycle.md): `method`
    `nccl` (all_reduce_perf's bus bandwidth per message size) or `agent` (Gbit/s from each
    worker to node-0), the `results` kept on the cluster, and an `error` sentence when it
    failed. `simulated` marks the simulated data center's stand-in figures."""

    ok: bool
    method: str = ""
    results: dict = field(default_factory=dict)
    error: str = ""
    output: str = ""
    simulated: bool = False


@dataclass(frozen=True)
class AgentCheckIn:
    """What a node's agent reports when it checks in (step `agent`): the GPUs it sees, as
    `clusters.telemetry.agent_service` takes them, and its WireGuard public key where it has one."""

    gpus: list[dict]
    wireguard_key: str | None = None


@dataclass(frozen=True)
class NetworkReport:
    """What a node's agent reports of the private network (step `network`): peer name ->
    reached, and what it measured to node-0 (the acceptance report)."""

    reachability: dict[str, bool]
    acceptance: dict | None = None


AgentReport = AgentCheckIn | NetworkReport


@dataclass(frozen=True)
class Released:
    """What a stop left behind. `pristine`: the host may serve the next tenant (it was
    reimaged and verified against its baseline, or it is a simulated machine); otherwise
    `why` tells staff what keeps it out (no reimage command, what differs). `warning` is for
    the user, with its `output`: what went wrong without stopping the release (a volume that
    could not be synced back)."""

    pristine: bool
    why: str = ""
    warning: str = ""
    output: str = ""


class DriverError(Exception):
    """Slow work that failed in a way the driver can say. With a `reason` (an Event reason such as
    `host_key_mismatch`) the lifecycle fails the node at once; without one the work is retried
    until its step's deadline (`machine_failed` after `START_ATTEMPTS` for a start)."""

    def __init__(self, message: str, *, reason: str = "", output: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason
        self.output = output


class Driver:
    """Start, watch, install, check and stop the machine serving a node.

    Every driver goes through the same calls; the lifecycle knows no driver by name. A node's
    agent reports on its own over HTTP (`clusters.telemetry.agent_service`); a driver whose
    machines have
    no agent of their own (the simulated data center) plays it through `agent_work_due` and
    `agent_report`, which the lifecycle calls for every driver and records as the agent's
    endpoints do. A driver is given what it needs (plans, the agent's token) and returns what
    it found; it never writes the lifecycle's rows itself.
    """

    name = "base"
    # Whether the lifecycle hands a cluster's nodes the same work in one task (its work is
    # quick and needs no worker of its own per node: the simulated data center), instead of one
    # task per node that a pool of workers runs side by side (a bootstrap over SSH).
    batches_work = False

    def start(self, node: Node, *, agent_token: str, plan: dict) -> dict:
        """Begin booting the host for `node` and bootstrap it with `plan`
        (`clusters.connect.node_plan`: hostname, /etc/hosts, environment, mounts, hostfile);
        returns what to keep in `node.driver_state`."""
        raise NotImplementedError

    def observe(self, node: Node, *, now: datetime) -> Observation:
        raise NotImplementedError

    def install(self, node: Node, *, plan: InstallPlan) -> InstallResult:
        """Install `plan.software` on `node`, after applying `plan.node_plans[node.name]` again
        (peers may have changed since the start)."""
        raise NotImplementedError

    def check(self, node: Node, *, plan: InstallPlan, now: datetime) -> CheckResult:
        """Run the software's readiness check on `node` (the head) for the whole plan."""
        raise NotImplementedError

    def drain(self, head: Node, *, plan: InstallPlan, drained: dict[str, str]) -> InstallResult:
        """Make the scheduler of `plan.software` on `head` (node-0) drain exactly the nodes in
        `drained` (node name -> why, in words) among the plan's nodes, and resume those the
        product drained before that are not in it; what a user drained by hand stays as it is.
        Slow work, outside any transaction; `ok` when the scheduler matches, with what changed
        in `output` (`runcrate: drained node-2`, `runcrate: resumed node-3`, `runcrate: skipped
        …`)."""
        raise NotImplementedError

    def stop(self, node: Node, *, attempt: int = 1) -> Released:
        """Stop the machine and make it fit for the next tenant: reimage and verify it where
        it can be, else wipe it (then it is not pristine: it waits for staff). Raises
        DriverError when that failed and should be tried again; `attempt` counts the tries
        (1 the first). Idempotent."""
        raise NotImplementedError

    def network_test(
        self, cluster: Cluster, *, nodes: list[Node], plan: InstallPlan
    ) -> NetworkTestResult:
        """Measure the private network between `nodes` (the cluster's joined machines, node-0
        first, with their hosts): slow work, run by a task outside any transaction."""
        return NetworkTestResult(
            ok=False, error=f"Machines of the {self.name} driver cannot run a network test."
        )

    def read_logs(self, node: Node, *, kinds: Sequence[LogKind], head_ip: str) -> list[LogText]:
        """Read `kinds` (`log_script`) on the machine serving `node`, each at most LOG_CAP_BYTES
        with the command that produced it: slow work, run by a task of the `machines` queue
        outside any transaction; it changes nothing on the host or in the dashboard. Raises
        DriverError (its message for the user) when the machine cannot be reached."""
        raise DriverError(f"Machines of the {self.name} driver keep no logs the dashboard reads.")

    # --- the node's agent, where the driver must do part of its work ------------------------

    def agent_work_due(self, node: Node, *, step: str, now: datetime, since: datetime) -> bool:
        """Whether the lifecycle should hand this node's `step` ("agent" or "network") to
        `do_agent_work` now; `since` is when the step started for the whole batch. Real
        machines' agents report on their own: never."""
        return False

    def agent_report(self, node: Node, *, step: str, peers: list[str]) -> AgentReport:
        """Play the agent of `node` (locked, read in the write-back's transaction) for `step`:
        what it would report (`AgentCheckIn` for "agent", `NetworkReport` for "network"),
        which the lifecycle records through `clusters.telemetry.agent_service`. `peers` are the
        names of
        the other nodes its network test reaches for. Quick: it runs with the cluster locked."""
        raise NotImplementedError

    def last_heard(self, node: Node, *, now: datetime) -> datetime | None:
        """When the node's agent was last heard from (its heartbeat); None if never."""
        return node.heartbeat_at


# --- logs and jobs (docs/metrics.md, "Logs and jobs") ---------------------------------------

# What a fetch keeps of each text: its last 256 KB, cut on the host (`tail -c`).
LOG_CAP_BYTES = 256 * 1024
# Where the ssh driver keeps on the host what its bootstrap and installers printed (under the
# product's state directory: the wipe removes it, verify.sh checks it is gone).
HOST_LOG_DIR = "/var/lib/runcrate/log"
# A text's first line names the command that produced it (the shell picked it on the host).
SOURCE_PREFIX = "runcrate: source="


class LogKind(StrEnum):
    """The texts a fetch reads: a node's logs, or what the head says of its jobs."""

    BOOTSTRAP = "bootstrap"
    INSTALL = "install"
    AGENT = "agent"
    SYSTEM = "system"
    SLURM_QUEUE = "slurm_queue"
    SLURM_NODES = "slurm_nodes"
    RAY_JOBS = "ray_jobs"
    RAY_STATUS = "ray_status"
    KUBERNETES_PODS = "kubernetes_pods"


NODE_LOG_KINDS = (LogKind.BOOTSTRAP, LogKind.INSTALL, LogKind.AGENT, LogKind.SYSTEM)
# The head's jobs by the cluster's software; none for software "none".
JOB_KINDS: dict[str, tuple[LogKind, ...]] = {
    "slurm": (LogKind.SLURM_QUEUE, LogKind.SLURM_NODES),
    "ray": (LogKind.RAY_JOBS, LogKind.RAY_STATUS),
    "kubernetes": (LogKind.KUBERNETES_PODS,),
}


@dataclass(frozen=True)
class LogSource:
    """One way to read a text on a host: `command` runs where `condition` (a shell test) holds."""

    condition: str
    command: str


@dataclass(frozen=True)
class LogText:
    """A text read from a host: the command that produced it (as the host's shell chose it) and
    its output, at most LOG_CAP_BYTES."""

    kind: LogKind
    command: str
    output: str


# The Ray head's GCS port (install-ray.sh `--port`).
RAY_GCS_PORT = 6379
SYSTEMD = "[ -d /run/systemd/system ] && command -v journalctl >/dev/null 2>&1"


def log_sources(kind: LogKind, *, head_ip: str) -> tuple[tuple[LogSource, ...], str]:
    """Where `kind` is read on a host, in order of preference, and what to say where none is.
    No part of any command comes from a user: `head_ip` is the cluster's own private address."""
    return {**_host_logs(), **_software_logs(head_ip)}[kind]


# A log kind's sources, in order of preference, and what to say where none is.
LogSources = dict[LogKind, tuple[tuple[LogSource, ...], str]]


def _host_logs() -> LogSources:
    """The host's own logs: the bootstrap's and the install's output, the agent's, the
    system's."""
    cap = f"tail -c {LOG_CAP_BYTES}"
    bootstrap, install = f"{HOST_LOG_DIR}/bootstrap.log", f"{HOST_LOG_DIR}/install.log"
    agent_file = "/var/log/runcrate-agent.log"
    return {
        LogKind.BOOTSTRAP: (
            (LogSource(f"[ -f {bootstrap} ]", f"{cap} {bootstrap}"),),
            "No bootstrap output is kept on this host.",
        ),
        LogKind.INSTALL: (
            (LogSource(f"[ -f {install} ]", f"{cap} {install}"),),
            "No install output is kept on this host (no software was installed yet).",
        ),
        LogKind.AGENT: (
            (
                LogSource(f"[ -f {agent_file} ]", f"{cap} {agent_file}"),
                LogSource(SYSTEMD, "journalctl --no-pager -u runcrate-agent -n 5000"),
            ),
            "The agent's log is not on this host.",
        ),
        LogKind.SYSTEM: (
            (
                LogSource(SYSTEMD, "journalctl --no-pager -n 5000"),
                LogSource("[ -r /var/log/syslog ]", f"{cap} /var/log/syslog"),
            ),
            "This host keeps neither a systemd journal nor /var/log/syslog.",
        ),
    }


def _software_logs(head_ip: str) -> LogSources:
    """What the installed software says: Slurm's queue and nodes, Ray's jobs and status
    (asked of the head at `head_ip`), Kubernetes' pods."""
    return {
        LogKind.SLURM_QUEUE: (
            (LogSource("command -v squeue >/dev/null 2>&1", "squeue"),),
            "squeue is not installed on this host.",
        ),
        LogKind.SLURM_NODES: (
            (LogSource("command -v sinfo >/dev/null 2>&1", "sinfo -N -l"),),
            "sinfo is not installed on this host.",
        ),
        LogKind.RAY_JOBS: (
            (
                LogSource(
                    "command -v ray >/dev/null 2>&1",
                    f"ray job list --address http://{head_ip}:{RAY_DASHBOARD_PORT}",
                ),
            ),
            "ray is not installed on this host.",
        ),
        LogKind.RAY_STATUS: (
            (
                LogSource(
                    "command -v ray >/dev/null 2>&1",
                    f"ray status --address {head_ip}:{RAY_GCS_PORT}",
                ),
            ),
            "ray is not installed on this host.",
        ),
        LogKind.KUBERNETES_PODS: (
            (LogSource("command -v kubectl >/dev/null 2>&1", "kubectl get pods -A"),),
            "kubectl is not installed on this host.",
        ),
    }


def log_script(kind: LogKind, *, head_ip: str) -> str:
    """One shell command that picks on the host where `kind` is read, says which (a first
    line `runcrate: source=COMMAND`) and prints its last LOG_CAP_BYTES (stderr included: a
    command's complaint is what the user must see)."""
    sources, missing = log_sources(kind, head_ip=head_ip)
    branches = []
    for i, source in enumerate(sources):
        said = shlex.quote(SOURCE_PREFIX + source.command)
        run = source.command
        if not run.startswith("tail -c "):
            run = f"{run} 2>&1 | tail -c {LOG_CAP_BYTES}"
        branches.append(f"{'if' if i == 0 else 'elif'} {source.condition}; then echo {said}; {run}")
    none = f"echo {shlex.quote(SOURCE_PREFIX)}; echo {shlex.quote(missing)}"
    return "; ".join(branches) + f"; else {none}; fi"


def read_log_text(kind: LogKind, output: str) -> LogText:
    """A `log_script`'s output as a LogText: the command its first line names, the rest capped
    (the host already cut it; a reply that was not is cut here)."""
    first, _, rest = output.partition("\n")
    if first.startswith(SOURCE_PREFIX):
        command = first.removeprefix(SOURCE_PREFIX).strip()
    else:
        command, rest = "", output
    # A NUL cannot be kept in a PostgreSQL text: it becomes U+FFFD, as undecodable bytes do.
    return LogText(
        kind=kind,
        command=command.replace("\x00", "\ufffd"),
        output=cap_text(rest).replace("\x00", "\ufffd"),
    )


def cap_text(text: str) -> str:
    """The last LOG_CAP_BYTES of `text` in UTF-8, never splitting a character."""
    data = text.encode()
    if len(data) <= LOG_CAP_BYTES:
        return text
    return data[-LOG_CAP_BYTES:].decode(errors="ignore")
