"""Replacing a lost or unhealthy worker in place (issue 36; docs/lifecycle.md, "Repair").

A worker of a running cluster (never node-0: the head holds /shared, the scheduler and the Ray
head) that is lost, or unhealthy, can be replaced: a new host of the same machine type takes the
same node name and private address, passes the same steps with their deadlines as a worker added
to a ready cluster (clusters/lifecycle/steps/workers.py), and is billed from the moment it is up.
The machine it replaces leaves at once: an unhealthy one's billing ends at that instant (a lost
one's ended at its last heartbeat), and its host goes offline for staff once released
(`Node.quarantine`, clusters/lifecycle/steps/release.py), never offered again before staff
reimage and verify it.

- `plan_replace` runs every check of a replacement (the node, the cluster's state, the key's
  limits, the budget, one hour of the added machine on the balance, a free host) and reserves
  nothing: what the API's plan, the CLI's and the MCP server's confirmation and the dashboard's
  confirm page show.
- `replace_node` does it, with the same checks, in one transaction on the locked cluster.
- `auto_repair`, on the beat: a cluster whose repair policy is `auto` has its lost workers
  replaced at once and its unhealthy ones once they stayed unhealthy for
  RUNCRATE_REPAIR_GRACE_SECONDS, at most RUNCRATE_AUTO_REPAIRS_PER_DAY per cluster in any
  24 hours; what it could not do is told once (`replacement_failed`), not at every beat.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

import audit
from accounts.models import ApiKey, User
from billing import metering
from clusters import policy
from clusters.errors import ClusterRefused
from clusters.lifecycle import dispatch
from clusters.lifecycle.reserve import (
    new_nodes,
    require_balance,
    require_budget,
    require_key_limits,
    require_repair_policy,
    reserve_hosts,
)
from clusters.lifecycle.rules import lock_cluster
from clusters.lifecycle.unit import UnitOfWork, read_nodes
from clusters.models import Cluster, Event, Node
from offers.offers import offered_hosts
from runcrate.durations import in_words
from runcrate.money import usd

log = logging.getLogger(__name__)

Status = Cluster.Status
NodeStatus = Node.Status
Reason = Event.Reason

HEAD_REFUSAL = (
    "node-0 is the cluster's head: it holds /shared, the scheduler and the Ray head, so it "
    "cannot be replaced in place. Terminate the cluster and create another to move off it."
)


@dataclass(frozen=True)
class ReplacePlan:
    """What replacing `node` would do, checked and unreserved: its problem (`why`), the price of
    the new machine, and what happens to the old one's billing."""

    cluster: Cluster
    node: Node
    why: str
    price_per_hour: Decimal
    machines_after: int

    @property
    def billing(self) -> str:
        """What the replacement does to the bill, in one sentence."""
        if self.node.status == NodeStatus.LOST:
            old = f"{self.node.name}'s billing ended at its last heartbeat"
        else:
            old = f"{self.node.name}'s machine is released and its billing ends now"
        return (
            f"{old}; the new machine is billed from the moment it is up, at "
            f"{usd(self.price_per_hour)}/h, like the others."
        )

    def as_dict(self) -> dict:
        return {
            "node": self.node.name,
            "private_ip": self.node.private_ip,
            "why": self.why,
            "price_per_hour": str(self.price_per_hour),
            "cluster_price_per_hour": str(self.price_per_hour * self.machines_after),
            "billing": self.billing,
        }


def node_problem(cluster: Cluster, node: Node) -> str:
    """Why `node` may be replaced, in words, or "" when it may not: it was lost, or the
    cluster's open health problems name it."""
    if node.status == NodeStatus.LOST:
        if cluster.failure_node == node.name and cluster.failure_reason == Reason.MACHINE_LOST:
            return cluster.failure_message.rstrip(".")
        return f"{node.name} was lost"
    if node.status != NodeStatus.JOINED:
        return ""
    if cluster.status != Status.DEGRADED:
        return ""
    problems = cluster.problems_of(node.name)
    return "; ".join(problems)


def current_node(nodes: list[Node], name: str) -> Node | None:
    """The node called `name` now: the live one, or else the latest that left (a lost one)."""
    named = [n for n in nodes if n.name == name]
    live = [n for n in named if n.status in Node.LIVE]
    if live:
        return live[-1]
    return max(named, key=lambda n: n.pk) if named else None


def replaceable(cluster: Cluster, nodes: list[Node], name: object) -> tuple[Node, str]:
    """The node `name` and its problem, or ClusterRefused saying why it cannot be replaced."""
    if not policy.is_running(cluster.status):
        raise ClusterRefused(
            "invalid_state",
            f"A machine can be replaced in a ready or degraded cluster; this one is "
            f"{cluster.status}.",
        )
    node = current_node(nodes, name) if isinstance(name, str) else None
    if node is None:
        raise ClusterRefused("unknown_node", f"{cluster.name} has no machine called {name}.")
    if node.index == 0:
        raise ClusterRefused("head_not_replaceable", HEAD_REFUSAL, field="node")
    if node.status == NodeStatus.STARTING:
        raise ClusterRefused(
            "replacement_in_progress",
            f"{node.name} is already starting"
            + (" as a replacement" if node.replaces_id else "")
            + ": wait for it to join.",
            field="node",
        )
    why = node_problem(cluster, node)
    if not why:
        state = "healthy" if node.status == NodeStatus.JOINED else f"{node.status}"
        raise ClusterRefused(
            "node_not_replaceable",
            f"{node.name} is {state}: only a lost or unhealthy machine is replaced.",
            field="node",
        )
    return node, why


def _live_after(nodes: list[Node], replaced: Node) -> int:
    """The cluster's machines once the replacement is up: the live ones, the one replaced
    counted once."""
    live = sum(1 for n in nodes if n.status in Node.LIVE)
    return live if replaced.status in Node.LIVE else live + 1


def _require_money(
    cluster: Cluster, nodes: list[Node], node: Node, api_key: ApiKey | None, now: datetime
) -> int:
    """The create's money rules, for one machine more: the key's limits, the environment's
    budget, and one hour of the added machine on the balance. Returns the machines after."""
    machines = _live_after(nodes, node)
    require_key_limits(
        api_key=api_key, machine_type=cluster.machine_type, machines=machines, adding=1
    )
    require_budget(environment=cluster.environment, now=now)
    require_balance(
        project=cluster.project,
        price_per_hour=cluster.price_per_machine_hour,
        doing=f"replacing {node.name} (one machine of {usd(cluster.price_per_machine_hour)}/h)",
    )
    return machines


def replacement_hosts(now: datetime):
    """The hosts a replacement may be drawn from: offered, and none quarantined in the last
    RUNCRATE_QUARANTINE_DAYS."""
    since = now - timedelta(days=settings.RUNCRATE_QUARANTINE_DAYS)
    return offered_hosts().filter(Q(quarantined_at__isnull=True) | Q(quarantined_at__lt=since))


def plan_replace(
    *, cluster: Cluster, node_name: object, api_key: ApiKey | None = None
) -> ReplacePlan:
    """Every check `replace_node` makes, in its order; nothing is reserved or changed."""
    now = timezone.now()
    with transaction.atomic():
        locked = lock_cluster(cluster.pk)
        if locked is None:
            raise ClusterRefused("invalid_state", "This cluster is gone.")
        nodes = read_nodes(locked)
        node, why = replaceable(locked, nodes, node_name)
        machines = _require_money(locked, nodes, node, api_key, now)
        if not replacement_hosts(now).filter(machine_type=locked.machine_type_id).exists():
            raise ClusterRefused(
                "not_enough_machines",
                f"No machine of {locked.machine_type.slug} is free right now to replace "
                f"{node.name}; nothing was reserved. Try again later.",
            )
    return ReplacePlan(locked, node, why, locked.price_per_machine_hour, machines)


def replace_node(
    *,
    cluster: Cluster,
    node_name: object,
    api_key: ApiKey | None = None,
    user: User | None = None,
    automatic: bool = False,
    now: datetime | None = None,
) -> Node:
    """Replace the lost or unhealthy worker `node_name` with a new machine under its name and
    private address; returns the new node (starting). Raises ClusterRefused, changing nothing,
    for a node that cannot be replaced or a replacement the money rules refuse."""
    now = now or timezone.now()
    with transaction.atomic():
        locked = lock_cluster(cluster.pk)
        if locked is None:
            raise ClusterRefused("invalid_state", "This cluster is gone.")
        work = UnitOfWork.load(locked, now=now)
        old, why = replaceable(locked, work.nodes, node_name)
        _require_money(locked, work.nodes, old, api_key, now)
        hosts = reserve_hosts(
            machine_type=locked.machine_type, count=1, now=now, among=replacement_hosts(now)
        )
        if old.status == NodeStatus.JOINED:
            _release_unhealthy(work, old, why)
            # Ended before its successor takes its index (one live node per index); the rest
            # of its row is written with the unit.
            Node.objects.filter(pk=old.pk).update(status=old.status)
        locked.bump_version()  # new_nodes stamps the new row with it
        (new,) = new_nodes(
            cluster=locked, hosts=hosts, first_index=old.index, is_worker=True, now=now
        )
        new.replaces = old
        new.cluster = locked
        work.nodes.append(new)
        work.touch(new, "replaces")
        who = "automatically (the cluster's repair policy)" if automatic else "as asked"
        if user is not None and not automatic:
            who = f"as {user.email} asked"
        work.event(
            Reason.REPLACE_REQUESTED,
            f"Replacing {old.name} {who}: {why}. A new machine takes its name and private "
            f"address {old.private_ip}; it is billed from the moment it is up, at "
            f"{usd(locked.price_per_machine_hour)}/h.",
            node=new,
        )
        work.flush()
        audit.note(
            summary=f"replaced {old.name} of cluster `{locked.name}`"
            f"{' automatically (its repair policy)' if automatic else ''} ({why})",
            obj=locked,
            changes={"replaced": audit.change(old.pk, new.pk)},
            action="clusters:auto_replace" if automatic else "",
        )
        dispatch.current().advance(locked.pk)
    log.info("cluster %s: replacing %s (%s)", locked.pk, old.name, why)
    return new


def _release_unhealthy(work: UnitOfWork, old: Node, why: str) -> None:
    """An unhealthy machine being replaced leaves now: its billing ends at this instant, its
    host goes to staff once released, the others stop naming it, and the problems it had leave
    with it (they are not 'healed')."""
    cluster = work.cluster
    metering.close_machine(
        cluster_id=cluster.pk,
        node_id=old.pk,
        project_id=cluster.project_id,
        at=work.now,
        refund_note=f"Refund: {cluster.name} {old.name} was replaced",
    )
    quarantine(work, old, f"Replaced as unhealthy: {why}.")
    work.end_node(old, NodeStatus.ENDED)
    work.replan_others(old)
    forget_problems(cluster, old.name)
    work.cluster_dirty = True


def forget_problems(cluster: Cluster, name: str) -> None:
    """The open health problems of the machine `name`, which left, leave with it: none of them
    is announced as healed, and none names its replacement (saved with the cluster)."""
    cluster.health_problems = {
        key: problem
        for key, problem in (cluster.health_problems or {}).items()
        if problem.get("node") != name
    }


def quarantine(work: UnitOfWork, node: Node, why: str) -> None:
    """Once released, `node`'s host goes offline for staff with `why` and its health report,
    instead of back to the pool (steps/release.py)."""
    report = [why]
    if node.gpu_health:
        report.append(f"GPU conditions: {node.gpu_health}")
    if node.health:
        report.append(f"Last health report: {node.health}")
    node.quarantine = "\n".join(report)[:4000]
    work.touch(node, "quarantine")


def set_repair_policy(*, cluster: Cluster, policy: object, user: User | None = None) -> Cluster:
    """Change who decides a replacement, for a cluster that has not ended; an event says so."""
    require_repair_policy(policy)
    now = timezone.now()
    with transaction.atomic():
        locked = lock_cluster(cluster.pk)
        if locked is None or not locked.can_set_repair_policy:
            raise ClusterRefused(
                "invalid_state",
                "The repair policy is for a cluster that runs; this one has ended.",
            )
        if locked.repair_policy == policy:
            return locked
        work = UnitOfWork.load(locked, now=now)
        audit.note(
            summary=f"set the repair policy of cluster `{locked.name}` to {policy}",
            obj=locked,
            changes={"repair_policy": audit.change(locked.repair_policy, str(policy))},
        )
        locked.repair_policy = str(policy)  # one of RepairPolicy's, checked above
        work.cluster_dirty = True
        who = f" by {user.email}" if user else ""
        work.event(
            Reason.REPAIR_POLICY,
            f"Repair policy set to {locked.get_repair_policy_display().lower()}{who}.",
        )
        work.flush()
    return locked


# --- the `auto` policy -------------------------------------------------------------------------


def repairs_today(cluster: Cluster, nodes: list[Node], now: datetime) -> int:
    """The replacements of `cluster` asked for in the last 24 hours."""
    since = now - timedelta(days=1)
    return sum(1 for n in nodes if n.replaces_id is not None and n.reserved_at >= since)


def auto_replaces(cluster: Cluster, nodes: list[Node], node: Node, *, now: datetime) -> bool:
    """Whether the `auto` policy replaces the worker `node`, lost now, at once."""
    return (
        cluster.repair_policy == Cluster.RepairPolicy.AUTO
        and node.index != 0
        and repairs_today(cluster, nodes, now) < settings.RUNCRATE_AUTO_REPAIRS_PER_DAY
    )


def auto_replaces_unhealthy(
    cluster: Cluster, nodes: list[Node], named: list[Node], *, now: datetime
) -> bool:
    """Whether the `auto` policy will replace every machine a new health problem names, once it
    outlasts the grace period: workers only (never node-0), within the daily bound."""
    return (
        cluster.repair_policy == Cluster.RepairPolicy.AUTO
        and bool(named)
        and all(n.index != 0 for n in named)
        and repairs_today(cluster, nodes, now) < settings.RUNCRATE_AUTO_REPAIRS_PER_DAY
    )


def due_for_auto_repair(cluster: Cluster, nodes: list[Node], now: datetime) -> list[str]:
    """The workers the `auto` policy replaces now: lost ones with no live machine under their
    name, and those whose health problems all began more than the grace period ago."""
    grace = timedelta(seconds=settings.RUNCRATE_REPAIR_GRACE_SECONDS)
    live_names = {n.name for n in nodes if n.status in Node.LIVE}
    due = [
        n.name
        for n in nodes
        if n.status == NodeStatus.LOST and n.index != 0 and n.name not in live_names
    ]
    if cluster.status == Status.DEGRADED:
        began: dict[str, datetime] = {}
        for problem in (cluster.health_problems or {}).values():
            since = datetime.fromisoformat(problem.get("since") or now.isoformat())
            name = problem.get("node", "")
            began[name] = min(began.get(name, since), since)
        for node in nodes:
            start = began.get(node.name)
            joined = node.status == NodeStatus.JOINED and node.index != 0
            if joined and start is not None and now - start >= grace:
                due.append(node.name)
    return sorted(set(due), key=lambda name: int(name.removeprefix("node-")))


def auto_repair(*, now: datetime | None = None) -> list[str]:
    """The beat's pass of the `auto` policy over the running clusters that have it; returns
    the replacements it asked for ("cluster/node-2")."""
    now = now or timezone.now()
    asked = []
    clusters = Cluster.objects.filter(
        repair_policy=Cluster.RepairPolicy.AUTO, status__in=policy.RUNNING
    ).filter(Q(status=Status.DEGRADED) | Q(nodes__status=NodeStatus.LOST))
    for cluster in clusters.distinct().order_by("pk"):
        asked += repair_cluster(cluster, now=now)
    return asked


def repair_cluster(cluster: Cluster, *, now: datetime) -> list[str]:
    """Replace what the `auto` policy finds due on `cluster`, within its daily bound."""
    nodes = list(cluster.nodes.all())
    asked = []
    for name in due_for_auto_repair(cluster, nodes, now):
        if repairs_today(cluster, nodes, now) >= settings.RUNCRATE_AUTO_REPAIRS_PER_DAY:
            _tell_once(
                cluster,
                name,
                f"{name} was not replaced automatically: the cluster had "
                f"{settings.RUNCRATE_AUTO_REPAIRS_PER_DAY} machines replaced in the last 24 "
                "hours, the most its repair policy replaces by itself. Replace it from the "
                "Machines tab, or terminate the cluster.",
                now=now,
            )
            break
        try:
            replace_node(cluster=cluster, node_name=name, automatic=True, now=now)
        except ClusterRefused as refused:
            said = f"{name} could not be replaced automatically: {refused.message}"
            _tell_once(cluster, name, said, now=now)
            continue
        asked.append(f"{cluster.pk}/{name}")
        nodes = list(cluster.nodes.all())
    return asked


def _tell_once(cluster: Cluster, name: str, message: str, *, now: datetime) -> None:
    """A `replacement_failed` event (and its email) with `message`, unless the last one about
    `name` said the same: a refusal is told once, not at every beat."""
    with transaction.atomic():
        locked = lock_cluster(cluster.pk)
        if locked is None:
            return
        last = (
            Event.objects.filter(
                cluster=locked, reason=Reason.REPLACEMENT_FAILED, message__startswith=name + " "
            )
            .order_by("-at", "-pk")
            .values_list("message", flat=True)
            .first()
        )
        if last == message:
            return
        work = UnitOfWork.load(locked, now=now)
        node = current_node(work.nodes, name)
        work.event(Reason.REPLACEMENT_FAILED, message, node=node)
        work.flush()


def grace_words() -> str:
    """The `auto` policy's grace period, in words."""
    return in_words(settings.RUNCRATE_REPAIR_GRACE_SECONDS)


__all__ = [
    "HEAD_REFUSAL",
    "ReplacePlan",
    "auto_repair",
    "auto_replaces",
    "auto_replaces_unhealthy",
    "forget_problems",
    "grace_words",
    "node_problem",
    "plan_replace",
    "quarantine",
    "replace_node",
    "replaceable",
    "set_repair_policy",
]
