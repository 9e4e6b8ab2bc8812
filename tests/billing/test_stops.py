"""Stops and billing emails after the meter: the balance ran out, a budget was reached, the
balance is low, 80% of a budget."""

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
import time_machine
from django.core import mail

from accounts.models import Environment
from billing import budgets
from billing.meter import charge_accrued
from billing.models import UsageRecord, balance_of
from clusters import lifecycle
from clusters.lifecycle.stops import enforce_limits
from clusters.models import Cluster, Event
from tests.billing.conftest import add_credit, bill_cluster
from tests.factories import ClusterFactory

NOW = datetime(2026, 3, 20, 12, 0, tzinfo=UTC)


@pytest.fixture(autouse=True)
def _work_in_memory():
    with lifecycle.dispatching_to(lifecycle.CollectingDispatcher()) as dispatcher:
        yield dispatcher


@pytest.fixture(autouse=True)
def _frozen():
    with time_machine.travel(NOW, tick=False):
        yield


def statuses(*clusters: Cluster) -> list[tuple[str, str]]:
    for cluster in clusters:
        cluster.refresh_from_db()
    return [(cluster.status, cluster.stop_reason) for cluster in clusters]


def test_it_stops_every_running_cluster_of_a_project_whose_balance_ran_out(owner, stranger):
    add_credit(owner.project, "10.00", at=NOW - timedelta(days=1))
    first = bill_cluster(owner.project, size=2, price="10.00", at=NOW - timedelta(minutes=40))
    second = bill_cluster(owner.project, size=2, price="10.00", at=NOW - timedelta(minutes=40))
    booting = ClusterFactory(project=owner.project, status=Cluster.Status.PROVISIONING)
    done = ClusterFactory(project=owner.project, status=Cluster.Status.TERMINATED)
    add_credit(stranger.project, "1000.00", at=NOW - timedelta(days=1))
    other = bill_cluster(stranger.project, size=2, price="10.00", at=NOW - timedelta(minutes=40))
    charge_accrued(now=NOW)  # owner: 10 − 4 machines × 10 USD/h × 40 min = −16.67

    result = enforce_limits(now=NOW)

    assert sorted(result.stopped_for_balance) == sorted([first.pk, second.pk, booting.pk])
    assert statuses(first, second, booting) == [("terminating", "balance")] * 3
    assert statuses(done, other) == [("terminated", ""), ("ready", "")]
    # Billing ended at the stop for every machine of the stopped clusters.
    assert not UsageRecord.objects.filter(
        cluster__in=[first, second], ended_at__isnull=True
    ).exists()
    assert UsageRecord.objects.filter(cluster=other, ended_at__isnull=True).count() == 2


def test_it_emails_the_owner_once_why_the_clusters_stopped(owner):
    add_credit(owner.project, "1.00", at=NOW - timedelta(days=1))
    cluster = bill_cluster(owner.project, size=2, price="10.00", at=NOW - timedelta(hours=1))
    charge_accrued(now=NOW)

    enforce_limits(now=NOW)
    enforce_limits(now=NOW + timedelta(minutes=1))

    assert len(mail.outbox) == 1
    message = mail.outbox[0]
    assert message.to == [owner.user.email]
    assert message.subject == f"Cluster {cluster.name} was stopped: your balance ran out"
    assert "Add credit" in message.body
    assert Event.objects.get(cluster=cluster, reason="stopped_balance").emailed_at is not None


def test_it_leaves_a_project_with_credit_alone(owner):
    add_credit(owner.project, "100.00", at=NOW - timedelta(days=1))
    cluster = bill_cluster(owner.project, size=2, price="1.00", at=NOW - timedelta(hours=1))
    charge_accrued(now=NOW)

    result = enforce_limits(now=NOW)

    assert result.stopped_for_balance == [] and result.stopped_for_budget == []
    assert statuses(cluster) == [("ready", "")]
    assert mail.outbox == []


def test_it_stops_the_clusters_of_an_environment_that_reached_its_budget(owner):
    add_credit(owner.project, "1000.00", at=NOW - timedelta(days=1))
    staging = Environment.objects.create(
        project=owner.project, name="staging", monthly_budget=Decimal("15.00")
    )
    spender = bill_cluster(
        owner.project, size=2, price="10.00", at=NOW - timedelta(hours=1), environment=staging
    )
    idle = ClusterFactory(project=owner.project, environment=staging)
    elsewhere = bill_cluster(owner.project, size=2, price="10.00", at=NOW - timedelta(hours=1))
    charge_accrued(now=NOW)  # staging spent 20.00 of 15.00 this month

    result = enforce_limits(now=NOW)

    assert sorted(result.stopped_for_budget) == sorted([spender.pk, idle.pk])
    assert statuses(spender, idle, elsewhere) == [
        ("terminating", "budget"),
        ("terminating", "budget"),
        ("ready", ""),
    ]
    spent = budgets.month_to_date_spend(environment=staging, now=NOW)
    assert budgets.is_reached(spent=spent, budget=staging.monthly_budget)
    assert len(mail.outbox) == 1
    assert mail.outbox[0].subject == "2 clusters were stopped: staging reached its monthly budget"


def test_it_counts_only_this_months_spend_against_a_budget(owner):
    add_credit(owner.project, "1000.00", at=NOW - timedelta(days=60))
    budgeted = Environment.objects.create(
        project=owner.project, name="research", monthly_budget=Decimal("15.00")
    )
    last_month = datetime(2026, 2, 28, 20, tzinfo=UTC)
    cluster = bill_cluster(
        owner.project, size=2, price="10.00", at=last_month, environment=budgeted
    )
    charge_accrued(now=datetime(2026, 3, 1, 0, 30, tzinfo=UTC))  # 80.00 in Feb, 10.00 in March

    assert budgets.month_to_date_spend(environment=budgeted, now=NOW) == Decimal("10.00")
    enforce_limits(now=NOW)
    assert statuses(cluster) == [("ready", "")]


def test_it_warns_once_when_the_balance_covers_less_than_an_hour(owner):
    add_credit(owner.project, "30.00", at=NOW - timedelta(days=1))
    bill_cluster(owner.project, size=2, price="10.00", at=NOW - timedelta(minutes=30))
    charge_accrued(now=NOW)  # 20.00 left at 20.00/h: exactly an hour, not less

    assert enforce_limits(now=NOW).low_balance_emails == 0
    charge_accrued(now=NOW + timedelta(minutes=1))
    assert enforce_limits(now=NOW + timedelta(minutes=1)).low_balance_emails == 1
    charge_accrued(now=NOW + timedelta(minutes=2))
    assert enforce_limits(now=NOW + timedelta(minutes=2)).low_balance_emails == 0

    assert len(mail.outbox) == 1
    assert mail.outbox[0].subject == "Your Runcrate balance runs out in 58 minutes"
    assert "$19.66" in mail.outbox[0].body  # 30 − 2 × 5.17; 19.66 / 20.00 h = 58.98 min


def test_it_warns_about_a_low_balance_again_after_a_top_up(owner):
    add_credit(owner.project, "15.00", at=NOW - timedelta(days=1))
    bill_cluster(owner.project, size=2, price="10.00", at=NOW - timedelta(minutes=1))
    charge_accrued(now=NOW)
    enforce_limits(now=NOW)
    add_credit(owner.project, "5.00", at=NOW)

    enforce_limits(now=NOW)

    assert len(mail.outbox) == 2


def test_it_warns_once_at_80_percent_of_a_budget(owner):
    add_credit(owner.project, "1000.00", at=NOW - timedelta(days=1))
    staging = Environment.objects.create(
        project=owner.project, name="staging", monthly_budget=Decimal("100.00")
    )
    bill_cluster(
        owner.project, size=2, price="10.00", at=NOW - timedelta(hours=4), environment=staging
    )
    charge_accrued(now=NOW - timedelta(minutes=1))  # 79.67 of 100: not yet

    assert enforce_limits(now=NOW - timedelta(minutes=1)).budget_emails == 0
    charge_accrued(now=NOW)  # 80.00
    assert enforce_limits(now=NOW).budget_emails == 1
    assert enforce_limits(now=NOW).budget_emails == 0

    assert mail.outbox[0].subject == "staging has spent 80% of its monthly budget"
    assert Cluster.objects.filter(environment=staging, status="ready").count() == 1


def test_it_stops_through_the_lifecycle_with_an_event_the_user_sees(owner):
    cluster = bill_cluster(owner.project, size=2, price="10.00", at=NOW - timedelta(hours=1))
    charge_accrued(now=NOW)

    enforce_limits(now=NOW)

    event = Event.objects.get(cluster=cluster, reason="stopped_balance")
    assert "the balance ran out" in event.message
    assert balance_of(owner.project.pk) == Decimal("-20.00")
