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
from django.utils import timezone

from clusters import connect
from clusters.drivers import InstallPlan, PlanNode, get_driver
from clusters.drivers.base import DriverError
from clusters.lifecycle import dispatch
from clusters.lifecycle.rules import LEASE_SECONDS, agent_token, lock_cluster
from clusters.models import Cluster, Node

log = logging.getLogger(__name__)

Status = Cluster.Status
NodeStatus = Node.Status

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


def _run(node: Node, action: str, now: datetime) -> dict:
    """The slow part of one piece of work: the driver's call for it."""
    driver = get_driver(node.host)
    kind, _, key = action.partition(":")
    if kind == "start":
        state = driver.start(node, agent_token=agent_token(node), plan=node_plan_for(node))
        return {"ok": True, "state": state}
    if kind == "replan":
        # The same start, on a machine that runs: only the plan's changes land (idempotent);
        # what the driver first recorded about the machine stays.
        driver.start(node, agent_token=agent_token(node), plan=node_plan_for(node))
        return {"ok": True, "key": key}
    if kind in ("agent", "network"):
        driver.do_agent_work(node, step=kind, agent_token=agent_token(node))
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
        warning = driver.stop(node)
        if warning:  # e.g. the volume could not be synced back: the wipe went on
            return {"ok": True, "warning": warning[0][:500], "output": warning[1][-20_000:]}
        return {"ok": True}
    raise ValueError(f"unknown node work {action!r}")


@contextmanager
def renewing_lease(node_id: int, token: str, seconds: float) -> Iterator[None]:
    """While the body runs, extend the node's lease every third of `seconds`, as long as
    `token` still holds it (a conditional update: a lease taken back stays taken back)."""
    stop = threading.Event()

    def renew() -> None:
        try:
            while not stop.wait(seconds / 3):
                until = timezone.now() + timedelta(seconds=seconds)
                held = Node.objects.filter(pk=node_id, lease_token=token).update(
                    lease_expires_at=until
                )
                if not held:
                    return
        except Exception:  # a renewal that fails leaves the lease to expire; the work goes on
            log.exception("node %s: the lease could not be renewed", node_id)
        finally:
            db.connection.close()  # this thread's own connection

    renewer = threading.Thread(target=renew, name=f"lease-{node_id}", daemon=True)
    renewer.start()
    try:
        yield
    finally:
        stop.set()
        renewer.join(timeout=10)


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
        with renewing_lease(node_id, token, LEASE_SECONDS[action.partition(":")[0]]):
            result = _run(node, action, now)
    except DriverError as error:  # the driver says what went wrong: no traceback needed
        log.warning("node %s: %s failed: %s", node_id, action, error.message)
        result = {
            "ok": False,
            "key": action.partition(":")[2],
            "error": error.message[:500],
            "reason": error.reason,
            "output": error.output[-20_000:],
        }
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
        if lock_cluster(cluster_id) is None:
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
        dispatch.current().advance(cluster_id)
    return True
