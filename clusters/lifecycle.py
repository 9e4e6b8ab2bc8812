"""Every transition of a cluster and its nodes (SPEC §2-§3, DESIGN.md "The lifecycle is a
reconciler"). Views, the API, tasks and the admin call these functions; none re-implements them.

- `create_cluster` validates, then reserves every host in one transaction with row locks.
- `advance` is level-triggered: it reads the cluster's rows and the clock, does what is due in
  one transaction with the cluster row locked, and returns what it did. Running it twice does
  nothing new. Slow work (starting a machine, an install, a check, wiping a host) is handed to a
  per-node task under a lease and never runs inside the transaction; the task writes its result
  back only while its lease token still matches (`do_node_work`).
- `terminate`, `retry_install`, `add_workers` change what the reconciler aims for.

Every write to a cluster's nodes happens with the cluster row locked, so `advance`, the agent's
check-ins and the tasks' write-backs never overwrite each other. The rules decided here where
SPEC is silent are written down in docs/lifecycle.md.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.core.cache import cache
from django.db import IntegrityError, connection, transaction
from django.db.models import Max, Q
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from accounts.models import Environment, Project, SshKey, User
from billing import budgets, ledger
from billing.models import UsageRecord
from clusters import connect, volumes
from clusters.drivers import InstallPlan, PlanNode, get_driver
from clusters.drivers.base import CheckState, MachineState
from clusters.errors import ClusterRefused
from clusters.models import NAME_RE, Cluster, Event, Node, give_up_after
from offers.models import MAX_NODES, MIN_NODES, Host, MachineType
from offers.offers import Availability, get_offer

log = logging.getLogger(__name__)

Status = Cluster.Status
Step = Node.Step
NodeStatus = Node.Status
Reason = Event.Reason

# How long an install may take before the cluster is degraded (`install_timeout`); at least
# RUNCRATE_MIN_STEP_SECONDS.
INSTALL_SECONDS = 15 * 60
# How often a pending readiness check runs again.
CHECK_EVERY = timedelta(seconds=5)
# A per-node task that failed is tried again after this long.
RETRY_AFTER = timedelta(seconds=10)
# Wiping a host is tried this many times before the host goes offline for staff.
RELEASE_ATTEMPTS = 3
# How long each kind of per-node work may hold its lease before the next tick may retry it.
LEASE_SECONDS = {
    "start": 120,
    "agent": 60,
    "network": 60,
    "install": 30 * 60,
    "check": 120,
    "stop": 300,
}
# How long a queued advance keeps others from being queued for the same cluster.
ADVANCE_PENDING_SECONDS = 30
# Statuses in which a user may terminate.
TERMINABLE = {Status.PROVISIONING, Status.INSTALLING, Status.READY, Status.DEGRADED}


# --- handing work on: Celery by default, in memory for tests and the benchmark -----------------


def advance_pending_key(cluster_id: int) -> str:
    return f"clusters:advance-pending:{cluster_id}"


class Dispatcher:
    """Hands work to Celery once the current transaction commits.

    Advances are coalesced: while one is queued for a cluster (a marker in the cache, removed
    by the task before it reads anything), more requests add nothing, so 64 nodes reporting at
    once cost one advance, not 64. A marker whose task never ran expires; the tick covers it.
    """

    def advance(self, cluster_id: int) -> None:
        from clusters import tasks

        def enqueue() -> None:
            if cache.add(advance_pending_key(cluster_id), True, timeout=ADVANCE_PENDING_SECONDS):
                tasks.advance.delay(cluster_id)

        transaction.on_commit(enqueue)

    def node_work(self, node_id: int, action: str, token: str) -> None:
        from clusters import tasks

        transaction.on_commit(lambda: tasks.node_work.delay(node_id, action, token))


class CollectingDispatcher(Dispatcher):
    """Keeps handed-off work in memory and runs it in this process on `run()`."""

    def __init__(self) -> None:
        self.advances: list[int] = []
        self.work: list[tuple[int, str, str]] = []
        self.ran = 0

    def advance(self, cluster_id: int) -> None:
        if cluster_id not in self.advances:
            self.advances.append(cluster_id)

    def node_work(self, node_id: int, action: str, token: str) -> None:
        self.work.append((node_id, action, token))

    def run(self, *, limit: int = 100_000) -> int:
        """Run everything handed off, and what that hands off, until nothing is left."""
        ran = 0
        while self.work or self.advances:
            if self.work:
                node_id, action, token = self.work.pop(0)
                do_node_work(node_id=node_id, action=action, token=token)
            else:
                advance(cluster_id=self.advances.pop(0))
            ran += 1
            if ran > limit:
                raise RuntimeError("the handed-off work does not settle")
        self.ran += ran
        return ran


_dispatcher: Dispatcher = Dispatcher()


def enqueue_advance(cluster_id: int) -> None:
    """Ask for `advance` on this cluster (after the current transaction commits)."""
    _dispatcher.advance(cluster_id)


@contextmanager
def dispatching_to(dispatcher: Dispatcher) -> Iterator[Dispatcher]:
    global _dispatcher
    previous, _dispatcher = _dispatcher, dispatcher
    try:
        yield dispatcher
    finally:
        _dispatcher = previous


# --- small rules -------------------------------------------------------------------------------


def money(amount: Decimal) -> str:
    return f"${amount:,.2f}"


def _duration(seconds: float) -> str:
    seconds = round(seconds)
    if seconds < 120:
        return f"{seconds} seconds"
    minutes = seconds / 60
    return f"{minutes:.0f} minutes" if minutes == int(minutes) else f"{minutes:.1f} minutes"


def step_deadline(*, start: datetime, seconds: float, cap: datetime) -> datetime:
    """`start + seconds`, never less than RUNCRATE_MIN_STEP_SECONDS, never past `cap`."""
    seconds = max(seconds, settings.RUNCRATE_MIN_STEP_SECONDS)
    return min(start + timedelta(seconds=seconds), cap)


def node_give_up_at(node: Node, machine_type: MachineType) -> datetime:
    """Nothing waits for a node past 25 minutes from its reservation (45 on slow-boot types);
    for the nodes created with the cluster that is the cluster's own `give_up_at`."""
    return node.reserved_at + give_up_after(machine_type.slow_boot)


def agent_token(node: Node) -> str:
    """The node's agent credential, derived rather than stored: only its hash is kept."""
    message = f"runcrate-agent:{node.cluster_id}:{node.index}:{node.reserved_at.isoformat()}"
    return hmac.new(settings.SECRET_KEY.encode(), message.encode(), hashlib.sha256).hexdigest()


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _lock_cluster(cluster_id: int) -> Cluster | None:
    return (
        Cluster.objects.select_for_update(of=("self",))
        .select_related("machine_type__gpu", "machine_type__location")
        .filter(pk=cluster_id)
        .first()
    )


# --- reservation ---------------------------------------------------------------------------


def reserve_hosts(*, machine_type: MachineType, count: int, now: datetime) -> list[Host]:
    """Take `count` free hosts of `machine_type`, all or none. Call inside a transaction.

    On PostgreSQL the rows are locked (`FOR UPDATE SKIP LOCKED`): two requests racing for the
    last machines never get the same one, and neither waits on the other. SQLite has no row
    locks; its IMMEDIATE transactions (see settings) already let one writer in at a time. The
    conditional update is checked either way.
    """
    free = Host.objects.filter(machine_type=machine_type, state=Host.State.FREE).order_by("pk")
    if connection.features.has_select_for_update_skip_locked:
        free = free.select_for_update(skip_locked=True)
    hosts = list(free[:count])
    taken = 0
    if len(hosts) == count:
        taken = Host.objects.filter(pk__in=[h.pk for h in hosts], state=Host.State.FREE).update(
            state=Host.State.RESERVED, state_changed_at=now
        )
    if taken != count:
        raise ClusterRefused(
            "not_enough_machines",
            f"Only {len(hosts) if taken == 0 else taken} machines of this type are free right "
            f"now and this needs {count}; nothing was reserved. Pick another offer or fewer "
            "machines.",
            field="nodes",
        )
    return hosts


def _new_nodes(
    *, cluster: Cluster, hosts: list[Host], first_index: int, is_worker: bool, now: datetime
) -> list[Node]:
    machine_type = cluster.machine_type
    nodes = []
    for offset, host in enumerate(hosts):
        node = Node(
            cluster=cluster,
            index=first_index + offset,
            host=host,
            holds_host=True,
            is_worker=is_worker,
            status=NodeStatus.STARTING,
            step=Step.RUNNING,
            step_started_at=now,
            reserved_at=now,
        )
        node.step_deadline = step_deadline(
            start=now,
            seconds=2 * machine_type.boot_seconds,
            cap=node_give_up_at(node, machine_type),
        )
        node.agent_token_hash = token_hash(agent_token(node))
        nodes.append(node)
    return Node.objects.bulk_create(nodes)


# --- create ------------------------------------------------------------------------------------


def _resolve_ssh_keys(*, project: Project, ssh_key_ids: list[int] | None) -> list[SshKey]:
    keys = SshKey.objects.filter(project=project).order_by("pk")
    if ssh_key_ids is None:
        found = list(keys)
    else:
        wanted = set(ssh_key_ids)
        found = list(keys.filter(pk__in=wanted))
        missing = wanted - {k.pk for k in found}
        if missing:
            raise ClusterRefused(
                "unknown_ssh_key",
                f"SSH key {', '.join(str(m) for m in sorted(missing))} is not one of this "
                "project's keys.",
                field="ssh_keys",
            )
    if not found:
        raise ClusterRefused(
            "no_ssh_keys",
            "Add an SSH public key first (or choose one): every node needs a key to let you in.",
            field="ssh_keys",
        )
    return found


def create_cluster(
    *,
    project: Project,
    user: User | None,
    environment: Environment,
    offer_slug: str,
    nodes: int,
    name: str,
    software: str,
    ssh_key_ids: list[int] | None = None,
    volume_id: int | None = None,
) -> Cluster:
    """Validate a request (SPEC §2, in this order), reserve every host, create the cluster,
    attach the volume `volume_id` if one is asked for.

    Raises ClusterRefused before anything is reserved or written.
    """
    now = timezone.now()
    if environment.project_id != project.pk:
        raise ClusterRefused("unknown_environment", "No such environment in this project.")
    if isinstance(nodes, bool) or not isinstance(nodes, int) or not MIN_NODES <= nodes <= MAX_NODES:
        raise ClusterRefused(
            "invalid_nodes",
            f"A cluster has {MIN_NODES} to {MAX_NODES} machines; {nodes!r} is not in that range.",
            field="nodes",
        )
    offer = get_offer(slug=offer_slug, nodes=nodes)
    if offer is None:
        raise ClusterRefused(
            "unknown_offer", f"There is no self-serve offer {offer_slug!r}.", field="offer"
        )
    machine_type = offer.machine_type
    if offer.availability is Availability.RESERVED_AHEAD:
        raise ClusterRefused(
            "invalid_nodes",
            f"{machine_type.location.name} only says whether it has machines, so self-serve "
            f"clusters there stop at {offer.max_nodes} machines; request a quote for {nodes}.",
            field="nodes",
        )
    if not offer.is_available:
        free = f"only {offer.free_hosts} are free" if offer.counts_capacity else "none are free"
        raise ClusterRefused(
            "not_enough_machines",
            f"This offer cannot start {nodes} machines now: {free}. Pick fewer machines or "
            "another offer.",
            field="nodes",
        )
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise ClusterRefused(
            "invalid_name",
            "A cluster name is a DNS label: 1-63 lowercase letters, digits and hyphens, starting "
            "and ending with a letter or digit.",
            field="name",
        )
    if Cluster.objects.filter(environment=environment, name=name, status__in=Cluster.LIVE).exists():
        raise ClusterRefused(
            "name_taken",
            f"A live cluster named {name!r} already exists in {environment.name}; pick another "
            "name.",
            field="name",
        )
    if software not in Cluster.Software.values:
        raise ClusterRefused(
            "software_not_offered",
            f"Software {software!r} is not offered; choose none, slurm, kubernetes or ray.",
            field="software",
        )
    if software == Cluster.Software.KUBERNETES and not machine_type.supports_kubernetes:
        raise ClusterRefused(
            "software_not_offered",
            "Kubernetes needs virtual machines or bare metal; this offer runs containers.",
            field="software",
        )
    volume = None
    if volume_id is not None:
        volume = volumes.volume_to_attach(
            project=project, volume_id=volume_id, machine_type=machine_type
        )
    keys = _resolve_ssh_keys(project=project, ssh_key_ids=ssh_key_ids)

    _require_balance(
        project=project, machine_type=machine_type, machines=nodes, doing="creating this cluster"
    )
    if environment.monthly_budget is not None:
        spent = budgets.month_to_date_spend(environment=environment, now=now)
        if spent >= environment.monthly_budget:
            raise ClusterRefused(
                "budget_reached",
                f"The {environment.name} environment has spent {money(spent)} this month, its "
                f"whole monthly budget of {money(environment.monthly_budget)}; raise the budget "
                "to create clusters here.",
            )

    try:
        with transaction.atomic():
            hosts = reserve_hosts(machine_type=machine_type, count=nodes, now=now)
            cluster = Cluster.objects.create(
                project=project,
                environment=environment,
                created_by=user,
                name=name,
                machine_type=machine_type,
                size=nodes,
                software=software,
                status=Status.PROVISIONING,
                authorized_keys="\n".join(k.public_key.strip() for k in keys) + "\n",
                created_at=now,
                give_up_at=now + give_up_after(machine_type.slow_boot),
            )
            cluster.ssh_keys.set(keys)
            if volume is not None:
                volumes.attach(volume=volume, cluster=cluster, now=now)
            _new_nodes(cluster=cluster, hosts=hosts, first_index=0, is_worker=False, now=now)
            attached = (
                f" Volume {volume.name} attached at {connect.VOLUME_DIR} on node-0."
                if volume
                else ""
            )
            Event.objects.create(
                cluster=cluster,
                at=now,
                reason=Reason.CREATED,
                message=(
                    f"Created: {nodes} × {machine_type.gpus_per_machine} {machine_type.gpu.name} "
                    f"in {machine_type.location.name}; {nodes} machines reserved.{attached}"
                ),
            )
            _dispatcher.advance(cluster.pk)
    except IntegrityError:
        # Another request took the name between the check above and this insert.
        if Cluster.objects.filter(
            environment=environment, name=name, status__in=Cluster.LIVE
        ).exists():
            raise ClusterRefused(
                "name_taken",
                f"A live cluster named {name!r} already exists in {environment.name}; pick "
                "another name.",
                field="name",
            ) from None
        raise
    return cluster


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
    usage: list[UsageRecord] = field(default_factory=list)
    handoffs: list[tuple[int, str, str]] = field(default_factory=list)

    @property
    def machine_type(self) -> MachineType:
        return self.cluster.machine_type

    @property
    def boot(self) -> int:
        return self.machine_type.boot_seconds

    # -- recording ------------------------------------------------------------------------

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
                message=message,
                output=output,
            )
        )
        self.done.append(f"{node.name + ': ' if node else ''}{reason}")

    def touch(self, node: Node) -> None:
        self.dirty[node.pk] = node

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

    def flush(self) -> None:
        if self.cluster_dirty and self.cluster.status in Cluster.TERMINAL:
            volumes.detach(cluster=self.cluster)  # failed, terminated or stopped: it has ended
        if self.dirty:
            Node.objects.bulk_update(list(self.dirty.values()), NODE_FIELDS)
        for state, host_ids in self.hosts.items():
            Host.objects.filter(pk__in=host_ids).update(state=state, state_changed_at=self.now)
        if self.usage:
            UsageRecord.objects.bulk_create(self.usage)
        if self.events:
            Event.objects.bulk_create(self.events)
        if self.cluster_dirty:
            self.cluster.save()
        for node_id, action, token in self.handoffs:
            _dispatcher.node_work(node_id, action, token)

    # -- joining: running -> agent -> network ----------------------------------------------

    def observe(self, node: Node) -> Failure | None:
        if not self.record(node, "start").get("ok"):
            return None
        observation = get_driver(node.host).observe(node, now=self.now)
        if observation.state in (MachineState.FAILED, MachineState.GONE):
            gone = observation.state is MachineState.GONE
            return Failure(
                Reason.MACHINE_GONE if gone else Reason.MACHINE_FAILED,
                node,
                node.step,
                observation.message
                or f"{node.name}'s machine {'disappeared' if gone else 'failed'}.",
            )
        if (
            observation.state is MachineState.RUNNING
            and observation.public_address != node.public_address
        ):
            # Where users reach it over SSH (the connect panel); a restarted machine may move.
            node.public_address = observation.public_address
            self.touch(node)
        if node.step == Step.RUNNING and (
            observation.state is MachineState.RUNNING or node.agent_at is not None
        ):
            since = min(observation.since or self.now, node.agent_at or self.now, self.now)
            if since <= node.step_deadline:
                node.running_at = since
                node.step = Step.AGENT
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
        if not start.get("ok") and not self._backing_off(start):
            self.hand_off(node, "start")
        if node.step == Step.RUNNING and self.now >= node.step_deadline:
            allowed = (node.step_deadline - node.reserved_at).total_seconds()
            return Failure(
                Reason.BOOT_TIMEOUT,
                node,
                Step.RUNNING,
                f"{node.name}'s machine did not come up within {_duration(allowed)} "
                f"({self._limit_note(node, 2)}).",
            )
        return None

    def step_agent(self, node: Node) -> Failure | None:
        if node.agent_at is not None and node.agent_at <= node.step_deadline:
            problem = hardware_problem(node, self.machine_type)
            if problem:
                return Failure(
                    Reason.HARDWARE_MISMATCH,
                    node,
                    Step.AGENT,
                    problem,
                    output="\n".join(_gpu_line(g) for g in node.gpus),
                )
            node.step = Step.NETWORK
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
        if self.now >= node.step_deadline:
            allowed = (node.step_deadline - node.step_started_at).total_seconds()
            return Failure(
                Reason.AGENT_TIMEOUT,
                node,
                Step.AGENT,
                f"{node.name}'s agent did not check in within {_duration(allowed)} of the "
                f"machine running ({self._limit_note(node, 1)}).",
            )
        driver = get_driver(node.host)
        if (
            driver.simulates_agent
            and driver.agent_due(node, now=self.now)
            and not self._backing_off(self.record(node, "agent"))
        ):
            self.hand_off(node, "agent")
        return None

    def step_network(self, batch: list[Node], peers_of: dict[int, list[str]]) -> list[Failure]:
        """The batch's network step; starts only once every agent of the batch checked in."""
        if any(n.step != Step.NETWORK for n in batch):
            return []
        last = max(n.agent_at for n in batch)
        failures = []
        for node in batch:
            if node.step_deadline is None:
                node.step_started_at = last
                node.step_deadline = step_deadline(
                    start=last, seconds=self.boot, cap=node_give_up_at(node, self.machine_type)
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
                and node.network_reported_at <= node.step_deadline
            ):
                node.network_at = node.network_reported_at
                self.touch(node)
                self.event(
                    Reason.NETWORK_OK,
                    f"{node.name} reaches every other node.",
                    node=node,
                    step=Step.NETWORK,
                )
                continue
            if self.now >= node.step_deadline:
                allowed = (node.step_deadline - last).total_seconds()
                missing = [p for p in peers if p not in reached]
                failures.append(
                    Failure(
                        Reason.NETWORK_TIMEOUT,
                        node,
                        Step.NETWORK,
                        f"{node.name} did not report reaching "
                        f"{', '.join(missing) or 'its peers'} within {_duration(allowed)} of the "
                        f"last agent checking in ({self._limit_note(node, 1)}).",
                        output=reachability_matrix(self.nodes),
                    )
                )
                continue
            driver = get_driver(node.host)
            if (
                driver.simulates_agent
                and any(p not in reached for p in peers)
                and driver.network_due(node, now=self.now, last_agent_at=last)
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
        return f"{times}the {_duration(self.boot)} boot time of {self.machine_type.slug}"

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
        if self.now >= self.cluster.give_up_at + timedelta(
            seconds=settings.RUNCRATE_MIN_STEP_SECONDS
        ):
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

    def _cap_minutes(self) -> int:
        return int(give_up_after(self.machine_type.slow_boot).total_seconds() // 60)

    def fail_cluster(self, failure: Failure) -> None:
        cluster = self.cluster
        self.set_status(Status.FAILED)
        cluster.failure_reason = failure.reason
        cluster.failure_node = failure.node.name
        cluster.failure_step = failure.step
        cluster.failure_message = failure.message
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

    def end_node(self, node: Node, status: Node.Status) -> None:
        node.status = status
        node.ended_at = self.now
        node.step_deadline = None
        node.lease_token = ""
        node.lease_expires_at = None
        self.touch(node)
        if node.holds_host:
            self.set_host(node, Host.State.CLEANING)

    def start_billing(self, nodes: list[Node]) -> None:
        for node in nodes:
            node.status = NodeStatus.JOINED
            self.touch(node)
            self.set_host(node, Host.State.IN_USE)
            self.usage.append(
                UsageRecord(
                    project_id=self.cluster.project_id,
                    cluster=self.cluster,
                    node=node,
                    price_per_hour=self.machine_type.price_per_hour,
                    started_at=self.now,
                    charged_until=self.now,
                )
            )

    def join_cluster(self, batch: list[Node]) -> None:
        cluster = self.cluster
        cluster.joined_at = self.now
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
        node.step = Step.DONE
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
        node.step = Step.INSTALL
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
                failures.append(
                    Failure(
                        Reason.INSTALL_FAILED,
                        node,
                        Step.INSTALL,
                        f"Installing {self.cluster.get_software_display()} failed on {node.name}.",
                        output=record.get("output") or record.get("error", ""),
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
            if node.step == Step.INSTALL and self.now >= node.step_deadline:
                problems = check.get("problems", {}) if check.get("key") == key else {}
                why = problems.get(node.name) or "its software never became ready"
                failures.append(
                    Failure(
                        Reason.INSTALL_TIMEOUT,
                        node,
                        Step.INSTALL,
                        f"{self.cluster.get_software_display()} was not ready on {node.name} "
                        f"within {_duration(INSTALL_SECONDS)}: {why}.",
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
            for node in targets:
                if node.step == Step.INSTALL:
                    node.step_deadline = None
                    self.touch(node)
            self.event(
                failure.reason,
                f"{failure.message} The cluster is degraded: its machines stay up, reachable "
                "and billed. Retry the install or terminate the cluster.",
                node=failure.node,
                step=Step.INSTALL,
                output=failure.output,
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
                    self.start_billing([node])
                    if self.cluster.software == Cluster.Software.NONE:
                        self.finish_node(node)
                        self.worker_joined(node)
                    else:
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

    def worker_joined(self, node: Node) -> None:
        self.event(
            Reason.WORKER_JOINED,
            f"Worker {node.name} joined the cluster; billed from {self.now:%H:%M:%S} UTC.",
            node=node,
            step=node.step,
        )

    def fail_worker(self, failure: Failure) -> None:
        node = failure.node
        if node.status == NodeStatus.JOINED:
            ended = UsageRecord.objects.filter(node=node, ended_at__isnull=True)
            record_ids = list(ended.values_list("pk", flat=True))
            ended.update(ended_at=self.now)
            _charge_on_commit(record_ids=record_ids)
        self.end_node(node, NodeStatus.FAILED)
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
            if not node.holds_host or node.status not in (NodeStatus.FAILED, NodeStatus.ENDED):
                continue
            stop = self.record(node, "stop")
            if stop.get("ok"):
                node.holds_host = False
                self.touch(node)
                self.set_host(node, Host.State.FREE)
                freed.append(node)
            elif stop.get("attempts", 0) >= RELEASE_ATTEMPTS:
                node.holds_host = False
                self.touch(node)
                self.set_host(node, Host.State.OFFLINE)
                self.event(
                    Reason.RELEASE_FAILED,
                    f"{node.host.name} could not be wiped after {RELEASE_ATTEMPTS} attempts "
                    f"({stop.get('error', 'no reason given')}); it is offline until staff look "
                    "at it.",
                    node=node,
                )
                log.error(
                    "host %s (cluster %s, %s) could not be released; now offline: %s",
                    node.host.name,
                    self.cluster.pk,
                    node.name,
                    stop.get("error"),
                )
            elif not self._backing_off(stop):
                self.hand_off(node, "stop")
        if freed:
            still_held = any(n.holds_host for n in self.nodes)
            names = ", ".join(n.name for n in freed)
            self.event(
                Reason.HOST_RELEASED,
                f"Released {names}: wiped and returned to the pool."
                + ("" if still_held else " Every machine of this cluster is released."),
            )

    def finish_terminating(self) -> None:
        if any(n.holds_host for n in self.nodes):
            return
        stopped = bool(self.cluster.stop_reason)
        self.set_status(Status.STOPPED if stopped else Status.TERMINATED)
        self.event(
            Reason.TERMINATED,
            f"Stopped because {self.cluster.get_stop_reason_display()}."
            if stopped
            else "Terminated: every machine was stopped and wiped.",
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
]


def advance(*, cluster_id: int, now: datetime | None = None) -> list[str]:
    """Carry one cluster as far as the clock and its rows allow; returns what it did."""
    now = now or timezone.now()
    with transaction.atomic():
        cluster = _lock_cluster(cluster_id)
        if cluster is None:
            return []
        nodes = list(cluster.nodes.select_related("host").order_by("index"))
        for node in nodes:
            node.cluster = cluster
        work = _Pass(cluster=cluster, nodes=nodes, now=now)
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
        if work.events:
            # Something moved (a step passed, the cluster joined): what it unlocks is due now,
            # not at the next tick. Each follow-up only runs on progress, so this settles.
            _dispatcher.advance(cluster.pk)
    return work.done


# --- per-node work, outside any transaction ---------------------------------------------------


def node_plan_for(node: Node) -> dict:
    """The plan a driver applies to `node` (`clusters.connect.node_plan`), from its cluster as
    it is now, starting nodes included."""
    cluster = (
        Cluster.objects.select_related("machine_type__location")
        .prefetch_related("nodes", "volumes")
        .get(pk=node.cluster_id)
    )
    shape = connect.shape_for(cluster, planning=True)
    return connect.node_plan(shape, next(n for n in shape.nodes if n.index == node.index))


def install_plan(
    cluster: Cluster, nodes: Iterable[Node], *, with_node_plans: bool = False
) -> InstallPlan:
    machine_type = cluster.machine_type
    node_plans = {}
    if with_node_plans:
        shape = connect.shape_for(
            Cluster.objects.select_related("machine_type__location")
            .prefetch_related("nodes", "volumes")
            .get(pk=cluster.pk),
            planning=True,
        )
        node_plans = {access.name: connect.node_plan(shape, access) for access in shape.nodes}
    return InstallPlan(
        cluster_name=cluster.name,
        software=cluster.software,
        gpus_per_machine=machine_type.gpus_per_machine,
        boot_seconds=machine_type.boot_seconds,
        nodes=[
            PlanNode(
                name=n.name,
                private_ip=n.private_ip,
                gpus=machine_type.gpus_per_machine,
                is_head=n.index == 0,
                installed_at=n.installed_at,
            )
            for n in nodes
            if n.status == NodeStatus.JOINED
        ],
        node_plans=node_plans,
    )


def _peer_names(node: Node) -> list[str]:
    peers = Node.objects.filter(
        cluster_id=node.cluster_id, status__in=[NodeStatus.STARTING, NodeStatus.JOINED]
    ).exclude(pk=node.pk)
    return [f"node-{i}" for i in peers.order_by("index").values_list("index", flat=True)]


def _run(node: Node, action: str, now: datetime) -> dict:
    """The slow part of one piece of work: talks to the driver (or plays the agent)."""
    from clusters.agent.service import agent_check_in, agent_report_network

    driver = get_driver(node.host)
    kind, _, key = action.partition(":")
    if kind == "start":
        state = driver.start(node, agent_token=agent_token(node), plan=node_plan_for(node))
        return {"ok": True, "state": state}
    if kind == "agent":
        agent_check_in(node=node.pk, token=agent_token(node), gpus=driver.agent_gpus(node))
        return {"ok": True}
    if kind == "network":
        peers = _peer_names(node)
        agent_report_network(
            node=node.pk,
            token=agent_token(node),
            reachability=driver.reachability(node, peers=peers),
        )
        return {"ok": True}
    cluster = node.cluster
    if kind == "install":
        nodes = list(cluster.nodes.all())
        result = driver.install(node, plan=install_plan(cluster, nodes, with_node_plans=True))
        return {"ok": result.ok, "key": key, "output": result.output[-20_000:]}
    if kind == "check":
        nodes = list(cluster.nodes.all())
        result = driver.check(node, plan=install_plan(cluster, nodes), now=now)
        return {
            "ok": True,
            "key": key,
            "state": str(result.state),
            "ready": sorted(result.ready_nodes),
            "problems": result.problems,
            "output": result.output[-20_000:],
        }
    if kind == "stop":
        driver.stop(node)
        return {"ok": True}
    raise ValueError(f"unknown node work {action!r}")


def do_node_work(*, node_id: int, action: str, token: str) -> bool:
    """Do one handed-off piece of work if `token` still holds the node's lease, and write the
    result back only if it still does. Returns whether the result was written."""
    node = (
        Node.objects.select_related("cluster__machine_type__gpu", "host")
        .filter(pk=node_id, lease_token=token)
        .first()
    )
    now = timezone.now()
    if node is None or node.lease_expires_at is None or node.lease_expires_at <= now:
        return False
    try:
        result = _run(node, action, now)
    except Exception as error:  # the work failed; record it and let the reconciler decide
        log.exception("node %s: %s failed", node_id, action)
        result = {
            "ok": False,
            "key": action.partition(":")[2],
            "error": f"{type(error).__name__}: {error}"[:500],
        }
    return _write_back(
        cluster_id=node.cluster_id, node_id=node_id, token=token, action=action, result=result
    )


def _write_back(*, cluster_id: int, node_id: int, token: str, action: str, result: dict) -> bool:
    kind = action.split(":")[0]
    now = timezone.now()
    with transaction.atomic():
        if _lock_cluster(cluster_id) is None:
            return False
        node = Node.objects.filter(pk=node_id, lease_token=token).first()
        if node is None:
            return False  # the lease was taken back (terminate, retry, expiry): drop the result
        previous = node.driver_state.get(kind) or {}
        state = result.pop("state", None) if kind == "start" else None
        if isinstance(state, dict):
            node.driver_state.update(state)
        result["at"] = now.isoformat()
        result["attempts"] = previous.get("attempts", 0) + 1
        node.driver_state[kind] = result
        node.lease_token = ""
        node.lease_expires_at = None
        node.save(update_fields=["driver_state", "lease_token", "lease_expires_at"])
        _dispatcher.advance(cluster_id)
    return True


# --- what users ask for --------------------------------------------------------------------


def terminate(*, cluster: Cluster, user: User | None = None) -> Cluster:
    """Stop every machine together; billing ends for all nodes at this instant."""
    return _end(cluster=cluster, user=user, stop_reason="")


def stop(*, cluster: Cluster, reason: str) -> Cluster:
    """Like terminate, for lack of balance or budget; the cluster ends `stopped`."""
    return _end(cluster=cluster, user=None, stop_reason=reason)


def _end(*, cluster: Cluster, user: User | None, stop_reason: str) -> Cluster:
    now = timezone.now()
    with transaction.atomic():
        locked = _lock_cluster(cluster.pk)
        if locked is None or locked.status not in TERMINABLE:
            status = locked.status if locked else "gone"
            raise ClusterRefused(
                "invalid_state",
                f"This cluster is {status}; only a provisioning, installing, ready or degraded "
                "cluster can be terminated.",
            )
        nodes = list(locked.nodes.select_related("host").order_by("index"))
        work = _Pass(cluster=locked, nodes=nodes, now=now)
        work.set_status(Status.TERMINATING)
        locked.ended_at = now
        locked.stop_reason = stop_reason
        UsageRecord.objects.filter(cluster=locked, ended_at__isnull=True).update(ended_at=now)
        for node in nodes:
            if node.status in (NodeStatus.STARTING, NodeStatus.JOINED):
                work.end_node(node, NodeStatus.ENDED)
        if stop_reason:
            reason = Reason.STOPPED_BALANCE if stop_reason == "balance" else Reason.STOPPED_BUDGET
            message = f"Stopping every machine: {locked.get_stop_reason_display()}."
        else:
            reason = Reason.TERMINATE_REQUESTED
            who = f" by {user.email}" if user else ""
            message = f"Terminate requested{who}: stopping every machine; billing ended."
        work.event(reason, message)
        work.flush()
        _dispatcher.advance(locked.pk)
        _charge_on_commit(cluster_id=locked.pk)
    return locked


def _charge_on_commit(*, cluster_id: int | None = None, record_ids: list[int] | None = None):
    """Bill ended machines up to their end now rather than at the meter's next run."""

    def charge() -> None:
        from billing import meter

        if cluster_id is not None:
            meter.charge_usage(cluster=Cluster(pk=cluster_id))
        else:
            meter.charge_usage(record_ids=record_ids)

    # robust: a failed charge is logged and left to the meter; it never undoes the end.
    transaction.on_commit(charge, robust=True)


def retry_install(*, cluster: Cluster) -> Cluster:
    """Install the software again on every node of a degraded cluster."""
    now = timezone.now()
    with transaction.atomic():
        locked = _lock_cluster(cluster.pk)
        if locked is None or locked.status != Status.DEGRADED:
            raise ClusterRefused(
                "invalid_state",
                f"Retry install is for a degraded cluster; this one is "
                f"{locked.status if locked else 'gone'}.",
            )
        nodes = list(locked.nodes.select_related("host").order_by("index"))
        work = _Pass(cluster=locked, nodes=nodes, now=now)
        work.set_status(Status.INSTALLING)
        locked.install_attempts += 1
        for node in nodes:
            if node.status == NodeStatus.JOINED:
                work.begin_install(node)
                node.lease_token = ""
                node.lease_expires_at = None
        work.event(
            Reason.RETRY_INSTALL,
            f"Installing {locked.get_software_display()} again (attempt "
            f"{locked.install_attempts}).",
        )
        work.flush()
        _dispatcher.advance(locked.pk)
    return locked


def _require_balance(
    *, project: Project, machine_type: MachineType, machines: int, doing: str
) -> None:
    """The balance must cover one hour of the whole cluster, and never less than the minimum."""
    needed = max(settings.RUNCRATE_MIN_BALANCE, machine_type.price_per_hour * machines)
    balance = ledger.balance(project=project)
    if balance < needed:
        raise ClusterRefused(
            "insufficient_balance",
            f"Your balance is {money(balance)}; {doing} needs at least {money(needed)} "
            f"(one hour of the whole cluster; never less than "
            f"{money(settings.RUNCRATE_MIN_BALANCE)}).",
        )


def add_workers(*, cluster: Cluster, count: int) -> Cluster:
    """Add `count` machines of the same type to a ready cluster; each is billed once it joins,
    and one that fails is released alone."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ClusterRefused("invalid_count", "Add at least one worker.", field="count")
    now = timezone.now()
    with transaction.atomic():
        locked = _lock_cluster(cluster.pk)
        if locked is None or locked.status != Status.READY:
            raise ClusterRefused(
                "invalid_state",
                f"Workers can be added to a ready cluster; this one is "
                f"{locked.status if locked else 'gone'}.",
            )
        nodes = locked.nodes.all()
        live = nodes.filter(status__in=[NodeStatus.STARTING, NodeStatus.JOINED]).count()
        if live + count > MAX_NODES:
            raise ClusterRefused(
                "invalid_count",
                f"A cluster has at most {MAX_NODES} machines: this one has {live}, so at most "
                f"{MAX_NODES - live} more.",
                field="count",
            )
        _require_balance(
            project=locked.project,
            machine_type=locked.machine_type,
            machines=live + count,
            doing=f"a cluster of {live + count} machines",
        )
        hosts = reserve_hosts(machine_type=locked.machine_type, count=count, now=now)
        first = (nodes.aggregate(last=Max("index"))["last"] or 0) + 1
        added = _new_nodes(cluster=locked, hosts=hosts, first_index=first, is_worker=True, now=now)
        Event.objects.create(
            cluster=locked,
            at=now,
            reason=Reason.WORKERS_ADDED,
            message=(
                f"Adding {count} worker{'s' if count > 1 else ''}: "
                f"{', '.join(n.name for n in added)}."
            ),
        )
        _dispatcher.advance(locked.pk)
    return locked


# --- periodic -------------------------------------------------------------------------------


def clusters_needing_work() -> list[int]:
    """The clusters a tick should advance: anything still moving, or still holding a host."""
    return list(
        Cluster.objects.filter(
            Q(status__in=[Status.PROVISIONING, Status.INSTALLING, Status.TERMINATING])
            | Q(nodes__status=NodeStatus.STARTING)
            | Q(nodes__holds_host=True, nodes__status__in=[NodeStatus.FAILED, NodeStatus.ENDED])
            | Q(status=Status.READY, nodes__step=Step.INSTALL, nodes__status=NodeStatus.JOINED)
        )
        .order_by("pk")
        .values_list("pk", flat=True)
        .distinct()
    )


def sweep_orphan_hosts() -> list[Host]:
    """Hosts marked taken that no node holds: reported loudly for staff, never freed blindly."""
    orphans = list(
        Host.objects.filter(
            state__in=[Host.State.RESERVED, Host.State.IN_USE, Host.State.CLEANING]
        ).exclude(nodes__holds_host=True)
    )
    for host in orphans:
        log.error("host %s is %s but no node holds it", host.name, host.state)
    return orphans


# --- checks on what the agent reports ---------------------------------------------------


def _gpu_line(gpu: dict) -> str:
    return ", ".join(str(gpu.get(k, "")) for k in ("name", "memory_total_mib", "uuid"))


def hardware_problem(node: Node, machine_type: MachineType) -> str | None:
    """Why the GPUs the agent saw are not what the machine type sells, or None."""
    gpus = node.gpus or []
    expected = machine_type.gpus_per_machine
    model = machine_type.gpu
    if len(gpus) != expected:
        return f"{node.name} reports {len(gpus)} GPUs; {machine_type.slug} has {expected}."
    for gpu in gpus:
        memory_gib = float(gpu.get("memory_total_mib", 0)) / 1024
        if abs(memory_gib - model.memory_gib) > 0.1 * model.memory_gib:
            return (
                f"{node.name} reports {gpu.get('name')} with {memory_gib:.0f} GiB; "
                f"{machine_type.slug} sells {model.name} ({model.memory_gib} GiB)."
            )
    return None


def reachability_matrix(nodes: list[Node]) -> str:
    """The N×N matrix of what each node's agent reached: ok, FAIL, or ? (not reported)."""
    names = [n.name for n in nodes if n.status != NodeStatus.ENDED or n.reachability]
    rows = {n.name: (n.reachability or {}) for n in nodes}
    corner = "from \\ to"
    width = max(len(corner), *(len(name) for name in names)) + 2
    lines = [corner.ljust(width) + "".join(name.ljust(width) for name in names)]
    for source in names:
        cells = []
        for target in names:
            if source == target:
                cells.append("-")
            elif target not in rows[source]:
                cells.append("?")
            else:
                cells.append("ok" if rows[source][target] else "FAIL")
        lines.append(source.ljust(width) + "".join(c.ljust(width) for c in cells))
    return "\n".join(line.rstrip() for line in lines)
