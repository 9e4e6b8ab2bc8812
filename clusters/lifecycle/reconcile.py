"""The reconciler: `advance` reads one locked cluster and the clock, does what is due, and hands
slow work to per-node tasks (`work`)."""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import cached_property

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from billing.models import UsageRecord
from clusters import volumes
from clusters.drivers import get_driver
from clusters.drivers.base import CheckState, MachineState
from clusters.lifecycle import dispatch
from clusters.lifecycle.rules import (
    CHECK_EVERY,
    INSTALL_SECONDS,
    LEASE_SECONDS,
    MEASURE_TURN_SECONDS,
    RELEASE_ATTEMPTS,
    RETRY_AFTER,
    START_ATTEMPTS,
    Downtime,
    acceptance_problem,
    acceptance_report,
    deadline_with_downtime,
    duration,
    extended,
    gpu_line,
    hardware_problem,
    lock_cluster,
    measured_note,
    needs_work,
    node_give_up_at,
    reachability_matrix,
    set_needs_work,
    step_deadline,
    with_node_names,
)
from clusters.models import Cluster, Event, Node, give_up_after
from clusters.software.checks import installer_verdict
from offers.models import Host, MachineType
from runcrate.models import our_downtime
from runcrate.sql import update_rows

log = logging.getLogger(__name__)

Status = Cluster.Status
Step = Node.Step
NodeStatus = Node.Status
Reason = Event.Reason

# --- the reconciler ------------------------------------------------------------------------


@dataclass
class Failure:
    reason: str
    node: Node
    step: str
    message: str
    output: str = ""


@dataclass
class _Pass:
    """One run of `advance` over a locked cluster: collects the writes, then flushes them."""

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
    usage: list[UsageRecord] = field(default_factory=list)
    handoffs: list[tuple[int, str, str]] = field(default_factory=list)
    fields: set[str] = field(default_factory=set)

    @property
    def machine_type(self) -> MachineType:
        return self.cluster.machine_type

    @property
    def boot(self) -> int:
        return self.machine_type.boot_seconds

    # -- recording ------------------------------------------------------------------------

    def for_user(self, text: str) -> str:
        """`text` with the cluster's machines named node-i, never by host name."""
        return with_node_names(text, self.nodes)

    def event(
        self, reason: str, message: str, *, node: Node | None = None, step: str = "", output=""
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
        self.hosts.setdefault(state, set()).add(node.host_id)

    def hand_off(self, node: Node, action: str) -> None:
        if node.lease_is_held(self.now):
            return
        token = secrets.token_hex(16)
        kind = action.split(":")[0]
        node.lease_token = token
        node.lease_expires_at = self.now + timedelta(seconds=LEASE_SECONDS[kind])
        self.touch(node)
        self.handoffs.append((node.pk, action, token))
        self.done.append(f"{node.name}: {kind} handed off")

    def record(self, node: Node, kind: str) -> dict:
        return node.driver_state.get(kind) or {}

    # -- deadlines --------------------------------------------------------------------------

    @cached_property
    def downtime(self) -> Downtime:
        """Our own downtime (the tick, the `machines` queue) since the earliest reservation of
        the cluster's nodes: read once, and only by a pass that finds a deadline passed."""
        cap = give_up_after(self.machine_type.slow_boot)
        since = min([n.reserved_at for n in self.nodes] + [self.cluster.give_up_at - cap])
        return our_downtime(since=since, now=self.now)

    def deadline(self, node: Node, at: datetime) -> datetime:
        """The node's step deadline as it stands at `at`: the stored one while `at` is before
        it; once it is not, moved back by the time our own machinery did not run since the
        step began (the node's cap by that since its reservation), so a step measures the
        machine, never our outages (docs/lifecycle.md, "Steps and deadlines")."""
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
        moved = (self.deadline(node, self.now) - node.step_deadline).total_seconds()
        if moved < 1:
            return ""
        return f"; not counting {duration(moved)} in which our own services did not run"

    def flush(self) -> None:
        if self.cluster_dirty and self.cluster.status in Cluster.TERMINAL:
            volumes.detach(cluster=self.cluster)  # failed, terminated or stopped: it has ended
        if self.cluster_dirty or self.dirty or self.events:
            # What the cluster page shows changed: its poll answers with these rows and events.
            version = self.cluster.bump_version()
            for row in [*self.dirty.values(), *self.events]:
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
        if self.usage:
            UsageRecord.objects.bulk_create(self.usage)
        if self.events:
            Event.objects.bulk_create(self.events)
        if set_needs_work(self.cluster, needs_work(self.cluster, self.nodes)):
            self.cluster_dirty = True  # what the tick reads
        if self.cluster_dirty:
            self.cluster.save()
        self.dispatch_handoffs()

    def dispatch_handoffs(self) -> None:
        """Work for a driver that batches (its work is quick: the simulated data center) goes
        out as one task per kind of work for the whole cluster; any other driver's, one task
        per node, so a pool of workers runs slow work (a bootstrap over SSH) side by side."""
        nodes = {n.pk: n for n in self.nodes}
        batches: dict[str, list[tuple[int, str]]] = {}
        for node_id, action, token in self.handoffs:
            if get_driver(nodes[node_id].host).batches_work:
                batches.setdefault(action, []).append((node_id, token))
            else:
                dispatch.current().node_work(action, [(node_id, token)])
        for action, leases in batches.items():
            dispatch.current().node_work(action, leases)

    # -- joining: running -> agent -> network ----------------------------------------------

    def observe(self, node: Node) -> Failure | None:
        if not self.record(node, "start").get("ok"):
            return None
        observation = get_driver(node.host).observe(node, now=self.now)
        if observation.state in (MachineState.FAILED, MachineState.GONE):
            gone = observation.state is MachineState.GONE
            return Failure(
                observation.reason or (Reason.MACHINE_GONE if gone else Reason.MACHINE_FAILED),
                node,
                node.step,
                observation.message
                or f"{node.name}'s machine {'disappeared' if gone else 'failed'}.",
            )
        reached = (observation.public_address, observation.public_port, observation.host_key)
        if observation.state is MachineState.RUNNING and reached != (
            node.public_address,
            node.public_port,
            node.host_key,
        ):
            # Where users reach it over SSH (the connect panel); a restarted machine may move.
            node.public_address, node.public_port, node.host_key = reached
            self.touch(node)
        if node.step == Step.RUNNING and (
            observation.state is MachineState.RUNNING or node.agent_at is not None
        ):
            since = min(observation.since or self.now, node.agent_at or self.now, self.now)
            if since <= self.deadline(node, since):
                node.running_at = since
                node.move_to(step=Step.AGENT)
                node.step_started_at = since
                node.step_deadline = step_deadline(
                    start=since, seconds=self.boot, cap=node_give_up_at(node, self.machine_type)
                )
                self.touch(node)
                self.event(
                    Reason.MACHINE_RUNNING,
                    f"{node.name}'s machine is running.",
                    node=node,
                    step=Step.RUNNING,
                )
        return None

    def step_running(self, node: Node) -> Failure | None:
        start = self.record(node, "start")
        if not start.get("ok") and start.get("attempts"):
            failure = self._start_failure(node, start)
            if failure is not None:
                return failure
        if not start.get("ok") and not self._backing_off(start):
            self.hand_off(node, "start")
        if node.step == Step.RUNNING and self.now >= self.deadline(node, self.now):
            allowed = (node.step_deadline - node.step_started_at).total_seconds()
            return Failure(
                Reason.BOOT_TIMEOUT,
                node,
                Step.RUNNING,
                f"{node.name}'s machine did not come up within {duration(allowed)} "
                f"({self._limit_note(node, 2)}{self.downtime_note(node)}).",
            )
        return None

    def _start_failure(self, node: Node, start: dict) -> Failure | None:
        """A start the driver refused for good (it named a reason: a host key that does not
        match), or that failed START_ATTEMPTS times (the host does not answer)."""
        if start.get("reason"):
            reason = start["reason"]
        elif start["attempts"] >= START_ATTEMPTS:
            reason = Reason.MACHINE_FAILED
        else:
            return None
        return Failure(
            reason,
            node,
            Step.RUNNING,
            f"{node.name}'s machine could not be started: "
            f"{start.get('error') or 'no reason given'}",
            output=start.get("output", ""),
        )

    def step_agent(self, node: Node) -> Failure | None:
        if node.agent_at is not None and node.agent_at <= self.deadline(node, node.agent_at):
            problem = hardware_problem(node, self.machine_type)
            if problem:
                return Failure(
                    Reason.HARDWARE_MISMATCH,
                    node,
                    Step.AGENT,
                    problem,
                    output="\n".join(gpu_line(g) for g in node.gpus),
                )
            node.move_to(step=Step.NETWORK)
            node.step_started_at = node.agent_at
            node.step_deadline = None  # set when the last agent of its batch checks in
            self.touch(node)
            self.event(
                Reason.AGENT_CHECKED_IN,
                f"{node.name}'s agent checked in with {len(node.gpus)} × "
                f"{node.gpus[0]['name'] if node.gpus else 'GPU'}.",
                node=node,
                step=Step.AGENT,
            )
            return None
        if self.now >= self.deadline(node, self.now):
            allowed = (node.step_deadline - node.step_started_at).total_seconds()
            return Failure(
                Reason.AGENT_TIMEOUT,
                node,
                Step.AGENT,
                f"{node.name}'s agent did not check in within {duration(allowed)} of the "
                f"machine running ({self._limit_note(node, 1)}{self.downtime_note(node)}).",
            )
        due = get_driver(node.host).agent_work_due(
            node, step=Step.AGENT, now=self.now, since=node.step_started_at
        )
        if due and not self._backing_off(self.record(node, "agent")):
            self.hand_off(node, "agent")
        return None

    def step_network(self, batch: list[Node], peers_of: dict[int, list[str]]) -> list[Failure]:
        """The batch's network step; starts only once every agent of the batch checked in."""
        if any(n.step != Step.NETWORK for n in batch):
            return []
        last = max(n.agent_at for n in batch)
        # The workers measure to node-0 one after another: each gets its turn's time.
        turns = MEASURE_TURN_SECONDS * sum(1 for n in batch if n.index > 0)
        failures = []
        for node in batch:
            if node.step_deadline is None:
                node.step_started_at = last
                node.step_deadline = step_deadline(
                    start=last,
                    seconds=self.boot + turns,
                    cap=node_give_up_at(node, self.machine_type),
                )
                self.touch(node)
            if node.network_at is not None:
                continue
            peers = peers_of[node.pk]
            reached = node.reachability or {}
            unreachable = [p for p in peers if reached.get(p) is False]
            if unreachable:
                failures.append(
                    Failure(
                        Reason.NETWORK_UNREACHABLE,
                        node,
                        Step.NETWORK,
                        f"{node.name} cannot reach {', '.join(unreachable)} over the private "
                        "network.",
                        output=reachability_matrix(self.nodes),
                    )
                )
                continue
            if (
                all(reached.get(p) is True for p in peers)
                and node.network_reported_at is not None
                and node.network_reported_at <= self.deadline(node, node.network_reported_at)
            ):
                problem = acceptance_problem(node, self.machine_type)
                if problem:
                    failures.append(Failure(Reason.ACCEPTANCE_FAILED, node, Step.NETWORK, problem))
                    continue
                node.network_at = node.network_reported_at
                self.touch(node)
                self.event(
                    Reason.NETWORK_OK,
                    f"{node.name} reaches every other node{measured_note(node)}.",
                    node=node,
                    step=Step.NETWORK,
                )
                continue
            if self.now >= self.deadline(node, self.now):
                allowed = (node.step_deadline - last).total_seconds()
                missing = [p for p in peers if p not in reached]
                turn_note = f", and {MEASURE_TURN_SECONDS} s for each worker to measure"
                turn_note = turn_note if turns else ""
                failures.append(
                    Failure(
                        Reason.NETWORK_TIMEOUT,
                        node,
                        Step.NETWORK,
                        f"{node.name} did not report reaching "
                        f"{', '.join(missing) or 'its peers'} within {duration(allowed)} of the "
                        f"last agent checking in ({self._limit_note(node, 1)}{turn_note}"
                        f"{self.downtime_note(node)}).",
                        output=reachability_matrix(self.nodes),
                    )
                )
                continue
            if (
                any(p not in reached for p in peers)
                and get_driver(node.host).agent_work_due(
                    node, step=Step.NETWORK, now=self.now, since=last
                )
                and not self._backing_off(self.record(node, "network"))
            ):
                self.hand_off(node, "network")
        return failures

    def join_steps(self, batch: list[Node], peers_of: dict[int, list[str]]) -> list[Failure]:
        failures = []
        for node in batch:
            failure = self.observe(node)
            if failure is None and node.step == Step.RUNNING:
                failure = self.step_running(node)
            if failure is None and node.step == Step.AGENT:
                failure = self.step_agent(node)
            if failure is not None:
                failures.append(failure)
        if failures:
            return failures
        return self.step_network(batch, peers_of)

    def _limit_note(self, node: Node, factor: int) -> str:
        cap = node_give_up_at(node, self.machine_type)
        if node.step_deadline is not None and node.step_deadline >= cap:
            minutes = int(give_up_after(self.machine_type.slow_boot).total_seconds() // 60)
            return f"nothing waits past {minutes} minutes from the reservation"
        seconds = factor * self.boot
        if seconds < settings.RUNCRATE_MIN_STEP_SECONDS:
            return f"at least {settings.RUNCRATE_MIN_STEP_SECONDS} seconds for any step"
        times = "" if factor == 1 else f"{factor} × "
        return f"{times}the {duration(self.boot)} boot time of {self.machine_type.slug}"

    def _backing_off(self, record: dict) -> bool:
        at = parse_datetime(record.get("at") or "")
        return bool(record) and at is not None and self.now < at + RETRY_AFTER

    # -- provisioning ----------------------------------------------------------------------

    def provision(self) -> None:
        batch = [n for n in self.nodes if n.status == NodeStatus.STARTING]
        names = [n.name for n in batch]
        peers_of = {n.pk: [p for p in names if p != n.name] for n in batch}
        failures = self.join_steps(batch, peers_of)
        if failures:
            self.fail_cluster(failures[0])
            return
        if batch and all(n.network_at is not None for n in batch):
            self.join_cluster(batch)
            return
        if self.now >= self._give_up_at() + timedelta(seconds=settings.RUNCRATE_MIN_STEP_SECONDS):
            # A safety net: every step deadline is capped at give_up_at, so this never fires
            # unless a node waits on a state no deadline covers.
            late = next(n for n in batch if n.network_at is None)
            self.fail_cluster(
                Failure(
                    Reason.CLUSTER_TIMEOUT,
                    late,
                    late.step,
                    f"The cluster did not come up by its {self._cap_minutes()}-minute limit.",
                )
            )

    def _give_up_at(self) -> datetime:
        """The cluster's `give_up_at`, moved back by our downtime once it has passed: its 25
        (45) minutes count only the machines' time."""
        give_up = self.cluster.give_up_at
        if self.now < give_up:
            return give_up
        since = give_up - give_up_after(self.machine_type.slow_boot)
        return extended(give_up, since=since, downtime=self.downtime)

    def _cap_minutes(self) -> int:
        return int(give_up_after(self.machine_type.slow_boot).total_seconds() // 60)

    def fail_cluster(self, failure: Failure) -> None:
        cluster = self.cluster
        self.set_status(Status.FAILED)
        cluster.failure_reason = failure.reason
        cluster.failure_node = failure.node.name
        cluster.failure_step = failure.step
        cluster.failure_message = self.for_user(failure.message)
        cluster.ended_at = self.now
        for node in self.nodes:
            if node.status in (NodeStatus.STARTING, NodeStatus.JOINED):
                self.end_node(node, NodeStatus.FAILED if node is failure.node else NodeStatus.ENDED)
        self.event(
            failure.reason,
            f"{failure.message} The cluster failed at {failure.node.name}, step "
            f"{failure.step}; every machine is being released and nothing was billed.",
            node=failure.node,
            step=failure.step,
            output=failure.output,
        )
        log.info(
            "cluster %s failed: %s at %s/%s",
            cluster.pk,
            failure.reason,
            failure.node.name,
            failure.step,
        )

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

    def start_billing(self, nodes: list[Node]) -> None:
        for node in nodes:
            self.join_node(node)
            self.bill(node)

    def join_node(self, node: Node) -> None:
        """The node passed `network`: it is the cluster's now (its host in use)."""
        node.move_to(status=NodeStatus.JOINED)
        self.touch(node)
        self.set_host(node, Host.State.IN_USE)

    def bill(self, node: Node) -> None:
        """The node's usage record opens now: billed from this instant."""
        self.usage.append(
            UsageRecord(
                project_id=self.cluster.project_id,
                cluster=self.cluster,
                node=node,
                price_per_hour=self.cluster.price_per_machine_hour,
                started_at=self.now,
                charged_until=self.now,
            )
        )

    def join_cluster(self, batch: list[Node]) -> None:
        cluster = self.cluster
        cluster.joined_at = self.now
        cluster.acceptance = acceptance_report(batch, self.machine_type, at=self.now)
        self.start_billing(batch)
        self.event(
            Reason.JOINED,
            f"All {len(batch)} machines joined; billing started for every machine at "
            f"{self.now:%H:%M:%S} UTC.",
        )
        if cluster.software == Cluster.Software.NONE:
            for node in batch:
                self.finish_node(node)
            self.mark_ready()
        else:
            self.set_status(Status.INSTALLING)
            cluster.install_attempts += 1
            for node in batch:
                self.begin_install(node)
            self.event(
                Reason.INSTALLING, f"Installing {cluster.get_software_display()} on every node."
            )

    def finish_node(self, node: Node) -> None:
        node.move_to(step=Step.DONE)
        node.step_started_at = self.now
        node.step_deadline = None
        self.touch(node)

    def mark_ready(self) -> None:
        self.set_status(Status.READY)
        self.cluster.ready_at = self.now
        self.cluster_dirty = True
        self.event(Reason.READY, f"Ready: {self._ready_summary()}")

    def _ready_summary(self) -> str:
        count = sum(1 for n in self.nodes if n.status == NodeStatus.JOINED)
        software = self.cluster.software
        what = "" if software == "none" else f" with {self.cluster.get_software_display()}"
        return f"{count} machines up{what}; connect to node-0."

    # -- software ------------------------------------------------------------------------

    def begin_install(self, node: Node) -> None:
        node.move_to(step=Step.INSTALL)
        node.step_started_at = self.now
        node.installed_at = None
        node.step_deadline = self.now + timedelta(
            seconds=max(INSTALL_SECONDS, settings.RUNCRATE_MIN_STEP_SECONDS)
        )
        self.touch(node)

    def install_key(self, targets: list[Node]) -> str:
        if self.cluster.status == Status.INSTALLING:
            return f"install-{self.cluster.install_attempts}"
        return f"workers-{max(n.index for n in targets)}"

    def install(self, targets: list[Node]) -> tuple[list[Failure], list[Node]]:
        """Install on every target, then check from the head; returns failures and the nodes
        whose software became ready in this pass."""
        key = self.install_key(targets)
        failures, installed = [], []
        for node in targets:
            record = self.record(node, "install")
            if record.get("key") != key:
                self.hand_off(node, f"install:{key}")
            elif not record.get("ok"):
                output = record.get("output") or ""
                said = record.get("error") or installer_verdict(output)
                failures.append(
                    Failure(
                        Reason.INSTALL_FAILED,
                        node,
                        Step.INSTALL,
                        f"Installing {self.cluster.get_software_display()} failed on {node.name}"
                        + (f": {said}." if said else "."),
                        output=output or record.get("error", ""),
                    )
                )
            else:
                if node.installed_at is None:
                    node.installed_at = parse_datetime(record["at"])
                    self.touch(node)
                installed.append(node)
        if failures:
            return failures, []
        head = next(n for n in self.nodes if n.index == 0)
        check = self.record(head, "check")
        became_ready = []
        if len(installed) == len(targets):
            if check.get("key") == key:
                ready = set(check.get("ready", []))
                for node in targets:
                    if node.name in ready and node.step == Step.INSTALL:
                        self.finish_node(node)
                        became_ready.append(node)
                if check.get("state") == CheckState.FAILED:
                    return [
                        Failure(
                            Reason.INSTALL_FAILED,
                            head,
                            Step.INSTALL,
                            "The readiness check could not be read: "
                            f"{'; '.join(check.get('problems', {}).values())}",
                            output=check.get("output", ""),
                        )
                    ], []
            stale = check.get("key") != key or (
                check.get("state") != CheckState.READY
                and self.now >= parse_datetime(check["at"]) + CHECK_EVERY
            )
            if stale and any(n.step == Step.INSTALL for n in targets):
                self.hand_off(head, f"check:{key}")
        for node in targets:
            if node.step == Step.INSTALL and self.now >= self.deadline(node, self.now):
                problems = check.get("problems", {}) if check.get("key") == key else {}
                why = problems.get(node.name) or "its software never became ready"
                failures.append(
                    Failure(
                        Reason.INSTALL_TIMEOUT,
                        node,
                        Step.INSTALL,
                        f"{self.cluster.get_software_display()} was not ready on {node.name} "
                        f"within {duration(INSTALL_SECONDS)}: {why}.",
                        output=check.get("output", "") if check.get("key") == key else "",
                    )
                )
        return failures, became_ready

    def installing(self) -> None:
        targets = [n for n in self.nodes if n.status == NodeStatus.JOINED]
        failures, _ = self.install(targets)
        if failures:
            failure = failures[0]
            self.set_status(Status.DEGRADED)
            # What the page's banner says: which node, at which step, and what the installer
            # said there; and every other node it failed on, each with what its installer said.
            message = " ".join(f.message for f in failures)
            output = (
                "\n".join(f"--- {f.node.name}\n{f.output}" for f in failures)
                if len(failures) > 1
                else failure.output
            )
            self.cluster.failure_reason = failure.reason
            self.cluster.failure_node = failure.node.name
            self.cluster.failure_step = Step.INSTALL
            self.cluster.failure_message = self.for_user(message)
            for node in targets:
                if node.step == Step.INSTALL:
                    node.step_deadline = None
                    self.touch(node)
            self.event(
                failure.reason,
                f"{message} The cluster is degraded: its machines stay up, reachable "
                "and billed. Retry the install or terminate the cluster.",
                node=failure.node,
                step=Step.INSTALL,
                output=output,
            )
            return
        if all(n.step == Step.DONE for n in targets):
            self.event(Reason.INSTALLED, f"{self.cluster.get_software_display()} is ready.")
            self.mark_ready()

    # -- workers added to a ready cluster --------------------------------------------------

    def workers(self) -> None:
        starting = [n for n in self.nodes if n.status == NodeStatus.STARTING]
        if starting:
            joined = [n.name for n in self.nodes if n.status == NodeStatus.JOINED]
            names = joined + [n.name for n in starting]
            peers_of = {n.pk: [p for p in names if p != n.name] for n in starting}
            for failure in self.join_steps(starting, peers_of):
                self.fail_worker(failure)
            for node in starting:
                if node.status == NodeStatus.STARTING and node.network_at is not None:
                    report = acceptance_report([node], self.machine_type, at=self.now)
                    self.cluster.acceptance.setdefault("nodes", []).extend(report["nodes"])
                    self.cluster_dirty = True
                    self.join_node(node)
                    self.replan_others(node)
                    if self.cluster.software == Cluster.Software.NONE:
                        self.finish_node(node)
                        self.worker_joined(node)
                    else:
                        # Billed once it is up: its software joined (a worker whose install
                        # fails was never of use, and is never billed).
                        self.begin_install(node)
        targets = [
            n for n in self.nodes if n.status == NodeStatus.JOINED and n.step == Step.INSTALL
        ]
        if targets:
            failures, became_ready = self.install(targets)
            for failure in failures:
                self.fail_worker(failure)
            for node in became_ready:
                self.worker_joined(node)

    def replan_others(self, changed: Node) -> None:
        """A worker joined, or a node left (a worker failed, a machine was lost): every other
        joined machine gets its node plan again, so its /etc/hosts, hostfile and pinned host
        keys name exactly the machines that serve the cluster now; a node that left is also
        taken out of the software's own configuration (`prune`: Slurm's slurm.conf)."""
        kind = "replan" if changed.status == NodeStatus.JOINED else "prune"
        for node in self.nodes:
            if node.status == NodeStatus.JOINED and node is not changed:
                self.hand_off(node, f"{kind}:{changed.name}")

    def worker_joined(self, node: Node) -> None:
        self.bill(node)
        self.event(
            Reason.WORKER_JOINED,
            f"Worker {node.name} joined the cluster; billed from {self.now:%H:%M:%S} UTC.",
            node=node,
            step=node.step,
        )

    def fail_worker(self, failure: Failure) -> None:
        node = failure.node
        # A worker is billed only once it is up (`worker_joined`): one that fails was not.
        was_joined = node.status == NodeStatus.JOINED
        self.end_node(node, NodeStatus.FAILED)
        if was_joined:
            self.replan_others(node)  # the others stop naming it
        self.event(
            Reason.WORKER_FAILED,
            f"{failure.message} Worker {node.name} is being released alone; the rest of the "
            "cluster keeps running.",
            node=node,
            step=failure.step,
            output=failure.output,
        )

    # -- releasing ------------------------------------------------------------------------

    def release(self) -> None:
        freed = []
        for node in self.nodes:
            if not node.holds_host or node.status not in Node.RELEASED:
                continue
            stop, start = self.record(node, "stop"), self.record(node, "start")
            if stop.get("ok"):
                if stop.get("warning"):
                    self.event(
                        Reason.VOLUME_SYNC_FAILED,
                        stop["warning"],
                        node=node,
                        output=stop.get("output", ""),
                    )
                node.holds_host = False
                self.touch(node)
                # A host goes back to the pool only reimaged and found pristine; otherwise it
                # is dirty, offered to no one until staff reimage it (docs/inventory.md).
                if stop.get("pristine"):
                    self.set_host(node, Host.State.FREE)
                else:
                    self.set_host(node, Host.State.DIRTY)
                    self.host_reports[node.host_id] = stop.get("why", "")
                freed.append(node)
            elif start.get("reason") == Reason.HOST_KEY_MISMATCH:
                # Never connected to, so nothing to wipe; and it must not serve anyone until
                # staff know why it offers another key (re-imaged, or not the machine at all).
                self.take_offline(
                    node,
                    f"The machine for {node.name} offered a host key that is not the pinned one; "
                    "it was never touched and is offline until staff check it.",
                    start.get("error", ""),
                )
            elif stop.get("attempts", 0) >= RELEASE_ATTEMPTS:
                self.take_offline(
                    node,
                    f"The machine that served {node.name} could not be wiped after "
                    f"{RELEASE_ATTEMPTS} attempts ({stop.get('error', 'no reason given')}); it is "
                    "offline until staff look at it.",
                    stop.get("error", ""),
                )
            elif not self._backing_off(stop):
                self.hand_off(node, "stop")
        if freed:
            still_held = any(n.holds_host for n in self.nodes)
            names = ", ".join(n.name for n in freed)
            self.event(
                Reason.HOST_RELEASED,
                f"Released {names}: stopped, and reimaged before anyone else uses "
                f"{'them' if len(freed) > 1 else 'it'}."
                + ("" if still_held else " Every machine of this cluster is released."),
            )

    def take_offline(self, node: Node, message: str, why: str) -> None:
        node.holds_host = False
        self.touch(node)
        self.set_host(node, Host.State.OFFLINE)
        self.event(Reason.RELEASE_FAILED, message, node=node)
        log.error(
            "host %s (cluster %s, %s) could not be released; now offline: %s",
            node.host.name,
            self.cluster.pk,
            node.name,
            why,
        )

    def finish_terminating(self) -> None:
        if any(n.holds_host for n in self.nodes):
            return
        stopped = bool(self.cluster.stop_reason)
        self.set_status(Status.STOPPED if stopped else Status.TERMINATED)
        # A machine whose stop never succeeded went offline (take_offline): say which.
        unwiped = [n.name for n in self.nodes if n.host_id and not self.record(n, "stop").get("ok")]
        if unwiped:
            ended = (
                f"every machine was stopped, but {', '.join(unwiped)} could not be wiped: "
                f"{'they are' if len(unwiped) > 1 else 'it is'} out of service until staff "
                "check, and nothing more is billed."
            )
        else:
            ended = "every machine was stopped and wiped."
        self.event(
            Reason.TERMINATED,
            f"Stopped because {self.cluster.get_stop_reason_display()}; {ended}"
            if stopped
            else f"Terminated: {ended}",
        )


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


def step_deadlines(cluster: Cluster, nodes: list[Node], now: datetime) -> dict[int, datetime]:
    """Each starting node's step deadline as `advance` judges it at `now` (`_Pass.deadline`:
    moved back by our own downtime once the stored one has passed), by node id: what the
    cluster page counts down to, so an outage of ours never shows a machine out of time. Reads
    our downtime only when a stored deadline has passed."""
    work = _Pass(cluster=cluster, nodes=nodes, now=now)
    return {
        node.pk: work.deadline(node, now)
        for node in nodes
        if node.status == Node.Status.STARTING and node.step_deadline is not None
    }


def advance(*, cluster_id: int, now: datetime | None = None) -> list[str]:
    """Carry one cluster as far as the clock and its rows allow; returns what it did."""
    now = now or timezone.now()
    with transaction.atomic():
        cluster = lock_cluster(cluster_id)
        if cluster is None:
            return []
        return advance_locked(cluster, read_nodes(cluster), now=now)


def read_nodes(cluster: Cluster) -> list[Node]:
    """A locked cluster's nodes, as the reconciler reads them."""
    nodes = list(cluster.nodes.select_related("host").order_by("index"))
    for node in nodes:
        node.cluster = cluster
    return nodes


def advance_locked(
    cluster: Cluster,
    nodes: list[Node],
    *,
    now: datetime,
    landed: list[Node] = (),
    fields: list[str] = (),
) -> list[str]:
    """`advance` on a cluster already locked, its nodes read: what a per-node task's write-back
    calls with the nodes whose results `landed` (changed in memory, `fields` beyond
    NODE_FIELDS), so they are written with the rest of the pass."""
    work = _Pass(cluster=cluster, nodes=nodes, now=now)
    for node in landed:
        work.touch(node, *fields)
    if cluster.status == Status.PROVISIONING:
        work.provision()
    elif cluster.status == Status.INSTALLING:
        work.installing()
    elif cluster.status == Status.READY:
        work.workers()
    work.release()
    if cluster.status == Status.TERMINATING:
        work.finish_terminating()
    work.flush()
    if work.events and cluster.needs_work:
        # Something moved (a step passed, the cluster joined): what it unlocks is due now,
        # not at the next tick. Each follow-up only runs on progress, so this settles; none
        # when nothing is left to do (the tick would not pick the cluster either).
        dispatch.current().advance(cluster.pk)
    return work.done


def charge_on_commit(*, cluster_id: int | None = None, record_ids: list[int] | None = None):
    """Bill ended machines up to their end now rather than at the meter's next run."""

    def charge() -> None:
        from billing import meter

        if cluster_id is not None:
            meter.charge_usage(cluster=Cluster(pk=cluster_id))
        else:
            meter.charge_usage(record_ids=record_ids)

    # robust: a failed charge is logged and left to the meter; it never undoes the end.
    transaction.on_commit(charge, robust=True)
