"""Per-node work, outside any transaction: what a driver is asked to do under a lease, and the
write-back that only lands while the lease still holds."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta

from django import db
from django.db import transaction
from django.db.models import Q
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from clusters import connect
from clusters.drivers import InstallPlan, PlanNode, get_driver
from clusters.drivers.base import DriverError
from clusters.lifecycle.reconcile import advance_locked, read_nodes
from clusters.lifecycle.rules import LEASE_SECONDS, agent_token, lock_cluster, running_deadline
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


def _run(node: Node, action: str, now: datetime, plans: _Plans) -> dict:
    """The slow part of one piece of work: the driver's call for it."""
    driver = get_driver(node.host)
    kind, _, key = action.partition(":")
    if kind == "start":
        state = driver.start(node, agent_token=agent_token(node), plan=plans.node(node))
        return {"ok": True, "state": state}
    if kind == "replan":
        # The same start, on a machine that runs: only the plan's changes land (idempotent);
        # what the driver first recorded about the machine stays.
        driver.start(node, agent_token=agent_token(node), plan=plans.node(node))
        return {"ok": True, "key": key}
    if kind == "prune":
        # A node left: the plan without it and, on a Slurm cluster's head, its installer again
        # with the nodes that are left, which hands every node the slurm.conf without it.
        driver.start(node, agent_token=agent_token(node), plan=plans.node(node))
        if node.index == 0 and node.cluster.software == Cluster.Software.SLURM:
            result = driver.install(node, plan=plans.install(with_node_plans=True))
            return {"ok": result.ok, "key": key, "output": result.output[-20_000:]}
        return {"ok": True, "key": key}
    if kind in ("agent", "network"):
        # The agent's report is recorded with the write-back, in its transaction.
        return {"ok": True}
    if kind == "install":
        result = driver.install(node, plan=plans.install(with_node_plans=True))
        return {"ok": result.ok, "key": key, "output": result.output[-20_000:]}
    if kind == "check":
        result = driver.check(node, plan=plans.install(), now=now)
        return {
            "ok": True,
            "key": key,
            "state": str(result.state),
            "ready": sorted(result.ready_nodes),
            "problems": result.problems,
            "output": result.output[-20_000:],
        }
    if kind == "stop":
        released = driver.stop(node)
        result = {"ok": True, "pristine": released.pristine, "why": released.why[:4000]}
        if released.warning:  # e.g. the volume could not be synced back: the release went on
            result |= {"warning": released.warning[:500], "output": released.output[-20_000:]}
        return result
    raise ValueError(f"unknown node work {action!r}")


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


def do_work(*, action: str, leases: list[tuple[int, str]]) -> int:
    """Do the same handed-off work on a batch of nodes of one cluster (a driver that batches
    hands a cluster's nodes over together; others one node at a time), each only while its
    token still holds its lease; write the results back together, in one transaction that
    also advances the cluster. Returns how many results were written."""
    tokens = dict(leases)
    kind = action.partition(":")[0]
    now = timezone.now()
    found = Node.objects.select_related(
        "cluster__machine_type__gpu", "cluster__machine_type__location", "host"
    ).filter(pk__in=list(tokens))
    nodes = [
        n
        for n in found.order_by("index")
        if n.lease_token == tokens[n.pk] and n.lease_expires_at and n.lease_expires_at > now
    ]
    if kind != "stop":
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
    with renewing_leases([(n.pk, n.lease_token) for n in nodes], LEASE_SECONDS[kind]):
        for node in nodes:
            results[node.pk] = _result(node, action, now, plans)
            if kind == "start":
                results[node.pk]["began"] = now.isoformat()  # when the driver was handed it
    return _write_back(
        cluster_id=cluster.pk,
        action=action,
        tokens={n.pk: n.lease_token for n in nodes},
        results=results,
    )


def _result(node: Node, action: str, now: datetime, plans: _Plans) -> dict:
    try:
        return _run(node, action, now, plans)
    except DriverError as error:  # the driver says what went wrong: no traceback needed
        log.warning("node %s: %s failed: %s", node.pk, action, error.message)
        return {
            "ok": False,
            "key": action.partition(":")[2],
            "error": error.message[:500],
            "reason": error.reason,
            "output": error.output[-20_000:],
        }
    except Exception as error:  # the work failed; record it and let the reconciler decide
        log.exception("node %s: %s failed", node.pk, action)
        return {
            "ok": False,
            "key": action.partition(":")[2],
            "error": f"{type(error).__name__}: {error}"[:500],
        }


def _write_back(
    *, cluster_id: int, action: str, tokens: dict[int, str], results: dict[int, dict]
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


def _count_from_start(node: Node, result: dict, cluster: Cluster) -> bool:
    """The first start of a node to land: its `running` step counts from when that start was
    handed to the driver, not from the reservation (the time the start waited for a worker
    of the `machines` queue is ours). Returns whether the deadline moved."""
    began = parse_datetime(result.get("began") or "")
    if node.status != NodeStatus.STARTING or node.step != Node.Step.RUNNING or began is None:
        return False
    if began <= node.step_started_at:
        return False
    node.step_started_at = began
    node.step_deadline = running_deadline(node, cluster.machine_type, start=began)
    return True


def _land(
    cluster_id: int,
    action: str,
    tokens: dict[int, str],
    results: dict[int, dict],
    *,
    now: datetime,
    then_advance: bool,
) -> int:
    kind = action.split(":")[0]
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
        result = dict(results[node.pk])
        if kind in ("agent", "network") and result["ok"]:
            # The driver plays the node's agent: its report is recorded now, under the lock,
            # with the rest of the write-back.
            try:
                changed.update(
                    get_driver(node.host).do_agent_work(
                        node,
                        step=kind,
                        agent_token=agent_token(node),
                        peers=[p for p in peers if p != node.name],
                    )
                )
            except Exception as error:
                log.exception("node %s: %s failed", node.pk, action)
                result = {"ok": False, "error": f"{type(error).__name__}: {error}"[:500]}
        previous = node.driver_state.get(kind) or {}
        if kind == "start" and not previous and _count_from_start(node, result, cluster):
            changed.update({"step_started_at", "step_deadline"})
        state = result.pop("state", None) if kind == "start" else None
        if isinstance(state, dict):
            node.driver_state.update(state)
        result["at"] = now.isoformat()
        result["attempts"] = previous.get("attempts", 0) + 1
        node.driver_state[kind] = result
        node.lease_token = ""
        node.lease_expires_at = None
    if then_advance:
        advance_locked(cluster, nodes, now=now, landed=landed, fields=sorted(changed))
    else:
        update_rows(landed, sorted(changed))
    return len(landed)
