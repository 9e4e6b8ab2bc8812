"""The simulated data center: the embedded default driver, and what the demo inventory uses.

Everything it reports is a pure function of the clock, the host's `fault` and the instant the
machine was started, so a test moving the clock sees exactly what a tick would see. A host
boots in its machine type's boot time divided by `RUNCRATE_SIM_SPEED` (call that `s`):

    started ──s──> running ──s/4──> agent checks in
    last agent checked in ──s/4──> network report
    install started ──s/2──> the software's check passes

Faults: `boot` never comes up; `crash` comes up, then fails s/8 later (before its agent checks
in); `agent` comes up but its agent never checks in; `network` cannot reach one peer (the next
node); `install` fails the software install.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from django.conf import settings
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from clusters.machines.base import (
    AgentCheckIn,
    AgentReport,
    CheckResult,
    Driver,
    DriverError,
    InstallPlan,
    InstallResult,
    LogKind,
    LogText,
    MachineState,
    NetworkReport,
    NetworkTestResult,
    Observation,
    Released,
    cap_text,
    log_sources,
)
from clusters.machines.software import checks, network_test
from clusters.machines.software import simulated as outputs

if TYPE_CHECKING:
    from clusters.models import Cluster, Node
    from offers.models import Host

DRIVER_VERSION = "550.54.15"
# The full version a simulated machine's nvidia-smi gives for the driver branch its type sells.
DRIVER_RELEASES = {"550": "550.54.15", "570": "570.124.06"}
# What a simulated machine's MemTotal keeps of the memory its type sells: the kernel's share.
MEMORY_SHOWN = 0.985
# Public addresses of simulated machines: the three documentation networks of RFC 5737, which
# route nowhere, so a demo's SSH command can never reach a stranger's machine.
DOCUMENTATION_NETWORKS = ("203.0.113", "198.51.100", "192.0.2")


def simulated_public_address(host: Host) -> str:
    """The host's own `address` when the operator gave one; otherwise one of the 762
    documentation addresses, derived from the host's id (host 1 is 203.0.113.1, host 255 is
    198.51.100.1, host 763 is 203.0.113.1 again)."""
    if host.address:
        return host.address
    network, last = divmod((host.pk - 1) % (254 * len(DOCUMENTATION_NETWORKS)), 254)
    return f"{DOCUMENTATION_NETWORKS[network]}.{last + 1}"


def simulated_driver(sold: str) -> str:
    """The driver a simulated machine reports: the full release of the branch its type sells
    ("570" -> "570.124.06"), the sold version itself when it names one, else DRIVER_VERSION."""
    if not sold:
        return DRIVER_VERSION
    return DRIVER_RELEASES.get(sold, sold)


def sim_seconds(boot_seconds: int) -> timedelta:
    return timedelta(seconds=boot_seconds / settings.RUNCRATE_SIM_SPEED)


class SimulatedDriver(Driver):
    """The simulated data center; it also plays each node's agent: it reports what the real
    agent would, which the lifecycle records through the same service functions as the real
    agent's HTTP endpoints (`clusters.telemetry.agent_service`)."""

    name = "simulated"
    batches_work = True

    # --- the machine -----------------------------------------------------------------------

    def start(self, node: Node, *, agent_token: str, plan: dict) -> dict:
        # A real machine would be bootstrapped with the plan (hostname, /etc/hosts, the
        # environment, /shared); the simulated one keeps it, so what it was given can be read.
        return {"started_at": timezone.now().isoformat(), "plan": plan}

    def _s(self, node: Node) -> timedelta:
        return sim_seconds(node.cluster.machine_type.boot_seconds)

    def _up_at(self, node: Node) -> datetime | None:
        started = parse_datetime(node.driver_state.get("started_at") or "")
        return started + self._s(node) if started else None

    def observe(self, node: Node, *, now: datetime) -> Observation:
        up_at = self._up_at(node)
        host = node.reserved_host
        if up_at is None or host.fault == "boot" or now < up_at:
            return Observation(MachineState.BOOTING)
        crash_at = up_at + self._s(node) / 8
        if host.fault == "crash" and now >= crash_at:
            return Observation(
                MachineState.FAILED,
                since=crash_at,
                message=f"{host.name} stopped responding (kernel panic, machine check).",
            )
        # Behind the location's SSH gateway a machine has no address of its own.
        gateway = node.cluster.machine_type.location.ssh_gateway
        address = "" if gateway else simulated_public_address(host)
        return Observation(MachineState.RUNNING, since=up_at, public_address=address)

    def stop(self, node: Node, *, attempt: int = 1) -> Released:
        # A simulated machine has nothing to wipe, and no tenant ever had root on it: the
        # simulated data center reimages it as it stops. The lifecycle still passes it
        # through `cleaning`, exactly as it does a real one.
        return Released(pristine=True)

    # --- its agent ---------------------------------------------------------------------------

    def agent_work_due(self, node: Node, *, step: str, now: datetime, since: datetime) -> bool:
        if step == "agent":
            return self.agent_due(node, now=now)
        return self.network_due(node, now=now, last_agent_at=since)

    def agent_report(self, node: Node, *, step: str, peers: list[str]) -> AgentReport:
        if step == "agent":
            return AgentCheckIn(gpus=self.agent_gpus(node))
        return NetworkReport(
            reachability=self.reachability(node, peers=peers), acceptance=self.acceptance(node)
        )

    def acceptance(self, node: Node) -> dict:
        """What a simulated agent measures to its peer in its round (node-0 too, where it has a
        peer): the Ethernet network's typical figures, 1.6 Gbit/s, or 80% of the machine type's
        link where that is faster."""
        machine_type = node.cluster.machine_type
        # Its vCPUs and memory, as sold (MemTotal a little under: the kernel keeps some).
        facts = {
            "vcpus": machine_type.vcpus,
            "memory_mib": None
            if machine_type.memory_gib is None
            else int(machine_type.memory_gib * 1024 * MEMORY_SHOWN),
        }
        if node.index == 0 and not node.cluster.nodes.exclude(pk=node.pk).exists():
            return {
                "latency_ms": None,
                "bandwidth_mbit": None,
                "method": None,
                "error": None,
                **facts,
            }
        link = machine_type.expected_link_mbit
        measured = {
            "latency_ms": 0.25,
            "bandwidth_mbit": max(1600.0, 0.8 * link),
            "method": "simulated",
            "error": None,
            **facts,
        }
        if node.index and node.cluster.machine_type.machine_kind != "container":
            # The simulated data center's /shared: mounted as its NFS would be.
            measured |= {"shared": "simulated", "shared_error": None}
        return measured

    def last_heard(self, node: Node, *, now: datetime) -> datetime | None:
        # A simulated agent never falls silent: it is heard from whenever anyone asks.
        return now

    def agent_due(self, node: Node, *, now: datetime) -> bool:
        up_at = self._up_at(node)
        if up_at is None or node.reserved_host.fault in ("boot", "crash", "agent"):
            return False
        return now >= up_at + self._s(node) / 4

    def agent_gpus(self, node: Node) -> list[dict]:
        machine_type = node.cluster.machine_type
        gpu = machine_type.gpu
        host = node.reserved_host
        return [
            {
                "name": f"NVIDIA {gpu.name}",
                "memory_total_mib": gpu.memory_gib * 1024 - 421,
                "uuid": "GPU-" + hashlib.sha256(f"{host.name}/{i}".encode()).hexdigest()[:32],
                "driver_version": simulated_driver(machine_type.driver_version),
            }
            for i in range(machine_type.gpus_per_machine)
        ]

    def network_due(self, node: Node, *, now: datetime, last_agent_at: datetime) -> bool:
        return now >= last_agent_at + self._s(node) / 4

    def reachability(self, node: Node, *, peers: list[str]) -> dict[str, bool]:
        """What the agent's N×N test finds from this node: a `network` fault cannot reach one
        peer, the next node after it."""
        result = dict.fromkeys(peers, True)
        if node.reserved_host.fault == "network" and peers:
            index = {name: int(name.split("-")[1]) for name in peers}
            after = [p for p in peers if index[p] > node.index]
            result[(after or peers)[0]] = False
        return result

    # --- the software ------------------------------------------------------------------------

    def install(self, node: Node, *, plan: InstallPlan) -> InstallResult:
        # A real driver applies `plan.node_plans[node.name]` again before installing (a worker
        # added since the start changes /etc/hosts and the hostfile); a simulated machine has
        # nothing to apply.
        ok = node.reserved_host.fault != "install"
        return InstallResult(
            ok=ok, output=outputs.install_log(software=plan.software, node=node.name, ok=ok)
        )

    def check(self, node: Node, *, plan: InstallPlan, now: datetime) -> CheckResult:
        settle = sim_seconds(plan.boot_seconds) / 2
        sim_nodes = [
            outputs.SimNode(
                name=n.name,
                private_ip=n.private_ip,
                gpus=n.gpus,
                gpu_slug=node.cluster.machine_type.gpu.slug,
                ready=n.installed_at is not None and now >= n.installed_at + settle,
                is_head=n.is_head,
            )
            for n in plan.nodes
        ]
        output = outputs.OUTPUTS[plan.software](sim_nodes)
        expected = [checks.ExpectedNode(n.name, n.private_ip, n.gpus) for n in plan.nodes]
        return checks.run_check(plan.software, output, expected)

    def drain(self, head: Node, *, plan: InstallPlan, drained: dict[str, str]) -> InstallResult:
        """No scheduler to ask: what drain.sh would print for a drain of `drained` that changed
        each node it names (a simulated machine keeps no state to resume from), so the
        product's flow runs on the simulated data center."""
        names = {n.name for n in plan.nodes}
        lines = []
        if plan.software != "none":
            for name in sorted(drained):
                if name in names:
                    lines.append(f"runcrate: drained {name}")
                else:
                    lines.append(f"runcrate: skipped {name} (not a node of this cluster)")
        lines.append("runcrate: ok")
        return InstallResult(ok=True, output="\n".join(lines) + "\n")

    # --- the network test --------------------------------------------------------------------

    def network_test(
        self, cluster: Cluster, *, nodes: list[Node], plan: InstallPlan
    ) -> NetworkTestResult:
        """nccl-tests' all_reduce_perf as it would print on the simulated Ethernet, read by the
        real parser; the result is marked simulated."""
        gpu = f"NVIDIA {cluster.machine_type.gpu.name}"
        output = outputs.all_reduce_perf(
            nodes=[n.name for n in nodes], gpus=plan.gpus_per_machine, gpu_name=gpu
        )
        command = network_test.all_reduce_perf_command(
            path=network_test.NCCL_TESTS_PATHS[1], ranks=len(nodes), gpus=plan.gpus_per_machine
        )
        return network_test.read_all_reduce_perf(output, status=0, command=command, simulated=True)

    # --- logs and jobs ---------------------------------------------------------------------------

    def read_logs(self, node: Node, *, kinds: Sequence[LogKind], head_ip: str) -> list[LogText]:
        """What the host would print for each of `kinds`, by the first command the ssh driver
        would choose (`log_sources`): plausible text from the node, its software and the clock,
        so the demo's tab shows what a real one does. A `boot` fault's machine cannot be reached."""
        if node.reserved_host.fault == "boot":
            raise DriverError(f"could not connect to {node.reserved_host.name}: timed out")
        now = timezone.now()
        return [
            LogText(
                kind=kind,
                command=log_sources(kind, head_ip=head_ip)[0][0].command,
                output=cap_text(self._log_text(node, kind, now=now, head_ip=head_ip)),
            )
            for kind in kinds
        ]

    def _log_text(self, node: Node, kind: LogKind, *, now: datetime, head_ip: str) -> str:
        """The text as the host would have it: a file's lines (bootstrap, install, the agent's,
        the system's) carry the time they were written, from the node's own steps, never the
        time of the read; only a command's live answer (sinfo, ray status) carries `now`."""
        if kind in (LogKind.BOOTSTRAP, LogKind.INSTALL, LogKind.AGENT, LogKind.SYSTEM):
            return self._host_file_text(node, kind)
        cluster = node.cluster
        gpus = cluster.machine_type.gpus_per_machine
        nodes = [f"node-{i}" for i in range(cluster.size)]
        if kind == LogKind.SLURM_QUEUE:
            return "JOBID PARTITION     NAME     USER ST       TIME  NODES NODELIST(REASON)\n"
        if kind == LogKind.SLURM_NODES:
            rows = "".join(
                f"{name:<9} 1 gpu*     idle 64 2:16:2 512000 0 1 (null) none\n" for name in nodes
            )
            return f"{now:%a %b %d %H:%M:%S %Y}\nNODELIST NODES PARTITION STATE CPUS ...\n{rows}"
        if kind == LogKind.RAY_JOBS:
            return "No jobs found.\n"
        if kind == LogKind.RAY_STATUS:
            return (
                f"======== Autoscaler status: {now:%Y-%m-%d %H:%M:%S} ========\n"
                f"Node status\nActive:\n {len(nodes)} node(s) at {head_ip} and peers\n"
                f"Resources\nUsage:\n 0.0/{len(nodes) * gpus}.0 GPU\n"
            )
        return "".join(
            f"kube-system   nvidia-device-plugin-{name}   1/1   Running   0   1h\n"
            for name in nodes
        )

    def _host_file_text(self, node: Node, kind: LogKind) -> str:
        """A host's log file as it was written: each line stamped when its step happened (the
        machine came up, its agent checked in, its network and install finished, its last
        heartbeat), and a step not reached yet has no line."""
        up = node.running_at or node.reserved_at
        if kind == LogKind.BOOTSTRAP:
            return (
                f"==> bootstrap, {up.isoformat(timespec='seconds')}\nruncrate: os=ubuntu 22.04\n"
                "runcrate: changed hostname\nruncrate: changed hosts\nruncrate: wireguard=kernel\n"
                "runcrate: agent=systemd\nruncrate: ok\n"
            )
        if kind == LogKind.INSTALL:
            # the install starts once the private network is up (the step after it)
            before = node.step in ("running", "agent", "network")
            started = node.network_at or node.installed_at or up
            if node.cluster.software == "none" or before:
                return "No install output is kept on this host (no software was installed yet).\n"
            ok = node.reserved_host.fault != "install"
            return f"==> install, {started.isoformat(timespec='seconds')}\n" + (
                outputs.install_log(software=node.cluster.software, node=node.name, ok=ok)
            )
        gpus = node.cluster.machine_type.gpus_per_machine
        if kind == LogKind.AGENT:
            lines = [
                (up, f"runcrate-agent: started (node {node.name})"),
                (node.agent_at, f"runcrate-agent: checked in ({gpus} GPUs)"),
                (node.heartbeat_at, f"runcrate-agent: heartbeat sent ({gpus} GPUs)"),
            ]
        else:
            lines = [
                (up, f"{node.name} sshd[812]: Accepted publickey for root"),
                (up, f"{node.name} systemd[1]: Started runcrate-agent.service."),
                (node.network_at, f"{node.name} kernel: wireguard: rc0: peers up"),
            ]
        return "".join(f"{at:%b %d %H:%M:%S} {line}\n" for at, line in lines if at is not None)
