"""The meter is set-based: its queries grow with clusters, never with machines, and a running
machine's row is written when it is first charged, when it crosses a clock hour and when it
ends, not at every run (billing/meter.py)."""

from datetime import UTC, datetime, timedelta
from decimal import Decimal

from django.db import connection
from django.db.models import Sum
from django.test.utils import CaptureQueriesContext

from bench.billing import build_billed_clusters
from billing import meter, metering
from billing.models import LedgerEntry, MeterMark, UsageRecord, balance_of
from billing.usage import Month, machine_rows
from tests.billing.conftest import bill_cluster, end_cluster
from tests.factories import ProjectFactory

T0 = datetime(2026, 3, 10, 9, 0, tzinfo=UTC)


def rows(cluster) -> list[tuple[datetime, Decimal]]:
    records = UsageRecord.objects.filter(cluster=cluster).order_by("pk")
    return list(records.values_list("charged_until", "charged_amount"))


def usage_total() -> Decimal:
    return -LedgerEntry.objects.filter(kind="usage").aggregate(total=Sum("amount"))["total"]


def metered(
    project, name: str, *, clusters: int, machines: int, minutes: tuple[int, ...]
) -> list[int]:
    """The queries of each meter run at these minutes after T0 (the first creates the lines)."""
    build_billed_clusters(
        project=project,
        clusters=clusters,
        machines_per_cluster=machines,
        started_at=T0,
        name_prefix=name,
    )
    counts = []
    for minute in minutes:
        with CaptureQueriesContext(connection) as queries:
            meter.charge_accrued(now=T0 + timedelta(minutes=minute, seconds=7))
        counts.append(len(queries))
    return counts


def end_fleet(minute: int) -> None:
    """The running machines end where the last run charged them, and are charged to their end
    (ended any earlier, they would hold a charge past their end, which the meter refunds)."""
    moment = T0 + timedelta(minutes=minute, seconds=7)
    UsageRecord.objects.filter(ended_at__isnull=True).update(ended_at=moment)
    meter.charge_accrued(now=moment)


def test_its_queries_are_the_same_for_2_machines_a_cluster_and_for_32(owner):
    # Minute 1 charges every machine for the first time, 2 and 3 within the hour, 61 crosses
    # into the next hour, 62 runs within it again.
    minutes = (1, 2, 3, 61, 62)
    small = metered(owner.project, "small", clusters=2, machines=2, minutes=minutes)
    end_fleet(minutes[-1])  # the first fleet is gone
    large = metered(owner.project, "large", clusters=2, machines=32, minutes=minutes)

    assert large == small
    # And with the clusters: 40 clusters in one batch cost what 2 do.
    end_fleet(minutes[-1])
    many = metered(owner.project, "many", clusters=40, machines=3, minutes=minutes)
    assert many == small
    assert max(small) <= 20  # savepoints included; the first run also makes marks and lines


def test_it_writes_a_running_machines_row_when_first_charged_at_an_hour_and_at_its_end(db):
    project = ProjectFactory()
    cluster = bill_cluster(project, size=2, price="36.00", at=T0)

    meter.charge_accrued(now=T0 + timedelta(seconds=100))  # first charged: written
    assert rows(cluster) == [(T0 + timedelta(seconds=100), Decimal("1.00"))] * 2

    meter.charge_accrued(now=T0 + timedelta(minutes=30))  # within the hour: not written
    assert rows(cluster) == [(T0 + timedelta(seconds=100), Decimal("1.00"))] * 2
    assert MeterMark.objects.get(cluster_id=cluster.pk).charged_until == T0 + timedelta(minutes=30)
    assert usage_total() == Decimal("36.00")  # 2 × 36 USD/h × 30 min
    assert meter.settled(UsageRecord.objects.filter(cluster=cluster))[0].charged_amount == Decimal(
        "18.00"
    )

    meter.charge_accrued(now=T0 + timedelta(hours=1, minutes=5))  # crossed an hour: written
    assert rows(cluster) == [(T0 + timedelta(hours=1, minutes=5), Decimal("39.00"))] * 2

    meter.charge_accrued(now=T0 + timedelta(hours=1, minutes=6))
    end_cluster(cluster, at=T0 + timedelta(hours=1, minutes=10))
    meter.charge_usage(cluster_id=cluster.pk)  # ended: written, charged to its end
    assert rows(cluster) == [(T0 + timedelta(hours=1, minutes=10), Decimal("42.00"))] * 2
    assert usage_total() == Decimal("84.00") == -balance_of(project.pk)


def test_a_machine_committed_after_a_meter_ran_past_its_start_is_charged_from_its_start(db):
    project = ProjectFactory()
    cluster = bill_cluster(project, size=1, price="36.00", at=T0)
    meter.charge_accrued(now=T0 + timedelta(seconds=100))
    meter.charge_accrued(now=T0 + timedelta(seconds=200))
    # A worker that joined at 50 s, whose transaction committed after the meter passed 200 s.
    worker = bill_cluster(project, size=1, price="36.00", at=T0 + timedelta(seconds=50))
    record = UsageRecord.objects.get(cluster=worker)
    UsageRecord.objects.filter(pk=record.pk).update(cluster=cluster)

    meter.charge_accrued(now=T0 + timedelta(seconds=300))

    # 300 s for the first machine, 250 s for the worker: nothing lost below the mark.
    assert usage_total() == Decimal("3.00") + Decimal("2.50")


def test_the_machine_rows_show_what_the_meter_charged_since_a_row_was_written(db):
    project = ProjectFactory()
    cluster = bill_cluster(project, size=3, price="36.00", at=T0)
    for minutes in (1, 10, 20):
        meter.charge_accrued(now=T0 + timedelta(minutes=minutes))

    machines = machine_rows(cluster=cluster, month=Month(2026, 3))

    assert [row.cost for row in machines] == [Decimal("12.00")] * 3
    assert [row.seconds for row in machines] == [1200] * 3
    assert {charged for charged, _ in rows(cluster)} == {T0 + timedelta(minutes=1)}


def test_a_lost_machines_refund_counts_what_the_meter_charged_since_its_row_was_written(db):
    project = ProjectFactory()
    cluster = bill_cluster(project, size=2, price="36.00", at=T0)
    meter.charge_accrued(now=T0 + timedelta(minutes=1))
    meter.charge_accrued(now=T0 + timedelta(minutes=10))  # rows still say 1 minute
    node = cluster.nodes.order_by("index").last()

    refunded = metering.close_machine(
        cluster_id=cluster.pk,
        node_id=node.pk,
        project_id=project.pk,
        at=T0 + timedelta(minutes=4),
        refund_note="Refund: lost",
    )

    assert refunded == Decimal("3.60")  # 6 minutes at 36 USD/h charged past its last word
    record = UsageRecord.objects.get(node=node)
    assert (record.charged_until, record.charged_amount) == (
        T0 + timedelta(minutes=4),
        Decimal("2.40"),
    )
    meter.charge_accrued(now=T0 + timedelta(minutes=20))
    # The other machine ran 20 minutes (12.00); the lost one is billed its 4 (2.40).
    assert balance_of(project.pk) == -(Decimal("12.00") + Decimal("6.00")) + Decimal("3.60")
