"""Per-node work, outside any transaction: what a driver is asked to do under a lease, and the
write-back that only lands while the lease still holds."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from django import db
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from clusters import connect
from clusters.lifecycle import dispatch, observe
from clusters.lifecycle.reconcile import advance_locked
from clusters.lifecycle.records import (
    OUTPUT_CHARS,
    Action,
    ActionKind,
    CheckOutcome,
    NodeWork,
    Outcome,
    StartOutcome,
    StopOutcome,
    outcome_type,
)
from clusters.lifecycle.rules import LEASE_SECONDS, agent_token, lock_cluster, running_deadline
from clusters.lifecycle.unit import read_nodes
from clusters.machines import InstallPlan, PlanNode, get_driver
from clusters.machines.base import DriverError
from clusters.models import Cluster, Node
from runcrate.sql import update_rows

log = logging.getLogger(__name__)

Status = Cluster.Status
NodeStatus = Node.Status

# --- per-node work, outside any transaction ---------------------------------------------------


def node_plan_for(node: Node) -> dict:
    """The plan a driver applies to `node` (`clusters.connect.node_plan`), from its cluster as
    it is now, starting nodes included."""
    return node_plans(node.cluster_id)[node.index]


def node_plans(cluster_id: int) -> dict[int, dict]:
    """Every node's plan (by index), from one read of the cluster: a batch of starts gets its
    plans from one call, not one per node."""
    cluster = (
        Cluster.objects.select_related("machine_type__location")
        .prefetch_related("nodes", "volumes")
        .get(pk=cluster_id)
    )
    shape = connect.shape_for(cluster, planning=True)
    return {access.index: connect.node_plan(shape, access) for access in shape.nodes}


def install_plan(
    cluster: Cluster, nodes: Iterable[Node], *, with_node_plans: bool = False
) -> InstallPlan:
    """What an install or a check needs of the cluster; `with_node_plans`, what an install
    applies first: every node's plan and its agent's token (`rules.agent_token`)."""
    machine_type = cluster.machine_type
    nodes = list(nodes)
    node_plans, agent_tokens = {}, {}
    if with_node_plans:
        agent_tokens = {n.name: agent_token(n) for n in nodes}
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
        agent_tokens=agent_tokens,
    )


def _run(node: Node, action: Action, now: datetime, plans: _Plans) -> Ran:
    """The slow part of one piece of work: the driver's call for it."""
    driver = get_driver(node.reserved_host)
    kind, key = action.kind, action.key
    if kind is ActionKind.START:
        machine = driver.start(node, agent_token=agent_token(node), plan=plans.node(node))
        return Ran(StartOutcome(ok=True), machine=machine)
    if kind is ActionKind.REPLAN:
        # The same start, on a machine that runs: only the plan's changes land (idempotent);
        # what the driver first recorded about the machine stays.
        driver.start(node, agent_token=agent_token(node), plan=plans.node(node))
        return Ran(Outcome(ok=True, key=key))
    if kind is ActionKind.PRUNE:
        # A node left: the plan without it and, on a Slurm cluster's head, its installer again
        # with the nodes that are left, which hands every node the slurm.conf without it.
        driver.start(node, agent_token=agent_token(node), plan=plans.node(node))
        if node.index == 0 and node.cluster.software == Cluster.Software.SLURM:
            result = driver.install(node, plan=plans.install(with_node_plans=True))
            return Ran(Outcome(ok=result.ok, key=key, output=result.output[-OUTPUT_CHARS:]))
        return Ran(Outcome(ok=True, key=key))
    if kind is ActionKind.DRAIN:
        return _drain(node, key, plans)
    if kind in (ActionKind.AGENT, ActionKind.NETWORK):
        # The agent's report is recorded with the write-back, in its transaction.
        return Ran(Outcome(ok=True))
    if kind is ActionKind.INSTALL:
        result = driver.install(node, plan=plans.install(with_node_plans=True))
        return Ran(Outcome(ok=result.ok, key=key, output=result.output[-OUTPUT_CHARS:]))
    if kind is ActionKind.CHECK:
        verdict = driver.check(node, plan=plans.install(), now=now)
        return Ran(
            CheckOutcome(
                ok=True,
                key=key,
                state=verdict.state,
                ready=tuple(sorted(verdict.ready_nodes)),
                problems=verdict.problems,
                output=verdict.output[-OUTPUT_CHARS:],
            )
        )
    # ActionKind.STOP: the driver is told which attempt this is (a volume's sync is retried).
    tried = NodeWork.of(node).get(ActionKind.STOP)
    released = driver.stop(node, attempt=(tried.attempts if tried else 0) + 1)
    # A warning (e.g. the volume could not be synced back) did not stop the release.
    return Ran(
        StopOutcome(
            ok=True,
            pristine=released.pristine,
            why=released.why[:4000],
            warning=released.warning[:500],
            output=released.output[-OUTPUT_CHARS:] if released.warning else "",
        )
    )


def _drain(head: Node, key: str, plans: _Plans) -> Ran:
    """The head's scheduler made to hold the drained workers the key names, each with why as
    the cluster holds it now (steps/drain.py compares the key with what it wants next)."""
    names = set(key.split(",")) if key else set()
    drained = {
        n.name: n.drained
        for n in head.cluster.nodes.filter(status=NodeStatus.JOINED)
        if n.name in names and n.drained
    }
    result = get_driver(head.reserved_host).drain(head, plan=plans.install(), drained=drained)
    return Ran(Outcome(ok=result.ok, key=key, output=result.output[-OUTPUT_CHARS:]))


@dataclass(frozen=True)
class Ran:
    """What one piece of work came back with, before it is written back: its outcome and,
    for a start, what the driver keeps about the machine."""

    outcome: Outcome
    machine: dict | None = None


class _Plans:
    """The plans a batch of work needs, each made once for the whole batch (they read the
    cluster as it is when the work runs)."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self._nodes: dict[int, dict] | None = None
        self._install: dict[bool, InstallPlan] = {}

    def node(self, node: Node) -> dict:
        if self._nodes is None:
            self._nodes = node_plans(self.cluster.pk)
        return self._nodes[node.index]

    def install(self, *, with_node_plans: bool = False) -> InstallPlan:
        if with_node_plans not in self._install:
            nodes = list(self.cluster.nodes.all())
            self._install[with_node_plans] = install_plan(
                self.cluster, nodes, with_node_plans=with_node_plans
            )
        return self._install[with_node_plans]


@contextmanager
def renewing_lease(node_id: int, token: str, seconds: float) -> Iterator[None]:
    """While the body runs, extend the node's lease every third of `seconds`, as long as
    `token` still holds it (a conditional update: a lease taken back stays taken back)."""
    with renewing_leases([(node_id, token)], seconds):
        yield


@contextmanager
def renewing_leases(leases: list[tuple[int, str]], seconds: float) -> Iterator[None]:
    """`renewing_lease` for a batch of (node, token): one conditional update renews every lease
    still held, until none is."""
    stop = threading.Event()
    held_by = Q()
    for node_id, token in leases:
        held_by |= Q(pk=node_id, lease_token=token)
    name = f"lease-{leases[0][0]}" + (f"+{len(leases) - 1}" if len(leases) > 1 else "")

    def renew() -> None:
        try:
            while not stop.wait(seconds / 3):
                until = timezone.now() + timedelta(seconds=seconds)
                held = Node.objects.filter(held_by).update(lease_expires_at=until)
                if not held:
                    return
        except Exception:  # a renewal that fails leaves the lease to expire; the work goes on
            log.exception("%s: the lease could not be renewed", name)
        finally:
            db.connection.close()  # this thread's own connection

    renewer = threading.Thread(target=renew, name=name, daemon=True)
    renewer.start()
    try:
        yield
    finally:
        stop.set()
        renewer.join(timeout=10)


def do_node_work(*, node_id: int, action: str, token: str) -> bool:
    """Do one handed-off piece of work if `token` still holds the node's lease, and write the
    result back only if it still does. Returns whether the result was written."""
    return do_work(action=action, leases=[(node_id, token)]) == 1


@dispatch.runs("node_work")
def do_work(*, action: str, leases: list[tuple[int, str]]) -> int:
    """Do the same handed-off work (`action` as the task queue carries it, `Action.to_task`)
    on a batch of nodes of one cluster (a driver that batches hands a cluster's nodes over
    together; others one node at a time), each only while its token still holds its lease;
    write the results back together, in one transaction that also advances the cluster.
    Returns how many results were written."""
    work = Action.from_task(action)
    tokens = dict(leases)
    now = timezone.now()
    found = Node.objects.select_related(
        "cluster__machine_type__gpu", "cluster__machine_type__location", "host"
    ).filter(pk__in=list(tokens))
    nodes = [
        n
        for n in found.order_by("index", "pk")
        if n.lease_token == tokens[n.pk] and n.lease_expires_at and n.lease_expires_at > now
    ]
    if work.kind is not ActionKind.STOP:
        # Work handed off before its node ended (a terminate, a failure) and not yet begun:
        # never begun now. Its lease is given back, so the stop (which waits for work in
        # flight, `end_node`) is handed off at the next pass instead of when the lease ends.
        ended = [n for n in nodes if n.status not in Node.LIVE]
        if ended:
            held = Q()
            for node in ended:
                held |= Q(pk=node.pk, lease_token=node.lease_token)
            Node.objects.filter(held).update(lease_token="", lease_expires_at=None)
            nodes = [n for n in nodes if n.status in Node.LIVE]
    if not nodes:
        return 0
    cluster = nodes[0].cluster
    for node in nodes:
        node.cluster = cluster  # one cluster object for the batch: its plans are made once
    plans = _Plans(cluster)
    results = {}
    with renewing_leases([(n.pk, n.lease_token) for n in nodes], LEASE_SECONDS[work.kind]):
        for node in nodes:
            ran = _result(node, work, now, plans)
            if isinstance(ran.outcome, StartOutcome):
                # When the driver was handed it.
                ran = Ran(replace(ran.outcome, began=now), machine=ran.machine)
            results[node.pk] = ran
    return _write_back(
        cluster_id=cluster.pk,
        action=work,
        tokens={n.pk: n.lease_token for n in nodes},
        results=results,
    )


def _result(node: Node, action: Action, now: datetime, plans: _Plans) -> Ran:
    failed = outcome_type(action.kind).failed
    try:
        return _run(node, action, now, plans)
    except DriverError as error:  # the driver says what went wrong: no traceback needed
        log.warning("node %s: %s failed: %s", node.pk, action, error.message)
        return Ran(
            failed(key=action.key, error=error.message, reason=error.reason, output=error.output)
        )
    except Exception as error:  # the work failed; record it and let the reconciler decide
        log.exception("node %s: %s failed", node.pk, action)
        return Ran(failed(key=action.key, error=f"{type(error).__name__}: {error}"))


def _write_back(
    *, cluster_id: int, action: Action, tokens: dict[int, str], results: dict[int, Ran]
) -> int:
    """Land each result whose token still holds its node, then advance the cluster on what
    landed, in the same transaction: one lock, one read and one write of the nodes, instead of
    a write-back and an advance each taking their own. Returns how many landed."""
    now = timezone.now()
    try:
        with transaction.atomic():
            return _land(cluster_id, action, tokens, results, now=now, then_advance=True)
    except Exception:
        # The pass failed (a bug, a worker stopped mid-pass): the results land alone, as
        # their own write-back, so the work is not done again once its lease runs out; the
        # next advance carries on from them.
        with transaction.atomic():
            _land(cluster_id, action, tokens, results, now=now, then_advance=False)
        raise


def _count_from_start(node: Node, start: StartOutcome, cluster: Cluster) -> bool:
    """The first start of a node to land: its `running` step counts from when that start was
    handed to the driver, not from the reservation (the time the start waited for a worker
    of the `machines` queue is ours). Returns whether the deadline moved."""
    began = start.began
    if node.status != NodeStatus.STARTING or node.step != Node.Step.RUNNING or began is None:
        return False
    if began <= node.step_started_at:
        return False
    node.step_started_at = began
    node.step_deadline = running_deadline(node, cluster.machine_type, start=began)
    return True


def _agent_report(node: Node, kind: ActionKind, peers: list[str]) -> list[str]:
    """The driver plays the node's agent: what it reports is recorded through the agent's
    own record (clusters/lifecycle/observe.py), on the locked node, unsaved (saved with the
    write-back). Returns the fields
    it changed."""
    report = get_driver(node.reserved_host).agent_report(
        node, step=kind, peers=[p for p in peers if p != node.name]
    )
    return observe.record_report(node, token=agent_token(node), report=report)


def _land(
    cluster_id: int,
    action: Action,
    tokens: dict[int, str],
    results: dict[int, Ran],
    *,
    now: datetime,
    then_advance: bool,
) -> int:
    kind = action.kind
    cluster = lock_cluster(cluster_id)
    if cluster is None:
        return 0
    nodes = read_nodes(cluster)
    landed = [n for n in nodes if n.pk in tokens and n.lease_token == tokens[n.pk]]
    if not landed:
        return 0  # every lease was taken back (terminate, retry, expiry): drop the results
    peers = [n.name for n in nodes if n.status in Node.LIVE]
    changed = {"driver_state", "lease_token", "lease_expires_at"}
    for node in landed:
        ran = results[node.pk]
        outcome = ran.outcome
        if kind in (ActionKind.AGENT, ActionKind.NETWORK) and outcome.ok:
            try:
                changed.update(_agent_report(node, kind, peers))
            except Exception as error:
                log.exception("node %s: %s failed", node.pk, action)
                outcome = Outcome.failed(error=f"{type(error).__name__}: {error}")
        done = NodeWork.of(node)
        if (
            isinstance(outcome, StartOutcome)
            and done.start is None
            and _count_from_start(node, outcome, cluster)
        ):
            changed.update({"step_started_at", "step_deadline"})
        done.land(kind, outcome, at=now, machine=ran.machine)
        node.driver_state = done.to_state()
        node.lease_token = ""
        node.lease_expires_at = None
    if then_advance:
        advance_locked(cluster, nodes, now=now, landed=landed, fields=sorted(changed))
    else:
        update_rows(landed, sorted(changed))
    return len(landed)
