"""The meter: per-second charges, rounded once over each machine's span, hour by hour."""

from datetime import UTC, datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal

import pytest
from django.db import transaction
from django.db.models import Sum
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from billing.meter import charge_accrued, charge_usage, cost_between
from billing.models import LedgerEntry, UsageDay, UsageRecord, balance_of
from billing.usage import Month, machine_rows
from clusters.models import Cluster
from tests.billing.conftest import bill_cluster, end_cluster
from tests.factories import ClusterFactory, ProjectFactory

T0 = datetime(2026, 3, 10, 9, 0, tzinfo=UTC)


def expected_cost(price: Decimal, seconds: int) -> Decimal:
    """The documented rule, written independently of the meter's integer arithmetic."""
    return (price * seconds / Decimal(3600)).quantize(Decimal("0.01"), ROUND_HALF_UP)


def usage_total(**filters) -> Decimal:
    total = LedgerEntry.objects.filter(kind=LedgerEntry.Kind.USAGE, **filters).aggregate(
        total=Sum("amount")
    )["total"]
    # Every amount has two places; SQLite sums them as floats (32.3100000000001), so the sum is
    # read back to the cent it exactly is in decimal.
    return -(total or Decimal("0.00")).quantize(Decimal("0.01"))


def test_it_charges_each_machine_per_second_at_its_hourly_price(db):
    project = ProjectFactory()
    cluster = bill_cluster(project, size=2, price="3.60", at=T0)

    result = charge_accrued(now=T0 + timedelta(seconds=1000))

    assert result.records == 2
    assert result.amount == Decimal("2.00")  # 2 machines × 3.60 USD/h × 1000 s
    assert balance_of(project.pk) == Decimal("-2.00")
    for record in UsageRecord.objects.filter(cluster=cluster):
        assert record.charged_until == T0 + timedelta(seconds=1000)
        assert record.charged_amount == Decimal("1.00")


@pytest.mark.parametrize("fraction", [0, 1, 999_499, 999_500, 999_600, 999_999])
def test_it_charges_only_whole_seconds_whatever_the_fraction_of_the_last(db, fraction):
    # 36.00 USD/h is a cent a second: a second too many shows. (SQLite's strftime rounds a
    # fraction to the millisecond, so …:59.9996 once read as a whole second more.)
    project = ProjectFactory()
    bill_cluster(project, size=1, price="36.00", at=T0)

    result = charge_accrued(now=T0 + timedelta(seconds=999, microseconds=fraction))

    assert result.amount == Decimal("9.99")


def test_it_changes_nothing_when_run_again_at_the_same_instant(db):
    project = ProjectFactory()
    bill_cluster(project, size=3, price="7.77", at=T0)
    charge_accrued(now=T0 + timedelta(minutes=17, seconds=3))
    before = list(LedgerEntry.objects.values_list("pk", "amount", "machine_seconds"))

    again = charge_accrued(now=T0 + timedelta(minutes=17, seconds=3))

    assert again.records == 0
    assert again.amount == Decimal("0.00")
    assert list(LedgerEntry.objects.values_list("pk", "amount", "machine_seconds")) == before


def test_it_rounds_the_whole_span_once_so_many_small_charges_do_not_drift(db):
    project = ProjectFactory()
    cluster = bill_cluster(project, size=2, price="0.01", at=T0)
    # 0.01 USD/h: each 60 s slice alone is worth 0.0002 USD and would round to zero.
    for minute in range(1, 121):
        charge_accrued(now=T0 + timedelta(minutes=minute))

    assert usage_total(cluster=cluster) == Decimal("0.04")  # 2 machines × 2 h × 0.01


def test_it_keeps_one_usage_line_per_cluster_and_clock_hour(db):
    project = ProjectFactory()
    start = T0 + timedelta(minutes=30)
    cluster = bill_cluster(project, size=2, price="10.00", at=start)
    for minutes in (10, 20, 45, 90, 95):
        charge_accrued(now=start + timedelta(minutes=minutes))

    lines = list(
        LedgerEntry.objects.filter(cluster=cluster)
        .order_by("period_start")
        .values_list("period_start", "amount", "machine_seconds")
    )
    assert lines == [
        (T0, Decimal("-10.00"), 2 * 1800),  # 09:30-10:00
        (T0 + timedelta(hours=1), Decimal("-20.00"), 2 * 3600),  # 10:00-11:00
        # 11:00-11:05: each machine is rounded on its own span, 15.83 − 15.00 = 0.83 each.
        (T0 + timedelta(hours=2), Decimal("-1.66"), 2 * 300),
    ]


def test_it_charges_an_ended_cluster_up_to_its_end_and_no_further(db):
    project = ProjectFactory()
    cluster = bill_cluster(project, size=2, price="36.00", at=T0)
    charge_accrued(now=T0 + timedelta(seconds=60))
    end_cluster(cluster, at=T0 + timedelta(seconds=100))

    charge_usage(cluster_id=cluster.pk)
    charge_accrued(now=T0 + timedelta(hours=5))

    assert usage_total(cluster=cluster) == Decimal("2.00")  # 2 × 36 USD/h × 100 s
    assert set(UsageRecord.objects.values_list("charged_until", flat=True)) == {
        T0 + timedelta(seconds=100)
    }


def test_it_charges_an_ended_cluster_at_the_next_run_when_nobody_charged_it(db):
    project = ProjectFactory()
    cluster = bill_cluster(project, size=2, price="36.00", at=T0)
    end_cluster(cluster, at=T0 + timedelta(seconds=50))

    charge_accrued(now=T0 + timedelta(minutes=3))

    assert usage_total(cluster=cluster) == Decimal("1.00")


def test_it_charges_only_the_records_asked_for(db):
    project = ProjectFactory()
    cluster = bill_cluster(project, size=3, price="36.00", at=T0)
    worker = UsageRecord.objects.filter(cluster=cluster).order_by("pk").last()
    UsageRecord.objects.filter(pk=worker.pk).update(ended_at=T0 + timedelta(seconds=10))

    charge_usage(record_ids=[worker.pk], until=T0 + timedelta(seconds=30))

    worker.refresh_from_db()
    assert worker.charged_amount == Decimal("0.10")
    assert usage_total(cluster=cluster) == Decimal("0.10")


def test_it_refuses_to_guess_what_to_charge(db):
    with pytest.raises(ValueError, match="either a cluster or record_ids"):
        charge_usage()


def test_it_makes_the_machine_rows_the_cluster_line_and_the_ledger_agree_across_months(db):
    project = ProjectFactory()
    start = datetime(2026, 1, 31, 23, 17, 41, 250000, tzinfo=UTC)
    cluster = bill_cluster(project, size=3, price="13.37", at=start)
    for minutes in (1, 5, 42, 43, 61, 200):
        charge_accrued(now=start + timedelta(minutes=minutes, microseconds=999))

    for month in (Month(2026, 1), Month(2026, 2)):
        rows = machine_rows(cluster=cluster, month=month)
        ledger = usage_total(
            cluster=cluster, period_start__gte=month.start, period_start__lt=month.end
        )
        assert sum(row.cost for row in rows) == ledger
    assert usage_total(cluster=cluster) == sum(
        UsageRecord.objects.filter(cluster=cluster).values_list("charged_amount", flat=True)
    )


# ---- the property -----------------------------------------------------------------------------

cluster_plans = st.lists(
    st.fixed_dictionaries(
        {
            "size": st.integers(min_value=2, max_value=5),
            "price_cents": st.integers(min_value=1, max_value=9_999),
            "joined_after": st.integers(min_value=0, max_value=3 * 3600),
            "microseconds": st.integers(min_value=0, max_value=999_999),
            "runs_for": st.one_of(st.none(), st.integers(min_value=0, max_value=4 * 3600)),
            "charged_at_end": st.booleans(),
        }
    ),
    min_size=1,
    max_size=3,
)
meter_runs = st.lists(st.integers(min_value=0, max_value=8 * 3600), max_size=12)
# Start just before a month ends, so charges also cross a month and a day.
BASE = datetime(2026, 4, 30, 21, 0, tzinfo=UTC)


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(plans=cluster_plans, runs=meter_runs, final_after=st.integers(0, 9 * 3600))
def test_it_charges_exactly_the_rounded_price_of_every_second_whatever_the_meter_timing(
    db, plans, runs, final_after
):
    with transaction.atomic():
        project = ProjectFactory()
        failed = ClusterFactory(project=project, status=Cluster.Status.FAILED, machines=True)
        clusters = []
        for plan in plans:
            joined = BASE + timedelta(
                seconds=plan["joined_after"], microseconds=plan["microseconds"]
            )
            price = Decimal(plan["price_cents"]) / 100
            cluster = bill_cluster(project, size=plan["size"], price=price, at=joined)
            end = None
            if plan["runs_for"] is not None:
                end = joined + timedelta(seconds=plan["runs_for"], microseconds=123)
            clusters.append((cluster, price, joined, end, plan["charged_at_end"]))

        final = BASE + timedelta(seconds=final_after + 9 * 3600)
        events = sorted(
            [(BASE + timedelta(seconds=s), "meter", None) for s in runs]
            + [(end, "end", c) for c, _, _, end, _ in clusters if end is not None],
            key=lambda event: event[0],
        )
        for moment, what, cluster_and in events:
            if what == "meter":
                charge_accrued(now=moment)
            else:
                cluster, _, _, _, charged_at_end = next(c for c in clusters if c[0] is cluster_and)
                end_cluster(cluster, at=moment)
                if charged_at_end:
                    charge_usage(cluster_id=cluster.pk, until=moment)
        charge_accrued(now=final)

        expected_total = Decimal("0.00")
        for cluster, price, joined, end, _ in clusters:
            until = min(final, end) if end else final
            seconds = int((until - joined).total_seconds()) if until > joined else 0
            per_machine = expected_cost(price, seconds)
            assert usage_total(cluster=cluster) == per_machine * cluster.size
            for month in (Month(2026, 4), Month(2026, 5)):
                in_month = usage_total(
                    cluster=cluster, period_start__gte=month.start, period_start__lt=month.end
                )
                assert in_month == sum(
                    row.cost for row in machine_rows(cluster=cluster, month=month)
                )
            expected_total += per_machine * cluster.size
        assert usage_total(project=project) == expected_total
        # The per-day rollup the Billing page reads holds the same sums as the hourly lines.
        for cluster, *_ in clusters:
            days = UsageDay.objects.filter(cluster=cluster)
            assert -sum((d.amount for d in days), Decimal(0)) == usage_total(cluster=cluster)
            assert sum(d.machine_seconds for d in days) == sum(
                LedgerEntry.objects.filter(cluster=cluster).values_list(
                    "machine_seconds", flat=True
                )
            )
        assert usage_total(cluster=failed) == Decimal("0.00")
        assert not LedgerEntry.objects.filter(cluster=failed).exists()

        snapshot = list(LedgerEntry.objects.order_by("pk").values_list("amount", "machine_seconds"))
        charge_accrued(now=final)
        assert (
            list(LedgerEntry.objects.order_by("pk").values_list("amount", "machine_seconds"))
            == snapshot
        )
        transaction.set_rollback(True)


def test_it_prices_any_window_of_a_machine_as_the_difference_of_its_span_costs(db):
    project = ProjectFactory()
    cluster = bill_cluster(project, size=2, price="0.05", at=T0)
    record = UsageRecord.objects.filter(cluster=cluster).first()
    middle = T0 + timedelta(minutes=30)

    first_half = cost_between(record, T0, middle)
    second_half = cost_between(record, middle, T0 + timedelta(hours=1))

    # 0.025 rounds up to 0.03; the second half is what is left of the hour: 0.05 − 0.03.
    assert (first_half, second_half) == (Decimal("0.03"), Decimal("0.02"))
