"""Stops for balance and budget, checked after every meter run (SPEC §4, docs/billing.md).

Billing is the lower layer and never imports clusters: it says which projects and environments
are over (billing/limits.py); stopping their clusters is the clusters' concern, here.

- The balance is at or below zero: every running cluster of the project is stopped
  (`stop_reason` balance).
- An environment's month-to-date spend reached its monthly budget: its clusters are stopped
  (`stop_reason` budget).
- Emails: a cluster was stopped (sent from its stop event, the outbox), plus billing's own
  (low balance, 80% of a budget). Each is sent once.

Stops go through `clusters.lifecycle.stop`, like a user's terminate. `run_meter`, the beat
task, charges what ran (billing's meter: machines and volumes' storage), then runs these checks.
"""

import logging
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime

from celery import shared_task
from django.utils import timezone

from accounts import recipients as told
from billing import limits, metering
from clusters import lifecycle
from clusters.models import Cluster, Event
from runcrate.emails import send_templated
from runcrate.models import Beat

logger = logging.getLogger(__name__)

STOP_EVENTS = {Event.Reason.STOPPED_BALANCE, Event.Reason.STOPPED_BUDGET}


@dataclass
class LimitsResult:
    stopped_for_balance: list[int] = field(default_factory=list)
    stopped_for_budget: list[int] = field(default_factory=list)
    low_balance_emails: int = 0
    budget_emails: int = 0
    stop_emails: int = 0


def _stop(cluster_ids: list[int], reason: str) -> list[int]:
    stopped = []
    for cluster in Cluster.objects.filter(pk__in=cluster_ids, status__in=Cluster.TERMINABLE):
        try:
            lifecycle.stop(cluster=cluster, reason=reason)
        except Exception:
            # One cluster that cannot be stopped now must not keep the others running; the
            # next meter run tries it again.
            logger.exception("could not stop cluster %s (%s)", cluster.pk, reason)
            continue
        # Its audit entry is the stop's own, in its transaction (lifecycle.stop).
        stopped.append(cluster.pk)
    return stopped


def enforce_limits(*, now: datetime | None = None) -> LimitsResult:
    """Stop what the balance or a budget no longer covers and send the billing emails."""
    now = now or timezone.now()
    result = LimitsResult()
    live = list(
        Cluster.objects.filter(status__in=Cluster.TERMINABLE).values_list(
            "pk", "project_id", "environment_id"
        )
    )
    project_ids = {project_id for _, project_id, _ in live}
    money = limits.balance_standing(project_ids)  # before any stop: what ran
    broke = money.over
    result.stopped_for_balance = _stop(
        [pk for pk, project_id, _ in live if project_id in broke], Cluster.StopReason.BALANCE
    )

    environment_ids = {env_id for _, project_id, env_id in live if project_id not in broke}
    budgets = limits.budget_standing(environment_ids, now=now)
    result.stopped_for_budget = _stop(
        [
            pk
            for pk, project_id, env_id in live
            if env_id in budgets.over and project_id not in broke
        ],
        Cluster.StopReason.BUDGET,
    )

    result.low_balance_emails = limits.warn_low_balances(money, now=now)
    result.budget_emails = limits.warn_budgets(budgets.warned(), budgets.spend, now)
    result.stop_emails = send_stop_emails(now=now)
    return result


def send_stop_emails(*, now: datetime | None = None) -> int:
    """Send one email per project and reason for the stop events not emailed yet (the outbox)."""
    now = now or timezone.now()
    pending = list(
        Event.objects.filter(reason__in=STOP_EVENTS, emailed_at__isnull=True)
        .select_related("cluster__environment")
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
    recipients = limits.billing_recipients({project_id for project_id, _ in groups})
    sent = 0
    for (project_id, reason), events in sorted(groups.items()):
        clusters = [event.cluster for event in events]
        to = list(recipients.get(project_id, []))
        # The creators too, while members (accounts/recipients.py: members only, read now).
        creators = told.members_among(project_id, [c.created_by_id for c in clusters])
        to += [email for email in creators if email not in to]
        try:
            sent += send_templated(
                template="cluster-stopped",
                to=to,
                context={
                    "clusters": clusters,
                    "reason": "balance" if reason == Event.Reason.STOPPED_BALANCE else "budget",
                    "environment": clusters[0].environment,
                },
                project_id=clusters[0].project_id,
            )
        except Exception:
            Event.objects.filter(pk__in=[event.pk for event in events]).update(emailed_at=None)
            raise
    return sent


@shared_task(name="clusters.stops.run_meter", ignore_result=True)
def run_meter() -> dict:
    """The meter's beat task: charge what ran, then stop what the balance or a budget no longer
    covers and send the billing emails. Safe to run twice and on several workers at once."""
    charged = metering.charge_accrued()
    stops = enforce_limits()
    Beat.record("meter")
    return {
        "records_charged": charged.records,
        "amount_charged": f"{charged.amount:.2f}",
        "volumes_charged": charged.volumes,
        "storage_charged": f"{charged.storage:.2f}",
        "stopped_for_balance": stops.stopped_for_balance,
        "stopped_for_budget": stops.stopped_for_budget,
        "emails": stops.low_balance_emails + stops.budget_emails + stops.stop_emails,
    }
