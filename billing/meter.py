"""The meter: turns the seconds machines ran into ledger debits (SPEC §4, docs/billing.md).

Each usage record (one per machine) is charged from where it was charged (`charged_point`) up
to now, the database's now and never a worker's clock, or up to its `ended_at` once it has
ended; what the ledger holds past an end is refunded (`_refund_past_end`). Its cost is
computed over its whole span, never as a sum of rounded slices:

    cost(t) = round_half_up(price_per_hour × whole seconds from started_at to t / 3600, 2)

and a charge debits `cost(new) − cost(old)`. So the debits of a record add up to the rounded
cost of its span exactly, whenever and however often the meter ran, and the cost of any window
`[a, b]` of a machine is `cost(b) − cost(a)`: per-machine rows, cluster lines and the ledger
agree to the cent.

A charge is split at clock hours (UTC): the ledger holds one usage line per cluster per hour,
which the meter adds to while that hour runs (the *accumulating* line) and never touches once
the hour is charged to its end. The same debits go to `UsageDay`, a per-cluster, per-day
rollup of those lines that the Billing page reads.

Running it twice, or on two workers at once, charges once: each batch of clusters' marks is
locked (`SELECT … FOR UPDATE SKIP LOCKED` on PostgreSQL; SQLite takes the write lock at BEGIN),
and a record is only charged past its charged point.

The volumes' storage is charged here too (`charge_storage`, "volume storage" below), onto one
line per volume per day, by the same rounding over a record's whole span, and posted by the
same step (`_post_lines`); the meter's run, billing.metering.charge_accrued, charges both.
Clusters open and close what is metered through billing/metering.py.
"""

import secrets
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from decimal import ROUND_CEILING, Decimal
from typing import NamedTuple

from django.core.cache import cache
from django.db import connection, transaction
from django.db.models import (
    Case,
    DecimalField,
    Exists,
    F,
    Min,
    Model,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Sum,
    Value,
    When,
)
from django.db.models.functions import Least, Now
from django.utils import timezone

from accounts.models import Project
from billing import balances
from billing.models import LedgerEntry, MeterMark, StorageRecord, UsageDay, UsageRecord
from runcrate.sql import update_from_values, update_rows  # and the `__among` lookup

HOUR = timedelta(hours=1)
BATCH_SIZE = 5000  # clusters per transaction (40,000 machines of 8)


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


# ---- the clock ---------------------------------------------------------------------------------
#
# The meter charges up to the database's now, never a worker's clock: every worker (and every
# meter) reads the one clock, so a worker whose clock runs fast cannot charge the future, and
# two meters on two machines agree on how far "now" is.


def database_now() -> datetime:
    """The database's clock (Django's `Now()`: PostgreSQL's statement_timestamp(), SQLite's own
    UTC clock). The meter reads it in the queries it already makes (the clusters to charge, the
    marks it locks); this is for everyone else."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT statement_timestamp()")
            return cursor.fetchone()[0]
        cursor.execute("SELECT strftime('%Y-%m-%d %H:%M:%f', 'now')")
        return datetime.fromisoformat(cursor.fetchone()[0]).replace(tzinfo=UTC)


def charge_clock(until: datetime | None = None) -> datetime:
    """How far a charge may go: the database's now, or `until` when that is earlier. Never a
    moment past the database's now, whatever the caller's clock says."""
    now = database_now()
    return now if until is None else min(until, now)


# ---- charging ---------------------------------------------------------------------------------
#
# The state. A record's `charged_until` is where it was charged when its row was last written:
# when the meter first charged it, when it crossed a clock hour and when it ended. In between,
# its cluster's MeterMark says how far the meter went: a record charged at least once is
# charged up to its mark (or its end, if that came first), never below its own
# `charged_until` (`charged_point`). A record never charged yet (`charged_until` still its
# start) is charged from its start, whatever the mark: it may have been committed after a meter
# that ran past its start.
#
# A run, per batch of clusters, in one transaction: lock their marks (`SKIP LOCKED`: a cluster
# another meter holds is that meter's), compute every record's charge hour by hour in one
# set-based statement (`_charges`, the rounding rule in integers, in SQL), write the records
# that first got charged, crossed an hour or reached their end (one UPDATE), move the marks to
# now (one), add the debits to the hourly lines, the day rollup and the balances (set-based).
# So its queries grow with clusters (batches of BATCH_SIZE), never with machines.


@dataclass
class ChargeResult:
    """What a charge did: machines (`records`, `amount`) and volumes' storage (`volumes`,
    `storage`) apart, as the meter's task reports them."""

    records: int = 0  # machines' usage records charged
    amount: Decimal = Decimal("0.00")  # what they were charged
    project_ids: set[int] = field(default_factory=set)
    refunded: Decimal = Decimal("0.00")  # charged past the end of machines, given back
    volumes: int = 0  # volumes' storage records charged
    storage: Decimal = Decimal("0.00")  # what they were charged

    def add(self, other: "ChargeResult") -> None:
        self.records += other.records
        self.amount += other.amount
        self.project_ids |= other.project_ids
        self.refunded += other.refunded
        self.volumes += other.volumes
        self.storage += other.storage


@dataclass
class Debit:
    """What one ledger line (a cluster-hour, a volume-day) is debited: cents and seconds."""

    project_id: int
    cents: int = 0
    machine_seconds: int = 0


def _chargeable(
    queryset: QuerySet[UsageRecord], now: datetime | Now | Least
) -> QuerySet[UsageRecord]:
    """Running records, and ended ones the meter has not charged to their end yet."""
    return queryset.filter(
        Q(ended_at__isnull=True) | Q(charged_until__lt=F("ended_at")), charged_until__lt=now
    )


def charged_point(record: UsageRecord, mark: datetime | None) -> datetime:
    """How far the ledger has charged `record`, given its cluster's mark (the SQL of
    `_records_cte` says the same as `lo`).

    A record whose row is written at or past its end is charged to its row. Any other record
    charged at least once is charged up to its mark, even one that ended before the mark: every
    meter run that moves a mark writes the row of each ended record it charges, so such a
    record was still running when the mark went past its end (a terminate on a clock behind
    the database's), and the ledger holds that charge until the meter refunds it
    (`_refund_past_end`)."""
    if mark is None or record.charged_until == record.started_at:
        return record.charged_until
    if record.ended_at is not None and record.charged_until >= record.ended_at:
        return record.charged_until
    return max(record.charged_until, mark)


def marks(**filters) -> dict[int, datetime | None]:
    """The marks of the clusters `filters` picks (`cluster_id__in=…`, `cluster__project_id=…`)
    by cluster id: one query."""
    return dict(MeterMark.objects.filter(**filters).values_list("cluster_id", "charged_until"))


def settle(record: UsageRecord, mark: datetime | None) -> UsageRecord:
    """`record` with `charged_until` and `charged_amount` set (in memory) to how far the meter
    has charged it, given its cluster's mark: what its row would say if the meter wrote it at
    every run."""
    point = charged_point(record, mark)
    if point != record.charged_until:
        record.charged_until = point
        record.charged_amount = cost(
            record.price_per_hour, billed_seconds(record.started_at, point)
        )
    return record


def settled(records: Iterable[UsageRecord]) -> list[UsageRecord]:
    """`settle` for each of `records`: one query for their marks."""
    records = list(records)
    found = marks(cluster_id__in={record.cluster_id for record in records})
    return [settle(record, found.get(record.cluster_id)) for record in records]


def lock_marks(cluster_ids: Iterable[int]) -> list[int]:
    """Lock the clusters' marks (made when missing), in one order, waiting for a meter that
    holds them; the ids locked. A caller that ends machines outside the meter (a refund) locks
    them first, so that no meter charges those machines meanwhile."""
    return _lock_waiting(cluster_ids).cluster_ids


def _lock_waiting(cluster_ids: Iterable[int]) -> "_Locked":
    cluster_ids = sorted(set(cluster_ids))
    _make_marks(cluster_ids)
    return _lock_marks(cluster_ids, skip_locked=False)


def _make_marks(cluster_ids: list[int]) -> None:
    existing = set(
        MeterMark.objects.filter(cluster_id__among=cluster_ids).values_list("cluster_id", flat=True)
    )
    if missing := [pk for pk in cluster_ids if pk not in existing]:
        MeterMark.objects.bulk_create(
            [MeterMark(cluster_id=pk) for pk in missing], ignore_conflicts=True
        )


@dataclass(frozen=True)
class _Locked:
    """The marks a transaction locked, with what the locking query also read: the database's
    clock, and whether a record of these clusters was charged past its end (then the meter
    looks for it, `_refund_past_end`; else that query is saved)."""

    cluster_ids: list[int]
    clock: datetime | None = None
    past_end: bool = False

    def __len__(self) -> int:
        return len(self.cluster_ids)


def _past_end_of_mark() -> Exists:
    """Whether the mark's cluster has an ended record that the ledger charged past its end
    (`LEDGER_POINT` > ended_at): its row says so, or it was charged to a mark past its end."""
    return Exists(
        UsageRecord.objects.filter(
            Q(charged_until__gt=F("ended_at"))
            | (
                Q(charged_until__lt=F("ended_at"), ended_at__lt=OuterRef("charged_until"))
                & ~Q(charged_until=F("started_at"))
            ),
            cluster_id=OuterRef("cluster_id"),
            ended_at__isnull=False,
        )
    )


def _lock_marks(cluster_ids: list[int], *, skip_locked: bool) -> _Locked:
    """With `skip_locked`, the marks another transaction holds are left out."""
    if not cluster_ids:
        return _Locked([])
    skip = skip_locked and connection.features.has_select_for_update_skip_locked
    rows = list(
        MeterMark.objects.filter(cluster_id__among=cluster_ids)
        .select_for_update(skip_locked=skip)
        .order_by("cluster_id")
        .annotate(clock=Now(), past_end=_past_end_of_mark())
        .values_list("cluster_id", "clock", "past_end")
    )
    if not rows:
        return _Locked([])
    return _Locked(
        cluster_ids=[row[0] for row in rows],
        clock=rows[0][1],
        past_end=any(row[2] for row in rows),
    )


class _Statement:
    """SQL text with its parameters in order, for PostgreSQL or SQLite."""

    def __init__(self) -> None:
        self.params: list = []
        self.postgres = connection.vendor == "postgresql"

    def value(self, value, kind: str) -> str:
        self.params.append(
            connection.ops.adapt_datetimefield_value(value) if kind == "timestamptz" else value
        )
        return f"%s::{kind}" if self.postgres else "%s"

    def among(self, column: str, values: list[int]) -> str:
        if self.postgres:
            self.params.append(values)
            return f"{column} = ANY(%s::bigint[])"
        self.params.extend(values)
        return f"{column} IN ({', '.join(['%s'] * len(values))})"

    def hours(self, rows: list[tuple[int, int, datetime, datetime]]) -> str:
        """A table h(n, cluster_id, hs, he): each cluster's clock hours to charge."""
        adapt = connection.ops.adapt_datetimefield_value
        if self.postgres:
            self.params.extend([list(column) for column in zip(*rows, strict=True)])
            return (
                "SELECT * FROM unnest(%s::bigint[], %s::bigint[], %s::timestamptz[], "
                "%s::timestamptz[]) AS h (n, cluster_id, hs, he)"
            )
        for n, cluster_id, start, end in rows:
            self.params.extend([n, cluster_id, adapt(start), adapt(end)])
        return "VALUES " + ", ".join(["(%s, %s, %s, %s)"] * len(rows))

    def seconds(self, later: str, earlier: str) -> str:
        """Whole seconds from `earlier` to `later` (later > earlier), like `billed_seconds`."""
        if self.postgres:
            return f"FLOOR(EXTRACT(EPOCH FROM ({later} - {earlier})))::bigint"

        # SQLite keeps a datetime as text, 'YYYY-MM-DD HH:MM:SS[.ffffff]' in UTC: whole seconds
        # from strftime, microseconds from the text, both native (Django's
        # django_timestamp_diff is a Python function, called once a row: most of a meter run).
        # strftime gets the text without its fraction, which it would round to the millisecond
        # (…:59.9996 would read as the next second).
        def micros(column: str) -> str:
            return (
                f"(CAST(strftime('%%s', substr({column}, 1, 19)) AS INTEGER) * 1000000 + CASE WHEN "
                f"length({column}) > 19 THEN CAST(substr({column}, 21, 6) AS INTEGER) ELSE 0 END)"
            )

        return f"(({micros(later)} - {micros(earlier)}) / 1000000)"

    def billed(self, moment: str) -> str:
        """`billed_seconds(started_at, moment)` of each row of x."""
        return f"(CASE WHEN {moment} > x.s THEN {self.seconds(moment, 'x.s')} ELSE 0 END)"

    def cost(self, moment: str) -> str:
        """`cost_in_cents(price, billed_seconds(started_at, moment))` of each row of x."""
        return f"((2 * x.pc * {self.billed(moment)} + 3600) / 7200)"

    def price_cents(self) -> str:
        if self.postgres:
            return "ROUND(u.price_per_hour * 100)::bigint"
        return "CAST(ROUND(u.price_per_hour * 100) AS INTEGER)"


# How far the ledger has charged a usage record u, given its cluster's mark m: `charged_point`.
LEDGER_POINT = """CASE
                    WHEN u.charged_until = u.started_at OR m.charged_until IS NULL
                        THEN u.charged_until
                    WHEN u.ended_at IS NOT NULL AND u.charged_until >= u.ended_at
                        THEN u.charged_until
                    WHEN m.charged_until > u.charged_until THEN m.charged_until
                    ELSE u.charged_until
                END"""


def _records_cte(
    sql: _Statement, *, now: datetime, cluster_ids: list[int], record_ids: list[int] | None
) -> str:
    """x: the chargeable records of the clusters (or `record_ids` among them), each with `lo`,
    how far it is charged (`charged_point`), and `hi`, how far this run charges it (now, or its
    end); clock: now and the start of its hour. Parameters are added in the text's order."""
    usage = UsageRecord._meta.db_table
    marks = MeterMark._meta.db_table
    clock = (
        f"SELECT {sql.value(now, 'timestamptz')} AS now, "
        f"{sql.value(hour_of(now), 'timestamptz')} AS hour"
    )
    where = sql.among("u.cluster_id", cluster_ids)
    if record_ids is not None:
        where += " AND " + sql.among("u.id", record_ids)
    return f"""
        clock AS ({clock}),
        r AS (
            SELECT u.id, u.cluster_id, u.project_id, u.started_at AS s, u.charged_until AS cu,
                u.ended_at AS e, {sql.price_cents()} AS pc, clock.hour AS ch,
                {LEDGER_POINT} AS lo,
                CASE WHEN u.ended_at IS NOT NULL AND u.ended_at < clock.now
                    THEN u.ended_at ELSE clock.now END AS t
            FROM {usage} u CROSS JOIN clock
            LEFT JOIN {marks} m ON m.cluster_id = u.cluster_id
            WHERE {where} AND (u.ended_at IS NULL OR u.charged_until < u.ended_at)
                AND u.charged_until < clock.now
        ),
        x AS (SELECT r.*, CASE WHEN r.t > r.lo THEN r.t ELSE r.lo END AS hi FROM r)"""  # noqa: S608 - names are ours, values are parameters


def _charges(
    cluster_ids: list[int], now: datetime, record_ids: list[int] | None
) -> tuple[dict[tuple[int, datetime], Debit], int, int]:
    """The debit of each (cluster, clock hour), the number of records charged and of rows to
    write: one query for the hours, one for the charges."""
    chargeable = _chargeable(UsageRecord.objects.filter(cluster_id__among=cluster_ids), now)
    if record_ids is not None:
        chargeable = chargeable.filter(pk__among=record_ids)
    firsts = chargeable.order_by().values("cluster_id").annotate(first=Min("charged_until"))
    hours: list[tuple[int, int, datetime, datetime]] = []
    for row in firsts.values_list("cluster_id", "first"):
        for hour, _, _ in _hours(hour_of(row[1]), now):
            hours.append((len(hours), row[0], hour, hour + HOUR))
    if not hours:
        return {}, 0, 0
    sql = _Statement()
    records = _records_cte(sql, now=now, cluster_ids=cluster_ids, record_ids=record_ids)
    table = sql.hours(hours)
    query = f"""
        WITH {records},
        h (n, cluster_id, hs, he) AS ({table}),
        p AS (
            SELECT x.*, h.n, h.hs,
                CASE WHEN x.lo > h.hs THEN x.lo ELSE h.hs END AS a,
                CASE WHEN x.hi < h.he THEN x.hi ELSE h.he END AS b
            FROM x JOIN h ON h.cluster_id = x.cluster_id AND h.hs < x.hi AND h.he > x.lo
        )
        SELECT x.n, x.project_id,
            SUM({sql.cost("x.b")} - {sql.cost("x.a")}),
            SUM({sql.billed("x.b")} - {sql.billed("x.a")}),
            SUM(CASE WHEN x.lo >= x.hs THEN 1 ELSE 0 END),
            SUM(CASE WHEN x.lo >= x.hs AND x.hi > x.cu AND ({_write_rule(record_ids)})
                THEN 1 ELSE 0 END)
        FROM p AS x
        GROUP BY x.n, x.project_id"""  # noqa: S608 - names are ours, values are parameters
    lines: dict[tuple[int, datetime], Debit] = {}
    charged = written = 0
    with connection.cursor() as cursor:
        cursor.execute(query, sql.params)
        for n, project_id, amount, seconds, count, rows in cursor.fetchall():
            _, cluster_id, hour, _ = hours[n]
            lines[(cluster_id, hour)] = Debit(project_id, int(amount), int(seconds))
            charged += int(count)
            written += int(rows)
    return lines, charged, written


def _write_rule(record_ids: list[int] | None) -> str:
    """Which charged records of x get their row written: those charged for the first time,
    ended ones, and those whose row is from an earlier hour; with `record_ids`, all of them."""
    return "x.cu = x.s OR x.e IS NOT NULL OR x.cu < x.ch" if record_ids is None else "1 = 1"


def _write_records(cluster_ids: list[int], now: datetime, record_ids: list[int] | None) -> None:
    """Write the charged point of the records that first got charged, crossed into this hour
    (or ran through older ones) or reached their end; with `record_ids`, of those records
    (their cluster's mark does not move for them)."""
    sql = _Statement()
    records = _records_cte(sql, now=now, cluster_ids=cluster_ids, record_ids=record_ids)
    rule = _write_rule(record_ids)
    table = connection.ops.quote_name(UsageRecord._meta.db_table)
    query = f"""
        WITH {records}
        UPDATE {table} SET charged_until = x.hi, charged_amount = {sql.cost("x.hi")} / 100.0
        FROM x
        WHERE {table}.id = x.id AND x.hi > x.cu AND ({rule})"""  # noqa: S608 - names are ours, values are parameters
    with connection.cursor() as cursor:
        cursor.execute(query, sql.params)


def _charge_clusters(
    locked: _Locked, until: datetime | None, *, record_ids: list[int] | None = None
) -> ChargeResult:
    """Charge the records of these locked clusters (or only `record_ids` among them) up to
    the database's now (or an earlier `until`), or to their end, and refund what was charged
    past their end; the caller holds the transaction and the marks' locks."""
    cluster_ids = locked.cluster_ids
    if not cluster_ids:
        return ChargeResult()
    assert locked.clock is not None  # read by the query that locked them
    now = locked.clock if until is None else min(until, locked.clock)
    refunded = Decimal("0.00")
    if locked.past_end:
        refunded = _refund_past_end(cluster_ids, record_ids)
    lines, charged, written = _charges(cluster_ids, now, record_ids)
    result = ChargeResult(records=charged, refunded=refunded)
    result.project_ids = {line.project_id for line in lines.values()}
    if written:
        _write_records(cluster_ids, now, record_ids)
    if record_ids is None:
        MeterMark.objects.filter(cluster_id__among=cluster_ids).update(
            charged_until=Case(
                When(Q(charged_until__isnull=True) | Q(charged_until__lt=now), then=Value(now)),
                default=F("charged_until"),
            )
        )
    result.amount = _post_lines(lines, now)
    return result


# ---- refunds: what the ledger holds past a machine's end ------------------------------------
#
# A machine's end is written by the lifecycle on its worker's clock; the meter charges on the
# database's. A machine ended at a moment the meter had already charged past (a terminate on a
# clock behind the database's; a charge of a meter that ran before the meter kept to the
# database's clock) holds a charge past its end. The meter refunds it the way a lost
# machine's charge past its last heartbeat is refunded (clusters/lifecycle/actions.py
# `_end_usage_at`): an adjustment line on the ledger, and the record charged to its end.


def refund_line(*, project_id: int, amount: Decimal, note: str) -> LedgerEntry | None:
    """The ledger line that gives back `amount` charged for time that was not run (it moves
    the balance, LedgerEntry.save); none for nothing."""
    if amount <= 0:
        return None
    return LedgerEntry.objects.create(
        project_id=project_id, kind=LedgerEntry.Kind.ADJUSTMENT, amount=amount, note=note
    )


def _past_end_query(sql: _Statement, where: str) -> str:
    """The ended records (`where` picks them among u) that the ledger charged past their end:
    id, cluster, project, cluster name, cents charged past the end, cents up to the end."""
    usage = UsageRecord._meta.db_table
    marks = MeterMark._meta.db_table
    clusters = _related(UsageRecord, "cluster")._meta.db_table
    return f"""
        WITH x AS (
            SELECT u.id, u.cluster_id, u.project_id, u.started_at AS s, u.ended_at AS e,
                {sql.price_cents()} AS pc, {LEDGER_POINT} AS lo
            FROM {usage} u LEFT JOIN {marks} m ON m.cluster_id = u.cluster_id
            WHERE {where} AND u.ended_at IS NOT NULL
        )
        SELECT x.id, x.cluster_id, x.project_id, c.name, {sql.cost("x.lo")} - {sql.cost("x.e")},
            {sql.cost("x.e")}
        FROM x JOIN {clusters} c ON c.id = x.cluster_id
        WHERE x.lo > x.e"""  # noqa: S608 - names are ours, values are parameters


def _refund_past_end(cluster_ids: list[int], record_ids: list[int] | None) -> Decimal:
    """Refund what these locked clusters' ended records (or `record_ids` among them) were
    charged past their end, one line per cluster, and write each record as charged to its end:
    one query when there is nothing to refund."""
    sql = _Statement()
    where = sql.among("u.cluster_id", cluster_ids)
    if record_ids is not None:
        where += " AND " + sql.among("u.id", record_ids)
    with connection.cursor() as cursor:
        cursor.execute(_past_end_query(sql, where), sql.params)
        rows = cursor.fetchall()
    if not rows:
        return Decimal("0.00")
    over: dict[tuple[int, int, str], int] = defaultdict(int)
    for _, cluster_id, project_id, name, past_end, _ in rows:
        over[(cluster_id, project_id, name)] += int(past_end)
    ended = UsageRecord.objects.filter(pk__among=[row[0] for row in rows])
    ended.update(charged_until=F("ended_at"))
    update_from_values(
        UsageRecord,
        {"charged_amount": "v.c1"},
        ("numeric",),
        [(row[0], cents(int(row[5]))) for row in rows],
    )
    refunded = Decimal("0.00")
    for (_, project_id, name), amount in sorted(over.items()):
        refund_line(
            project_id=project_id,
            amount=cents(amount),
            note=f"Refund: {name} was billed past its end",
        )
        refunded += cents(amount)
    return refunded


def refund_past_end(cluster_ids: Iterable[int]) -> Decimal:
    """Refund now what these clusters' machines were charged past their end (the meter's next
    run would): `manage.py check_balances --repair`."""
    with transaction.atomic():
        locked = _lock_waiting(cluster_ids)
        if not locked.past_end:
            return Decimal("0.00")
        return _refund_past_end(locked.cluster_ids, None)


def charged_past(*, now: datetime | None = None) -> list["PastCharge"]:
    """Every usage record the ledger charged past its end or past now (the database's): what
    `manage.py check_balances` reports. The meter refunds the first kind at its next run; the
    second is a charge of the future, which the meter never makes. One query."""
    sql = _Statement()
    moment = sql.value(charge_clock(now), "timestamptz")
    usage = UsageRecord._meta.db_table
    marks = MeterMark._meta.db_table
    query = f"""
        WITH x AS (
            SELECT u.id, u.cluster_id, u.project_id, u.started_at AS s, u.ended_at AS e,
                {LEDGER_POINT} AS lo
            FROM {usage} u LEFT JOIN {marks} m ON m.cluster_id = u.cluster_id
        )
        SELECT x.id, x.cluster_id, x.project_id, x.lo, x.e FROM x
        WHERE x.lo > x.s AND (x.lo > {moment} OR (x.e IS NOT NULL AND x.lo > x.e))
        ORDER BY x.id"""  # noqa: S608 - names are ours, values are parameters
    with connection.cursor() as cursor:
        cursor.execute(query, sql.params)
        rows = cursor.fetchall()
    return [
        PastCharge(
            record_id=row[0],
            cluster_id=row[1],
            project_id=row[2],
            charged_until=_aware(row[3]),
            ended_at=_aware(row[4]) if row[4] else None,
        )
        for row in rows
    ]


@dataclass(frozen=True)
class PastCharge:
    record_id: int
    cluster_id: int
    project_id: int
    charged_until: datetime
    ended_at: datetime | None

    @property
    def past_end(self) -> bool:
        return self.ended_at is not None and self.charged_until > self.ended_at


def _aware(moment: datetime | str) -> datetime:
    """A datetime a raw query returned (SQLite: its text), in UTC."""
    if isinstance(moment, str):
        moment = datetime.fromisoformat(moment)
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


@dataclass(frozen=True)
class _LineKind:
    """A kind of metered line on the ledger: one per item (`owner`: a cluster, a volume) per
    period (a clock hour, a day), `period_start` its start; `record` is the metered row that
    names the item (billing does not import clusters: the name comes through its relation);
    `days`: whether its debits also add up in the per-day rollup (`UsageDay`: machines)."""

    kind: str
    owner: str
    record: type[Model]
    note: str
    days: bool

    def names(self, owner_ids: set[int]) -> dict[int, str]:
        column = f"{self.owner}_id"
        return dict(
            self.record._default_manager.filter(**{f"{column}__among": owner_ids})
            .order_by()
            .values_list(column, f"{self.owner}__name")
            .distinct()
        )


USAGE_LINES = _LineKind(
    LedgerEntry.Kind.USAGE, "cluster", UsageRecord, "Cluster usage — {}", days=True
)
STORAGE_LINES = _LineKind(
    LedgerEntry.Kind.STORAGE, "volume", StorageRecord, "Volume storage — {}", days=False
)


def _find_lines(
    kind: _LineKind, keys: set[tuple[int, datetime]]
) -> dict[tuple[int, datetime], int]:
    """The primary keys of the lines of `kind` for these (item, period start) keys. The items
    are held (their marks or records locked): nobody else creates these lines meanwhile."""
    column = f"{kind.owner}_id"
    rows = LedgerEntry.objects.filter(
        **{"kind": kind.kind, f"{column}__among": {owner for owner, _ in keys}},
        period_start__in={start for _, start in keys},
    ).values_list("pk", column, "period_start")
    found = {(owner, start): pk for pk, owner, start in rows}
    return {key: pk for key, pk in found.items() if key in keys}


def _post_lines(
    lines: dict[tuple[int, datetime], Debit], now: datetime, kind: _LineKind = USAGE_LINES
) -> Decimal:
    """Add each (item, period)'s debit to its line of `kind`, creating the line when it is new,
    and to the balances (and, for machines, to the day rollup): the one way the meter writes
    the ledger, for every kind of metered item."""
    lines = {key: line for key, line in lines.items() if line.cents or line.machine_seconds}
    if not lines:
        return Decimal("0.00")
    entries = _find_lines(kind, set(lines))
    missing = sorted(set(lines) - set(entries))
    if missing:
        names = kind.names({owner for owner, _ in missing})
        # A terminate of a cluster whose mark was locked by nobody yet, or a line a crashed
        # run left: ON CONFLICT DO NOTHING keeps the line there is, which is added to below.
        LedgerEntry.objects.bulk_create(
            [
                LedgerEntry(
                    project_id=lines[(owner, start)].project_id,
                    kind=kind.kind,
                    period_start=start,
                    amount=Decimal("0.00"),
                    machine_seconds=0,
                    note=kind.note.format(names.get(owner, owner)),
                    created_at=now,
                    **{f"{kind.owner}_id": owner},
                )
                for owner, start in missing
            ],
            ignore_conflicts=True,
        )
        entries.update(_find_lines(kind, set(missing)))
    # Added in the database to the lines, whatever they held.
    update_from_values(
        LedgerEntry,
        {"amount": "amount - v.c1", "machine_seconds": "machine_seconds + v.c2"},
        ("numeric", "bigint"),
        [(entries[key], cents(line.cents), line.machine_seconds) for key, line in lines.items()],
    )
    if kind.days:
        _post_days(lines)
    _move_balances(lines)
    return cents(sum(line.cents for line in lines.values()))


def _move_balances(lines: dict[tuple[int, datetime], Debit]) -> None:
    """The debits move each project's running balance, in the transaction of the lines."""
    debits: dict[int, int] = defaultdict(int)
    for line in lines.values():
        debits[line.project_id] += line.cents
    balances.move({project_id: -cents(amount) for project_id, amount in debits.items()})


def _post_days(lines: dict[tuple[int, datetime], Debit]) -> None:
    """Add the same debits to the per-day rollup (UsageDay), the same way as the lines."""
    days: dict[tuple[int, date], Debit] = {}
    last_hours: dict[tuple[int, date], datetime] = {}
    for (cluster_id, hour), line in lines.items():
        key = (cluster_id, hour.date())
        day = days.setdefault(key, Debit(project_id=line.project_id))
        day.cents += line.cents
        day.machine_seconds += line.machine_seconds
        last_hours[key] = max(hour, last_hours.get(key, hour))
    found = _find_days(set(days))
    missing = sorted(set(days) - set(found))
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
        found.update(_find_days(set(missing)))
    ops = connection.ops
    update_from_values(
        UsageDay,
        {
            "amount": "amount - v.c1",
            "machine_seconds": "machine_seconds + v.c2",
            "last_hour": "v.c3",
        },
        ("numeric", "bigint", "timestamptz"),
        [
            (
                found[key][0],
                cents(day.cents),
                day.machine_seconds,
                ops.adapt_datetimefield_value(max(last_hours[key], found[key][1])),
            )
            for key, day in days.items()
        ],
    )


def _find_days(keys: set[tuple[int, date]]) -> dict[tuple[int, date], tuple[int, datetime]]:
    rows = UsageDay.objects.filter(
        cluster_id__among={c for c, _ in keys}, day__in={d for _, d in keys}
    ).values_list("pk", "cluster_id", "day", "last_hour")
    found = {(cluster_id, day): (pk, last) for pk, cluster_id, day, last in rows}
    return {key: value for key, value in found.items() if key in keys}


# The cache key where each meter run leaves its stamp (`stamp_run`): a page that shows a
# balance polls it, a cache read and no query, and asks for the balance again once it moved.
RUN_STAMP_KEY = "billing:meter-run"


def stamp_run() -> str:
    """Say that the meter ran (the stamp: new on each run, whatever the clock says)."""
    stamp = secrets.token_hex(6)
    cache.set(RUN_STAMP_KEY, stamp, timeout=None)
    return stamp


def last_run_stamp() -> str:
    """The last meter run's stamp, or "" when the cache has none (one cache read)."""
    return str(cache.get(RUN_STAMP_KEY) or "")


def charge_accrued(*, now: datetime | None = None, batch_size: int = BATCH_SIZE) -> ChargeResult:
    """Charge every running or not-yet-fully-charged machine's usage record up to the
    database's now (or an earlier `now`: tests and the bench replay the past), `batch_size`
    clusters per transaction. A cluster another meter holds is skipped: that meter charges it.
    The meter's run charges the volumes' storage too (`charge_storage`), through
    billing.metering.charge_accrued."""
    # The database's clock, read by the query that finds the clusters (`Now()`), with those
    # whose row says it was charged past its end: refunded (`_refund_past_end`).
    clock = Now() if now is None else Least(Value(now), Now())
    past_end = Q(ended_at__isnull=False, charged_until__gt=F("ended_at"))
    rows = list(
        (_chargeable(UsageRecord.objects.all(), clock) | UsageRecord.objects.filter(past_end))
        .order_by("cluster_id")
        .values_list("cluster_id", flat=True)
        .distinct()
    )
    result = ChargeResult()
    for start in range(0, len(rows), batch_size):
        batch = rows[start : start + batch_size]
        # New clusters' marks are made (and committed) first: a second meter would otherwise
        # wait on the first one's uncommitted insert instead of skipping its clusters.
        _make_marks(batch)
        with transaction.atomic():
            locked = _lock_marks(batch, skip_locked=True)
            if locked:
                result.add(_charge_clusters(locked, now))
    stamp_run()
    return result


def charge_usage(
    *,
    cluster_id: int | None = None,
    record_ids: Iterable[int] | None = None,
    until: datetime | None = None,
) -> ChargeResult:
    """Charge one cluster's records (or the given ones) up to `until`, or to their end.

    Run after a cluster or a worker ends (billing/metering.py `charge_on_commit`), so the bill
    stops at the end instant, not at the next meter run. Each record is charged up to
    min(`until`, the database's now, its `ended_at`), and what the ledger holds past its end is
    refunded. It waits for a meter holding the same cluster.
    """
    if (cluster_id is None) == (record_ids is None):
        raise ValueError("charge_usage needs either a cluster or record_ids.")
    with transaction.atomic():
        if cluster_id is not None:
            return _charge_clusters(_lock_waiting([cluster_id]), until)
        ids = list(record_ids or ())
        clusters = UsageRecord.objects.filter(pk__in=ids).values_list("cluster_id", flat=True)
        return _charge_clusters(_lock_waiting(clusters), until, record_ids=ids)


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


def storage_for_days(per_month: Decimal, days: int) -> Decimal:
    """USD `days` days of storage cost that costs `per_month` USD a storage month (30 days),
    rounded up to the cent: what the balance must cover to create a volume
    (clusters/volumes.py)."""
    cost = per_month * days * Decimal(DAY.total_seconds()) / STORAGE_MONTH_SECONDS
    return cost.quantize(Decimal("0.01"), rounding=ROUND_CEILING)


class BurnRateColumns(NamedTuple):
    machines: Subquery
    stored: Subquery


def burn_rate_columns() -> BurnRateColumns:
    """What a project runs and stores per hour, as two columns to annotate projects with:
    `machines` (USD/h of every machine billed now) and `stored` (GB-month price × GB of every
    kept volume, which `burn_rate_of` turns into USD/h)."""
    money: DecimalField[Decimal, Decimal] = DecimalField(max_digits=24, decimal_places=4)
    machines = (
        UsageRecord.objects.filter(project_id=OuterRef("pk"), ended_at__isnull=True)
        .order_by()
        .values("project_id")
        .annotate(total=Sum("price_per_hour"))
        .values("total")
    )
    # The volumes through the projects' relation: billing does not import clusters.
    volume = _related(Project, "volumes")
    stored = (
        volume._default_manager.filter(project_id=OuterRef("pk"), deleted_at__isnull=True)
        .order_by()
        .values("project_id")
        .annotate(total=Sum(F("price_per_gb_month") * F("size_gb"), output_field=money))
        .values("total")
    )
    return BurnRateColumns(
        machines=Subquery(machines, output_field=money),
        stored=Subquery(stored, output_field=money),
    )


def _related(model: type[Model], name: str) -> type[Model]:
    """The model at the other end of `model`'s relation `name` (another app's model, which
    billing does not import)."""
    related = model._meta.get_field(name).related_model
    assert isinstance(related, type)  # "self" and labels are resolved once the apps are ready
    return related


def burn_rate_of(machines: Decimal | None, stored: Decimal | None) -> Decimal:
    """USD per hour from the two `burn_rate_columns` of a project."""
    return Decimal("0.00") + (machines or 0) + storage_per_hour(stored or Decimal(0), 1)


def burn_rates(project_ids: set[int]) -> dict[int, Decimal]:
    """USD per hour of what each project runs and stores: the price of every machine billed now
    and the storage of every volume it keeps (SPEC §4's burn rate). One query."""
    columns = burn_rate_columns()
    rows = (
        Project.objects.filter(pk__in=project_ids)
        .annotate(machines=columns.machines, stored=columns.stored)
        .values_list("pk", "machines", "stored")
    )
    rates = {project_id: Decimal("0.00") for project_id in project_ids}
    for project_id, machines, stored in rows:
        rates[project_id] = burn_rate_of(machines, stored)
    return rates


def days(start: datetime, end: datetime) -> Iterator[tuple[datetime, datetime]]:
    """`[start, end)` cut at midnight (UTC): (the day's midnight, piece end)."""
    while start < end:
        day = start.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
        piece_end = min(end, day + DAY)
        yield day, piece_end
        start = piece_end


def _chargeable_storage(
    queryset: QuerySet[StorageRecord], now: datetime | Least
) -> QuerySet[StorageRecord]:
    """Storage still billed, and ended storage not yet charged to its end."""
    return queryset.filter(
        Q(ended_at__isnull=True) | Q(charged_until__lt=F("ended_at")), charged_until__lt=now
    )


def _storage_debits(
    records: Iterable[StorageRecord], now: datetime
) -> tuple[dict[tuple[int, datetime], Debit], list[StorageRecord]]:
    """The debit of each (volume, day) for charging locked storage records up to `now` (or
    their end), and the records charged, with their new charged point (in memory).

    Like machines, a volume's cost is computed over its whole span from its start, so its
    debits add up to the rounded cost of everything it stored, however often the meter runs."""
    lines: dict[tuple[int, datetime], Debit] = defaultdict(lambda: Debit(project_id=0))
    changed = []
    for record in records:
        until = min(now, record.ended_at) if record.ended_at else now
        if until <= record.charged_until:
            continue
        price, size, start = record.price_per_gb_month, record.size_gb, record.started_at
        seconds_before = billed_seconds(start, record.charged_until)
        cents_before = storage_cost_in_cents(price, size, seconds_before)
        for day, piece_end in days(record.charged_until, until):
            seconds_after = billed_seconds(start, piece_end)
            cents_after = storage_cost_in_cents(price, size, seconds_after)
            line = lines[(record.volume_id, day)]
            line.project_id = record.project_id
            line.cents += cents_after - cents_before
            line.machine_seconds += seconds_after - seconds_before
            seconds_before, cents_before = seconds_after, cents_after
        record.charged_until = until
        record.charged_amount = cents(cents_before)
        changed.append(record)
    return dict(lines), changed


def _charge_storage_records(records: Sequence[StorageRecord], now: datetime) -> ChargeResult:
    """Charge these locked storage records up to `now` (or their end) onto their per-day
    storage lines; the caller holds the transaction and the records' locks."""
    lines, changed = _storage_debits(records, now)
    update_rows(changed, ["charged_until", "charged_amount"])
    result = ChargeResult(
        volumes=len(changed), project_ids={record.project_id for record in changed}
    )
    result.storage = _post_lines(lines, now, STORAGE_LINES)
    return result


def charge_storage(
    *,
    now: datetime | None = None,
    volume_ids: Iterable[int] | None = None,
    batch_size: int = BATCH_SIZE,
) -> ChargeResult:
    """Charge every volume's storage up to now (the caller's clock, never past the database's;
    or an earlier `now`), or to its end, batch by batch; with `volume_ids`, only theirs
    (waiting for a meter that holds them). Safe to run twice and on several workers at once:
    a batch's records are locked (another meter's are skipped), and a record is only charged
    past its own `charged_until`."""
    # The caller's clock by default, as the volumes are created on it; never past the
    # database's, read by the query that locks the batch.
    clock = Least(Value(now or timezone.now()), Now())
    queryset = StorageRecord.objects.all()
    if volume_ids is not None:
        queryset = queryset.filter(volume_id__in=list(volume_ids))
    skip = connection.features.has_select_for_update_skip_locked and volume_ids is None
    result = ChargeResult()
    after_pk = 0
    while True:
        with transaction.atomic():
            batch = list(
                _chargeable_storage(queryset.filter(pk__gt=after_pk), clock)
                .select_for_update(skip_locked=skip)
                .annotate(clock=clock)
                .order_by("pk")[:batch_size]
            )
            if batch:
                result.add(_charge_storage_records(batch, batch[0].clock))
        if len(batch) < batch_size:
            return result
        after_pk = batch[-1].pk
