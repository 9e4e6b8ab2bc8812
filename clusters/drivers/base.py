"""The driver interface the lifecycle talks to, and the values it returns.

The lifecycle calls `observe` inside its transaction, so it must be cheap: it reads what the
driver already knows (its `driver_state`, the clock), never opens a connection. `start`,
`install`, `check` and `stop` are slow work; the lifecycle runs them in per-node tasks under a
lease, outside any transaction.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from clusters.models import Node


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

    @property
    def head(self) -> PlanNode:
        return next(n for n in self.nodes if n.is_head)


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


class Driver:
    """Start, watch, install, check and stop the machine serving a node."""

    name = "base"
    # The simulated data center also plays the nodes' agents (DESIGN.md: it calls the same
    # service functions as the real agent's endpoints); real drivers leave that to the agent.
    simulates_agent = False

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

    def stop(self, node: Node) -> None:
        """Stop the machine and wipe it (`/shared` included). Idempotent."""
        raise NotImplementedError
