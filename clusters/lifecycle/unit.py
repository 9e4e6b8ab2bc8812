"""The lifecycle's unit of work: one locked cluster and its nodes, loaded once; the steps
(`clusters/lifecycle/steps/`) decide on it and collect what changes (node fields, host states,
events, machines to bill, work to hand off); `flush` writes it all back at once.

`advance` runs one over a cluster (`reconcile`); the actions (`terminate`, `retry_install`,
`mark_lost`) and the health judgement use the same one for their own change, so every change
to a cluster's nodes is written, versioned and followed by its events the same way.
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import cached_property

from django.conf import settings

from billing import metering
from clusters import volumes
from clusters.lifecycle import dispatch
from clusters.lifecycle.records import Action, ActionKind, NodeWork, Outcome
from clusters.lifecycle.rules import (
    INSTALL_SECONDS,
    LEASE_SECONDS,
    RETRY_AFTER,
    Downtime,
    deadline_with_downtime,
    needs_work,
    node_give_up_at,
    set_needs_work,
    step_deadline,
    with_node_names,
)
from clusters.machines import get_driver
from clusters.models import Cluster, Event, Node, give_up_after
from offers.models import Host, MachineType
from runcrate.durations import in_words, whole_minutes
from runcrate.models import our_downtime
from runcrate.sql import update_rows

log = logging.getLogger(__name__)

Status = Cluster.Status
Step = Node.Step
NodeStatus = Node.Status
Reason = Event.Reason

# The node fields every write-back of a unit of work writes (`UnitOfWork.touch` adds others).
NODE_FIELDS = [
    "status",
    "step",
    "step_started_at",
    "step_deadline",
    "running_at",
    "agent_at",
    "network_at",
    "installed_at",
    "ended_at",
    "holds_host",
    "lease_token",
    "lease_expires_at",
    "public_address",
    "public_port",
    "host_key",
    "version",
]


def read_nodes(cluster: Cluster) -> list[Node]:
    """A locked cluster's nodes, as the reconciler reads them."""
    nodes = list(cluster.nodes.select_related("host").order_by("index", "pk"))
    for node in nodes:
        node.cluster = cluster
    return nodes


@dataclass(frozen=True)
class Handoff:
    """Work handed to a node under the lease `token` (sent once the unit is written back)."""

    node_id: int
    action: Action
    token: str


@dataclass
class UnitOfWork:
    """One locked cluster, its nodes and the clock; collects the writes, then `flush`es them."""

    cluster: Cluster
    nodes: list[Node]
    now: datetime
    done: list[str] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    dirty: dict[int, Node] = field(default_factory=dict)
    cluster_dirty: bool = False
    hosts: dict[str, set[int]] = field(default_factory=dict)
    # Why a host released now is dirty, for staff (Host.pristine_report), by host.
    host_reports: dict[int, str] = field(default_factory=dict)
    # Hosts quarantined now (a lost machine's, or one replaced as unhealthy), with why.
    quarantined: dict[int, str] = field(default_factory=dict)
    # The nodes billed from `now` on (their machines joined the cluster).
    billed: list[Node] = field(default_factory=list)
    handoffs: list[Handoff] = field(default_factory=list)
    # Something the unit could not hand off yet (the head busy, a failed drain backing off):
    # the tick advances the cluster again, beside what `needs_work` reads from its rows.
    still_due: bool = False
    fields: set[str] = field(default_factory=set)
    _work: dict[int, NodeWork] = field(default_factory=dict)

    @classmethod
    def load(cls, cluster: Cluster, *, now: datetime) -> UnitOfWork:
        """The unit for `cluster`, locked by the caller, with its nodes read once."""
        return cls(cluster=cluster, nodes=read_nodes(cluster), now=now)

    @property
    def machine_type(self) -> MachineType:
        return self.cluster.machine_type

    @property
    def boot(self) -> int:
        return self.machine_type.boot_seconds

    @property
    def head(self) -> Node:
        return next(n for n in self.nodes if n.index == 0)

    def work_of(self, node: Node) -> NodeWork:
        """What the node's work has written back (read from its `driver_state` once)."""
        if node.pk not in self._work:
            self._work[node.pk] = NodeWork.of(node)
        return self._work[node.pk]

    # -- recording ------------------------------------------------------------------------

    def for_user(self, text: str) -> str:
        """`text` with the cluster's machines named node-i, never by host name."""
        return with_node_names(text, self.nodes)

    def event(
        self,
        reason: str,
        message: str,
        *,
        node: Node | None = None,
        step: str = "",
        output: str = "",
    ) -> None:
        self.events.append(
            Event(
                cluster=self.cluster,
                node=node,
                at=self.now,
                reason=reason,
                step=step,
                message=self.for_user(message),
                output=output,
            )
        )
        self.done.append(f"{node.name + ': ' if node else ''}{reason}")

    def touch(self, node: Node, *fields: str) -> None:
        """The node is written back; `fields` are those beyond NODE_FIELDS it changed."""
        self.dirty[node.pk] = node
        self.fields.update(fields)

    def set_status(self, status: Cluster.Status) -> None:
        self.cluster.move_to(status)
        self.cluster_dirty = True

    def set_host(self, node: Node, state: Host.State) -> None:
        assert node.host_id is not None  # reserved with its host
        self.hosts.setdefault(state, set()).add(node.host_id)

    def hand_off(self, node: Node, action: Action) -> None:
        if node.lease_is_held(self.now):
            return
        token = secrets.token_hex(16)
        node.lease_token = token
        node.lease_expires_at = self.now + timedelta(seconds=LEASE_SECONDS[action.kind])
        self.touch(node)
        self.handoffs.append(Handoff(node.pk, action, token))
        self.done.append(f"{node.name}: {action.kind} handed off")

    def bill(self, node: Node) -> None:
        """The node's machine is billed from this instant."""
        self.billed.append(node)

    # -- deadlines --------------------------------------------------------------------------

    @cached_property
    def downtime(self) -> Downtime:
        """Our own downtime (the tick, the `machines` queue) since the earliest reservation of
        the cluster's nodes: read once, and only by a unit that finds a deadline passed."""
        cap = give_up_after(self.machine_type.slow_boot)
        since = min([n.reserved_at for n in self.nodes] + [self.cluster.give_up_at - cap])
        return our_downtime(since=since, now=self.now)

    def deadline(self, node: Node, at: datetime) -> datetime:
        """The node's step deadline as it stands at `at`: the stored one while `at` is before
        it; once it is not, moved back by the time our own machinery did not run since the
        step began (the node's cap by that since its reservation), so a step measures the
        machine, never our outages (docs/lifecycle.md, "Steps and deadlines")."""
        assert node.step_deadline is not None  # set when the step began
        if at < node.step_deadline:
            return node.step_deadline
        capped = node.step != Step.INSTALL  # an install's own 15 minutes, never the cap
        return deadline_with_downtime(
            node.step_deadline,
            since=node.step_started_at,
            cap=node_give_up_at(node, self.machine_type) if capped else None,
            reserved_at=node.reserved_at,
            downtime=self.downtime,
        )

    def downtime_note(self, node: Node) -> str:
        """What a timeout's message adds when its deadline was moved back by our downtime."""
        deadline = self.deadline(node, self.now)
        assert node.step_deadline is not None  # self.deadline read it
        moved = (deadline - node.step_deadline).total_seconds()
        if moved < 1:
            return ""
        return f"; not counting {in_words(moved)} in which our own services did not run"

    def limit_note(self, node: Node, factor: int) -> str:
        """Which limit a step's time came from, for a timeout's message."""
        cap = node_give_up_at(node, self.machine_type)
        if node.step_deadline is not None and node.step_deadline >= cap:
            return f"nothing waits past {self.cap_minutes()} minutes from the reservation"
        seconds = factor * self.boot
        if seconds < settings.RUNCRATE_MIN_STEP_SECONDS:
            return f"at least {settings.RUNCRATE_MIN_STEP_SECONDS} seconds for any step"
        times = "" if factor == 1 else f"{factor} × "
        return f"{times}the {in_words(self.boot)} boot time of {self.machine_type.slug}"

    def cap_minutes(self) -> int:
        return whole_minutes(int(give_up_after(self.machine_type.slow_boot).total_seconds()))

    def backing_off(self, outcome: Outcome | None) -> bool:
        """Whether work that came back `outcome` waits before it is tried again."""
        return outcome is not None and outcome.backing_off(self.now, RETRY_AFTER)

    # -- transitions more than one step makes -----------------------------------------------

    def end_node(self, node: Node, status: Node.Status, *, at: datetime | None = None) -> None:
        """The node stops serving the cluster (at `at`, default now); its host is wiped. Work
        in flight on it (a bootstrap, an install) keeps its lease: the stop is handed off only
        once that work has written back or its lease ran out, so no wipe or reimage ever races
        a bootstrap that is still changing the host."""
        node.move_to(status=status)
        node.ended_at = at or self.now
        node.step_deadline = None
        if not node.lease_is_held(self.now):
            node.lease_token = ""
            node.lease_expires_at = None
        self.touch(node)
        if node.holds_host:
            self.set_host(node, Host.State.CLEANING)

    def join_node(self, node: Node) -> None:
        """The node passed `network`: it is the cluster's now (its host in use)."""
        node.move_to(status=NodeStatus.JOINED)
        self.touch(node)
        self.set_host(node, Host.State.IN_USE)

    def finish_node(self, node: Node) -> None:
        node.move_to(step=Step.DONE)
        node.step_started_at = self.now
        node.step_deadline = None
        self.touch(node)

    def begin_install(self, node: Node) -> None:
        node.move_to(step=Step.INSTALL)
        node.step_started_at = self.now
        node.installed_at = None
        # An install has its own 15 minutes, never the node's give-up cap (`deadline`).
        node.step_deadline = step_deadline(start=self.now, seconds=INSTALL_SECONDS, cap=None)
        self.touch(node)

    def replan_others(self, changed: Node) -> None:
        """A worker joined, or a node left (a worker failed, a machine was lost): every other
        joined machine gets its node plan again, so its /etc/hosts, hostfile and pinned host
        keys name exactly the machines that serve the cluster now; a node that left is also
        taken out of the software's own configuration (`prune`: Slurm's slurm.conf)."""
        joined = changed.status == NodeStatus.JOINED
        action = Action(ActionKind.REPLAN if joined else ActionKind.PRUNE, changed.name)
        for node in self.nodes:
            if node.status == NodeStatus.JOINED and node is not changed:
                self.hand_off(node, action)

    def mark_ready(self) -> None:
        self.set_status(Status.READY)
        self.cluster.ready_at = self.now
        count = sum(1 for n in self.nodes if n.status == NodeStatus.JOINED)
        software = self.cluster.software
        what = "" if software == "none" else f" with {self.cluster.get_software_display()}"
        self.event(Reason.READY, f"Ready: {count} machines up{what}; connect to node-0.")

    # -- writing back -----------------------------------------------------------------------

    def flush(self) -> None:
        """Write everything collected, in as few statements as it takes, then hand off the
        work (sent once the transaction commits)."""
        if self.cluster_dirty and self.cluster.status in Cluster.TERMINAL:
            volumes.detach(cluster=self.cluster)  # failed, terminated or stopped: it has ended
        if self.cluster_dirty or self.dirty or self.events:
            # What the cluster page shows changed: its poll answers with these rows and events.
            version = self.cluster.bump_version()
            rows: list[Node | Event] = [*self.dirty.values(), *self.events]
            for row in rows:
                row.version = version
            self.cluster_dirty = True
        if self.dirty:
            update_rows(
                list(self.dirty.values()), NODE_FIELDS + sorted(self.fields - {*NODE_FIELDS})
            )
        for state, host_ids in self.hosts.items():
            Host.objects.filter(pk__in=host_ids).update(state=state, state_changed_at=self.now)
        for host_id, report in self.host_reports.items():
            Host.objects.filter(pk=host_id).update(pristine_report=report)
        for host_id, why in self.quarantined.items():
            Host.objects.filter(pk=host_id).update(quarantined_at=self.now, quarantine_reason=why)
        metering.open_machines(
            project_id=self.cluster.project_id,
            cluster_id=self.cluster.pk,
            node_ids=[node.pk for node in self.billed],
            price_per_hour=self.cluster.price_per_machine_hour,
            at=self.now,
        )
        if self.events:
            Event.objects.bulk_create(self.events)
        if set_needs_work(self.cluster, self.still_due or needs_work(self.cluster, self.nodes)):
            self.cluster_dirty = True  # what the tick reads
        if self.cluster_dirty:
            self.cluster.save()
        self.dispatch_handoffs()

    def dispatch_handoffs(self) -> None:
        """Work for a driver that batches (its work is quick: the simulated data center) goes
        out as one task per kind of work for the whole cluster; any other driver's, one task
        per node, so a pool of workers runs slow work (a bootstrap over SSH) side by side."""
        nodes = {n.pk: n for n in self.nodes}
        batches: dict[Action, list[tuple[int, str]]] = {}
        for handoff in self.handoffs:
            lease = (handoff.node_id, handoff.token)
            if get_driver(nodes[handoff.node_id].reserved_host).batches_work:
                batches.setdefault(handoff.action, []).append(lease)
            else:
                dispatch.current().node_work(handoff.action.to_task(), [lease])
        for action, leases in batches.items():
            dispatch.current().node_work(action.to_task(), leases)
