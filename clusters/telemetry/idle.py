"""The idle notice (issue 23, item 5; docs/metrics.md "The idle notice"): a ready cluster whose
GPUs all do nothing is told so, once per idle period. Nothing is stopped, nothing is billed
differently: the user decides.

Every minute the beat (`clusters.tasks.notice_idle_gpus`) calls `notice_idle`, which judges every
ready or degraded cluster at once from the stored samples, in a fixed number of queries:

- a cluster is **idle** when, over the last RUNCRATE_IDLE_GPU_MINUTES, no GPU of its joined
  machines reported a utilisation at or above RUNCRATE_IDLE_GPU_PERCENT, every one of those
  machines reported in (nearly) every minute of it (a cluster whose agents stopped reporting is
  not idle: nothing says what its GPUs do), and it was ready for all of it. The raw samples
  answer for the last hour, the minute rollups' `utilization_max` beyond it;
- the first run that finds it idle sets `idle_since` (the end of the last busy sample it sees,
  or the cluster's ready time, or the oldest sample it reads) and writes one `gpus_idle` event,
  which sends the "idle" email;
- a run that sees a sample at or above the threshold after `idle_since` clears it with a
  `gpus_busy` event (no email). Idle again later is a new period: a new event and email.

The events are written by the lifecycle's unit of work on the locked cluster, as every event
is, so the cluster's version moves and the page's poll shows them. `notice_text` says the
banner's words (the page, the API), `idle_words` the event's.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.db import transaction
from django.db.models import Count, Max, Prefetch, Q
from django.db.models.functions import Trunc
from django.utils import timezone

from clusters import policy
from clusters.lifecycle.rules import lock_cluster
from clusters.lifecycle.unit import UnitOfWork, read_nodes
from clusters.models import Cluster, Event, GpuRollup, GpuSample, Node, Resolution
from clusters.telemetry.metrics import RAW_KEEP
from runcrate.durations import span
from runcrate.money import usd

WATCHED = policy.RUNNING  # ready or degraded (clusters/policy.py)
MINUTE = timedelta(minutes=1)
# Minutes of the period a machine's reports may miss and the period still count as covered:
# the two at its ends, which the period only partly holds (the current one may have no report
# yet). A machine silent for longer says nothing about its GPUs.
MISSED_MINUTES = 2


@dataclass(frozen=True)
class Reading:
    """What one node's samples say over the period read (`read_samples`): the minutes of the
    idle period it reported a utilisation in, and when it last reported one at or above the
    threshold (None: not in what was read)."""

    minutes: int = 0
    last_busy: datetime | None = None


@dataclass(frozen=True)
class Period:
    """The times one run judges: the idle period (`start`…`now`), the oldest time it reads
    (`lookback`: the raw hour, or the period where that is longer) and where the raw samples
    take over from the minute rollups (`raw_from`)."""

    now: datetime
    start: datetime
    lookback: datetime
    raw_from: datetime

    @classmethod
    def at(cls, now: datetime, *, minutes: float) -> Period:
        start = now - timedelta(minutes=minutes)
        # The raw rows of whole minutes still within the hour they are kept (older ones may be
        # pruned already; their minutes are rolled up by then).
        raw_from = _minute(now) - (RAW_KEEP - MINUTE)
        return cls(now=now, start=start, lookback=min(raw_from, _minute(start)), raw_from=raw_from)

    @property
    def minutes_needed(self) -> int:
        """The minutes of the period each machine must have reported in."""
        buckets = int((_minute(self.now) - _minute(self.start)) / MINUTE) + 1
        return max(1, buckets - MISSED_MINUTES)


def _minute(at: datetime) -> datetime:
    return at.replace(second=0, microsecond=0)


def read_samples(period: Period, *, percent: float) -> dict[int, Reading]:
    """Each joined node of a ready or degraded cluster's `Reading`, by node id: one aggregate
    over the raw samples and, when the period reaches back past them, one over the minute
    rollups, for every node at once."""
    nodes = Q(node__status=Node.Status.JOINED, node__cluster__status__in=WATCHED)
    readings: dict[int, Reading] = {}
    raw = (
        GpuSample.objects.filter(nodes, at__gte=period.raw_from, at__lte=period.now)
        .values("node_id")
        .annotate(
            minutes=Count(
                Trunc("at", "minute", tzinfo=UTC),
                distinct=True,
                filter=Q(at__gte=period.start, utilization_percent__isnull=False),
            ),
            last_busy=Max("at", filter=Q(utilization_percent__gte=percent)),
        )
        .values_list("node_id", "minutes", "last_busy")
    )
    for node_id, minutes, last_busy in raw:
        readings[node_id] = Reading(minutes, last_busy)
    if period.lookback >= period.raw_from:
        return readings
    rolled = (
        GpuRollup.objects.filter(
            nodes,
            resolution=Resolution.MINUTE,
            start__gte=period.lookback,
            start__lt=period.raw_from,
        )
        .values("node_id")
        .annotate(
            minutes=Count(
                "start",
                distinct=True,
                filter=Q(start__gte=_minute(period.start), utilization_max__isnull=False),
            ),
            last_busy=Max("start", filter=Q(utilization_max__gte=percent)),
        )
        .values_list("node_id", "minutes", "last_busy")
    )
    for node_id, minutes, last_busy in rolled:
        known = readings.get(node_id, Reading())
        # A busy minute was busy until its end, as far as the rollup says; the raw samples,
        # later, win when they have one.
        busy = known.last_busy or (last_busy + MINUTE if last_busy else None)
        readings[node_id] = Reading(known.minutes + minutes, busy)
    return readings


@dataclass(frozen=True)
class Verdict:
    """What the samples say of one cluster: idle since `since`, busy again, or neither."""

    idle_since: datetime | None = None
    busy: bool = False


def judge(
    cluster: Cluster, nodes: Iterable[Node], readings: dict[int, Reading], period: Period
) -> Verdict:
    """One cluster's `Verdict`, in plain Python over what `read_samples` read."""
    joined = [n for n in nodes if n.status == Node.Status.JOINED]
    if not joined:
        return Verdict()
    found = [readings.get(n.pk, Reading()) for n in joined]
    busy_times = [r.last_busy for r in found if r.last_busy is not None]
    last_busy = max(busy_times, default=None)
    if cluster.idle_since is not None:
        return Verdict(busy=last_busy is not None and last_busy > cluster.idle_since)
    ready_at = cluster.ready_at or cluster.joined_at
    if ready_at is None or ready_at > period.start:
        return Verdict()  # not ready for the whole period
    if last_busy is not None and last_busy > period.start:
        return Verdict()
    if any(r.minutes < period.minutes_needed for r in found):
        return Verdict()  # a machine's reports do not cover the period
    return Verdict(idle_since=max(last_busy or period.lookback, ready_at, period.lookback))


def notice_idle(*, now: datetime | None = None) -> int:
    """Tell the ready clusters whose GPUs all stayed idle long enough (one `gpus_idle` event and
    email per idle period) and mark those working again (`gpus_busy`); returns how many clusters
    changed. Reads every cluster at once in four queries (the clusters, their live machines, the
    raw samples' and the rollups' aggregates) and clears `idle_since` of the clusters no longer
    ready or degraded in one more; a cluster that changes costs its own locked write."""
    now = now or timezone.now()
    percent = settings.RUNCRATE_IDLE_GPU_PERCENT
    period = Period.at(now, minutes=settings.RUNCRATE_IDLE_GPU_MINUTES)
    # An idle period ends with the cluster (terminated, stopped, failed, installing again).
    Cluster.objects.filter(idle_since__isnull=False).exclude(status__in=WATCHED).update(
        idle_since=None
    )
    clusters = list(
        Cluster.objects.filter(status__in=WATCHED)
        .select_related("machine_type")
        .prefetch_related(Prefetch("nodes", queryset=Node.objects.filter(status__in=Node.LIVE)))
    )
    if not clusters:
        return 0
    readings = read_samples(period, percent=percent)
    changed = 0
    for cluster in clusters:
        verdict = judge(cluster, cluster.nodes.all(), readings, period)
        if verdict.idle_since is not None or verdict.busy:
            changed += _write(cluster.pk, verdict, seen=cluster.idle_since, now=now)
    return changed


def _write(cluster_id: int, verdict: Verdict, *, seen: datetime | None, now: datetime) -> int:
    """The verdict written on the locked cluster, unless it changed since it was read (another
    run, or the cluster left ready or degraded): the idle period's start and its event, or its
    end and its event. Returns 1 when written."""
    with transaction.atomic():
        cluster = lock_cluster(cluster_id)
        if cluster is None or cluster.status not in WATCHED or cluster.idle_since != seen:
            return 0
        work = UnitOfWork(cluster=cluster, nodes=read_nodes(cluster), now=now)
        if verdict.idle_since is not None:
            cluster.idle_since = verdict.idle_since
            words = notice_text(cluster, nodes=work.nodes, now=now)
            work.event(
                Event.Reason.GPUS_IDLE,
                f"{words}. Nothing is stopped: its machines keep running "
                "and billed until you terminate the cluster.",
            )
        else:
            cluster.idle_since = None
            work.event(Event.Reason.GPUS_BUSY, "The GPUs work again: the idle notice is over.")
        work.cluster_dirty = True
        work.flush()
    return 1


def idle_words(*, gpus: int, idle_for: timedelta, price_per_hour: Decimal) -> str:
    """ "32 GPUs idle for 45 min, costing $95.68 per hour"."""
    plural = "" if gpus == 1 else "s"
    return f"{gpus} GPU{plural} idle for {span(idle_for)}, costing {usd(price_per_hour)} per hour"


def notice_text(
    cluster: Cluster, *, nodes: Iterable[Node] | None = None, now: datetime | None = None
) -> str:
    """The idle notice's words while the cluster is idle ("" otherwise): its GPUs, how long, and
    what they cost an hour, priced as the page's header prices it (the machines up). `nodes`
    are the cluster's (read here when not given)."""
    if cluster.idle_since is None or cluster.status not in WATCHED:
        return ""
    nodes = list(cluster.nodes.all() if nodes is None else nodes)
    machines = cluster.machines_priced(Cluster.machines_up_in(nodes))
    now = now or timezone.now()
    return idle_words(
        gpus=machines * cluster.machine_type.gpus_per_machine,
        idle_for=now - cluster.idle_since,
        price_per_hour=cluster.price_per_hour(machines),
    )
