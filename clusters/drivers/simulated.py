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
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from django.conf import settings
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from clusters.drivers.base import (
    CheckResult,
    Driver,
    InstallPlan,
    InstallResult,
    MachineState,
    Observation,
)
from clusters.software import checks
from clusters.software import simulated as outputs

if TYPE_CHECKING:
    from clusters.models import Node

DRIVER_VERSION = "550.54.15"


def sim_seconds(boot_seconds: int) -> timedelta:
    return timedelta(seconds=boot_seconds / settings.RUNCRATE_SIM_SPEED)


class SimulatedDriver(Driver):
    name = "simulated"
    simulates_agent = True

    # --- the machine -----------------------------------------------------------------------

    def start(self, node: Node, *, agent_token: str) -> dict:
        return {"started_at": timezone.now().isoformat()}

    def _s(self, node: Node) -> timedelta:
        return sim_seconds(node.cluster.machine_type.boot_seconds)

    def _up_at(self, node: Node) -> datetime | None:
        started = parse_datetime(node.driver_state.get("started_at") or "")
        return started + self._s(node) if started else None

    def observe(self, node: Node, *, now: datetime) -> Observation:
        up_at = self._up_at(node)
        if up_at is None or node.host.fault == "boot" or now < up_at:
            return Observation(MachineState.BOOTING)
        crash_at = up_at + self._s(node) / 8
        if node.host.fault == "crash" and now >= crash_at:
            return Observation(
                MachineState.FAILED,
                since=crash_at,
                message=f"{node.host.name} stopped responding (kernel panic, machine check).",
            )
        return Observation(MachineState.RUNNING, since=up_at)

    def stop(self, node: Node) -> None:
        # A simulated machine has nothing to wipe; the lifecycle still passes it through
        # `cleaning`, exactly as it does a real one.
        return None

    # --- its agent ---------------------------------------------------------------------------

    def agent_due(self, node: Node, *, now: datetime) -> bool:
        up_at = self._up_at(node)
        if up_at is None or node.host.fault in ("boot", "crash", "agent"):
            return False
        return now >= up_at + self._s(node) / 4

    def agent_gpus(self, node: Node) -> list[dict]:
        machine_type = node.cluster.machine_type
        gpu = machine_type.gpu
        return [
            {
                "name": f"NVIDIA {gpu.name}",
                "memory_total_mib": gpu.memory_gib * 1024 - 421,
                "uuid": "GPU-" + hashlib.sha256(f"{node.host.name}/{i}".encode()).hexdigest()[:32],
                "driver_version": DRIVER_VERSION,
            }
            for i in range(machine_type.gpus_per_machine)
        ]

    def network_due(self, node: Node, *, now: datetime, last_agent_at: datetime) -> bool:
        return now >= last_agent_at + self._s(node) / 4

    def reachability(self, node: Node, *, peers: list[str]) -> dict[str, bool]:
        """What the agent's N×N test finds from this node: a `network` fault cannot reach one
        peer, the next node after it."""
        result = dict.fromkeys(peers, True)
        if node.host.fault == "network" and peers:
            index = {name: int(name.split("-")[1]) for name in peers}
            after = [p for p in peers if index[p] > node.index]
            result[(after or peers)[0]] = False
        return result

    # --- the software ------------------------------------------------------------------------

    def install(self, node: Node, *, plan: InstallPlan) -> InstallResult:
        ok = node.host.fault != "install"
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
