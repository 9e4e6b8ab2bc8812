"""What the balance and the budgets no longer cover, and the billing emails about it (SPEC §4,
docs/billing.md). Billing answers which projects and environments are over; stopping their
clusters is the clusters' concern (clusters/lifecycle/stops.py), which asks after every meter run.

- A project whose balance is at or below zero is over (`balance_standing`).
- An environment whose month-to-date spend reached its monthly budget is over
  (`budget_standing`, by `billing.budgets.is_reached`).
- Emails: the balance covers less than one hour of what runs; an environment spent 80% of its
  budget. Each is sent once: a `Notice` row (unique) records it.
"""

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.db import IntegrityError, transaction
from django.db.models import Max

from accounts.models import Environment, Membership
from billing import balances, policy
from billing.access import BILLING_ROLES
from billing.budgets import is_reached, month_start, spend_by_environment
from billing.meter import burn_rates
from billing.models import LedgerEntry, Notice
from runcrate.emails import send_templated


@dataclass
class BalanceStanding:
    """The projects' balances and burn rates, and those whose balance is at or below zero."""

    balance: dict[int, Decimal]
    burn: dict[int, Decimal]
    over: set[int]

    def low(self) -> set[int]:
        """Those not over whose balance covers less than an hour of what they run and store."""
        return {
            project_id
            for project_id in self.balance
            if project_id not in self.over
            and policy.is_low(self.balance[project_id], self.burn[project_id])
        }


def balance_standing(project_ids: set[int]) -> BalanceStanding:
    """Two queries: the balances (running totals) and the burn rates."""
    balance = balances.balances(project_ids)
    return BalanceStanding(
        balance=balance,
        burn=burn_rates(project_ids),
        over={pk for pk, amount in balance.items() if amount <= 0},
    )


@dataclass
class BudgetStanding:
    """The environments with a budget among those asked about, their month's spend, and those
    whose spend reached the budget (`over`)."""

    environments: dict[int, Environment]
    spend: dict[int, Decimal]
    over: set[int]

    def warned(self) -> dict[int, Environment]:
        """Those at 80% of their budget or more, not over it."""
        return {
            env_id: env
            for env_id, env in self.environments.items()
            if env_id not in self.over
            and policy.budget_warns(spent=self.spend[env_id], budget=env.monthly_budget)
        }


def budget_standing(environment_ids: set[int], *, now: datetime) -> BudgetStanding:
    environments = {
        env.pk: env
        for env in Environment.objects.filter(pk__in=environment_ids, monthly_budget__isnull=False)
    }
    spend = spend_by_environment(environment_ids=list(environments), now=now)
    over = {
        env_id
        for env_id, env in environments.items()
        if is_reached(spent=spend[env_id], budget=env.monthly_budget)
    }
    return BudgetStanding(environments=environments, spend=spend, over=over)


def billing_recipients(project_ids: set[int]) -> dict[int, list[str]]:
    """Who hears about money: each project's members who may manage its billing (its owners
    and managers, by the permission table: billing/access.py)."""
    rows = Membership.objects.filter(
        project_id__in=project_ids,
        role__in=BILLING_ROLES,
        user__is_active=True,
    ).values_list("project_id", "user__email")
    recipients: dict[int, list[str]] = defaultdict(list)
    for project_id, email in rows.order_by("pk"):
        recipients[project_id].append(email)
    return recipients


def claim_notice(
    *, project_id: int, kind: str, key: str, now: datetime, environment_id: int | None = None
) -> bool:
    """Record that a notice goes out; False when it already went (the unique row exists)."""
    try:
        with transaction.atomic():
            Notice.objects.create(
                project_id=project_id,
                environment_id=environment_id,
                kind=kind,
                key=key,
                sent_at=now,
            )
    except IntegrityError:
        return False
    return True


def warn_low_balances(standing: BalanceStanding, *, now: datetime) -> int:
    """Email the projects whose balance covers less than an hour of what they ran when
    `standing` was taken, once per credit; the emails sent."""
    low = standing.low()
    if not low:
        return 0
    balance, burn = standing.balance, standing.burn
    # Once per credit: the warning may come again after the next top-up or adjustment.
    last_credit = dict(
        LedgerEntry.objects.filter(project_id__in=low, amount__gt=0)
        .values("project_id")
        .annotate(last=Max("pk"))
        .values_list("project_id", "last")
    )
    recipients = billing_recipients(low)
    sent = 0
    for project_id in sorted(low):
        key = f"after-credit-{last_credit.get(project_id, 0)}"
        if not claim_notice(project_id=project_id, kind=Notice.Kind.LOW_BALANCE, key=key, now=now):
            continue
        hours = balance[project_id] / burn[project_id]
        sent += send_templated(
            template="billing-low-balance",
            to=recipients.get(project_id, []),
            project_id=project_id,
            context={
                "balance": balance[project_id],
                "burn_rate": burn[project_id],
                "minutes_left": max(0, int(hours * 60)),
            },
        )
    return sent


def warn_budgets(
    environments: dict[int, Environment], spend: dict[int, Decimal], now: datetime
) -> int:
    """Email each environment's 80%-of-budget warning, once per month and budget."""
    if not environments:
        return 0
    recipients = billing_recipients({env.project_id for env in environments.values()})
    month = month_start(now)
    sent = 0
    for env_id, env in sorted(environments.items()):
        assert env.monthly_budget is not None  # BudgetStanding.warned: those with a budget
        # Once per environment, month and budget: raising the budget arms the warning again.
        key = f"{env_id}:{month:%Y-%m}:{env.monthly_budget}"
        if not claim_notice(
            project_id=env.project_id,
            environment_id=env_id,
            kind=Notice.Kind.BUDGET_WARNING,
            key=key,
            now=now,
        ):
            continue
        sent += send_templated(
            template="billing-budget-warning",
            to=recipients.get(env.project_id, []),
            project_id=env.project_id,
            context={
                "environment": env,
                "spent": spend[env_id],
                "budget": env.monthly_budget,
                "share": _percent(spend[env_id], env.monthly_budget),
                "month": month,
            },
        )
    return sent


def _percent(spent: Decimal, budget: Decimal) -> int:
    return int(spent * 100 / budget) if budget else 100
