"""The edges of the money rules, each exactly on its line: a balance of exactly 0.00 stops, spend
exactly equal to the budget stops, terminate charges the ledger at once, and a failed worker's
usage ends at the instant it failed."""

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
import time_machine

from accounts.models import Environment
from billing.meter import charge_accrued
from billing.models import UsageRecord, balance_of
from clusters import lifecycle
from clusters.lifecycle.stops import enforce_limits
from clusters.models import Cluster
from tests.billing.conftest import add_credit, bill_cluster

NOW = datetime(2026, 3, 20, 12, 0, tzinfo=UTC)


@pytest.fixture(autouse=True)
def _work_in_memory():
    with lifecycle.dispatching_to(lifecycle.CollectingDispatcher()) as dispatcher:
        yield dispatcher


def test_a_balance_of_exactly_zero_stops_the_clusters(owner):
    with time_machine.travel(NOW, tick=False):
        add_credit(owner.project, "20.00", at=NOW - timedelta(days=1))
        cluster = bill_cluster(owner.project, size=2, price="10.00", at=NOW - timedelta(hours=1))
        charge_accrued(now=NOW)  # 2 machines × 10 USD/h × 1 h = the 20.00 there was
        assert balance_of(owner.project) == Decimal("0.00")

        result = enforce_limits(now=NOW)

    assert result.stopped_for_balance == [cluster.pk]
    cluster.refresh_from_db()
    assert (cluster.status, cluster.stop_reason) == ("terminating", "balance")


def test_a_cent_above_zero_leaves_them_running(owner):
    with time_machine.travel(NOW, tick=False):
        add_credit(owner.project, "20.01", at=NOW - timedelta(days=1))
        cluster = bill_cluster(owner.project, size=2, price="10.00", at=NOW - timedelta(hours=1))
        charge_accrued(now=NOW)
        assert enforce_limits(now=NOW).stopped_for_balance == []
    cluster.refresh_from_db()
    assert cluster.status == "ready"


def test_spend_exactly_equal_to_the_budget_stops_the_environment(owner):
    month_start = datetime(2026, 3, 1, tzinfo=UTC)
    with time_machine.travel(NOW, tick=False):
        add_credit(owner.project, "1000.00", at=month_start)
        environment = Environment.objects.get(project=owner.project, name="default")
        environment.monthly_budget = Decimal("20.00")
        environment.save(update_fields=["monthly_budget"])
        cluster = bill_cluster(
            owner.project,
            size=2,
            price="10.00",
            at=NOW - timedelta(hours=1),
            environment=environment,
        )
        charge_accrued(now=NOW)  # spend this month: exactly 20.00

        result = enforce_limits(now=NOW)

    assert result.stopped_for_budget == [cluster.pk]
    cluster.refresh_from_db()
    assert (cluster.status, cluster.stop_reason) == ("terminating", "budget")


def test_terminate_charges_the_ledger_at_once_not_at_the_next_meter_run(
    owner, django_capture_on_commit_callbacks
):
    with time_machine.travel(NOW, tick=False):
        add_credit(owner.project, "100.00", at=NOW - timedelta(days=1))
        cluster = bill_cluster(owner.project, size=2, price="10.00", at=NOW - timedelta(minutes=30))
        with django_capture_on_commit_callbacks(execute=True):
            lifecycle.terminate(cluster=cluster)
    # No meter ran: the ledger already holds the 30 minutes of 2 machines at 10 USD/h.
    assert balance_of(owner.project) == Decimal("90.00")
    assert set(UsageRecord.objects.filter(cluster=cluster).values_list("ended_at", flat=True)) == {
        NOW
    }
    with time_machine.travel(NOW + timedelta(minutes=5), tick=False):
        charge_accrued(now=NOW + timedelta(minutes=5))
    assert balance_of(owner.project) == Decimal("90.00")  # charged once


@pytest.mark.django_db
def test_a_worker_that_fails_before_it_is_up_is_never_billed():
    from tests.clusters.lifecycle_kit import T0, Sim, at, create, inventory, new_project

    _, project = new_project()
    clock = time_machine.travel(T0, tick=False)
    traveller = clock.start()
    # The added worker's host fails its install: it passed `network`, but it was never up.
    machine_type = inventory(hosts=3, boot_seconds=180, faults={2: "install"})
    with Sim() as sim:
        cluster = create(project, machine_type, nodes=2, software="slurm")
        sim.run_until(traveller, at(180 * 2))
        cluster.refresh_from_db()
        assert cluster.status == Cluster.Status.READY
        lifecycle.add_workers(cluster=cluster, count=1)
        sim.run_until(traveller, at(180 * 6))
    clock.stop()
    worker = cluster.nodes.get(index=2)
    assert worker.status == "failed"
    assert worker.network_at is not None
    assert not UsageRecord.objects.filter(node=worker).exists()
    billed = UsageRecord.objects.filter(cluster=cluster).values_list("node__index", flat=True)
    assert sorted(billed) == [0, 1]
