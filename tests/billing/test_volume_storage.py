"""Volume storage on the ledger: charged per second at price × size / (30 days), on one line per
volume per day, from creation to deletion, attached or not; shown on the Billing page as its own
line, in the CSV and the transactions API."""

import contextlib
import csv
import io
import threading
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
import time_machine
from django.db import connection
from django.db.models import Sum

from billing import meter
from billing.models import LedgerEntry, StorageRecord, balance_of
from clusters import lifecycle, volumes
from clusters.lifecycle.stops import run_meter
from clusters.models import Volume
from tests.billing.conftest import add_credit
from tests.conftest import postgres_only
from tests.factories import LocationFactory, MachineTypeFactory, ProjectFactory

T0 = datetime(2026, 3, 10, 9, 0, tzinfo=UTC)


@pytest.fixture
def ohio(db):
    location = LocationFactory(code="us-east-2", volume_price_per_gb_month=Decimal("0.10"))
    MachineTypeFactory(location=location)  # an offer there can attach a volume
    return location


def paying_project():
    """A project whose balance covers a week of a few volumes (what creating one needs)."""
    project = ProjectFactory()
    add_credit(project, "100.00", at=T0 - timedelta(days=1))
    return project


def new_volume(project, location, *, at=T0, size_gb=1000, name="datasets") -> Volume:
    with time_machine.travel(at, tick=False):
        return volumes.create_volume(
            project=project, name=name, location=location.code, size_gb=size_gb
        )


def storage_lines(volume: Volume) -> list[tuple[datetime, Decimal, int]]:
    return list(
        LedgerEntry.objects.filter(kind="storage", volume=volume)
        .order_by("period_start")
        .values_list("period_start", "amount", "machine_seconds")
    )


def charged(volume: Volume) -> Decimal:
    total = LedgerEntry.objects.filter(kind="storage", volume=volume).aggregate(t=Sum("amount"))
    return -(total["t"] or Decimal("0"))


def test_it_prices_storage_per_second_over_a_thirty_day_month():
    # 1,000 GB at 0.10 USD per GB-month: 100 USD per 30 days.
    assert meter.storage_cost_in_cents(Decimal("0.10"), 1000, 30 * 86_400) == 10_000
    assert meter.storage_cost_in_cents(Decimal("0.10"), 1000, 86_400) == 333  # 3.3333…
    assert meter.storage_cost_in_cents(Decimal("0.10"), 1000, 3600) == 14  # 0.1388…
    assert meter.storage_cost_in_cents(Decimal("0.0875"), 1, 30 * 86_400) == 9  # 0.0875
    assert meter.storage_cost_in_cents(Decimal("0.10"), 1000, 0) == 0


def test_it_charges_a_volume_from_its_creation_on_a_line_per_day(ohio):
    project = paying_project()
    volume = new_volume(project, ohio, at=T0)  # 09:00 on March 10

    result = meter.charge_storage(now=T0 + timedelta(days=1, hours=3))  # 12:00 on March 11

    assert result.volumes == 1 and result.storage == Decimal("3.75")  # 27 h of 100 USD/720 h
    assert storage_lines(volume) == [
        (datetime(2026, 3, 10, tzinfo=UTC), Decimal("-2.08"), 15 * 3600),
        (datetime(2026, 3, 11, tzinfo=UTC), Decimal("-1.67"), 12 * 3600),
    ]
    entry = LedgerEntry.objects.filter(volume=volume).first()
    assert entry.note == "Volume storage — datasets" and entry.cluster is None
    record = StorageRecord.objects.get(volume=volume)
    assert record.charged_until == T0 + timedelta(days=1, hours=3)
    assert record.charged_amount == Decimal("3.75")
    assert balance_of(project.pk) == Decimal("96.25")


def test_it_charges_each_second_once_however_often_it_runs(ohio):
    project = paying_project()
    often = new_volume(project, ohio, name="often", size_gb=700)
    once = new_volume(project, ohio, name="once", size_gb=700)
    end = T0 + timedelta(days=2, minutes=13)
    moment = T0
    while moment < end:
        moment = min(end, moment + timedelta(minutes=7, seconds=3))
        meter.charge_storage(now=moment, volume_ids=[often.pk])
    meter.charge_storage(now=end, volume_ids=[once.pk])
    meter.charge_storage(now=end)  # twice: nothing new

    # 70 USD per 30 days, for 2 days and 13 minutes: 4.6877 USD.
    assert charged(often) == charged(once) == Decimal("4.69")
    assert len(storage_lines(often)) == len(storage_lines(once)) == 3


def test_it_stops_charging_at_the_deletion(ohio):
    project = paying_project()
    volume = new_volume(project, ohio)
    meter.charge_storage(now=T0 + timedelta(hours=5))
    with time_machine.travel(T0 + timedelta(hours=10), tick=False):
        volumes.delete_volume(volume=volume)

    meter.charge_storage(now=T0 + timedelta(days=3))
    meter.charge_storage(now=T0 + timedelta(days=4))

    assert charged(volume) == Decimal("1.39")  # 10 hours of 100 USD per 720 hours
    volume.refresh_from_db()
    record = StorageRecord.objects.get(volume=volume)
    assert record.charged_until == record.ended_at == volume.deleted_at == T0 + timedelta(hours=10)


def test_it_charges_a_deleted_volume_up_to_its_deletion_at_once(
    ohio, django_capture_on_commit_callbacks
):
    project = paying_project()
    volume = new_volume(project, ohio)

    with (
        time_machine.travel(T0 + timedelta(hours=1), tick=False),
        django_capture_on_commit_callbacks(execute=True),
    ):
        volumes.delete_volume(volume=volume)

    assert charged(volume) == Decimal("0.14")


def test_it_charges_storage_in_the_meters_run(ohio):
    project = ProjectFactory()
    add_credit(project, "50.00", at=T0)
    new_volume(project, ohio, at=T0)

    with (
        time_machine.travel(T0 + timedelta(hours=2), tick=False),
        lifecycle.dispatching_to(lifecycle.CollectingDispatcher()),
    ):
        summary = run_meter.apply().get()

    assert summary["volumes_charged"] == 1
    assert summary["storage_charged"] == "0.28"
    assert balance_of(project.pk) == Decimal("49.72")


def test_it_shows_storage_as_its_own_line_on_the_billing_page(owner, ohio):
    add_credit(owner.project, "100.00", at=T0 - timedelta(days=1))
    volume = new_volume(owner.project, ohio, at=T0)
    new_volume(owner.project, ohio, at=T0, name="checkpoints")
    meter.charge_storage(now=T0 + timedelta(days=1, hours=3))

    with time_machine.travel(T0 + timedelta(days=1, hours=3, minutes=1), tick=False):
        page = owner.browser_client().get("/billing/?month=2026-03").content.decode()
        csv_text = owner.browser_client().get("/billing/export.csv?month=2026-03")
        api = owner.api().get("/api/v1/billing/transactions?type=storage").json()

    text = " ".join(page.split())
    assert "Volume storage — datasets" in text
    assert "Volume storage — checkpoints" in text
    assert "\u2212$3.75" in text
    assert "Volume storage</dt><dd>$7.50" in text
    rows = list(csv.DictReader(io.StringIO(csv_text.content.decode())))
    storage = [row for row in rows if row["type"] == "storage"]
    assert len(storage) == 2
    datasets = next(row for row in storage if "datasets" in row["note"])
    assert datasets["amount_usd"] == "-3.75"
    assert datasets["location"] == "us-east-2"
    assert datasets["note"] == "Volume storage — datasets (1000 GB at $0.10 per GB-month)"
    assert {entry["volume_id"] for entry in api["data"]} == {volume.pk, volume.pk + 1}
    assert {entry["type"] for entry in api["data"]} == {"storage"}


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_it_charges_once_when_two_meters_run_at_once(monkeypatch):
    location = LocationFactory(code="us-east-2", volume_price_per_gb_month=Decimal("0.10"))
    MachineTypeFactory(location=location)  # an offer there can attach a volume
    project = paying_project()
    add_credit(project, "100.00", at=T0 - timedelta(days=1))  # a week of six of them: $140
    for n in range(6):
        new_volume(project, location, name=f"v-{n}")
    inside = threading.Barrier(2, timeout=5)
    charge_records = meter._charge_storage_records

    def charge_while_the_other_is_inside(batch, now):
        # Both meters hold their batch's row locks here: without them both would charge all.
        with contextlib.suppress(threading.BrokenBarrierError):
            inside.wait()
        return charge_records(batch, now)

    monkeypatch.setattr(meter, "_charge_storage_records", charge_while_the_other_is_inside)
    errors = []

    def run():
        try:
            meter.charge_storage(now=T0 + timedelta(hours=7), batch_size=3)
        except BaseException as error:  # noqa: BLE001 - reported to the test
            errors.append(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    assert errors == []
    total = LedgerEntry.objects.filter(kind="storage").aggregate(t=Sum("amount"))["t"]
    assert total == Decimal("-0.97") * 6  # 7 h of 100 USD per 720 h, for each volume, once
    assert LedgerEntry.objects.filter(kind="storage").count() == 6
