"""Environments and their monthly budgets (SPEC §4-§5, docs/billing.md).

An environment's month-to-date spend is the usage the meter has charged to its clusters since
the start of the calendar month (UTC). A budget is reached when the spend is at or over it
(`is_reached`, the one comparison: a spend equal to the budget stops): reaching it stops the
environment's clusters (clusters/lifecycle/stops.py) and refuses new ones
(clusters/lifecycle/reserve.py `require_budget`).
"""

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, Protocol

from django.db import IntegrityError, transaction
from django.db.models import Sum
from django.utils import timezone

import audit
from accounts.models import Environment, Project
from billing import policy
from billing.models import UsageDay
from runcrate.errors import Refused
from runcrate.money import TOO_LARGE, TOO_PRECISE, TOO_SMALL, NotAnAmount, read_amount, usd

MAX_BUDGET = Decimal("10000000.00")
MAX_ENVIRONMENTS = 50
NAME_RE = re.compile(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?")


class BudgetRefused(Refused):
    """Bad input for a budget or an environment, with a code and a sentence for a person."""

    STATUS = {"budget_below_spend": 409}


class BudgetBelowSpend(BudgetRefused):
    """A budget at or below the month's spend would stop clusters that run: it is set only when
    confirmed. Carries what it would stop, for the page that asks."""

    def __init__(self, *, environment: Environment, amount: Decimal, stops: "BudgetStops") -> None:
        names = ", ".join(cluster.name for cluster in stops.clusters)
        count = len(stops.clusters)
        super().__init__(
            "budget_below_spend",
            f"A monthly budget of {usd(amount)} is at or below what {environment.name} has "
            f"spent this month ({usd(stops.spent)}): it stops its {count} running "
            f"cluster{'s' if count != 1 else ''} ({names}) within a minute, deleting everything "
            "on their machines, and no new cluster starts there until next month or a higher "
            'budget. Nothing was changed; send it again confirmed ("confirm": true) to set it.',
            field="monthly_budget",
        )
        self.amount = amount
        self.stops = stops


def month_start(now: datetime | None = None) -> datetime:
    now = (now or timezone.now()).astimezone(UTC)
    return now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def spend_by_environment(
    *, environment_ids: list[int], now: datetime | None = None
) -> dict[int, Decimal]:
    """Month-to-date spend of each environment, in one query."""
    if not environment_ids:
        return {}
    rows = (
        UsageDay.objects.filter(
            cluster__environment_id__in=environment_ids, day__gte=month_start(now).date()
        )
        .values("cluster__environment_id")
        .annotate(total=Sum("amount"))
        .order_by()
    )
    spend = {environment_id: Decimal("0.00") for environment_id in environment_ids}
    for row in rows:
        spend[row["cluster__environment_id"]] = -row["total"]
    return spend


def month_to_date_spend(*, environment: Environment, now: datetime | None = None) -> Decimal:
    return spend_by_environment(environment_ids=[environment.pk], now=now)[environment.pk]


def is_reached(*, spent: Decimal, budget: Decimal | None) -> bool:
    """Whether a month's spend `spent` reached `budget`: at or over it. No budget (None) is
    never reached; a budget of zero is reached from the start."""
    return budget is not None and spent >= budget


def parse_budget(raw: object) -> Decimal | None:
    """A budget from a form or the API: empty or None clears it; else 0 ≤ amount, 2 places."""
    if raw is None or (isinstance(raw, str) and raw.strip() == ""):
        return None
    try:
        return read_amount(raw, minimum=Decimal("0"), maximum=MAX_BUDGET)
    except NotAnAmount as error:
        if error.reason == TOO_SMALL:
            message = "The budget must be zero or more USD."
        elif error.reason == TOO_LARGE:
            message = f"The budget can be at most {usd(MAX_BUDGET)}."
        elif error.reason == TOO_PRECISE:
            message = "The budget takes at most 2 decimal places."
        else:
            message = f"The budget must be an amount in USD, like 500.00, not {raw!r}."
        raise BudgetRefused("invalid_budget", message) from None


class NamedRow(Protocol):
    """A cluster as billing reads it (billing does not import clusters): a row with a name."""

    pk: Any
    name: str


@dataclass(frozen=True)
class BudgetStops:
    """What a budget would stop: the month's spend and, when the budget is at or below it, the
    environment's clusters that the meter's next run stops (clusters/lifecycle/stops.py)."""

    spent: Decimal
    clusters: Sequence[NamedRow]


def budget_stops(
    *, environment: Environment, amount: Decimal, now: datetime | None = None
) -> BudgetStops:
    spent = month_to_date_spend(environment=environment, now=now)
    if not is_reached(spent=spent, budget=amount):
        return BudgetStops(spent=spent, clusters=[])
    # Through the environment's relation (billing does not import clusters), in the statuses
    # that the clusters' stops end (clusters/lifecycle/stops.py).
    clusters = environment.clusters
    running = clusters.filter(status__in=clusters.model.TERMINABLE)
    return BudgetStops(spent=spent, clusters=list(running.order_by("name", "pk")))


def set_budget(
    *,
    environment: Environment,
    amount: Decimal | None,
    confirm: bool = False,
    now: datetime | None = None,
) -> BudgetStops | None:
    """Set (or, with None, clear) the environment's monthly budget; returns what it stops.

    A budget at or below the month's spend stops the clusters that run there: unless
    `confirm`, it raises BudgetBelowSpend (naming them) and changes nothing."""
    stops = None
    if amount is not None:
        amount = parse_budget(amount)
    with transaction.atomic():
        # Creates lock the same row (clusters/lifecycle/reserve.py): this waits for those in
        # flight, so the clusters it stops include every one they commit, and a create that
        # comes after sees the new budget.
        before = lock_environment(environment).monthly_budget
        if amount is not None:
            stops = budget_stops(environment=environment, amount=amount, now=now)
            if stops.clusters and not confirm:
                raise BudgetBelowSpend(environment=environment, amount=amount, stops=stops)
        Environment.objects.filter(pk=environment.pk).update(monthly_budget=amount)
        audit.note(
            summary=f"set the monthly budget of `{environment.name}` to "
            f"{usd(amount) if amount is not None else 'none'}",
            obj=environment,
            changes={"monthly_budget": audit.change(_amount(before), _amount(amount))},
        )
    environment.monthly_budget = amount
    return stops


def _amount(amount: Decimal | None) -> str | None:
    """A budget as the audit log keeps it: "500.00", or None for no budget."""
    return None if amount is None else f"{amount:.2f}"


def lock_environment(environment: Environment) -> Environment:
    """The environment's row, locked (`SELECT … FOR UPDATE`) until the caller's transaction
    ends, as it is now: what a budget change and a create hold, so neither misses the other."""
    return Environment.objects.select_for_update().get(pk=environment.pk)


def create_environment(
    *, project: Project, name: str, monthly_budget: Decimal | None = None
) -> Environment:
    name = (name or "").strip()
    field = Environment._meta.get_field("name")
    assert field.max_length is not None  # a CharField
    if not name:
        raise BudgetRefused("invalid_name", "Give the environment a name.", field="name")
    if len(name) > field.max_length or not _is_slug(name):
        raise BudgetRefused(
            "invalid_name",
            f"“{name}” is not a valid name: use lowercase letters, digits and hyphens, "
            f"at most {field.max_length} characters.",
            field="name",
        )
    if project.environments.count() >= MAX_ENVIRONMENTS:
        raise BudgetRefused(
            "too_many_environments", f"A project has at most {MAX_ENVIRONMENTS} environments."
        )
    try:
        with transaction.atomic():
            return Environment.objects.create(
                project=project, name=name, monthly_budget=monthly_budget
            )
    except IntegrityError:
        raise BudgetRefused(
            "environment_exists", f"The project already has an environment “{name}”.", field="name"
        ) from None


def _is_slug(name: str) -> bool:
    return NAME_RE.fullmatch(name) is not None


@dataclass(frozen=True)
class EnvironmentBudget:
    environment: Environment
    spent: Decimal

    @property
    def budget(self) -> Decimal | None:
        return self.environment.monthly_budget

    @property
    def share(self) -> int | None:
        """Percent of the budget spent this month (capped at 100 for the bar)."""
        if self.budget is None:
            return None
        if self.budget == 0:
            return 100
        return min(100, int(self.spent * 100 / self.budget))

    @property
    def reached(self) -> bool:
        return is_reached(spent=self.spent, budget=self.budget)

    @property
    def warning(self) -> bool:
        """80% of the budget or more spent this month (billing/policy.py)."""
        return policy.budget_warns(spent=self.spent, budget=self.budget)


def environment_budgets(
    *, project: Project, now: datetime | None = None
) -> list[EnvironmentBudget]:
    """The project's environments with this month's spend, in two queries."""
    environments = list(project.environments.order_by("name"))
    spend = spend_by_environment(environment_ids=[e.pk for e in environments], now=now)
    return [EnvironmentBudget(environment=e, spent=spend[e.pk]) for e in environments]
