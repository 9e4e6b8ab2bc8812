"""What the Billing page, the billing API and the CSV export show (SPEC §4, docs/billing.md).

Every report here runs a fixed number of queries whatever the number of clusters, machines
or ledger lines: cluster lines are aggregated by the database from the hourly usage lines of
the ledger, and per-machine rows are computed from the usage records with the meter's own
rounding rule (`billing.meter.cost_between`), so the two agree to the cent.
"""

import calendar
import heapq
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal

from django.core.exceptions import ObjectDoesNotExist
from django.db.models import (
    BooleanField,
    Case,
    CharField,
    Exists,
    F,
    IntegerField,
    Max,
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
from django.db.models.functions import Now, TruncDate, TruncMonth
from django.db.models.lookups import IsNull
from django.utils import timezone

from accounts.models import Membership, Project
from billing import policy
from billing.access import BILLING_ROLES
from billing.meter import (
    HOUR,
    billed_seconds,
    burn_rate_columns,
    burn_rate_of,
    burn_rates,
    cents,
    cost_between,
    cost_in_cents,
    marks,
    settle,
)
from billing.models import LedgerEntry, UsageDay, UsageRecord, balance_of
from runcrate.durations import span
from runcrate.errors import Refused
from runcrate.money import plain, usd, usd_rate

ZERO = Decimal("0.00")
# Lines that are not usage: listed one by one on the Billing page.
CREDIT_KINDS = (LedgerEntry.Kind.TOPUP, LedgerEntry.Kind.ADJUSTMENT)
CENT = Decimal("0.01")
MAX_MONTHS = 36


class MonthInvalid(Refused, ValueError):
    """A month that is not YYYY-MM (or out of range)."""

    def __init__(self, message: str) -> None:
        super().__init__("invalid_month", message, field="month")


@dataclass(frozen=True, order=True)
class Month:
    year: int
    month: int

    @classmethod
    def of(cls, moment: datetime) -> "Month":
        moment = moment.astimezone(UTC)
        return cls(moment.year, moment.month)

    @classmethod
    def parse(cls, raw: str | None, *, now: datetime | None = None) -> "Month":
        """`YYYY-MM`; empty means the current month. Raises MonthInvalid with a message."""
        if not raw:
            return cls.of(now or timezone.now())
        try:
            year, month = (int(part) for part in raw.strip().split("-"))
            if not (2000 <= year <= 2999 and 1 <= month <= 12) or len(raw.strip()) != 7:
                raise ValueError
        except ValueError:
            raise MonthInvalid(
                f"month must be a month as YYYY-MM, like 2026-11, not {raw!r}."
            ) from None
        return cls(year, month)

    @property
    def start(self) -> datetime:
        return datetime(self.year, self.month, 1, tzinfo=UTC)

    @property
    def first_day(self) -> date:
        return date(self.year, self.month, 1)

    @property
    def end(self) -> datetime:
        return self.next.start

    @property
    def next(self) -> "Month":
        return Month(self.year + self.month // 12, self.month % 12 + 1)

    @property
    def previous(self) -> "Month":
        return Month(self.year - (self.month == 1), (self.month - 2) % 12 + 1)

    @property
    def days(self) -> int:
        return calendar.monthrange(self.year, self.month)[1]

    @property
    def param(self) -> str:
        return f"{self.year:04d}-{self.month:02d}"

    @property
    def label(self) -> str:
        return f"{calendar.month_name[self.month]} {self.year}"

    def __str__(self) -> str:
        return self.param


def months_since(created_at: datetime, *, now: datetime | None = None) -> list[Month]:
    """The months to choose from, newest first: from the project's first to this one."""
    current, first = Month.of(now or timezone.now()), Month.of(created_at)
    months = [current]
    while months[-1] > first and len(months) < MAX_MONTHS:
        months.append(months[-1].previous)
    return months


def hours(seconds: int) -> Decimal:
    return (Decimal(seconds) / 3600).quantize(CENT, ROUND_HALF_UP)


# ---- the top of the page -------------------------------------------------------------------


@dataclass(frozen=True)
class Summary:
    balance: Decimal
    burn_rate: Decimal
    hours_remaining: Decimal | None  # None while nothing runs
    # The part of burn_rate that is machines billed now (clusters running), where it was read
    # (`summary_for_member`, the top bar's); None where only the total was.
    running_per_hour: Decimal | None = None

    @classmethod
    def of(
        cls, *, balance: Decimal, burn_rate: Decimal, running_per_hour: Decimal | None = None
    ) -> "Summary":
        hours = policy.runway_hours(balance, burn_rate)
        remaining = None if hours is None else hours.quantize(CENT, ROUND_HALF_UP)
        return cls(
            balance=balance,
            burn_rate=burn_rate,
            hours_remaining=remaining,
            running_per_hour=running_per_hour,
        )

    @property
    def seconds_remaining(self) -> Decimal | None:
        """What the balance covers of what runs, unrounded (hours_remaining is to the cent):
        the runway (billing/policy.py)."""
        return policy.runway_seconds(self.balance, self.burn_rate)

    @property
    def low(self) -> bool:
        """The balance covers less than an hour of what runs (the Billing page's warning, the
        low-balance email's rule: billing/policy.py)."""
        return policy.is_low(self.balance, self.burn_rate)

    @property
    def runway_warns(self) -> bool:
        """The top bar's runway banner (billing/policy.py `runway_warns`): a cluster runs and
        the balance is low. False where what runs was not read apart (`running_per_hour`)."""
        return policy.runway_warns(
            self.balance, self.burn_rate, running_per_hour=self.running_per_hour or Decimal(0)
        )


def summary(*, project_id: int) -> Summary:
    """Current balance, burn rate (USD/h of running machines and stored volumes) and hours
    left: two queries, neither of which reads the ledger."""
    balance = balance_of(project_id)  # the running total: one row (billing/balances.py)
    return Summary.of(balance=balance, burn_rate=burn_rates({project_id})[project_id])


def summary_for_member(*, project: Project, user: Model) -> Summary | None:
    """The summary of a project row in hand (its `balance` is the running total) for `user`,
    or None when the user may not see billing (a developer: billing/access.py). One query:
    the burn rate and the user's role together; what the top bar of every page costs."""
    columns = burn_rate_columns()
    row = (
        Project.objects.filter(pk=project.pk)
        .annotate(
            machines=columns.machines,
            stored=columns.stored,
            sees_billing=Exists(
                Membership.objects.filter(
                    project_id=OuterRef("pk"), user_id=user.pk, role__in=BILLING_ROLES
                )
            ),
        )
        .values_list("machines", "stored", "sees_billing")
        .first()
    )
    if row is None or not row[2]:
        return None
    return Summary.of(
        balance=project.balance,
        burn_rate=burn_rate_of(row[0], row[1]),
        running_per_hour=row[0] or Decimal("0.00"),
    )


# ---- a cluster's cost so far and uptime (docs/billing.md "Cost so far and uptime") ------------


@dataclass(frozen=True)
class ClusterCost:
    """What a cluster's machines cost from the moment billing started to now (or to their end),
    by the meter's rule, the time it has been billed, and (asked with `rows=True`) a row per
    machine and calendar month that add up to `cost` to the cent (docs/billing.md, "One cost")."""

    cost: Decimal
    billed_from: datetime | None  # None: never billed
    billed_until: datetime | None  # the last machine's end; None while one is billed
    uptime_seconds: int
    machines: int = 0  # the machines billed (a usage record each), ended ones included
    # The machines billed now while it runs, or that were billed to its end once it ended:
    # a worker added counts, a machine lost or replaced before the end does not.
    machines_now: int = 0
    node_costs: Mapping[int, Decimal] = field(default_factory=dict)  # node id -> its cost
    rows: tuple["MachineRow", ...] = ()

    @property
    def billed(self) -> bool:
        return self.billed_from is not None

    @property
    def running(self) -> bool:
        return self.billed and self.billed_until is None

    def ahead(self, *, price_per_hour: Decimal, seconds: int) -> list[tuple[int, str, str]]:
        """The cost so far and the uptime as the page words them at each of the next `seconds`
        seconds where either changes: (seconds from now, cost, uptime). The cost grows by
        `price_per_hour` rounded as the meter rounds it (`cost_in_cents`), worded by
        runcrate.money and runcrate.durations, so the page's script only shows what is written
        here (docs/clusters.md, "Sticky header")."""
        base = int(self.cost * 100)
        rows: list[tuple[int, str, str]] = []
        shown = (usd(self.cost), span(self.uptime_seconds))
        for later in range(1, seconds + 1):
            now = (
                usd(cents(base + cost_in_cents(price_per_hour, later))),
                span(self.uptime_seconds + later),
            )
            if now != shown:
                rows.append((later, *now))
                shown = now
        return rows


NOT_BILLED = ClusterCost(cost=ZERO, billed_from=None, billed_until=None, uptime_seconds=0)


def cluster_costs(
    cluster_ids: Iterable[int], *, now: datetime, rows: bool = False
) -> dict[int, ClusterCost]:
    """Each cluster's cost so far, one query for any number of clusters (a row per machine):
    the one figure every page, the API, the CLI and the MCP server show (docs/billing.md,
    "One cost"). A machine's cost at `now` is what the ledger charged its record plus what its
    open record ran since, which by the meter's rounding is `cost(price, whole seconds from its
    start to its end or now)`: so it is the same whether the meter ran or not, and equals the
    cluster's usage lines in the ledger once it has. Each machine is rounded on its own, and
    the cluster's cost is the sum of its machines'; with `rows`, a machine running across a
    month's end has a row per month (`cost(b) − cost(a)`), and the rows add up to the cost.
    Uptime: from the first machine's start to the last one's end, or to now while one is
    billed. A cluster never billed is NOT_BILLED.

    Now is never past the database's (read by the same query): the meter charges on that
    clock, so a web worker whose clock runs fast shows no cost the meter would not charge."""
    ids = list(cluster_ids)
    if not ids:
        return {}
    costs = _costs_of(UsageRecord.objects.filter(cluster_id__in=ids), now=now, rows=rows)
    return {cluster_id: costs.get(cluster_id, NOT_BILLED) for cluster_id in ids}


def _costs_of(
    records: QuerySet[UsageRecord], *, now: datetime, rows: bool
) -> dict[int, ClusterCost]:
    records = records.annotate(clock=Now()).order_by()
    if rows:
        records = records.select_related(
            "node__replaced_by", "cluster__machine_type__gpu", "cluster__machine_type__location"
        ).order_by("cluster_id", "node__index", "pk")
    else:
        # A cost reads these of each record, nothing of what the meter keeps (charged_*): a
        # 64-machine cluster's API detail parses 64 times fewer of each (issue 38).
        records = records.only("cluster", "node", "price_per_hour", "started_at", "ended_at")
    by_cluster: dict[int, list[UsageRecord]] = defaultdict(list)
    for record in records:
        by_cluster[record.cluster_id].append(record)
        now = min(now, record.clock)
    return {cluster_id: _cluster_cost(found, now, rows) for cluster_id, found in by_cluster.items()}


def _cluster_cost(records: list[UsageRecord], now: datetime, rows: bool) -> ClusterCost:
    node_cents: dict[int, int] = defaultdict(int)
    machine_rows: list[MachineRow] = []
    for record in records:
        end = record.ended_at or now
        node_cents[record.node_id] += cost_in_cents(
            record.price_per_hour, billed_seconds(record.started_at, end)
        )
        if rows:
            machine_rows += _month_rows(record, end)
    first = min(record.started_at for record in records)
    running = [record for record in records if record.ended_at is None]
    last = None if running else max(record.ended_at for record in records if record.ended_at)
    to_end = running or [record for record in records if record.ended_at == last]
    return ClusterCost(
        cost=cents(sum(node_cents.values())),
        billed_from=first,
        billed_until=last,
        uptime_seconds=billed_seconds(first, last or now),
        machines=len(records),
        machines_now=len(to_end),
        node_costs={node_id: cents(amount) for node_id, amount in node_cents.items()},
        rows=tuple(machine_rows),
    )


def _month_rows(record: UsageRecord, end: datetime) -> list["MachineRow"]:
    """A machine's rows from its start to `end`, one per calendar month (UTC) it ran in:
    each `cost(b) − cost(a)` of its whole span, so they add up to its cost to the cent."""
    found = []
    month, last = Month.of(record.started_at), Month.of(end)
    while month.start <= last.start:
        found.append(machine_row(record, month, until=end))
        month = month.next
    return found


# ---- the month's statement -------------------------------------------------------------------


@dataclass
class Line:
    """One line of a month: a top-up, an adjustment, or one cluster's usage."""

    kind: str
    at: date  # the day of the line (a cluster line: its first day in the month)
    last_period: datetime | None
    cluster_id: int | None
    title: str
    billed: bool  # a usage line: one of its cluster's machines still runs
    amount: Decimal
    machine_seconds: int
    entry_id: int
    accumulating: bool = False

    @property
    def is_usage(self) -> bool:
        return self.kind == LedgerEntry.Kind.USAGE

    @property
    def hours(self) -> Decimal:
        return hours(self.machine_seconds)

    @property
    def cost(self) -> Decimal:
        """A charge as a bill reads it: the ledger's debit, positive."""
        return -self.amount

    @property
    def is_storage(self) -> bool:
        return self.kind == LedgerEntry.Kind.STORAGE

    @property
    def label(self) -> str:
        if self.is_usage:
            return f"Cluster usage — {self.title}"
        if self.is_storage:
            return f"Volume storage — {self.title}"
        return self.title or LedgerEntry.Kind(self.kind).label


_LINE_FIELDS = (
    "line_kind",
    "at",
    "last_period",
    "cluster_id",
    "title",
    "billed",
    "line_amount",
    "seconds",
    "entry_id",
)


def still_billed() -> IsNull:
    """Whether the row's cluster is still billed: one of its machines runs (billing's own
    record of it, instead of the cluster's status, which is the clusters' business)."""
    # A scalar subquery, not EXISTS: PostgreSQL may answer an EXISTS for many rows with one
    # hashed scan of every running machine, which is what a page of lines must not cost.
    running = UsageRecord.objects.filter(cluster_id=OuterRef("cluster_id"), ended_at__isnull=True)
    return IsNull(Subquery(running.order_by().values("pk")[:1]), False)


def _days_in(month: Month) -> QuerySet[UsageDay]:
    return UsageDay.objects.filter(day__gte=month.first_day, day__lt=month.next.first_day)


def _of_line(month: Month, column: str, aggregate: type[Sum] | type[Max]) -> Subquery:
    """`aggregate` of `column` over the month's days of the outer row's cluster (≤ 31 rows)."""
    days = _days_in(month).filter(cluster_id=OuterRef("cluster_id")).order_by()
    return Subquery(days.values("cluster_id").annotate(total=aggregate(column)).values("total")[:1])


def _cluster_lines(project_id: int, month: Month) -> QuerySet:
    """One line per cluster billed in the month: its first day's row of the per-day rollup
    (no earlier day of the cluster in the month), its sums read from its own days. Ordered by
    that row's day and id, which an index holds (`usage_day_project`), so a page of lines reads
    a page of rows whatever the number of clusters, not one aggregate over all of them."""
    earlier = _days_in(month).filter(cluster_id=OuterRef("cluster_id"), day__lt=OuterRef("day"))
    return (
        _days_in(month)
        .filter(project_id=project_id)
        .filter(~Exists(earlier))
        .annotate(
            line_kind=Value(LedgerEntry.Kind.USAGE.value, output_field=CharField()),
            at=F("day"),
            last_period=_of_line(month, "last_hour", Max),
            title=F("cluster__name"),
            billed=still_billed(),
            line_amount=_of_line(month, "amount", Sum),
            seconds=_of_line(month, "machine_seconds", Sum),
            entry_id=F("pk"),
        )
        .values_list(*_LINE_FIELDS)
    )


def _credit_lines(project_id: int, month: Month) -> QuerySet:
    return (
        LedgerEntry.objects.filter(
            project_id=project_id, created_at__gte=month.start, created_at__lt=month.end
        )
        .filter(kind__in=CREDIT_KINDS)
        .annotate(
            line_kind=F("kind"),
            at=TruncDate("created_at", tzinfo=UTC),
            last_period=F("period_start"),
            title=F("note"),
            billed=Value(False, output_field=BooleanField()),
            line_amount=F("amount"),
            seconds=F("machine_seconds"),
            entry_id=F("pk"),
        )
        .values_list(*_LINE_FIELDS)
    )


def _storage_lines(project_id: int, month: Month) -> QuerySet:
    """One line per volume stored in the month, from its per-day storage lines (≤ 31 rows)."""
    return (
        LedgerEntry.objects.filter(
            project_id=project_id,
            kind=LedgerEntry.Kind.STORAGE,
            period_start__gte=month.start,
            period_start__lt=month.end,
        )
        .values("volume_id")
        .annotate(
            line_kind=Value(LedgerEntry.Kind.STORAGE.value, output_field=CharField()),
            at=Min(TruncDate("period_start", tzinfo=UTC)),
            last_period=Max("period_start"),
            line_cluster=Value(None, output_field=IntegerField()),
            title=F("volume__name"),
            billed=Value(False, output_field=BooleanField()),
            line_amount=Sum("amount"),
            seconds=Sum("machine_seconds"),
            entry_id=Min("pk"),
        )
        .values_list(
            "line_kind",
            "at",
            "last_period",
            "line_cluster",
            "title",
            "billed",
            "line_amount",
            "seconds",
            "entry_id",
        )
    )


LINES_PER_PAGE = 25
MAX_PAGE = 10_000  # a page number past this reads as this (a huge one must not reach SQL)


@dataclass(frozen=True)
class StatementPage:
    """A page of the month's statement: its lines, and whether pages come before and after it.
    It holds no count of all the lines (that would read every cluster of the month): the page
    links to the first, the previous and the next page."""

    number: int
    lines: list[Line]
    has_next: bool

    @property
    def has_previous(self) -> bool:
        return self.number > 1

    @property
    def has_other_pages(self) -> bool:
        return self.has_previous or self.has_next

    @property
    def previous_page_number(self) -> int:
        return self.number - 1

    @property
    def next_page_number(self) -> int:
        return self.number + 1


def _statement_key(row: tuple) -> tuple[date, int]:
    at = row[1]
    if isinstance(at, str):  # SQLite hands dates back as text
        at = date.fromisoformat(at[:10])
    return at, row[-1]


def statement_page(
    *,
    project_id: int,
    month: Month,
    number: int = 1,
    per_page: int = LINES_PER_PAGE,
    now: datetime | None = None,
    live: bool = False,
) -> StatementPage:
    """Page `number` of the month's lines, newest first: one line per top-up or adjustment, one
    per cluster billed in the month and one per volume whose storage was charged in it. Three
    queries, each reading at most the lines up to the end of the page (each part in its own
    order, merged here), so the page costs the same for 30 clusters and for 5,000. With `live`
    (the Billing page), the lines of clusters still billed are brought to `now` (`_to_now`)."""
    number = min(max(1, number), MAX_PAGE)
    wanted = number * per_page + 1  # one more than the page: is there a next one?
    parts = [
        list(part.order_by("-at", "-entry_id")[:wanted])
        for part in (
            _cluster_lines(project_id, month),
            _credit_lines(project_id, month),
            _storage_lines(project_id, month),
        )
    ]
    rows = list(heapq.merge(*parts, key=_statement_key, reverse=True))[:wanted]
    first = (number - 1) * per_page
    lines = to_lines(rows[first : first + per_page], now=now)
    if live:
        _to_now(lines, month, to_lines(rows), now or timezone.now())
    return StatementPage(number=number, lines=lines, has_next=len(rows) > first + per_page)


def in_month(rows: Iterable["MachineRow"], month: Month) -> list["MachineRow"]:
    """The rows of `cluster_costs` (`rows=True`) for `month`."""
    return [row for row in rows if month.start <= row.started_at < month.end]


def _to_now(lines: list[Line], month: Month, read: list[Line], now: datetime) -> None:
    """The page's lines of clusters still billed, brought from the meter's last charge to `now`
    by the one cost (`cluster_costs`): the month's part of the cluster's cost so far, its
    machines' month rows summed, as its page, its Billing tab and the API show it. A line of a
    cluster that ended is the ledger's, which the meter charged to the end: the same figure.
    One query, for the clusters still billed among the lines read (those up to the end of the
    page, as the statement reads them), so a page costs the same whatever it shows."""
    billed = [line.cluster_id for line in read if line.is_usage and line.billed]
    live = cluster_costs([cluster_id for cluster_id in billed if cluster_id], now=now, rows=True)
    for line in lines:
        if line.is_usage and line.cluster_id in live:
            rows = in_month(live[line.cluster_id].rows, month)
            line.amount = -sum((row.cost for row in rows), ZERO)
            line.machine_seconds = sum(row.seconds for row in rows)


def month_lines(*, project_id: int, month: Month, now: datetime | None = None) -> list[Line]:
    """Every line of the month, oldest first: the statement's three parts (a line per cluster,
    per volume, per top-up or adjustment) read whole, for the invoice (billing/invoices.py).
    Three queries, however many lines."""
    parts = [
        list(part.order_by("at", "entry_id"))
        for part in (
            _cluster_lines(project_id, month),
            _credit_lines(project_id, month),
            _storage_lines(project_id, month),
        )
    ]
    return to_lines(list(heapq.merge(*parts, key=_statement_key)), now=now)


def _line_moment() -> Case:
    """When a line that is not hourly usage falls, as the statement places it: a storage line
    at the day it charges, a credit when it was made."""
    return Case(
        When(kind=LedgerEntry.Kind.STORAGE, then=F("period_start")), default=F("created_at")
    )


def months_with_lines(*, project_id: int) -> set[Month]:
    """The months in which the project has a line: usage (by its days), storage (by the day it
    charges) or a credit (by when it was made). Two queries over the per-day rollup and the
    ledger without its hourly usage lines."""
    days = (
        UsageDay.objects.filter(project_id=project_id)
        .annotate(month=TruncMonth("day"))
        .values_list("month", flat=True)
        .distinct()
    )
    others = (
        LedgerEntry.objects.filter(project_id=project_id)
        .exclude(kind=LedgerEntry.Kind.USAGE)
        .annotate(month=TruncMonth(_line_moment(), tzinfo=UTC))
        .values_list("month", flat=True)
        .distinct()
    )
    found = [*days.order_by(), *others.order_by()]
    return {Month(moment.year, moment.month) for moment in found}


def projects_with_lines(*, month: Month) -> set[int]:
    """The projects with a line in `month`, as `months_with_lines` counts them; two queries."""
    days = _days_in(month).values_list("project_id", flat=True).distinct()
    others = (
        LedgerEntry.objects.exclude(kind=LedgerEntry.Kind.USAGE)
        .alias(moment=_line_moment())
        .filter(moment__gte=month.start, moment__lt=month.end)
        .values_list("project_id", flat=True)
        .distinct()
    )
    return {*days.order_by(), *others.order_by()}


def to_lines(rows: list[tuple], *, now: datetime | None = None) -> list[Line]:
    now = now or timezone.now()
    lines = []
    for row in rows:
        line = Line(**dict(zip(_LINE_FIELDS_OUT, row, strict=True)))
        line.amount = Decimal(line.amount).quantize(CENT)
        line.accumulating = bool(
            line.is_usage
            and line.last_period is not None
            and line.billed
            and now < _aware(line.last_period) + HOUR
        )
        lines.append(line)
    return lines


_LINE_FIELDS_OUT = (
    "kind",
    "at",
    "last_period",
    "cluster_id",
    "title",
    "billed",
    "amount",
    "machine_seconds",
    "entry_id",
)


def _aware(moment: datetime | str) -> datetime:
    # A UNION's columns lose their field types on some backends: read them back as datetimes.
    if isinstance(moment, str):
        moment = datetime.fromisoformat(moment)
    return moment if timezone.is_aware(moment) else moment.replace(tzinfo=UTC)


@dataclass(frozen=True)
class MonthTotals:
    usage: Decimal  # positive: what the month's usage cost
    credits: Decimal  # top-ups and adjustments, signed
    storage: Decimal = ZERO  # positive: what the month's volume storage cost


def month_totals(*, project_id: int, month: Month) -> MonthTotals:
    usage = UsageDay.objects.filter(
        project_id=project_id, day__gte=month.first_day, day__lt=month.next.first_day
    ).aggregate(total=Sum("amount"))["total"]
    credit = Q(kind__in=CREDIT_KINDS, created_at__gte=month.start, created_at__lt=month.end)
    storage = Q(
        kind=LedgerEntry.Kind.STORAGE, period_start__gte=month.start, period_start__lt=month.end
    )
    totals = (
        LedgerEntry.objects.filter(project_id=project_id)
        .filter(credit | storage)
        .aggregate(credits=Sum("amount", filter=credit), storage=Sum("amount", filter=storage))
    )
    return MonthTotals(
        usage=-(usage or ZERO),
        credits=totals["credits"] or ZERO,
        storage=-(totals["storage"] or ZERO),
    )


def spend_per_day(*, project_id: int, month: Month) -> list[tuple[date, Decimal]]:
    """Usage and volume storage charged on each day of the month (every day, zero included):
    one query."""
    machines = (
        UsageDay.objects.filter(
            project_id=project_id, day__gte=month.first_day, day__lt=month.next.first_day
        )
        .values("day")
        .annotate(total=Sum("amount"))
        .values_list("day", "total")
        .order_by()
    )
    storage = (
        LedgerEntry.objects.filter(
            project_id=project_id,
            kind=LedgerEntry.Kind.STORAGE,
            period_start__gte=month.start,
            period_start__lt=month.end,
        )
        .annotate(day=TruncDate("period_start", tzinfo=UTC))
        .values("day")
        .annotate(total=Sum("amount"))
        .values_list("day", "total")
        .order_by()
    )
    by_day: dict[date, Decimal] = defaultdict(lambda: ZERO)
    for day, total in machines.union(storage, all=True):
        if isinstance(day, str):  # a UNION's columns lose their types on SQLite
            day = date.fromisoformat(day[:10])
        by_day[day] -= Decimal(total)
    first = month.first_day
    return [
        (first + timedelta(days=n), by_day.get(first + timedelta(days=n), ZERO))
        for n in range(month.days)
    ]


# ---- per-machine rows --------------------------------------------------------------------------


@dataclass(frozen=True)
class MachineRow:
    cluster_id: int
    cluster_name: str
    node: str
    gpu: str
    location: str
    started_at: datetime
    ended_at: datetime | None  # None: still running
    seconds: int
    rate: Decimal
    cost: Decimal

    @property
    def hours(self) -> Decimal:
        return hours(self.seconds)


def _records_in(month: Month) -> QuerySet[UsageRecord]:
    """The records that may have been charged in `month`: a running one's row says how far it
    was charged only once an hour (billing/meter.py), so each is `settle`d before it is read."""
    return (
        UsageRecord.objects.filter(
            Q(charged_until__gt=month.start)
            | Q(ended_at__isnull=True)
            | Q(ended_at__gt=month.start),
            started_at__lt=month.end,
        )
        .select_related(
            "node__replaced_by", "cluster__machine_type__gpu", "cluster__machine_type__location"
        )
        .order_by("cluster_id", "node__index", "pk")
    )


def _settled_rows(records: Iterable[UsageRecord], marks: dict, month: Month) -> Iterator:
    for record in records:
        settle(record, marks.get(record.cluster_id))
        if record.charged_until > month.start:
            yield record.cluster_id, machine_row(record, month)


def machine_name(record: UsageRecord) -> str:
    """A machine's name on the bill: its node's, and for one that was replaced (lost, or
    unhealthy: docs/lifecycle.md "Repair") when, so its row and its replacement's read apart:
    "node-3 (replaced 14:02)"."""
    node = record.node
    try:
        replacement = getattr(node, "replaced_by")  # noqa: B009 (a reverse one-to-one)
    except ObjectDoesNotExist:
        return node.name
    return f"{node.name} (replaced {replacement.reserved_at:%H:%M})"


def machine_row(record: UsageRecord, month: Month, *, until: datetime | None = None) -> MachineRow:
    """A machine's part of the month, up to where the meter has charged it (or to `until`:
    `cluster_costs`' rows), never past its end (what the meter charged past an end it refunds:
    billing/meter.py `_refund_past_end`)."""
    start = max(record.started_at, month.start)
    reached = record.charged_until if until is None else until
    charged_end = min(reached, month.end)
    if record.ended_at is not None:
        charged_end = max(start, min(charged_end, record.ended_at))
    if record.ended_at is not None and record.ended_at <= month.end:
        end: datetime | None = record.ended_at
    elif reached >= month.end:
        end = month.end  # runs on after the month: its part of the month is over
    else:
        end = None  # running
    machine_type = record.cluster.machine_type
    return MachineRow(
        cluster_id=record.cluster_id,
        cluster_name=record.cluster.name,
        node=machine_name(record),
        gpu=f"{machine_type.gpus_per_machine}× {machine_type.gpu.name}",
        location=machine_type.location.code,
        started_at=start,
        ended_at=end,
        seconds=billed_seconds(record.started_at, charged_end)
        - billed_seconds(record.started_at, start),
        rate=record.price_per_hour,
        cost=cost_between(record, start, charged_end),
    )


def machine_rows(*, cluster: Model, month: Month, now: datetime | None = None) -> list[MachineRow]:
    """One row per machine of `cluster` billed in `month`, up to where the meter charged it
    (the ledger's: two queries); with `now` (the Billing page's opened line), up to `now`: the
    one cost's rows (`cluster_costs`, one query), as the line of a cluster still billed is."""
    if now is not None:
        cost = cluster_costs([cluster.pk], now=now, rows=True)[cluster.pk]
        return in_month(cost.rows, month)
    records = _records_in(month).filter(cluster_id=cluster.pk)
    found = marks(cluster_id__in=[cluster.pk])
    return [row for _, row in _settled_rows(records, found, month)]


def machine_rows_by_cluster(
    *, project_id: int, month: Month, cluster_ids: list[int] | None = None
) -> dict[int, list[MachineRow]]:
    records = _records_in(month).filter(project_id=project_id)
    if cluster_ids is not None:
        records = records.filter(cluster_id__in=cluster_ids)
    found = marks(cluster__project_id=project_id)
    rows: dict[int, list[MachineRow]] = defaultdict(list)
    for cluster_id, row in _settled_rows(records.iterator(chunk_size=2000), found, month):
        rows[cluster_id].append(row)
    return rows


# ---- the API's usage report ------------------------------------------------------------------


@dataclass(frozen=True)
class ClusterUsage:
    cluster_id: int
    name: str
    machine_seconds: int
    total: Decimal
    accumulating: bool
    machines: list[MachineRow]

    @property
    def hours(self) -> Decimal:
        return hours(self.machine_seconds)


def cluster_usage(
    *, project_id: int, month: Month, offset: int, limit: int, now: datetime | None = None
) -> tuple[int, list[ClusterUsage]]:
    """A page of the month's cluster lines with their machines: three queries."""
    queryset = _cluster_lines(project_id, month).order_by("-at", "-entry_id")
    total = queryset.count()
    lines = to_lines(list(queryset[offset : offset + limit]), now=now)
    cluster_ids = [line.cluster_id for line in lines if line.cluster_id is not None]
    assert len(cluster_ids) == len(lines)  # _cluster_lines: every line is a cluster's
    machines = machine_rows_by_cluster(project_id=project_id, month=month, cluster_ids=cluster_ids)
    return total, [
        ClusterUsage(
            cluster_id=cluster_id,
            name=line.title,
            machine_seconds=line.machine_seconds,
            total=-line.amount,
            accumulating=line.accumulating,
            machines=machines.get(cluster_id, []),
        )
        for cluster_id, line in zip(cluster_ids, lines, strict=True)
    ]


# ---- CSV ---------------------------------------------------------------------------------------

CSV_HEADER = [
    "type",
    "date",
    "cluster",
    "node",
    "gpu",
    "location",
    "start",
    "end",
    "hours",
    "rate_usd_per_hour",
    "amount_usd",
    "note",
]


def _iso(moment: datetime | None) -> str:
    if moment is None:
        return ""
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def csv_rows(*, project_id: int, month: Month) -> Iterator[list[str]]:
    """The month as CSV rows: one per machine (cost as a debit) and one per top-up or
    adjustment. Summing `amount_usd` gives the month's net, as on the page."""
    yield CSV_HEADER
    credits = (
        LedgerEntry.objects.filter(
            project_id=project_id, created_at__gte=month.start, created_at__lt=month.end
        )
        .filter(kind__in=CREDIT_KINDS)
        .order_by("created_at", "pk")
    )
    for entry in credits:
        yield [
            entry.kind,
            _iso(entry.created_at),
            "",
            "",
            "",
            "",
            "",
            "",
            "",
            "",
            plain(entry.amount),
            entry.note,
        ]
    yield from _storage_csv_rows(project_id=project_id, month=month)
    for records in machine_rows_by_cluster(project_id=project_id, month=month).values():
        for row in records:
            yield [
                "usage",
                _iso(row.started_at),
                row.cluster_name,
                row.node,
                row.gpu,
                row.location,
                _iso(row.started_at),
                _iso(row.ended_at),
                f"{row.hours:.2f}",
                plain(row.rate),
                plain(-row.cost),
                "running" if row.ended_at is None else "",
            ]


def _storage_csv_rows(*, project_id: int, month: Month) -> Iterator[list[str]]:
    """One row per volume whose storage was charged in the month (its cost as a debit)."""
    volumes = (
        LedgerEntry.objects.filter(
            project_id=project_id,
            kind=LedgerEntry.Kind.STORAGE,
            period_start__gte=month.start,
            period_start__lt=month.end,
        )
        .values(
            "volume_id",
            "volume__name",
            "volume__size_gb",
            "volume__location__code",
            "volume__price_per_gb_month",
            "volume__created_at",
            "volume__deleted_at",
        )
        .annotate(total=Sum("amount"))
        .order_by("volume__name", "volume_id")
    )
    for row in volumes:
        start = max(row["volume__created_at"], month.start)
        deleted = row["volume__deleted_at"]
        end = deleted if deleted is not None and deleted < month.end else None
        yield [
            "storage",
            _iso(start),
            "",
            "",
            "",
            row["volume__location__code"],
            _iso(start),
            _iso(end),
            "",
            "",
            plain(row["total"]),
            f"Volume storage — {row['volume__name']} ({row['volume__size_gb']} GB at "
            f"{usd_rate(row['volume__price_per_gb_month'])} per GB-month)",
        ]
