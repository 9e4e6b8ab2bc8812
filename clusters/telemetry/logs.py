"""Logs and jobs (issue 23, item 6; docs/metrics.md, "Logs and jobs").

Per node, on demand, its logs (what the bootstrap and the installer printed, the agent's log, the
tail of the system log); on the head, what its software says of the jobs (Slurm's queue and
nodes, Ray's jobs and status, Kubernetes' pods). The driver reads them over its own connection
(`Driver.read_logs`, the commands in `clusters.machines.base.log_sources`: none comes from the
user) in a task of the `logs` queue; each text is kept whole up to 256 KB (`NodeLog`), with
the command that produced it and when, until the next fetch of its group replaces it.

At most one fetch per node and group runs, and a new one starts only once the last finished 30
seconds ago (`claim`, one conditional UPDATE): a Logs tab left open polls the jobs every 30 s,
and any number of open tabs cost the head one fetch every 30 s. A fetch that fails (no SSH)
keeps the error beside the texts before it; it never changes the cluster or its nodes.

The host is a tenant's, root on it: the driver reads each fetch against a deadline and a byte cap
of its own (`clusters.machines.ssh.LOG_FETCH_SECONDS`, `LOG_READ_BYTES`), never trusting the host's
`tail`, and at most MAX_RUNNING_PER_CLUSTER fetches of one cluster and MAX_RUNNING_PER_PROJECT of
one project run at once, so one project's hosts can hold only a few of the `logs` worker's threads
and never another customer's work.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import Count, F, Prefetch, Q
from django.utils import timezone

from accounts.models import Project
from clusters.errors import ClusterRefused
from clusters.lifecycle import dispatch
from clusters.machines import get_driver
from clusters.machines.base import JOB_KINDS, NODE_LOG_KINDS, DriverError, LogKind
from clusters.models import Cluster, LogFetch, Node, NodeLog, private_ip
from runcrate.text import visible_controls

log = logging.getLogger(__name__)

# The shortest time between two fetches of one node's group: the jobs panel's refresh.
MIN_INTERVAL = timedelta(seconds=30)
# A fetch asked for this long ago and not finished is taken for lost (a worker that died):
# well past the driver's own bounds (its connection, then LOG_FETCH_SECONDS for the whole read),
# so a fetch still within its deadline is never started again.
LOST_AFTER = timedelta(minutes=5)
# Fetches running at once (asked for, not finished, not lost): per cluster and per project.
MAX_RUNNING_PER_CLUSTER = 2
MAX_RUNNING_PER_PROJECT = 4

Group = LogFetch.Group

TITLES: dict[str, str] = {
    LogKind.BOOTSTRAP: "Bootstrap output",
    LogKind.INSTALL: "Install output",
    LogKind.AGENT: "Agent log",
    LogKind.SYSTEM: "System log",
    LogKind.SLURM_QUEUE: "Slurm queue",
    LogKind.SLURM_NODES: "Slurm nodes",
    LogKind.RAY_JOBS: "Ray jobs",
    LogKind.RAY_STATUS: "Ray status",
    LogKind.KUBERNETES_PODS: "Kubernetes pods",
}


def kinds_for(group: str, cluster: Cluster) -> tuple[LogKind, ...]:
    """What a fetch of `group` reads: a node's logs, or the head's jobs for the cluster's
    software (none for software none)."""
    if group == Group.LOGS:
        return NODE_LOG_KINDS
    return JOB_KINDS.get(cluster.software, ())


def readable(node: Node) -> bool:
    """Whether a node's machine can be read: it is live and holds its host."""
    return node.status in Node.LIVE and node.holds_host and node.host_id is not None


def readable_nodes(cluster: Cluster) -> list[Node]:
    return [n for n in cluster.nodes.select_related("host").order_by("index", "pk") if readable(n)]


def head_of(cluster: Cluster) -> Node | None:
    """node-0, where the software's controller runs, while it can be read."""
    return next((n for n in readable_nodes(cluster) if n.index == 0), None)


def is_running(fetch: LogFetch, now: datetime) -> bool:
    """Asked for, not finished since, and not so long ago that it was lost."""
    if fetch.requested_at is None or fetch.requested_at <= now - LOST_AFTER:
        return False
    return fetch.fetched_at is None or fetch.fetched_at < fetch.requested_at


def fetch_due(fetch: LogFetch, now: datetime) -> bool:
    """`claim`'s rule, for a row already read: none running and the last finished 30 s ago."""
    if is_running(fetch, now):
        return False
    return fetch.fetched_at is None or fetch.fetched_at <= now - MIN_INTERVAL


def claim(fetch: LogFetch, *, now: datetime) -> bool:
    """Mark a fetch asked for, if `fetch_due` holds in the database now: one conditional UPDATE,
    so two requests at once start one fetch."""
    not_running = (
        Q(requested_at__isnull=True)
        | Q(requested_at__lte=now - LOST_AFTER)
        | Q(fetched_at__gte=F("requested_at"))
    )
    quiet = Q(fetched_at__isnull=True) | Q(fetched_at__lte=now - MIN_INTERVAL)
    claimed = LogFetch.objects.filter(not_running & quiet, pk=fetch.pk).update(requested_at=now)
    if claimed:
        fetch.requested_at = now
    return bool(claimed)


def fetch_for(node: Node, group: str) -> LogFetch:
    fetch, _ = LogFetch.objects.get_or_create(node=node, group=group)
    return fetch


def refusal(cluster: Cluster, node: Node | None, group: str) -> str:
    """Why no fetch of `group` can run on `node` at all, or ""."""
    if not cluster.is_live:
        return "This cluster has ended: its machines are gone, and their logs with them."
    if node is None or not readable(node):
        return "That machine is not running: there is nothing to read on it."
    if group == Group.JOBS and node.index != 0:
        return "Jobs are read on the head, node-0."
    if not kinds_for(group, cluster):
        return "This cluster runs no scheduler: there is no job queue to show."
    return ""


def request_fetch(*, cluster: Cluster, node: Node | None, group: str) -> LogFetch:
    """Ask for a fetch of `group` on `node` (a person's Fetch logs): refused, changing nothing,
    while the cluster or machine is not live, while one runs, or within 30 s of the last."""
    why = refusal(cluster, node, group)
    if why:
        raise ClusterRefused("invalid_state", why, status=409)
    assert node is not None
    fetch = fetch_for(node, group)
    now = timezone.now()
    with transaction.atomic():
        busy = busy_refusal(cluster, now=now)
        if busy:
            raise ClusterRefused("logs_fetches_busy", busy, status=409)
        claimed = claim(fetch, now=now)
    if not claimed:
        fetch.refresh_from_db()
        if is_running(fetch, now):
            raise ClusterRefused(
                "logs_fetch_running", f"{node.name}'s {group} are being read now.", status=409
            )
        raise ClusterRefused(
            "logs_fetched_recently",
            f"{node.name}'s {group} were read less than 30 seconds ago: they are shown here.",
            status=409,
        )
    enqueue(fetch)
    return fetch


def refresh_jobs(cluster: Cluster) -> LogFetch | None:
    """The jobs panel's poll: start a fetch of the head's jobs when the last is 30 s old and none
    runs; the head's fetch row either way (None where jobs cannot be read)."""
    head = head_of(cluster)
    if refusal(cluster, head, Group.JOBS):
        return None
    assert head is not None
    fetch = fetch_for(head, Group.JOBS)
    now = timezone.now()
    if fetch_due(fetch, now):
        with transaction.atomic():
            started = not busy_refusal(cluster, now=now) and claim(fetch, now=now)
        if started:
            enqueue(fetch)
    return fetch


def running_fetches(now: datetime) -> Q:
    """The fetches asked for, not finished since, and not lost: `is_running` as a filter."""
    return Q(requested_at__gt=now - LOST_AFTER) & (
        Q(fetched_at__isnull=True) | Q(fetched_at__lt=F("requested_at"))
    )


def busy_refusal(cluster: Cluster, *, now: datetime) -> str:
    """Why no more fetches of `cluster` may start now (its own or its project's running ones
    are at their bound), or "". Called inside a transaction: the project's row is locked first,
    so two requests at once cannot both take the last place."""
    Project.objects.select_for_update().filter(pk=cluster.project_id).first()
    counts = LogFetch.objects.filter(
        running_fetches(now), node__cluster__project_id=cluster.project_id
    ).aggregate(
        project=Count("pk"),
        cluster=Count("pk", filter=Q(node__cluster_id=cluster.pk)),
    )
    if counts["cluster"] >= MAX_RUNNING_PER_CLUSTER:
        return (
            f"{counts['cluster']} reads of this cluster's machines are running; start another "
            "once one has finished (each ends within two minutes)."
        )
    if counts["project"] >= MAX_RUNNING_PER_PROJECT:
        return (
            f"{counts['project']} reads of this project's machines are running; start another "
            "once one has finished (each ends within two minutes)."
        )
    return ""


def enqueue(fetch: LogFetch) -> None:
    """The task, once the claim is committed; a broker that cannot take it ends the fetch with
    that error at once (it is not left running)."""

    def send() -> None:
        fetch_logs = dispatch.task("fetch_logs")
        if not dispatch.publish(f"the logs fetch {fetch.pk}", lambda: fetch_logs.delay(fetch.pk)):
            LogFetch.objects.filter(pk=fetch.pk).update(
                fetched_at=timezone.now(),
                error="The dashboard could not queue the fetch (its task queue is away); "
                "try again shortly.",
            )

    transaction.on_commit(send)


def run_fetch(*, fetch_id: int) -> bool:
    """Read the fetch's texts through the node's driver (slow: outside any transaction), then
    write them back in one transaction, the fetch row locked. A driver error is kept as the
    fetch's error. True when texts were read. Safe twice: the second read replaces the first."""
    try:
        row = LogFetch.objects.select_related("node__cluster", "node__host").get(pk=fetch_id)
    except LogFetch.DoesNotExist:
        return False
    node, cluster = row.node, row.node.cluster
    why = refusal(cluster, node, row.group)
    kinds = kinds_for(row.group, cluster)
    texts = []
    if not why:
        head_ip = private_ip(0)  # the head's private address: the plan's, never input
        try:
            texts = get_driver(node.reserved_host).read_logs(node, kinds=kinds, head_ip=head_ip)
        except DriverError as error:
            why = error.message
    now = timezone.now()
    with transaction.atomic():
        locked = LogFetch.objects.select_for_update().filter(pk=fetch_id).first()
        if locked is None:
            return False
        if why:
            locked.error = why
        else:
            locked.error = ""
            locked.texts.all().delete()
            NodeLog.objects.bulk_create(
                NodeLog(
                    fetch=locked, kind=t.kind, command=t.command, output=t.output, fetched_at=now
                )
                for t in texts
            )
        locked.fetched_at = now
        locked.save(update_fields=["error", "fetched_at"])
    if why:
        log.info("logs fetch %s of node %s: %s", fetch_id, node.pk, why)
    return not why


# --- what the tab shows -------------------------------------------------------------------------


@dataclass(frozen=True)
class Text:
    """A kept text as the tab shows it."""

    log: NodeLog
    title: str
    slug: str

    @property
    def shown(self) -> str:
        """The text with its control characters made visible (ESC as ␛: runcrate.text
        `visible_controls`): what the host printed is shown, never replayed. The download
        gives the same, or the raw text with `?raw=1`."""
        return visible_controls(self.log.output)


@dataclass(frozen=True)
class Panel:
    """One node's group as the tab shows it: its texts, when, the last error, whether a fetch
    runs, and whether another may start now."""

    node: Node
    group: str
    texts: list[Text]
    fetch: LogFetch | None
    running: bool
    due: bool

    @property
    def fetched_at(self) -> datetime | None:
        return self.fetch.fetched_at if self.fetch else None

    @property
    def error(self) -> str:
        return self.fetch.error if self.fetch else ""


def panel(node: Node, group: str, *, now: datetime | None = None) -> Panel:
    """What the tab shows of `node`'s `group`: two queries (the fetch row, its texts)."""
    now = now or timezone.now()
    row = (
        LogFetch.objects.filter(node=node, group=group)
        .prefetch_related(Prefetch("texts", queryset=NodeLog.objects.order_by("pk")))
        .first()
    )
    texts = [
        Text(log=t, title=TITLES.get(t.kind, t.kind), slug=f"{node.name}-{t.kind}")
        for t in (row.texts.all() if row else [])
    ]
    return Panel(
        node=node,
        group=group,
        texts=texts,
        fetch=row,
        running=bool(row and is_running(row, now)),
        due=row is None or fetch_due(row, now),
    )


def pick(nodes: list[Node], name: str | None) -> Node | None:
    """The node the tab shows: the one named (among the cluster's readable `nodes` only),
    else the head, else the first readable one."""
    by_name = {n.name: n for n in nodes}
    if name and name in by_name:
        return by_name[name]
    return nodes[0] if nodes else None


def tab_context(cluster: Cluster, *, node_name: str | None = None) -> dict[str, Any]:
    """What the Logs & jobs tab shows: the node picker, the picked node's logs and the head's
    jobs (for a live cluster); an ended one says so."""
    if not cluster.is_live:
        return {"logs_live": False}
    nodes = readable_nodes(cluster)
    picked = pick(nodes, node_name)
    head = next((n for n in nodes if n.index == 0), None)
    jobs_kinds = kinds_for(Group.JOBS, cluster)
    return {
        "logs_live": True,
        "logs_nodes": nodes,
        "logs_panel": panel(picked, Group.LOGS) if picked else None,
        "jobs_panel": panel(head, Group.JOBS) if head and jobs_kinds else None,
        "jobs_software": cluster.get_software_display(),
        "jobs_none": not jobs_kinds,
        "jobs_poll_seconds": int(MIN_INTERVAL.total_seconds()),
    }
