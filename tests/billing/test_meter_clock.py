"""The meter charges on the database's clock, never a worker's (issue 19, item 2): a worker whose
clock runs fast charges nothing past the database's now, and what the ledger holds past a
machine's end (a terminate on a clock behind the database's) is refunded, so a cluster that ran
2 seconds is billed 2 seconds. `check_balances` fails on usage charged past its end or past now.
"""

from datetime import timedelta
from decimal import Decimal

import pytest
import time_machine
from django.core.management import CommandError, call_command
from django.db.models import Sum

from billing import meter
from billing.models import LedgerEntry, MeterMark, UsageRecord, balance_of
from billing.usage import Month, cluster_costs, machine_rows
from clusters import lifecycle
from clusters.lifecycle.stops import run_meter
from tests.billing.conftest import add_credit, bill_cluster

PRICE = Decimal("36.00")  # a cent a second: a second too many shows


def usage_charged(cluster) -> Decimal:
    total = LedgerEntry.objects.filter(cluster=cluster, kind=LedgerEntry.Kind.USAGE).aggregate(
        total=Sum("amount")
    )["total"]
    return -(total or Decimal("0.00"))


def refunds(project) -> Decimal:
    lines = LedgerEntry.objects.filter(
        project=project, kind=LedgerEntry.Kind.ADJUSTMENT, note__startswith="Refund:"
    )
    return lines.aggregate(total=Sum("amount"))["total"] or Decimal("0.00")


def test_a_meter_on_a_clock_30_minutes_fast_charges_nothing_past_the_databases_now(owner):
    add_credit(owner.project, "1000.00")
    started = meter.database_now() - timedelta(minutes=10)
    cluster = bill_cluster(owner.project, size=2, price=PRICE, at=started)

    before = meter.database_now()
    with time_machine.travel(before + timedelta(minutes=30), tick=True):
        summary = run_meter.apply().get()  # the beat's meter, on the fast worker
    after = meter.database_now()

    # Ten minutes (and the moments the test took) of 2 machines, not forty.
    low = 2 * meter.cost(PRICE, meter.billed_seconds(started, before))
    high = 2 * meter.cost(PRICE, meter.billed_seconds(started, after))
    assert low <= usage_charged(cluster) <= high
    assert Decimal(summary["amount_charged"]) == usage_charged(cluster)
    assert balance_of(owner.project) == Decimal("1000.00") - usage_charged(cluster)
    assert MeterMark.objects.get(cluster=cluster).charged_until <= after
    assert all(r.charged_until <= after for r in UsageRecord.objects.filter(cluster=cluster))
    assert meter.charged_past() == []


def test_an_earlier_now_is_kept_but_a_later_one_is_the_databases(owner):
    started = meter.database_now() - timedelta(minutes=5)
    cluster = bill_cluster(owner.project, size=1, price=PRICE, at=started)

    meter.charge_accrued(now=started + timedelta(seconds=100))
    assert usage_charged(cluster) == Decimal("1.00")

    meter.charge_accrued(now=started + timedelta(days=3))  # the future: no further than now
    assert usage_charged(cluster) <= meter.cost(
        PRICE, meter.billed_seconds(started, meter.database_now())
    )
    assert MeterMark.objects.get(cluster=cluster).charged_until <= meter.database_now()


def test_a_cluster_terminated_after_2_seconds_is_billed_2_seconds(
    owner, django_capture_on_commit_callbacks
):
    # Billing started a minute ago by the database's clock, and the meter charged that minute.
    # The terminate runs on a worker whose clock is behind the database's: it ends the cluster
    # 2 seconds after it started, where the meter had already charged past.
    add_credit(owner.project, "100.00")
    started = meter.database_now() - timedelta(minutes=1)
    cluster = bill_cluster(owner.project, size=2, price=PRICE, at=started)
    meter.charge_accrued()
    assert usage_charged(cluster) >= Decimal("1.20")  # 2 machines × 60 s × a cent

    with (
        time_machine.travel(started + timedelta(seconds=2), tick=False),
        django_capture_on_commit_callbacks(execute=True),
    ):
        lifecycle.terminate(cluster=cluster, user=owner.user)

    two_seconds = 2 * meter.cost(PRICE, 2)
    assert two_seconds == Decimal("0.04")
    assert usage_charged(cluster) - refunds(owner.project) == two_seconds
    assert balance_of(owner.project) == Decimal("100.00") - two_seconds
    for record in UsageRecord.objects.filter(cluster=cluster):
        assert record.ended_at == record.charged_until == started + timedelta(seconds=2)
        assert record.charged_amount == Decimal("0.02")
    assert LedgerEntry.objects.get(note__startswith="Refund:").note == (
        f"Refund: {cluster.name} was billed past its end"
    )
    # The cluster's figures say 2 seconds too, and a meter run later changes nothing.
    assert cluster_costs([cluster.pk], now=meter.database_now())[cluster.pk].cost == two_seconds
    rows = machine_rows(cluster=cluster, month=Month.of(started))
    assert [(row.seconds, row.cost) for row in rows] == [(2, Decimal("0.02"))] * 2
    meter.charge_accrued()
    assert balance_of(owner.project) == Decimal("100.00") - two_seconds
    assert meter.charged_past() == []


def test_a_worker_ended_before_the_meters_mark_is_refunded_alone(owner):
    started = meter.database_now() - timedelta(minutes=1)
    cluster = bill_cluster(owner.project, size=2, price=PRICE, at=started)
    meter.charge_accrued(now=started + timedelta(seconds=50))
    worker = UsageRecord.objects.filter(cluster=cluster).order_by("pk").last()
    UsageRecord.objects.filter(pk=worker.pk).update(ended_at=started + timedelta(seconds=20))

    result = meter.charge_usage(record_ids=[worker.pk])

    assert result.refunded == Decimal("0.30")  # charged to 50 s, ended at 20 s
    worker.refresh_from_db()
    assert (worker.charged_until, worker.charged_amount) == (
        started + timedelta(seconds=20),
        Decimal("0.20"),
    )
    assert usage_charged(cluster) - refunds(owner.project) == Decimal("0.70")  # 50 s + 20 s
    # The other machine still runs, charged by its mark.
    meter.charge_accrued(now=started + timedelta(seconds=60))
    assert usage_charged(cluster) - refunds(owner.project) == Decimal("0.80")


def test_the_next_meter_run_refunds_a_machine_whose_row_was_charged_past_its_end(owner):
    # A record charged (its row written) up to 100 s, then ended at 40 s with nobody charging
    # it: the beat's meter finds it and refunds the 60 s.
    started = meter.database_now() - timedelta(minutes=5)
    cluster = bill_cluster(owner.project, size=1, price=PRICE, at=started)
    meter.charge_accrued(now=started + timedelta(seconds=100))
    UsageRecord.objects.filter(cluster=cluster).update(ended_at=started + timedelta(seconds=40))

    result = meter.charge_accrued()

    assert result.refunded == Decimal("0.60")
    assert usage_charged(cluster) - refunds(owner.project) == Decimal("0.40")
    assert meter.charged_past() == []


def test_check_balances_fails_on_usage_charged_past_its_end_and_repairs_it(owner, capsys):
    started = meter.database_now() - timedelta(minutes=5)
    cluster = bill_cluster(owner.project, size=1, price=PRICE, at=started)
    meter.charge_accrued(now=started + timedelta(seconds=100))
    record = UsageRecord.objects.get(cluster=cluster)
    UsageRecord.objects.filter(pk=record.pk).update(ended_at=started + timedelta(seconds=40))

    with pytest.raises(CommandError, match="1 usage record"):
        call_command("check_balances")
    out = capsys.readouterr().out
    assert "Every balance is the sum of its ledger." in out  # the ledger agrees with itself
    assert f"usage record {record.pk} (cluster {cluster.pk}" in out and "past its end" in out

    call_command("check_balances", "--repair")

    assert refunds(owner.project) == Decimal("0.60")
    call_command("check_balances")
    assert "No usage is charged past its end or past now." in capsys.readouterr().out


def test_check_balances_fails_on_usage_charged_past_now(owner, capsys):
    # What a meter on a fast clock wrote before the meter kept to the database's clock.
    started = meter.database_now() - timedelta(minutes=5)
    cluster = bill_cluster(owner.project, size=1, price=PRICE, at=started)
    meter.charge_accrued(now=started + timedelta(seconds=100))
    record = UsageRecord.objects.get(cluster=cluster)
    MeterMark.objects.filter(cluster=cluster).update(
        charged_until=meter.database_now() + timedelta(minutes=30)
    )

    assert [charge.record_id for charge in meter.charged_past()] == [record.pk]
    with pytest.raises(CommandError, match="1 usage record"):
        call_command("check_balances", "--repair")  # the future is not the meter's to refund
    assert "past the database's now" in capsys.readouterr().out


def test_the_cost_so_far_on_a_fast_clock_is_never_past_the_databases_now(owner):
    # A web worker 30 minutes fast shows what the meter would charge, not the future.
    started = meter.database_now() - timedelta(minutes=1)
    cluster = bill_cluster(owner.project, size=1, price=PRICE, at=started)

    cost = cluster_costs([cluster.pk], now=started + timedelta(minutes=31))[cluster.pk]

    after = meter.database_now()
    assert Decimal("0.60") <= cost.cost <= meter.cost(PRICE, meter.billed_seconds(started, after))
    assert 60 <= cost.uptime_seconds <= meter.billed_seconds(started, after)
