"""GPU and node metrics (issue 23; docs/metrics.md): what the agents report, kept to last and
cheap to write.

Every RUNCRATE_METRICS_SECONDS the agent of a live node of a ready or degraded cluster posts
a report (`record`): one raw row per GPU and one for the node, written in at most three queries
whatever the GPU count. The beat rolls the raw rows up per minute, and the minutes per hour
(`roll_up`: min, mean and max of each charted figure, and the number of samples), one
INSERT … SELECT per rollup over every node at once, and prunes what has outlived its keep
(`prune`): raw rows after an hour, minutes after 14 days, hours after 90 days. `window` reads a
cluster's latest figures and the series of a window in a fixed number of queries.

A report's time is the server's clock when it arrives, never the agent's: a node whose clock is
wrong still lands in the right bucket.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.db import connection, models
from django.db.models import Avg, Case, Count, F, Max, Min, Q, Sum, Value, When
from django.db.models.expressions import RawSQL
from django.db.models.functions import Cast, Coalesce, Greatest, Trunc
from django.utils import timezone

from clusters import policy
from clusters.models import (
    Cluster,
    GpuRollup,
    GpuSample,
    Node,
    NodeRollup,
    NodeSample,
    Resolution,
)
from clusters.telemetry import health as node_health
from clusters.telemetry.agent_service import AgentRefused, ReportingNode, reporting_node
from runcrate.sql import insert_rows

RAW_KEEP = timedelta(hours=1)
MINUTES_KEEP = timedelta(days=14)
HOURS_KEEP = timedelta(days=90)
# A report holds at most this many GPUs, so its GPU rows are one INSERT on every database
# (SQLite's 999 bound parameters at 15 columns a row).
MAX_GPUS = 64

# The throttle reasons nvidia-smi names (`clocks_throttle_reasons.*`, `clocks_event_reasons.*`),
# each a bit of `GpuSample.throttle`, in this order. A name not listed is ignored: a newer
# driver's reason must not cost the report.
THROTTLE_REASONS = (
    "gpu_idle",
    "applications_clocks_setting",
    "sw_power_cap",
    "hw_slowdown",
    "sync_boost",
    "sw_thermal_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
)
_THROTTLE_BIT = {name: 1 << bit for bit, name in enumerate(THROTTLE_REASONS)}

_INT_LIMIT = 2**31 - 1  # a PositiveIntegerField on every database
_BIG_LIMIT = 2**63 - 1  # a PositiveBigIntegerField


def recording(*, cluster_status: str, node_status: str) -> bool:
    """Whether a node's reports are kept: a live node of a ready or degraded cluster. The
    check-in's `metrics_seconds` asks the same, so an agent sends only what is kept."""
    return policy.is_running(cluster_status) and node_status in Node.LIVE


def metrics_seconds(cluster: Cluster, node: Node) -> int | None:
    """How often `node`'s agent sends a report (its check-in's answer), or None: not now."""
    if recording(cluster_status=cluster.status, node_status=node.status):
        return settings.RUNCRATE_METRICS_SECONDS
    return None


# --- a report, checked ------------------------------------------------------------------------


class _Invalid(Exception):
    pass


@dataclass(frozen=True)
class _Number:
    """One figure of a report: its range, and whether it must be whole."""

    low: float
    high: float
    whole: bool = False


# Every figure a report may carry and its range. A figure out of range refuses the whole report
# (422, naming it) rather than being clamped: a figure outside what the hardware can show means
# the agent misread its source, and a clamped one would be a plausible-looking lie on a chart.
GPU_FIGURES: dict[str, _Number] = {
    "utilization_percent": _Number(0, 100),
    "memory_used_mib": _Number(0, _INT_LIMIT, whole=True),
    "memory_total_mib": _Number(0, _INT_LIMIT, whole=True),
    "temperature_c": _Number(-50, 200),
    "power_w": _Number(0, 100_000),
    "power_limit_w": _Number(0, 100_000),
    "sm_clock_mhz": _Number(0, 100_000, whole=True),
    "ecc_corrected": _Number(0, _BIG_LIMIT, whole=True),
    "ecc_uncorrected": _Number(0, _BIG_LIMIT, whole=True),
}
GPU_FLAGS = ("retired_pages_pending", "remapped_rows_pending")
NODE_FIGURES: dict[str, _Number] = {
    "cpu_percent": _Number(0, 100),
    "memory_used_mib": _Number(0, _INT_LIMIT, whole=True),
    "memory_total_mib": _Number(0, _INT_LIMIT, whole=True),
    "disk_root_used_gib": _Number(0, 1e12),
    "disk_root_total_gib": _Number(0, 1e12),
    "disk_shared_used_gib": _Number(0, 1e12),
    "disk_shared_total_gib": _Number(0, 1e12),
    "network_rx_bytes": _Number(0, _BIG_LIMIT, whole=True),
    "network_tx_bytes": _Number(0, _BIG_LIMIT, whole=True),
}


def _figure(where: str, value: Any, rule: _Number) -> float | int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _Invalid(f"{where} must be a number or absent, not {value!r}.")
    if not math.isfinite(value) or not rule.low <= value <= rule.high:
        raise _Invalid(f"{where} must be between {rule.low:g} and {rule.high:g}, not {value!r}.")
    if rule.whole:
        if value != int(value):
            raise _Invalid(f"{where} must be a whole number, not {value!r}.")
        return int(value)
    return float(value)


def _throttle(where: str, value: Any) -> int | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(name, str) for name in value):
        raise _Invalid(f"{where} must be a list of throttle reasons (strings) or absent.")
    mask = 0
    for name in value:
        mask |= _THROTTLE_BIT.get(name, 0)
    return mask


def clean_report(report: Any) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """A report as the agent sends it (docs/metrics.md), checked: its GPUs' rows and the node's
    row, as model fields. Refused (AgentRefused invalid_report, 422) with what is wrong; a
    field the report does not know is ignored, a figure absent or null is stored as null."""
    try:
        return _clean(report)
    except _Invalid as invalid:
        raise AgentRefused("invalid_report", str(invalid)) from None


def _clean(report: Any) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    if not isinstance(report, dict):
        raise _Invalid("The report must be an object with gpus and node.")
    gpus = report.get("gpus")
    if gpus is None:
        gpus = []
    if not isinstance(gpus, list) or not all(isinstance(gpu, dict) for gpu in gpus):
        raise _Invalid("gpus must be a list of objects.")
    if len(gpus) > MAX_GPUS:
        raise _Invalid(f"gpus lists {len(gpus)} GPUs; a node has at most {MAX_GPUS}.")
    rows, seen = [], set()
    for position, gpu in enumerate(gpus):
        where = f"gpus[{position}]"
        index = gpu.get("index")
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < MAX_GPUS:
            raise _Invalid(f"{where}.index must be a whole number from 0 to {MAX_GPUS - 1}.")
        if index in seen:
            raise _Invalid(f"{where}.index {index} is listed twice.")
        seen.add(index)
        row: dict[str, Any] = {"index": index}
        for name, rule in GPU_FIGURES.items():
            row[name] = _figure(f"{where}.{name}", gpu.get(name), rule)
        for name in GPU_FLAGS:
            flag = gpu.get(name)
            if flag is not None and not isinstance(flag, bool):
                raise _Invalid(f"{where}.{name} must be true, false or absent.")
            row[name] = flag
        row["throttle"] = _throttle(f"{where}.throttle", gpu.get("throttle"))
        rows.append(row)
    node = report.get("node")
    if node is None:
        return rows, None
    if not isinstance(node, dict):
        raise _Invalid("node must be an object or absent.")
    host = {name: _figure(f"node.{name}", node.get(name), r) for name, r in NODE_FIGURES.items()}
    return rows, host


def throttle_names(mask: int | None) -> list[str] | None:
    """The reasons a stored bitmask holds, in THROTTLE_REASONS' order (None: none were read)."""
    if mask is None:
        return None
    return [name for name, bit in _THROTTLE_BIT.items() if mask & bit]


# --- recording a report -------------------------------------------------------------------------


def record(*, node_id: int, token: str, report: Any) -> int | None:
    """Keep what `node_id`'s agent reported; returns the seconds until its next report (the
    endpoint's `metrics_seconds`), or None when nothing is kept (its cluster is not ready or
    degraded, or the node not live): the agent then waits for its check-in to say when.

    Four queries at most, whatever the GPU count, and no BEGIN or COMMIT besides: the node
    and its token (the check-in's refusals: a wrong token, an unknown or released node), the
    node's pace (`take_report`: a report sooner than the agent was told to send it is refused,
    429), one insert of the GPU rows, one of the node's. A report it cannot read, or naming
    GPUs the machine does not have, is refused before anything is written."""
    gpus, host = clean_report(report)
    sender = reporting_node(node_id, token)
    if not recording(cluster_status=sender.cluster_status, node_status=sender.node_status):
        return None
    check_gpu_indexes(gpus, machine_gpus=sender.machine_gpus)
    at = timezone.now()
    take_report(sender.node_id, now=at)
    store(sender.node_id, sender.cluster_id, gpus=gpus, host=host, at=at)
    judge_gpu_health(sender, gpus, at=at)
    return settings.RUNCRATE_METRICS_SECONDS


def check_gpu_indexes(gpus: list[dict[str, Any]], *, machine_gpus: int) -> None:
    """Refuse (invalid_report, 422) a report naming a GPU the machine does not have: more GPUs
    than its machine type's `gpus_per_machine`, or an index outside 0 … that count - 1. Its
    figures would otherwise be judged as this node's GPUs' health (fake ECC errors of GPU 63
    on a 2-GPU node degrading the cluster)."""
    if len(gpus) > machine_gpus:
        raise AgentRefused(
            "invalid_report",
            f"gpus lists {len(gpus)} GPUs; this machine has {machine_gpus}.",
        )
    foreign = sorted(gpu["index"] for gpu in gpus if gpu["index"] >= machine_gpus)
    if foreign:
        raise AgentRefused(
            "invalid_report",
            f"gpus names GPU {', '.join(map(str, foreign))}; this machine's GPUs are numbered "
            f"0 to {machine_gpus - 1}.",
        )


# A node's agent may send this many reports in a row sooner than its interval (a report sent
# late and the next on time, an agent restarted) before it must keep to the interval.
METRICS_BURST = 3


class TooManyReports(AgentRefused):
    """A metrics report sooner than the node's pace allows (429); `retry_after` is the whole
    seconds until one is taken again."""

    def __init__(self, retry_after: int) -> None:
        super().__init__(
            "too_many_reports",
            f"This node reports more often than every {settings.RUNCRATE_METRICS_SECONDS} s; "
            f"send the next report in {retry_after} s.",
        )
        self.retry_after = retry_after


def take_report(node_id: int, *, now: datetime) -> None:
    """Count one report of `node_id` against its pace, or refuse it (TooManyReports): at most
    METRICS_BURST reports at once, then one every RUNCRATE_METRICS_SECONDS (the interval its
    agent is told), however many arrive at once. A generic cell rate: `Node.metrics_paced_until`
    moves on by one interval with each report taken, and a report is taken while it is at most
    METRICS_BURST - 1 intervals ahead of now. One conditional UPDATE, so two reports arriving
    together cannot both take the last place; a refused one reads the row once more, for its
    Retry-After, and stores nothing."""
    interval = timedelta(seconds=settings.RUNCRATE_METRICS_SECONDS)
    latest = now + interval * (METRICS_BURST - 1)
    taken = (
        Node.objects.filter(pk=node_id)
        .filter(Q(metrics_paced_until__isnull=True) | Q(metrics_paced_until__lte=latest))
        .update(
            metrics_paced_until=Greatest(Coalesce("metrics_paced_until", Value(now)), Value(now))
            + Value(interval)
        )
    )
    if taken:
        return
    paced_until = (
        Node.objects.filter(pk=node_id).values_list("metrics_paced_until", flat=True).first()
    )
    wait = (paced_until - latest).total_seconds() if paced_until is not None else 1
    raise TooManyReports(retry_after=max(math.ceil(wait), 1))


def judge_gpu_health(sender: ReportingNode, gpus: list[dict[str, Any]], *, at: datetime) -> None:
    """The report's GPU health (clusters/telemetry/health.py, docs/metrics.md "GPU health"),
    judged only when there may be something to say: the report shows a condition, the node has
    one kept, or its cluster has a GPU problem of it open. A healthy report of a healthy node
    costs no query; only a joined node is judged (a joining worker's GPUs are not in use yet)."""
    if sender.node_status != Node.Status.JOINED:
        return
    named = [{**gpu, "throttle": throttle_names(gpu["throttle"])} for gpu in gpus]
    conditions = node_health.gpu_conditions(named, accepted=sender.accepted_gpus)
    if conditions or sender.gpu_health or sender.gpu_problems_open:
        node_health.judge_gpu_report(
            node_id=sender.node_id,
            cluster_id=sender.cluster_id,
            token_hash=sender.token_hash,
            conditions=conditions,
            now=at,
        )


def store(
    node_id: int,
    cluster_id: int,
    *,
    gpus: list[dict[str, Any]],
    host: dict[str, Any] | None,
    at: datetime,
) -> None:
    """Write one report's rows (as `clean_report` gives them) for `node_id` at `at`, and move
    its cluster's metrics version: the agent's report (`record`) and the simulated data center's
    figures (`clusters.telemetry.simulated_metrics`) alike. Two queries, none when there is
    nothing."""
    # Two statements, each committing on its own: a transaction around them would cost a BEGIN
    # and a COMMIT, two round trips more than the three; so would bulk_create, which wraps
    # even one INSERT in its own transaction, hence the one INSERT it would send, sent bare
    # (runcrate/sql.py `insert_rows`). Each insert is whole; should the second fail, the
    # report's GPU rows stand without its node's row, as a report without `node` would.
    if gpus:
        insert_rows([GpuSample(node_id=node_id, at=at, **row) for row in gpus])
    if host is not None:
        NodeSample.objects.create(node_id=node_id, at=at, **host)
    bump_metrics_version(cluster_id)


@dataclass(frozen=True)
class Report:
    """One node's report as `store_many` takes it: what `clean_report` gives, and whose."""

    node_id: int
    cluster_id: int
    gpus: list[dict[str, Any]]
    host: dict[str, Any] | None


# The most parameters one INSERT of `store_many` sends (PostgreSQL takes 65,535): a GPU row has
# about 15 columns, so 2,000 rows a statement, 250 8-GPU nodes.
STORE_PARAMETERS = 30_000


def store_many(reports: Sequence[Report], *, at: datetime) -> None:
    """Write many nodes' reports at `at` (the simulated data center's run, a push gateway's
    batch) in a fixed number of queries whatever the node count: one bare INSERT of every GPU
    row and one of every node row (`store`'s two, shared; a batch past STORE_PARAMETERS takes
    one more statement per that many parameters), and each cluster's metrics version moved
    once (the cache, no query). What `store` does for one report, for all of them."""
    gpu_rows = [
        GpuSample(node_id=report.node_id, at=at, **row) for report in reports for row in report.gpus
    ]
    host_rows = [
        NodeSample(node_id=report.node_id, at=at, **report.host)
        for report in reports
        if report.host is not None
    ]
    for rows in (gpu_rows, host_rows):
        if not rows:
            continue
        columns = len(type(rows[0])._meta.concrete_fields)
        step = max(STORE_PARAMETERS // columns, 1)
        for start in range(0, len(rows), step):
            insert_rows(rows[start : start + step])
    for cluster_id in sorted({report.cluster_id for report in reports}):
        bump_metrics_version(cluster_id)


def _version_key(cluster_id: int) -> str:
    return f"clusters:metrics-version:{cluster_id}"


def bump_metrics_version(cluster_id: int) -> None:
    """Mark that the cluster's metrics changed, for the pages' poll (not the cluster's
    `version`: a sample is no change of the cluster). In the cache, not the database: a report
    writes no row of the cluster. A version the cache lost starts again from the clock in
    milliseconds, so it never goes back to a value a page has already seen."""
    key = _version_key(cluster_id)
    try:
        cache.incr(key)
    except ValueError:  # not there (yet, or any more)
        if not cache.add(key, int(time.time() * 1000), timeout=None):
            cache.incr(key)  # another report made it meanwhile


def metrics_version(cluster_id: int) -> int:
    """The cluster's metrics version (0 before its first report): a poll that saw another
    redraws its charts."""
    return int(cache.get(_version_key(cluster_id), 0))


# --- rollups and pruning (the beat) ------------------------------------------------------------


def _span(figure: str, name: str) -> dict[str, Any]:
    return {
        f"{name}_min": Min(figure, output_field=models.FloatField()),
        f"{name}_mean": Avg(figure, output_field=models.FloatField()),
        f"{name}_max": Max(figure, output_field=models.FloatField()),
    }


def _weighted(name: str) -> dict[str, Any]:
    """A span of spans: the lowest min, the highest max, the mean weighted by the samples of
    each bucket that had the figure."""
    mean, had = F(f"{name}_mean"), Case(When(**{f"{name}_mean__isnull": False}, then="samples"))
    return {
        f"{name}_min": Min(f"{name}_min"),
        f"{name}_mean": Sum(mean * F("samples"), output_field=models.FloatField())
        / Cast(Sum(had), models.FloatField()),
        f"{name}_max": Max(f"{name}_max"),
    }


@dataclass(frozen=True)
class _Rollup:
    """What one rollup reads and writes: the rows it groups, per what, and into which table."""

    target: type[models.Model]
    source: Callable[[], models.QuerySet]
    time_field: str
    keys: tuple[str, ...]
    figures: Callable[[], dict[str, Any]]


def _rollups(resolution: int) -> list[_Rollup]:
    if resolution == Resolution.MINUTE:
        return [
            _Rollup(
                GpuRollup,
                GpuSample.objects.all,
                "at",
                ("node_id", "index"),
                lambda: {
                    "samples": Count("id"),
                    **_span("utilization_percent", "utilization"),
                    **_span("memory_used_mib", "memory_used"),
                    **_span("temperature_c", "temperature"),
                    **_span("power_w", "power"),
                },
            ),
            _Rollup(
                NodeRollup,
                NodeSample.objects.all,
                "at",
                ("node_id",),
                lambda: {
                    "samples": Count("id"),
                    **_span("cpu_percent", "cpu"),
                    **_span("memory_used_mib", "memory_used"),
                    "network_rx_bytes": Max("network_rx_bytes"),
                    "network_tx_bytes": Max("network_tx_bytes"),
                },
            ),
        ]
    minutes = Resolution.MINUTE.value
    return [
        _Rollup(
            GpuRollup,
            lambda: GpuRollup.objects.filter(resolution=minutes),
            "start",
            ("node_id", "index"),
            lambda: {
                "samples": Sum("samples"),
                **_weighted("utilization"),
                **_weighted("memory_used"),
                **_weighted("temperature"),
                **_weighted("power"),
            },
        ),
        _Rollup(
            NodeRollup,
            lambda: NodeRollup.objects.filter(resolution=minutes),
            "start",
            ("node_id",),
            lambda: {
                "samples": Sum("samples"),
                **_weighted("cpu"),
                **_weighted("memory_used"),
                "network_rx_bytes": Max("network_rx_bytes"),
                "network_tx_bytes": Max("network_tx_bytes"),
            },
        ),
    ]


def _floor(moment: datetime, resolution: int) -> datetime:
    seconds = int(moment.timestamp()) // resolution * resolution
    return datetime.fromtimestamp(seconds, tz=UTC)


def roll_up(resolution: int, *, now: datetime | None = None) -> int:
    """Roll the finished buckets of `resolution` up (per minute from the raw rows, per hour from
    the minutes) for every node at once; returns the rows written.

    Each table's rollup is two queries: the latest bucket it holds, then one INSERT … SELECT
    … ON CONFLICT DO UPDATE from that bucket's predecessor on (on SQLite and PostgreSQL alike).
    Its last two buckets are computed again, so a report that committed just after a bucket
    was rolled up is counted the next time, and running it twice leaves the same rows."""
    now = now or timezone.now()
    unit = "minute" if resolution == Resolution.MINUTE else "hour"
    finished = _floor(now, resolution)
    written = 0
    for rollup in _rollups(resolution):
        latest = rollup.target._default_manager.filter(resolution=resolution).aggregate(
            at=Max("start")
        )
        source = rollup.source().filter(**{f"{rollup.time_field}__lt": finished})
        if latest["at"] is not None:
            since = latest["at"] - timedelta(seconds=resolution)
            source = source.filter(**{f"{rollup.time_field}__gte": since})
        grouped = (
            source.annotate(bucket=Trunc(rollup.time_field, unit, tzinfo=UTC))
            .values(*rollup.keys, "bucket")
            # Aliased: a rollup's figures are named like the minutes' columns it reads.
            .annotate(**{f"v_{name}": figure for name, figure in rollup.figures().items()})
            .order_by()
        )
        written += _upsert(rollup.target, grouped, resolution=resolution, keys=rollup.keys)
    return written


def _upsert(
    target: type[models.Model], grouped: models.QuerySet, *, resolution: int, keys: tuple[str, ...]
) -> int:
    compiler = grouped.query.get_compiler(connection=connection)
    sql, params = compiler.as_sql()
    # The SELECT's columns, by the names the compiler gave them: the keys and the bucket, then
    # the figures (aliased `v_<column>`). Read, not assumed, so the INSERT names them in order.
    selected = [alias or column.target.attname for column, _, alias in compiler.select]
    assert selected[: len(keys) + 1] == [*keys, "bucket"], selected
    quote = connection.ops.quote_name
    columns = [*keys, "start", *(alias.removeprefix("v_") for alias in selected[len(keys) + 1 :])]
    names = ", ".join(quote(_column(target, c)) for c in columns)
    unique = ", ".join(quote(_column(target, c)) for c in [*keys, "start"])
    updates = ", ".join(f"{quote(c)} = excluded.{quote(c)}" for c in columns[len(keys) + 1 :])
    # `WHERE true`: SQLite reads an ON CONFLICT after a bare FROM as a join's ON otherwise.
    table, resolution_column = quote(target._meta.db_table), quote("resolution")
    statement = f"INSERT INTO {table} ({resolution_column}, {names}) SELECT %s, * FROM ({sql}) AS grouped WHERE true ON CONFLICT ({resolution_column}, {unique}) DO UPDATE SET {updates}"  # noqa: E501, S608 - names are ours (quoted), values are parameters
    with connection.cursor() as cursor:
        cursor.execute(statement, (resolution, *params))
        return max(cursor.rowcount, 0)


def _column(model: type[models.Model], name: str) -> str:
    field = model._meta.get_field(name)
    assert isinstance(field, models.Field) and field.column, name
    return field.column


def prune(*, now: datetime | None = None, raw: bool = True, rollups: bool = True) -> int:
    """Delete what has outlived its keep (raw rows after RAW_KEEP, minutes after MINUTES_KEEP,
    hours after HOURS_KEEP): one DELETE per table and resolution. Returns the rows deleted."""
    now = now or timezone.now()
    deleted = 0
    old: list[models.QuerySet] = []
    if raw:
        old += [GpuSample.objects.filter(at__lt=now - RAW_KEEP)]
        old += [NodeSample.objects.filter(at__lt=now - RAW_KEEP)]
    if rollups:
        for resolution, keep in ((Resolution.MINUTE, MINUTES_KEEP), (Resolution.HOUR, HOURS_KEEP)):
            old += [GpuRollup.objects.filter(resolution=resolution, start__lt=now - keep)]
            old += [NodeRollup.objects.filter(resolution=resolution, start__lt=now - keep)]
    for rows in old:
        # One DELETE each: nothing refers to these rows, so nothing need be collected first.
        deleted += rows._raw_delete(connection.alias)
    return deleted


def roll_up_minutes(*, now: datetime | None = None) -> int:
    """The beat's every minute: finished minutes rolled up from the raw rows, then the raw rows
    older than an hour deleted (after, so none is deleted before it counted)."""
    now = now or timezone.now()
    written = roll_up(Resolution.MINUTE, now=now)
    prune(now=now, raw=True, rollups=False)
    return written


def roll_up_hours(*, now: datetime | None = None) -> int:
    """The beat's every hour: finished hours rolled up from the minutes, then the minutes and
    hours past their keep deleted."""
    now = now or timezone.now()
    written = roll_up(Resolution.HOUR, now=now)
    prune(now=now, raw=False, rollups=True)
    return written


# --- reading a window ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Span:
    """A figure over a bucket: its lowest, mean and highest value (all three the sample's own
    for a raw row); None where no sample had it."""

    min: float | None
    mean: float | None
    max: float | None

    @classmethod
    def of(cls, value: float | None) -> Span:
        return cls(value, value, value)


@dataclass(frozen=True)
class GpuPoint:
    at: datetime  # the sample's time, or its bucket's start
    index: int
    samples: int
    utilization_percent: Span
    memory_used_mib: Span
    temperature_c: Span
    power_w: Span


@dataclass(frozen=True)
class HostPoint:
    at: datetime
    samples: int
    cpu_percent: Span
    memory_used_mib: Span
    network_rx_bytes: int | None  # the cumulative counter (at the bucket's end)
    network_tx_bytes: int | None


@dataclass(slots=True)
class GpuNow:
    """A GPU's figures in its node's latest report (None: not reported, or not read: see
    `latest`'s `columns`). Not frozen: a frozen dataclass sets each field through
    object.__setattr__, six times as long, and a Metrics tab poll makes 512 at 64 × 8 GPUs."""

    index: int
    utilization_percent: float | None
    memory_used_mib: int | None
    memory_total_mib: int | None
    temperature_c: float | None
    power_w: float | None
    power_limit_w: float | None
    sm_clock_mhz: int | None
    throttle: list[str] | None
    ecc_corrected: int | None
    ecc_uncorrected: int | None
    retired_pages_pending: bool | None
    remapped_rows_pending: bool | None


# The GPU rows' columns a GpuNow holds, in its order.
_GPU_NOW = tuple(GpuNow.__dataclass_fields__)


@dataclass(frozen=True)
class HostNow:
    """A node's own figures in its latest report."""

    cpu_percent: float | None
    memory_used_mib: int | None
    memory_total_mib: int | None
    disk_root_used_gib: float | None
    disk_root_total_gib: float | None
    disk_shared_used_gib: float | None
    disk_shared_total_gib: float | None
    network_rx_bytes: int | None
    network_tx_bytes: int | None


@dataclass
class NodeMetrics:
    node: Node
    reported_at: datetime | None = None  # its latest report (within the raw hour), or None
    gpus: list[GpuNow] = field(default_factory=list)
    host: HostNow | None = None
    series: list[GpuPoint] = field(default_factory=list)  # by time, then GPU index
    host_series: list[HostPoint] = field(default_factory=list)


@dataclass(frozen=True)
class Window:
    name: str
    start: datetime
    end: datetime
    resolution_seconds: int  # RUNCRATE_METRICS_SECONDS for raw rows
    nodes: list[NodeMetrics]


# A window, how far back it reads, and from what: raw rows (None) or a rollup's resolution.
# The raw rows for 15 minutes (a point per report); minutes for the hour and the day (60 and
# 1,440 points a GPU; the minute in progress is in the latest figures); hours for the week.
WINDOWS: dict[str, tuple[timedelta, int | None]] = {
    "15m": (timedelta(minutes=15), None),
    "1h": (timedelta(hours=1), Resolution.MINUTE),
    "24h": (timedelta(hours=24), Resolution.MINUTE),
    "7d": (timedelta(days=7), Resolution.HOUR),
}


def fitting_window(cluster: Cluster, *, now: datetime) -> str:
    """The window a cluster's figures are shown in when none was asked for: the smallest of
    WINDOWS that covers its life since it was ready (its figures begin then), so a young
    cluster shows all of its figures; the longest once it outlived them all."""
    since = cluster.ready_at or cluster.created_at
    age = now - since
    for name, (span, _resolution) in WINDOWS.items():
        if age <= span:
            return name
    return next(reversed(WINDOWS))


def window(cluster: Cluster, window: str = "15m", *, now: datetime | None = None) -> Window:
    """The cluster's live nodes, each with its latest figures (GPUs and its own) and the series
    of `window` ("15m", "1h", "24h" or "7d"). Five queries whatever the node count: the nodes
    with the time of their latest report, the latest GPU rows, the latest node rows, the GPU
    series and the node series. A window it does not know is a ValueError."""
    if window not in WINDOWS:
        raise ValueError(f"window must be one of {', '.join(WINDOWS)}, not {window!r}")
    now = now or timezone.now()
    span, resolution = WINDOWS[window]
    start = now - span
    nodes = list(_live_nodes(cluster.pk))
    found = {node.pk: NodeMetrics(node=node) for node in nodes}
    if not nodes:
        return Window(window, start, now, _seconds(resolution), [])
    _latest_figures(nodes, found)
    ids = list(found)
    if resolution is None:
        _raw_series(ids, start, found)
    else:
        _rollup_series(ids, resolution, start, found)
    return Window(window, start, now, _seconds(resolution), list(found.values()))


def latest(
    cluster_id: int, *, now: datetime | None = None, columns: Sequence[str] | None = None
) -> Window:
    """The cluster's live nodes with their latest GPU figures alone, no series and no host
    figures (a window of no length, ending `now`; each node's `reported_at` as in `window`):
    what changes with each report, for the Metrics tab's poll (issue 38). Of each GPU only
    `columns` (GpuNow's fields; its index always) where given, the others None: the heatmaps
    read five of thirteen. One query whatever the node count (`_latest_sql`)."""
    now = now or timezone.now()
    read = set(_GPU_NOW[1:] if columns is None else columns)
    found: dict[int, NodeMetrics] = {}
    with connection.cursor() as cursor:
        cursor.execute(_latest_sql(read), [cluster_id, *sorted(Node.LIVE)])
        rows = cursor.fetchall()
    for node_id, index, status, last_gpus, last_host, *gpu in rows:
        metrics = found.get(node_id)
        if metrics is None:
            # As the ORM makes a node read with `only()`: nothing else set (nor defaulted).
            node = Node.from_db(connection.alias, _NODE_READ, (node_id, cluster_id, index, status))
            times = [_moment(at) for at in (last_gpus, last_host) if at is not None]
            metrics = found[node_id] = NodeMetrics(node=node, reported_at=max(times, default=None))
        if gpu[0] is None:
            continue  # a node with no GPU rows: one row of its own, nothing joined
        if "throttle" in read:
            gpu[_THROTTLE] = throttle_names(gpu[_THROTTLE])
            # SQLite answers a boolean column with 0 or 1 to a raw query.
            for flag in _FLAGS:
                gpu[flag] = None if gpu[flag] is None else bool(gpu[flag])
        metrics.gpus.append(GpuNow(*gpu))
    return Window("", now, now, _seconds(None), list(found.values()))


# What `latest` knows of each node: its name (its index) and its status.
_NODE_READ = ("id", "cluster_id", "index", "status")
# Where a GPU's throttle reasons and its flags are among GpuNow's fields.
_THROTTLE = _GPU_NOW.index("throttle")
_FLAGS = [_GPU_NOW.index(flag) for flag in GPU_FLAGS]


def _latest_sql(read: Collection[str]) -> str:
    """The live nodes of a cluster (its id, then the live statuses, as parameters) by index,
    each with the times of its latest GPU and node rows and its latest GPU rows, as GpuNow's
    fields: those in `read` and the index, NULL for the others (a node with no rows: one row,
    with nulls). One statement, where the ORM took two and a list of (node, time) pairs
    between them, at 64 nodes most of a Metrics tab poll (issue 38). Each node's latest times
    are a MAX over the (node, at) index, once a node: the nodes are a grouped subquery, which
    PostgreSQL does not fold into the outer query, nor SQLite into a join (folded, each MAX
    ran once for every GPU row: 3.5 ms, not 1.1, at 64 × 8); its latest GPU rows are joined
    through the same index on that time. The times come as text, which is read once a node
    (`_moment`), not once a GPU row: 1,024 times parsed at 64 × 8 GPUs were half of the
    Python's work."""
    q = connection.ops.quote_name
    node, gpu = q(Node._meta.db_table), q(GpuSample._meta.db_table)
    figures = "".join(
        f", g.{q(_column(GpuSample, c))}" if c in read else ", NULL" for c in _GPU_NOW[1:]
    )
    live = ", ".join(["%s"] * len(Node.LIVE))
    pk, index, status, node_id, at = (q(c) for c in ("id", "index", "status", "node_id", "at"))
    # The table and column names are the models', quoted; every value is a parameter.
    return (
        f"SELECT n.{pk}, n.{index}, n.{status}, CAST(n.last_gpus AS TEXT), "  # noqa: S608
        f"CAST(n.last_host AS TEXT), g.{index}{figures} "
        f"FROM (SELECT o.{pk}, o.{index}, o.{status}, "
        f"{_latest_at(GpuSample)} AS last_gpus, {_latest_at(NodeSample)} AS last_host "
        f"FROM {node} o WHERE o.{q('cluster_id')} = %s AND o.{status} IN ({live}) "
        f"GROUP BY o.{pk}, o.{index}, o.{status}) n "
        f"LEFT JOIN {gpu} g ON g.{node_id} = n.{pk} AND g.{at} = n.last_gpus "
        f"ORDER BY n.{index}, g.{index}"
    )


def _latest_at(samples: type[GpuSample] | type[NodeSample]) -> str:
    """The time of the latest of `samples`' rows of the node `o` (a node row aliased `o`): a
    MAX over their (node, at) index, once a node (`_latest_sql`, `_utilization_sql`)."""
    q = connection.ops.quote_name
    table, node_id, at = q(samples._meta.db_table), q("node_id"), q("at")
    return f"(SELECT MAX(l.{at}) FROM {table} l WHERE l.{node_id} = o.{q('id')})"  # noqa: S608


def _moment(text: str) -> datetime:
    """A time `_latest_sql` read as text: PostgreSQL's with its offset, SQLite's as it stores
    it (UTC, without one)."""
    moment = datetime.fromisoformat(text)
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _live_nodes(cluster_id: int) -> models.QuerySet[Node]:
    """The cluster's live nodes by index, each with the time of its latest GPU and node rows."""
    latest = GpuSample.objects.filter(node=models.OuterRef("pk")).order_by("-at").values("at")
    latest_host = NodeSample.objects.filter(node=models.OuterRef("pk")).order_by("-at")
    return (
        Node.objects.filter(cluster_id=cluster_id, status__in=Node.LIVE)
        .annotate(
            last_gpus=models.Subquery(latest[:1]),
            last_host=models.Subquery(latest_host.values("at")[:1]),
        )
        .order_by("index")
    )


def _seconds(resolution: int | None) -> int:
    return settings.RUNCRATE_METRICS_SECONDS if resolution is None else int(resolution)


def _pairs(model: type[models.Model], nodes: Sequence[Node], attribute: str) -> RawSQL | None:
    """(node, at) of each node's latest row: `(node_id, at) IN ((…), …)`, each pair read
    through the (node, at) index. Written as SQL: Django builds an OR of 64 Q pairs in several
    milliseconds, the Metrics tab's poll's largest cost at 64 nodes (issue 38)."""
    pairs = [(n.pk, getattr(n, attribute)) for n in nodes if getattr(n, attribute)]
    if not pairs:
        return None
    quote = connection.ops.quote_name
    table = quote(model._meta.db_table)
    values = ", ".join(["(%s, %s)"] * len(pairs))
    sql = f"({table}.{quote('node_id')}, {table}.{quote('at')}) IN ({values})"
    params = [value for pair in pairs for value in pair]
    return RawSQL(sql, params, output_field=models.BooleanField())  # noqa: S611 - our own SQL


def _latest_figures(nodes: Sequence[Node], found: dict[int, NodeMetrics]) -> None:
    """Each node's latest GPU rows and its latest node row."""
    gpus = _pairs(GpuSample, nodes, "last_gpus")
    rows = GpuSample.objects.filter(gpus).order_by("index") if gpus else GpuSample.objects.none()
    throttle = _GPU_NOW.index("throttle")
    last_gpus = {node.pk: getattr(node, "last_gpus", None) for node in nodes}
    # Their time is the node's latest (`last_gpus`): not read again, 512 times at 64 nodes.
    for node_id, *figures in rows.values_list("node_id", *_GPU_NOW):
        metrics = found[node_id]
        metrics.reported_at = last_gpus[node_id]
        figures[throttle] = throttle_names(figures[throttle])
        metrics.gpus.append(GpuNow(*figures))
    pairs = _pairs(NodeSample, nodes, "last_host")
    fields = tuple(HostNow.__dataclass_fields__)
    samples = NodeSample.objects.filter(pairs) if pairs else NodeSample.objects.none()
    for node_id, at, *figures in samples.values_list("node_id", "at", *fields):
        metrics = found[node_id]
        if metrics.reported_at is None or at > metrics.reported_at:
            metrics.reported_at = at
        metrics.host = HostNow(*figures)


def _raw_series(ids: list[int], start: datetime, found: dict[int, NodeMetrics]) -> None:
    gpus = GpuSample.objects.filter(node_id__in=ids, at__gte=start)
    for row in gpus.order_by("node_id", "at", "index").values(
        "node_id", "at", "index", "utilization_percent", "memory_used_mib", "temperature_c",
        "power_w",
    ):  # fmt: skip
        found[row["node_id"]].series.append(
            GpuPoint(
                at=row["at"],
                index=row["index"],
                samples=1,
                utilization_percent=Span.of(row["utilization_percent"]),
                memory_used_mib=Span.of(row["memory_used_mib"]),
                temperature_c=Span.of(row["temperature_c"]),
                power_w=Span.of(row["power_w"]),
            )
        )
    hosts = NodeSample.objects.filter(node_id__in=ids, at__gte=start).order_by("node_id", "at")
    for sample in hosts:
        found[sample.node_id].host_series.append(
            HostPoint(
                at=sample.at,
                samples=1,
                cpu_percent=Span.of(sample.cpu_percent),
                memory_used_mib=Span.of(sample.memory_used_mib),
                network_rx_bytes=sample.network_rx_bytes,
                network_tx_bytes=sample.network_tx_bytes,
            )
        )


def _stored(row: Any, name: str) -> Span:
    low, mean, high = (getattr(row, f"{name}_{part}") for part in ("min", "mean", "max"))
    return Span(low, mean, high)


def _rollup_series(
    ids: list[int], resolution: int, start: datetime, found: dict[int, NodeMetrics]
) -> None:
    since = _floor(start, resolution)
    rows = GpuRollup.objects.filter(node_id__in=ids, resolution=resolution, start__gte=since)
    for row in rows.order_by("node_id", "start", "index"):
        found[row.node_id].series.append(
            GpuPoint(
                at=row.start,
                index=row.index,
                samples=row.samples,
                utilization_percent=_stored(row, "utilization"),
                memory_used_mib=_stored(row, "memory_used"),
                temperature_c=_stored(row, "temperature"),
                power_w=_stored(row, "power"),
            )
        )
    hosts = NodeRollup.objects.filter(node_id__in=ids, resolution=resolution, start__gte=since)
    for host in hosts.order_by("node_id", "start"):
        found[host.node_id].host_series.append(
            HostPoint(
                at=host.start,
                samples=host.samples,
                cpu_percent=_stored(host, "cpu"),
                memory_used_mib=_stored(host, "memory_used"),
                network_rx_bytes=host.network_rx_bytes,
                network_tx_bytes=host.network_tx_bytes,
            )
        )


# --- the pages' small readings: a node row's utilisation, the list's traces ---------------------

# A node whose latest report is older than this many report intervals has stopped reporting:
# its figures are its last, not its current ones (the node row and the Metrics tab say so).
LATE_REPORTS = 3


def reporting(reported_at: datetime | None, *, now: datetime) -> bool:
    """Whether a node's latest report (`reported_at`) is recent enough to be its current one."""
    late = timedelta(seconds=LATE_REPORTS * settings.RUNCRATE_METRICS_SECONDS)
    return reported_at is not None and now - reported_at <= late


@dataclass(frozen=True)
class NodeUtilization:
    """A node's GPUs in its latest report: how many, their mean utilisation (None where none
    had it), and when."""

    gpus: int
    mean_percent: float | None
    reported_at: datetime


def utilization_now(node_ids: Sequence[int]) -> dict[int, NodeUtilization]:
    """Each node's latest report's GPU count and mean utilisation (the node rows'), by node
    id; a node with no raw row in the last hour is absent. One query whatever the nodes
    (`_utilization_sql`)."""
    if not node_ids:
        return {}
    rows = _utilization_rows("id", list(node_ids))
    return {row[0]: found for row in rows if (found := utilization_of(*row[-3:]))}


def nodes_with_utilization(cluster_id: int) -> list[tuple[Node, NodeUtilization | None]]:
    """The cluster's nodes by index (read as `only()` would, with `_NODE_ROW`'s columns), each
    with its latest report's utilisation (None as `utilization_now` leaves one out): the
    Machines tab's poll, in one query whatever the node count (`_utilization_sql`)."""
    found = []
    for *columns, last_at, gpus, mean in _utilization_rows("cluster_id", [cluster_id]):
        node = Node.from_db(connection.alias, _NODE_ROW, columns)
        found.append((node, utilization_of(last_at, gpus, mean)))
    return found


# What `nodes_with_utilization` reads of each node.
_NODE_ROW = ("id", "cluster_id", "index", "replaces_id", "status")


def _utilization_rows(column: str, values: list[int]) -> list[tuple]:
    """`_utilization_sql`'s rows for the nodes whose `column` is one of `values`: each node's
    `_NODE_ROW` columns, then its latest report's time, GPU count and mean utilisation."""
    with connection.cursor() as cursor:
        cursor.execute(_utilization_sql(column, len(values)), values)
        rows = cursor.fetchall()
    return [
        (
            *columns,
            None if last_at is None else _moment(last_at),
            gpus,
            None if mean is None else float(mean),
        )
        for *columns, last_at, gpus, mean in rows
    ]


def _utilization_sql(column: str, count: int) -> str:
    """The nodes whose `column` is one of `count` parameters, by index, each with the time of
    its latest GPU row and that report's row count and mean utilisation. One statement of
    written SQL, where the ORM's three subqueries a node (the latest time asked three times)
    took a Machines tab poll's longest part to compile and run at 64 nodes (issue 38). The
    latest time is a MAX over the (node, at) index once a node, in a grouped subquery that
    neither PostgreSQL nor SQLite folds into the join (as in `_latest_sql`); the report's rows
    are joined by a range on it, not an equality, so the planner reads them through (node,
    at): every node of a simulated run reports at one instant, and an equality led it to the
    (at) index, which holds every node's rows of that instant (18 ms at 64 nodes, not 1)."""
    q = connection.ops.quote_name
    node, gpu = q(Node._meta.db_table), q(GpuSample._meta.db_table)
    columns = ", ".join(f"o.{q(_column(Node, c))}" for c in _NODE_ROW)
    outer = ", ".join(f"n.{q(_column(Node, c))}" for c in _NODE_ROW)
    pk, node_id, at = q("id"), q("node_id"), q("at")
    utilization, where = q(_column(GpuSample, "utilization_percent")), q(_column(Node, column))
    places = ", ".join(["%s"] * count)
    # The table and column names are the models', quoted; every value is a parameter.
    return (
        f"SELECT {outer}, CAST(n.last_at AS TEXT), COUNT(g.{pk}), AVG(g.{utilization}) "  # noqa: S608
        f"FROM (SELECT {columns}, "
        f"{_latest_at(GpuSample)} AS last_at "
        f"FROM {node} o WHERE o.{where} IN ({places}) GROUP BY {columns}) n "
        f"LEFT JOIN {gpu} g ON g.{node_id} = n.{pk} AND g.{at} >= n.last_at "
        f"GROUP BY {outer}, n.last_at ORDER BY n.{q('index')}, n.{pk}"
    )


def utilization_of(
    last_at: datetime | None, gpus: float | None, mean: float | None
) -> NodeUtilization | None:
    """A node's utilisation from `_utilization_rows`'s figures; None without a raw row in the
    last hour (the raw rows are kept that long)."""
    if last_at is None or last_at < timezone.now() - RAW_KEEP:
        return None
    return NodeUtilization(gpus=int(gpus or 0), mean_percent=mean, reported_at=last_at)


@dataclass(frozen=True)
class TracePoint:
    at: datetime  # the minute's start
    percent: float  # the mean of its GPUs' mean utilisation that minute


def utilization_traces(
    cluster_ids: Sequence[int], *, now: datetime | None = None
) -> dict[int, list[TracePoint]]:
    """Each cluster's mean GPU utilisation per minute over the last hour, from the minute
    rollups (the Clusters list's trace), by cluster id; a cluster with none is absent. One
    query whatever the clusters, read through the rollups' (resolution, start) index."""
    if not cluster_ids:
        return {}
    now = now or timezone.now()
    rows = (
        GpuRollup.objects.filter(
            resolution=Resolution.MINUTE,
            start__gte=_floor(now - timedelta(hours=1), Resolution.MINUTE),
            node__cluster_id__in=cluster_ids,
            utilization_mean__isnull=False,
        )
        .values("node__cluster_id", "start")
        .annotate(percent=Avg("utilization_mean"))
        .order_by("node__cluster_id", "start")
    )
    traces: dict[int, list[TracePoint]] = {}
    for row in rows:
        traces.setdefault(row["node__cluster_id"], []).append(
            TracePoint(at=row["start"], percent=row["percent"])
        )
    return traces
