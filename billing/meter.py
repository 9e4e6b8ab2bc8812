"""The meter: turns the seconds machines ran into ledger debits (SPEC §4, docs/billing.md).

Each usage record (one per machine) is charged from `charged_until` up to now, or up to its
`ended_at` once it has ended. Its cost is computed over its whole span, never as a sum of
rounded slices:

    cost(t) = round_half_up(price_per_hour × whole seconds from started_at to t / 3600, 2)

and a charge debits `cost(new) − cost(old)`. So the debits of a record add up to the rounded
cost of its span exactly, whenever and however often the meter ran, and the cost of any window
`[a, b]` of a machine is `cost(b) − cost(a)`: per-machine rows, cluster lines and the ledger
agree to the cent.

A charge is split at clock hours (UTC): the ledger holds one usage line per cluster per hour,
which the meter adds to while that hour runs (the *accumulating* line) and never touches once
the hour is charged to its end. The same debits go to `UsageDay`, a per-cluster, per-day
rollup of those lines that the Billing page reads.

Running it twice, or on two workers at once, charges once: each batch of records is locked
(`SELECT … FOR UPDATE SKIP LOCKED` on PostgreSQL; SQLite takes the write lock at BEGIN), and
a record is only charged past its own `charged_until`.
"""

from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from decimal import ROUND_CEILING, Decimal

from django.db import connection, transaction
from django.db.models import F, Model, Q, QuerySet, Sum
from django.utils import timezone

from billing import balances
from billing.models import LedgerEntry, UsageDay, UsageRecord
from clusters.models import Cluster, Volume

HOUR = timedelta(hours=1)
BATCH_SIZE = 1000


# ---- the rounding rule ----------------------------------------------------------------------


def billed_seconds(started_at: datetime, until: datetime) -> int:
    """Whole seconds from `started_at` to `until` (a started second is not billed)."""
    if until <= started_at:
        return 0
    elapsed = until - started_at
    return elapsed.days * 86_400 + elapsed.seconds


def cost_in_cents(price_per_hour: Decimal, seconds: int) -> int:
    """`price × seconds / 3600` in cents, rounded half up, in exact integer arithmetic."""
    price_cents = int((price_per_hour * 100).to_integral_value())
    return (2 * price_cents * seconds + 3600) // 7200


def cents(amount: int) -> Decimal:
    return Decimal(amount).scaleb(-2)


def cost(price_per_hour: Decimal, seconds: int) -> Decimal:
    return cents(cost_in_cents(price_per_hour, seconds))


def cost_between(record: UsageRecord, start: datetime, end: datetime) -> Decimal:
    """What `record` costs from `start` to `end`: cost(end) − cost(start) of its span."""
    first = billed_seconds(record.started_at, start)
    last = billed_seconds(record.started_at, end)
    if last <= first:
        return Decimal("0.00")
    price = record.price_per_hour
    return cents(cost_in_cents(price, last) - cost_in_cents(price, first))


def hour_of(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def _hours(start: datetime, end: datetime) -> Iterator[tuple[datetime, datetime, datetime]]:
    """`[start, end)` cut at clock hours: (hour, piece start, piece end)."""
    while start < end:
        hour = hour_of(start)
        piece_end = min(end, hour + HOUR)
        yield hour, start, piece_end
        start = piece_end


# ---- charging ---------------------------------------------------------------------------------


@dataclass
class ChargeResult:
    records: int = 0
    amount: Decimal = Decimal("0.00")
    project_ids: set[int] = field(default_factory=set)

    def add(self, other: "ChargeResult") -> None:
        self.records += other.records
        self.amount += other.amount
        self.project_ids |= other.project_ids


@dataclass
class _Line:
    project_id: int
    cents: int = 0
    machine_seconds: int = 0


def _chargeable(queryset: QuerySet[UsageRecord], now: datetime) -> QuerySet[UsageRecord]:
    """Running records, and ended ones the meter has not charged to their end yet."""
    return queryset.filter(
        Q(ended_at__isnull=True) | Q(charged_until__lt=F("ended_at")), charged_until__lt=now
    )


def _charge_records(records: Iterable[UsageRecord], now: datetime) -> ChargeResult:
    """Charge locked `records` up to `now` (or their end); the caller holds the transaction."""
    lines: dict[tuple[int, datetime], _Line] = defaultdict(lambda: _Line(project_id=0))
    changed: list[UsageRecord] = []
    result = ChargeResult()
    for record in records:
        until = min(now, record.ended_at) if record.ended_at else now
        if until <= record.charged_until:
            continue
        price, started_at = record.price_per_hour, record.started_at
        seconds_before = billed_seconds(started_at, record.charged_until)
        cents_before = cost_in_cents(price, seconds_before)
        for hour, _, piece_end in _hours(record.charged_until, until):
            seconds_after = billed_seconds(started_at, piece_end)
            cents_after = cost_in_cents(price, seconds_after)
            line = lines[(record.cluster_id, hour)]
            line.project_id = record.project_id
            line.cents += cents_after - cents_before
            line.machine_seconds += seconds_after - seconds_before
            seconds_before, cents_before = seconds_after, cents_after
        record.charged_until = until
        record.charged_amount = cents(cents_before)
        changed.append(record)
        result.records += 1
        result.project_ids.add(record.project_id)
    if changed:
        ops = connection.ops
        _update_from_values(
            UsageRecord,
            {"charged_until": "v.c1", "charged_amount": "v.c2"},
            ("timestamptz", "numeric"),
            [
                (
                    record.pk,
                    ops.adapt_datetimefield_value(record.charged_until),
                    record.charged_amount,
                )
                for record in changed
            ],
        )
    result.amount = _post_lines(lines, now)
    return result


def _update_from_values(
    model: type[Model], assignments: dict[str, str], types: tuple[str, ...], rows: list[tuple]
) -> None:
    """`UPDATE … SET … FROM` a set of (pk, c1, c2, …): many rows with their own values in one
    statement, in linear time (Django's bulk_update builds a CASE per row, which takes
    seconds for a meter's thousands of rows). Expressions name the values `v.c1`, `v.c2`, ….
    PostgreSQL gets one array per column (`unnest`), SQLite a VALUES list."""
    quote = connection.ops.quote_name
    table = quote(model._meta.db_table)
    names = ["pk"] + [f"c{index}" for index in range(1, len(types) + 1)]
    if connection.vendor == "postgresql":
        arrays = ", ".join(f"%s::{kind}[]" for kind in ("bigint", *types))
        source = f"unnest({arrays}) AS v ({', '.join(names)})"
        params = [list(column) for column in zip(*rows, strict=True)]
    else:
        row = "(" + ", ".join(["%s"] * len(names)) + ")"
        columns = ", ".join(f"column{index + 1} AS {name}" for index, name in enumerate(names))
        source = f"(SELECT {columns} FROM (VALUES {', '.join([row] * len(rows))})) AS v"  # noqa: S608 - no input
        params = [value for row_values in rows for value in row_values]
    sets = ", ".join(f"{quote(column)} = {value}" for column, value in assignments.items())
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} SET {sets} FROM {source} WHERE {table}.{quote('id')} = v.pk",  # noqa: S608 - names are ours, values are parameters
            params,
        )


def _lock_lines(keys: set[tuple[int, datetime]]) -> dict[tuple[int, datetime], int]:
    """The primary keys of the usage lines for these (cluster, hour) keys, locked."""
    cluster_ids = {cluster_id for cluster_id, _ in keys}
    hours = {hour for _, hour in keys}
    # Every meter locks lines in the same order (cluster, hour), so two never deadlock.
    rows = (
        LedgerEntry.objects.select_for_update()
        .filter(kind=LedgerEntry.Kind.USAGE, cluster_id__in=cluster_ids, period_start__in=hours)
        .order_by("cluster_id", "period_start")
        .values_list("pk", "cluster_id", "period_start")
    )
    locked = {(cluster_id, hour): pk for pk, cluster_id, hour in rows}
    return {key: pk for key, pk in locked.items() if key in keys}


def _post_lines(lines: dict[tuple[int, datetime], _Line], now: datetime) -> Decimal:
    """Add each cluster-hour's debit to its usage line, creating the line when it is new."""
    lines = {key: line for key, line in lines.items() if line.cents or line.machine_seconds}
    if not lines:
        return Decimal("0.00")
    entries = _lock_lines(set(lines))
    missing = sorted(set(lines) - set(entries))
    if missing:
        names = dict(
            Cluster.objects.filter(pk__in={c for c, _ in missing}).values_list("pk", "name")
        )
        # Another meter (or a terminate) may be creating the same line right now: the insert
        # then waits for it and keeps its line (ON CONFLICT DO NOTHING), which is locked and
        # added to below like any other.
        LedgerEntry.objects.bulk_create(
            [
                LedgerEntry(
                    project_id=lines[(cluster_id, hour)].project_id,
                    kind=LedgerEntry.Kind.USAGE,
                    cluster_id=cluster_id,
                    period_start=hour,
                    amount=Decimal("0.00"),
                    machine_seconds=0,
                    note=f"Cluster usage — {names.get(cluster_id, cluster_id)}",
                    created_at=now,
                )
                for cluster_id, hour in missing
            ],
            ignore_conflicts=True,
        )
        entries.update(_lock_lines(set(missing)))
    # Added in the database to the locked lines, whatever they held.
    _update_from_values(
        LedgerEntry,
        {"amount": "amount - v.c1", "machine_seconds": "machine_seconds + v.c2"},
        ("numeric", "bigint"),
        [(entries[key], cents(line.cents), line.machine_seconds) for key, line in lines.items()],
    )
    _post_days(lines)
    _move_balances(lines)
    return cents(sum(line.cents for line in lines.values()))


def _move_balances(lines: dict[tuple[int, datetime], _Line]) -> None:
    """The debits move each project's running balance, in the transaction of the lines."""
    debits: dict[int, int] = defaultdict(int)
    for line in lines.values():
        debits[line.project_id] += line.cents
    balances.move({project_id: -cents(amount) for project_id, amount in debits.items()})


def _post_days(lines: dict[tuple[int, datetime], _Line]) -> None:
    """Add the same debits to the per-day rollup (UsageDay), the same way as the lines."""
    days: dict[tuple[int, date], _Line] = {}
    last_hours: dict[tuple[int, date], datetime] = {}
    for (cluster_id, hour), line in lines.items():
        key = (cluster_id, hour.date())
        day = days.setdefault(key, _Line(project_id=line.project_id))
        day.cents += line.cents
        day.machine_seconds += line.machine_seconds
        last_hours[key] = max(hour, last_hours.get(key, hour))
    locked = _lock_days(set(days))
    missing = sorted(set(days) - set(locked))
    if missing:
        UsageDay.objects.bulk_create(
            [
                UsageDay(
                    project_id=days[key].project_id,
                    cluster_id=key[0],
                    day=key[1],
                    amount=Decimal("0.00"),
                    machine_seconds=0,
                    last_hour=last_hours[key],
                )
                for key in missing
            ],
            ignore_conflicts=True,
        )
        locked.update(_lock_days(set(missing)))
    ops = connection.ops
    _update_from_values(
        UsageDay,
        {
            "amount": "amount - v.c1",
            "machine_seconds": "machine_seconds + v.c2",
            "last_hour": "v.c3",
        },
        ("numeric", "bigint", "timestamptz"),
        [
            (
                locked[key][0],
                cents(day.cents),
                day.machine_seconds,
                ops.adapt_datetimefield_value(max(last_hours[key], locked[key][1])),
            )
            for key, day in days.items()
        ],
    )


def _lock_days(keys: set[tuple[int, date]]) -> dict[tuple[int, date], tuple[int, datetime]]:
    rows = (
        UsageDay.objects.select_for_update()
        .filter(cluster_id__in={c for c, _ in keys}, day__in={d for _, d in keys})
        .order_by("cluster_id", "day")
        .values_list("pk", "cluster_id", "day", "last_hour")
    )
    locked = {(cluster_id, day): (pk, last) for pk, cluster_id, day, last in rows}
    return {key: value for key, value in locked.items() if key in keys}


def _locked(queryset: QuerySet[UsageRecord], *, skip_locked: bool) -> QuerySet[UsageRecord]:
    if connection.features.has_select_for_update_skip_locked and skip_locked:
        return queryset.select_for_update(skip_locked=True)
    return queryset.select_for_update()


def charge_accrued(*, now: datetime | None = None, batch_size: int = BATCH_SIZE) -> ChargeResult:
    """Charge every running or not-yet-fully-charged record up to `now`, batch by batch.

    A batch another meter holds is skipped: that meter charges it.
    """
    now = now or timezone.now()
    result = ChargeResult()
    after_pk = 0
    while True:
        with transaction.atomic():
            batch = list(
                _locked(
                    _chargeable(UsageRecord.objects.filter(pk__gt=after_pk), now),
                    skip_locked=True,
                ).order_by("pk")[:batch_size]
            )
            if batch:
                result.add(_charge_records(batch, now))
        if len(batch) < batch_size:
            return result
        after_pk = batch[-1].pk


def charge_usage(
    *,
    cluster: Cluster | None = None,
    record_ids: Iterable[int] | None = None,
    until: datetime | None = None,
) -> ChargeResult:
    """Charge one cluster's records (or the given ones) up to `until`, or to their end.

    Called by the lifecycle when a cluster or a worker ends, right after it set `ended_at`,
    so the bill stops at the end instant, not at the next meter run. Each record is charged
    up to min(`until` or now, its `ended_at`). It waits for a meter holding the same rows.
    """
    if (cluster is None) == (record_ids is None):
        raise ValueError("charge_usage needs either a cluster or record_ids.")
    now = until or timezone.now()
    queryset = UsageRecord.objects.all()
    if cluster is not None:
        queryset = queryset.filter(cluster=cluster)
    else:
        queryset = queryset.filter(pk__in=list(record_ids or ()))
    with transaction.atomic():
        records = list(_locked(_chargeable(queryset, now), skip_locked=False).order_by("pk"))
        return _charge_records(records, now)


# ---- what the Billing page shows -------------------------------------------------------------


def is_accumulating(entry: LedgerEntry, *, cluster_ended: bool, now: datetime) -> bool:
    """A usage line is accumulating while its hour runs and its cluster is still billed."""
    if entry.kind != LedgerEntry.Kind.USAGE or entry.period_start is None:
        return False
    return not cluster_ended and now < entry.period_start + HOUR


# ---- volume storage (docs/billing.md "Volume storage", docs/volumes.md) ------------------------

# A storage month is 30 days: a volume costs size × price per GB-month every 2,592,000 seconds,
# charged per second like a machine, whatever the calendar month's length.
STORAGE_MONTH_SECONDS = 30 * 24 * 3600
DAY = timedelta(days=1)


def storage_cost_in_cents(price_per_gb_month: Decimal, size_gb: int, seconds: int) -> int:
    """`price × size × seconds / 2,592,000` in cents, rounded half up, in exact integers (a
    location's price has at most 4 decimals: counted in 1/10,000 USD)."""
    units = int((price_per_gb_month * 10_000).to_integral_value())
    denominator = STORAGE_MONTH_SECONDS * 100  # 1/10,000 USD·s per GB → cents
    return (2 * units * size_gb * seconds + denominator) // (2 * denominator)


def storage_per_hour(price_per_gb_month: Decimal, size_gb: int) -> Decimal:
    """USD per hour of a volume: its storage month (30 days) spread over 720 hours, unrounded."""
    return price_per_gb_month * size_gb * Decimal(HOUR.total_seconds()) / STORAGE_MONTH_SECONDS


def storage_per_day(per_month: Decimal) -> Decimal:
    """USD a day of storage that costs `per_month` USD a storage month (30 days), rounded up to
    the cent: what the balance must cover to create a volume (clusters/volumes.py)."""
    day = per_month * Decimal(DAY.total_seconds()) / STORAGE_MONTH_SECONDS
    return day.quantize(Decimal("0.01"), rounding=ROUND_CEILING)


def burn_rates(project_ids: set[int]) -> dict[int, Decimal]:
    """USD per hour of what each project runs and stores: the price of every machine billed now
    and the storage of every volume it keeps (SPEC §4's burn rate). Two queries."""
    rates = {project_id: Decimal("0.00") for project_id in project_ids}
    machines = (
        UsageRecord.objects.filter(project_id__in=project_ids, ended_at__isnull=True)
        .values("project_id")
        .annotate(rate=Sum("price_per_hour"))
    )
    for row in machines:
        rates[row["project_id"]] += row["rate"]
    volumes = Volume.objects.filter(
        project_id__in=project_ids, deleted_at__isnull=True
    ).values_list("project_id", "price_per_gb_month", "size_gb")
    for project_id, price, size in volumes:
        rates[project_id] += storage_per_hour(price, size)
    return rates


def _days(start: datetime, end: datetime) -> Iterator[tuple[datetime, datetime]]:
    """`[start, end)` cut at midnight (UTC): (the day's midnight, piece end)."""
    while start < end:
        day = start.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
        piece_end = min(end, day + DAY)
        yield day, piece_end
        start = piece_end


def _chargeable_volumes(queryset: QuerySet, now: datetime) -> QuerySet:
    """Live volumes, and deleted ones not yet charged to their deletion."""
    return queryset.filter(
        Q(deleted_at__isnull=True) | Q(charged_until__lt=F("deleted_at")), charged_until__lt=now
    )


def _charge_volumes(volumes: Iterable, now: datetime) -> ChargeResult:
    """Charge locked volumes up to `now` (or their deletion) onto their per-day storage lines.

    Like machines, a volume's cost is computed over its whole life from `created_at`, so its
    debits add up to the rounded cost of everything it stored, however often this runs."""
    from clusters.models import Volume

    lines: dict[tuple[int, datetime], _Line] = defaultdict(lambda: _Line(project_id=0))
    names: dict[int, str] = {}
    changed = []
    result = ChargeResult()
    for volume in volumes:
        until = min(now, volume.deleted_at) if volume.deleted_at else now
        if until <= volume.charged_until:
            continue
        price, size, created = volume.price_per_gb_month, volume.size_gb, volume.created_at
        seconds_before = billed_seconds(created, volume.charged_until)
        cents_before = storage_cost_in_cents(price, size, seconds_before)
        for day, piece_end in _days(volume.charged_until, until):
            seconds_after = billed_seconds(created, piece_end)
            cents_after = storage_cost_in_cents(price, size, seconds_after)
            line = lines[(volume.pk, day)]
            line.project_id = volume.project_id
            line.cents += cents_after - cents_before
            line.machine_seconds += seconds_after - seconds_before
            seconds_before, cents_before = seconds_after, cents_after
        volume.charged_until = until
        volume.charged_amount = cents(cents_before)
        names[volume.pk] = volume.name
        changed.append(volume)
        result.records += 1
        result.project_ids.add(volume.project_id)
    if changed:
        # Volumes are few next to machines: Django's own bulk update is fast enough here.
        Volume.objects.bulk_update(changed, ["charged_until", "charged_amount"])
    result.amount = _post_storage_lines(lines, names, now)
    return result


def _lock_storage_lines(keys: set[tuple[int, datetime]]) -> dict[tuple[int, datetime], LedgerEntry]:
    # Locked in one order (volume, day), so two meters never deadlock.
    rows = (
        LedgerEntry.objects.select_for_update()
        .filter(
            kind=LedgerEntry.Kind.STORAGE,
            volume_id__in={volume_id for volume_id, _ in keys},
            period_start__in={day for _, day in keys},
        )
        .order_by("volume_id", "period_start")
        .only("pk", "volume_id", "period_start", "amount", "machine_seconds")
    )
    return {
        (entry.volume_id, entry.period_start): entry
        for entry in rows
        if (entry.volume_id, entry.period_start) in keys
    }


def _post_storage_lines(
    lines: dict[tuple[int, datetime], _Line], names: dict[int, str], now: datetime
) -> Decimal:
    """Add each volume-day's debit to its storage line, creating the line when it is new (the
    same ON CONFLICT DO NOTHING, lock, then add as the machines' lines)."""
    lines = {key: line for key, line in lines.items() if line.cents or line.machine_seconds}
    if not lines:
        return Decimal("0.00")
    entries = _lock_storage_lines(set(lines))
    missing = sorted(set(lines) - set(entries))
    if missing:
        LedgerEntry.objects.bulk_create(
            [
                LedgerEntry(
                    project_id=lines[key].project_id,
                    kind=LedgerEntry.Kind.STORAGE,
                    volume_id=key[0],
                    period_start=key[1],
                    amount=Decimal("0.00"),
                    note=f"Volume storage — {names[key[0]]}",
                    created_at=now,
                )
                for key in missing
            ],
            ignore_conflicts=True,
        )
        entries.update(_lock_storage_lines(set(missing)))
    # The lines are locked: what they hold now is what this meter adds to.
    for key, line in lines.items():
        entries[key].amount -= cents(line.cents)
        entries[key].machine_seconds += line.machine_seconds
    LedgerEntry.objects.bulk_update([entries[key] for key in lines], ["amount", "machine_seconds"])
    _move_balances(lines)
    return cents(sum(line.cents for line in lines.values()))


def charge_storage(
    *,
    now: datetime | None = None,
    volume_ids: Iterable[int] | None = None,
    batch_size: int = BATCH_SIZE,
) -> ChargeResult:
    """Charge every volume's storage up to `now` (or its deletion), batch by batch; with
    `volume_ids`, only those (waiting for a meter that holds them). Safe to run twice and on
    several workers at once: a batch another meter holds is skipped, and a volume is only
    charged past its own `charged_until`."""
    from clusters.models import Volume

    now = now or timezone.now()
    queryset = Volume.objects.all()
    if volume_ids is not None:
        queryset = queryset.filter(pk__in=list(volume_ids))
    result = ChargeResult()
    after_pk = 0
    while True:
        with transaction.atomic():
            chargeable = _chargeable_volumes(queryset.filter(pk__gt=after_pk), now)
            if connection.features.has_select_for_update_skip_locked and volume_ids is None:
                chargeable = chargeable.select_for_update(skip_locked=True)
            else:
                chargeable = chargeable.select_for_update()
            batch = list(chargeable.order_by("pk")[:batch_size])
            if batch:
                result.add(_charge_volumes(batch, now))
        if len(batch) < batch_size:
            return result
        after_pk = batch[-1].pk
