"""The billing API: balance, usage per month, the ledger, and environment budgets.

Owners and managers only (developers see no billing, SPEC §5), with a key that holds the
`billing` scope. Money is a decimal string with 2 places; times are ISO 8601 in UTC.
"""

from datetime import datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Annotated, Literal, TypedDict

from django.utils import timezone
from ninja import Field, Query, Router, Schema

import audit
from accounts import permissions
from accounts.api_auth import Scope, needs
from accounts.models import Environment
from accounts.requests import ApiRequest
from billing import balances, budgets, usage
from billing.meter import HOUR
from billing.models import LedgerEntry
from runcrate import durations, outages
from runcrate.api import (
    ApiError,
    ErrorOut,
    ListMeta,
    Offset,
    list_envelope,
    money_str,
    paginated,
    utc_str,
)
from runcrate.money import NotAnAmount, read_amount

if TYPE_CHECKING:
    from django_stubs_ext import WithAnnotations

router = Router(tags=["billing"])
# The dearest hourly price `/billing/balance` is asked about (a price card's whole cluster).
MAX_PRICE = Decimal("1000000000")
BILLING = needs(Scope.BILLING)


def _billing_project(request: ApiRequest, action: str = "billing.view"):
    """The key's project when its maker's role allows `action`; else 403 role_forbidden,
    worded by the permission table (accounts/permissions.py)."""
    permissions.require(request.user, request.project, action)
    return request.project


# ---- balance ----------------------------------------------------------------------------------


class BalanceOut(Schema):
    balance: str = Field(description="USD: the sum of the ledger.")
    burn_rate: str = Field(description="USD per hour of every machine running now.")
    hours_remaining: str | None = Field(
        description="Hours the balance lasts at this burn rate; null while nothing runs."
    )
    runway_seconds: int | None = Field(
        description="Whole seconds the balance lasts at this burn rate (its runway, rounded "
        "down); null while nothing runs."
    )
    runway: str | None = Field(
        description="The runway in words, to the nearest minute, as the top bar's banner says "
        "it: '5 h 20 min', '3 days 4 h'; null while nothing runs."
    )
    low: bool = Field(
        description="The balance covers less than an hour of what runs (the low-balance "
        "email's rule)."
    )
    minimum_balance: str = Field(
        description="USD: the least a balance must hold to create a cluster, however cheap."
    )
    balance_needed: str | None = Field(
        description="USD: what the balance must hold to create a cluster costing the asked "
        "`price_per_hour` (one hour of it, never less than minimum_balance); null when not asked."
    )
    currency: str = "USD"


class BalanceEnvelope(Schema):
    data: BalanceOut


@router.get(
    "/billing/balance",
    auth=BILLING,
    response={200: BalanceEnvelope, 401: ErrorOut, 403: ErrorOut},
    summary="Balance, burn rate and hours remaining",
)
def balance(request: ApiRequest, price_per_hour: str | None = None) -> dict:
    project = _billing_project(request)
    summary = usage.summary(project_id=project.pk)
    needed = None
    if price_per_hour is not None:
        try:
            price = read_amount(price_per_hour, minimum=Decimal("0"), maximum=MAX_PRICE)
        except NotAnAmount:
            raise ApiError(
                422,
                "invalid_price",
                f"price_per_hour is USD per hour of a whole cluster, like 40.00, from 0 to "
                f"{MAX_PRICE:,}; not {price_per_hour!r}.",
            ) from None
        needed = balances.balance_needed(price)
    runway = summary.seconds_remaining
    return {
        "data": {
            "balance": money_str(summary.balance),
            "burn_rate": money_str(summary.burn_rate),
            "hours_remaining": money_str(summary.hours_remaining),
            "runway_seconds": None if runway is None else int(runway),
            "runway": None if runway is None else durations.about(runway),
            "low": summary.low,
            "minimum_balance": money_str(balances.minimum_balance()),
            "balance_needed": money_str(needed),
            "currency": "USD",
        }
    }


# ---- usage --------------------------------------------------------------------------------------


class UsageMachineOut(Schema):
    node: str
    gpu: str
    location: str
    started_at: str = Field(description="When it started, or the month's start if earlier.")
    ended_at: str | None = Field(description="When it ended, or the month's end; null: running.")
    hours: str
    rate: str = Field(description="USD per hour for this machine.")
    cost: str = Field(description="USD charged for this machine in the month.")


class ClusterUsageOut(Schema):
    cluster_id: int
    name: str
    hours: str = Field(description="Machine-hours charged in the month.")
    total: str = Field(description="USD charged in the month: the sum of the machines' costs.")
    accumulating: bool = Field(description="The current hour's charge is still growing.")
    machines: list[UsageMachineOut]


class UsageMeta(ListMeta):
    month: str
    total_usage: str = Field(description="USD of usage charged in the month, every cluster.")


class UsageList(Schema):
    data: list[ClusterUsageOut]
    meta: UsageMeta


@router.get(
    "/billing/usage",
    auth=BILLING,
    response={200: UsageList, 401: ErrorOut, 403: ErrorOut, 422: ErrorOut},
    summary="Usage of a month, per cluster and per machine",
)
def usage_of_month(
    request: ApiRequest,
    month: Annotated[
        str | None, Query(description="YYYY-MM; the current month if omitted.")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Offset = 0,
) -> dict:
    project = _billing_project(request)
    chosen = usage.Month.parse(month)
    total, lines = usage.cluster_usage(
        project_id=project.pk, month=chosen, offset=offset, limit=limit
    )
    totals = usage.month_totals(project_id=project.pk, month=chosen)
    return list_envelope(
        [
            {
                "cluster_id": line.cluster_id,
                "name": line.name,
                "hours": money_str(line.hours),
                "total": money_str(line.total),
                "accumulating": line.accumulating,
                "machines": [
                    {
                        "node": row.node,
                        "gpu": row.gpu,
                        "location": row.location,
                        "started_at": utc_str(row.started_at),
                        "ended_at": utc_str(row.ended_at),
                        "hours": money_str(row.hours),
                        "rate": money_str(row.rate),
                        "cost": money_str(row.cost),
                    }
                    for row in line.machines
                ],
            }
            for line in lines
        ],
        total=total,
        limit=limit,
        offset=offset,
        month=chosen.param,
        total_usage=money_str(totals.usage),
    )


# ---- transactions ----------------------------------------------------------------------------


class TransactionOut(Schema):
    id: int
    type: str = Field(description="topup, usage, adjustment or storage (a volume's day).")
    amount: str = Field(description="USD: positive credits, negative debits.")
    note: str
    created_at: str
    cluster_id: int | None
    cluster_name: str | None
    volume_id: int | None = Field(description="Storage: the volume it charges.")
    period_start: str | None = Field(
        description="Usage: the clock hour (UTC) it charges; storage: the day."
    )
    machine_seconds: int | None = Field(description="Usage: machine-seconds charged.")
    accumulating: bool = Field(description="Usage: this hour's charge is still growing.")


class TransactionList(Schema):
    data: list[TransactionOut]
    meta: ListMeta


@router.get(
    "/billing/transactions",
    auth=BILLING,
    response={200: TransactionList, 401: ErrorOut, 403: ErrorOut, 422: ErrorOut},
    summary="The ledger, newest first",
)
def transactions(
    request: ApiRequest,
    type: Annotated[  # noqa: A002 - the API's documented parameter name
        Literal["topup", "usage", "adjustment", "storage"] | None,
        Query(description="Only lines of this type."),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    offset: Offset = 0,
) -> dict:
    project = _billing_project(request)
    queryset = LedgerEntry.objects.filter(project=project)
    if type:
        queryset = queryset.filter(kind=type)
    queryset = queryset.annotate(billed=usage.still_billed()).select_related("cluster")
    queryset = queryset.order_by("-created_at", "-pk")
    now = timezone.now()
    return paginated(
        queryset, limit=limit, offset=offset, render=lambda entry: _transaction(entry, now=now)
    )


class _Billed(TypedDict):
    billed: bool  # usage.still_billed(), annotated by the transactions' query


def _transaction(entry: "WithAnnotations[LedgerEntry, _Billed]", *, now: datetime) -> dict:
    is_usage = entry.kind == LedgerEntry.Kind.USAGE
    return {
        "id": entry.pk,
        "type": entry.kind,
        "amount": money_str(entry.amount),
        "note": entry.note,
        "created_at": utc_str(entry.created_at),
        "cluster_id": entry.cluster_id,
        "cluster_name": entry.cluster.name if entry.cluster is not None else None,
        "volume_id": entry.volume_id,
        "period_start": utc_str(entry.period_start),
        "machine_seconds": entry.machine_seconds if is_usage else None,
        "accumulating": bool(
            is_usage
            and entry.period_start is not None
            and entry.billed
            and now < entry.period_start + HOUR
        ),
    }


# ---- budgets -----------------------------------------------------------------------------------


class BudgetIn(Schema):
    amount: Decimal | None = Field(
        description='USD as a decimal string, like "500.00"; null clears the budget.'
    )
    confirm: bool = Field(
        False,
        description="Needed to set a budget at or below the month's spend while clusters run "
        "in the environment: it stops them. Without it such a budget is 409 "
        "`budget_below_spend`, naming them, and nothing changes.",
    )


class EnvironmentBudgetOut(Schema):
    name: str
    monthly_budget: str | None
    month_to_date_spend: str
    budget_reached: bool
    stopping: list[str] = Field(
        description="The clusters this budget stops (it is at or below the month's spend)."
    )


class EnvironmentBudgetEnvelope(Schema):
    data: EnvironmentBudgetOut


@router.put(
    "/environments/{name}/budget",
    auth=BILLING,
    response={
        200: EnvironmentBudgetEnvelope,
        401: ErrorOut,
        403: ErrorOut,
        404: ErrorOut,
        409: ErrorOut,
        422: ErrorOut,
    },
    summary="Set or clear an environment's monthly budget",
)
@outages.committing
def put_budget(request: ApiRequest, name: str, payload: BudgetIn) -> dict:
    project = _billing_project(request, "budgets.manage")
    environment = Environment.objects.filter(project=project, name=name).first()
    if environment is None:
        raise ApiError(404, "not_found", f"The project has no environment named {name!r}.")
    amount = budgets.parse_budget(payload.amount)
    before = environment.monthly_budget
    stops = budgets.set_budget(environment=environment, amount=amount, confirm=payload.confirm)
    after = environment.monthly_budget
    audit.record(
        request,
        changes={"monthly_budget": {"before": money_str(before), "after": money_str(after)}},
    )
    spent = budgets.month_to_date_spend(environment=environment)
    return {
        "data": {
            "name": environment.name,
            "monthly_budget": money_str(environment.monthly_budget),
            "month_to_date_spend": money_str(spent),
            "budget_reached": budgets.is_reached(spent=spent, budget=amount),
            "stopping": [cluster.name for cluster in stops.clusters] if stops else [],
        }
    }
