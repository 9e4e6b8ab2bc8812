"""Two meters at once (two workers, real PostgreSQL transactions) charge every second once: each
holds its clusters' marks (billing/meter.py)."""

import contextlib
import threading
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.db import connection
from django.db.models import Sum

from billing import meter
from billing.models import LedgerEntry, UsageRecord
from tests.billing.conftest import bill_cluster, end_cluster
from tests.conftest import postgres_only
from tests.factories import ProjectFactory

T0 = datetime(2026, 3, 10, 9, 0, tzinfo=UTC)


def _in_threads(*targets) -> list[BaseException]:
    errors: list[BaseException] = []

    def run(target):
        try:
            target()
        except BaseException as error:  # noqa: BLE001 - reported to the test
            errors.append(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(target,)) for target in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return errors


def _usage_total() -> Decimal:
    return -LedgerEntry.objects.filter(kind="usage").aggregate(total=Sum("amount"))["total"]


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_it_charges_once_when_two_meters_run_at_once(monkeypatch):
    project = ProjectFactory()
    for _ in range(3):
        bill_cluster(project, size=4, price="36.00", at=T0)  # 12 machines
    now = T0 + timedelta(seconds=100)
    inside = threading.Barrier(2, timeout=10)
    first_inside = threading.Event()
    met = []
    charge_clusters = meter._charge_clusters

    def charge_while_the_other_is_inside(cluster_ids, until, **options):
        # Both meters hold their batch's marks at this point: without the locks they would
        # both have read, and would both charge, the same clusters.
        met.append(len(cluster_ids))
        first_inside.set()
        with contextlib.suppress(threading.BrokenBarrierError):
            inside.wait()
        return charge_clusters(cluster_ids, until, **options)

    monkeypatch.setattr(meter, "_charge_clusters", charge_while_the_other_is_inside)

    def second_meter() -> None:
        # It starts once the first holds its whole first batch: started together, the two
        # could each lock one mark of that batch (SKIP LOCKED), and the split would say nothing.
        assert first_inside.wait(timeout=10), "the first meter never charged"
        meter.charge_accrued(now=now, batch_size=2)

    errors = _in_threads(lambda: meter.charge_accrued(now=now, batch_size=2), second_meter)

    assert errors == []
    # The two meters were inside at once, on different clusters: one took the first batch
    # (2 clusters), the other skipped it and took the third cluster; whichever then reached
    # the other's clusters found them locked or charged already.
    assert sorted(met[:2]) == [1, 2]
    assert _usage_total() == Decimal("12.00")  # 12 machines × 36 USD/h × 100 s, once
    assert set(UsageRecord.objects.values_list("charged_amount", flat=True)) == {Decimal("1.00")}
    assert LedgerEntry.objects.filter(kind="usage").count() == 3  # one per cluster and hour


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_it_charges_once_when_the_meter_and_a_terminate_charge_the_same_cluster(monkeypatch):
    project = ProjectFactory()
    cluster = bill_cluster(project, size=4, price="36.00", at=T0)
    end_cluster(cluster, at=T0 + timedelta(seconds=50))
    started = threading.Event()
    charge_clusters = meter._charge_clusters

    def slow_charge(cluster_ids, until, **options):
        started.set()
        return charge_clusters(cluster_ids, until, **options)

    monkeypatch.setattr(meter, "_charge_clusters", slow_charge)

    def charge_at_the_end():
        started.wait(timeout=10)
        meter.charge_usage(cluster_id=cluster.pk, until=T0 + timedelta(seconds=50))

    errors = _in_threads(
        lambda: meter.charge_accrued(now=T0 + timedelta(minutes=5)),
        charge_at_the_end,
    )

    assert errors == []
    assert _usage_total() == Decimal("2.00")  # 4 × 36 USD/h × 50 s
    assert LedgerEntry.objects.filter(kind="usage").count() == 1
