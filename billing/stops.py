"""Stops and billing emails, checked after every meter run (SPEC §4, docs/billing.md).

- The balance is at or below zero: every running cluster of the project is stopped
  (`stop_reason` balance).
- An environment's month-to-date spend reached its monthly budget: its clusters are stopped
  (`stop_reason` budget).
- Emails: a cluster was stopped (sent from its stop event, the outbox); the balance covers less
  than one hour of the running clusters; an environment spent 80% of its budget. Each is sent
  once: a `Notice` row (unique) or the event's `emailed_at` records it.

Stops go through `clusters.lifecycle.stop`, like a user's terminate.
"""

import logging
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal

from django.db import IntegrityError, transaction
from django.db.models import Max
from django.utils import timezone

from accounts.models import Environment, Membership
from billing import balances
from billing.budgets import WARNING_SHARE, month_start, spend_by_environment
from billing.meter import burn_rates
from billing.models import LedgerEntry, Notice
from clusters.models import Cluster, Event
from runcrate.emails import send_templated

logger = logging.getLogger(__name__)

STOP_EVENTS = {Event.Reason.STOPPED_BALANCE, Event.Reason.STOPPED_BUDGET}
LOW_BALANCE_HOURS = Decimal("1")


@dataclass
class LimitsResult:
    stopped_for_balance: list[int] = field(default_factory=list)
    stopped_for_budget: list[int] = field(default_factory=list)
    low_balance_emails: int = 0
    budget_emails: int = 0
    stop_emails: int = 0


def billing_recipients(project_ids: set[int]) -> dict[int, list[str]]:
    """Who hears about money: each project's owners and managers."""
    rows = Membership.objects.filter(
        project_id__in=project_ids,
        role__in=[Membership.Role.OWNER, Membership.Role.MANAGER],
        user__is_active=True,
    ).values_list("project_id", "user__email")
    recipients: dict[int, list[str]] = defaultdict(list)
    for project_id, email in rows.order_by("pk"):
        recipients[project_id].append(email)
    return recipients


def _stop(cluster_ids: list[int], reason: str) -> list[int]:
    from clusters import lifecycle

    stopped = []
    for cluster in Cluster.objects.filter(pk__in=cluster_ids, status__in=Cluster.STOPPABLE):
        try:
            lifecycle.stop(cluster=cluster, reason=reason)
        except Exception:
            # One cluster that cannot be stopped now must not keep the others running; the
            # next meter run tries it again.
            logger.exception("could not stop cluster %s (%s)", cluster.pk, reason)
            continue
        stopped.append(cluster.pk)
    return stopped


def enforce_limits(*, now: datetime | None = None) -> LimitsResult:
    """Stop what the balance or a budget no longer covers and send the billing emails."""
    now = now or timezone.now()
    result = LimitsResult()
    live = list(
        Cluster.objects.filter(status__in=Cluster.STOPPABLE).values_list(
            "pk", "project_id", "environment_id"
        )
    )
    project_ids = {project_id for _, project_id, _ in live}
    balance = balances.balances(project_ids)
    burn = burn_rates(project_ids)

    broke = {project_id for project_id in project_ids if balance[project_id] <= 0}
    result.stopped_for_balance = _stop(
        [pk for pk, project_id, _ in live if project_id in broke], Cluster.StopReason.BALANCE
    )

    environment_ids = {env_id for _, project_id, env_id in live if project_id not in broke}
    environments = {
        env.pk: env
        for env in Environment.objects.filter(pk__in=environment_ids, monthly_budget__isnull=False)
    }
    spend = spend_by_environment(environment_ids=list(environments), now=now)
    over = {env_id for env_id, env in environments.items() if spend[env_id] >= env.monthly_budget}
    result.stopped_for_budget = _stop(
        [pk for pk, project_id, env_id in live if env_id in over and project_id not in broke],
        Cluster.StopReason.BUDGET,
    )

    low = {
        project_id
        for project_id in project_ids - broke
        if burn[project_id] > 0 and balance[project_id] < burn[project_id] * LOW_BALANCE_HOURS
    }
    result.low_balance_emails = _warn_low_balance(low, balance, burn, now)
    warned = {
        env_id: env
        for env_id, env in environments.items()
        if env_id not in over and spend[env_id] >= env.monthly_budget * WARNING_SHARE
    }
    result.budget_emails = _warn_budgets(warned, spend, now)
    result.stop_emails = send_stop_emails(now=now)
    return result


def _claim_notice(
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


def _warn_low_balance(
    project_ids: set[int], balance: dict[int, Decimal], burn: dict[int, Decimal], now: datetime
) -> int:
    if not project_ids:
        return 0
    # Once per credit: the warning may come again after the next top-up or adjustment.
    last_credit = dict(
        LedgerEntry.objects.filter(project_id__in=project_ids, amount__gt=0)
        .values("project_id")
        .annotate(last=Max("pk"))
        .values_list("project_id", "last")
    )
    recipients = billing_recipients(project_ids)
    sent = 0
    for project_id in sorted(project_ids):
        key = f"after-credit-{last_credit.get(project_id, 0)}"
        if not _claim_notice(project_id=project_id, kind=Notice.Kind.LOW_BALANCE, key=key, now=now):
            continue
        hours = balance[project_id] / burn[project_id]
        sent += send_templated(
            template="billing-low-balance",
            to=recipients.get(project_id, []),
            context={
                "balance": balance[project_id],
                "burn_rate": burn[project_id],
                "minutes_left": max(0, int(hours * 60)),
            },
        )
    return sent


def _warn_budgets(
    environments: dict[int, Environment], spend: dict[int, Decimal], now: datetime
) -> int:
    if not environments:
        return 0
    recipients = billing_recipients({env.project_id for env in environments.values()})
    month = month_start(now)
    sent = 0
    for env_id, env in sorted(environments.items()):
        # Once per environment, month and budget: raising the budget arms the warning again.
        key = f"{env_id}:{month:%Y-%m}:{env.monthly_budget}"
        if not _claim_notice(
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


def send_stop_emails(*, now: datetime | None = None) -> int:
    """Send one email per project and reason for the stop events not emailed yet (the outbox)."""
    now = now or timezone.now()
    pending = list(
        Event.objects.filter(reason__in=STOP_EVENTS, emailed_at__isnull=True)
        .select_related("cluster__environment", "cluster__created_by")
        .order_by("pk")
    )
    claimed = [
        event
        for event in pending
        # A conditional update per event: two senders at once send each email once.
        if Event.objects.filter(pk=event.pk, emailed_at__isnull=True).update(emailed_at=now)
    ]
    if not claimed:
        return 0
    groups: dict[tuple[int, str], list[Event]] = defaultdict(list)
    for event in claimed:
        groups[(event.cluster.project_id, event.reason)].append(event)
    recipients = billing_recipients({project_id for project_id, _ in groups})
    sent = 0
    for (project_id, reason), events in sorted(groups.items()):
        clusters = [event.cluster for event in events]
        to = list(recipients.get(project_id, []))
        for cluster in clusters:
            creator = cluster.created_by.email if cluster.created_by_id else None
            if creator and creator not in to:
                to.append(creator)
        try:
            sent += send_templated(
                template="cluster-stopped",
                to=to,
                context={
                    "clusters": clusters,
                    "reason": "balance" if reason == Event.Reason.STOPPED_BALANCE else "budget",
                    "environment": clusters[0].environment,
                },
            )
        except Exception:
            Event.objects.filter(pk__in=[event.pk for event in events]).update(emailed_at=None)
            raise
    return sent
