"""The beat task: one meter run charges, then stops what the balance no longer covers."""

from datetime import timedelta
from decimal import Decimal

from django.conf import settings
from django.utils import timezone

from billing.models import balance_of
from clusters import lifecycle
from clusters.lifecycle.stops import run_meter
from clusters.models import Cluster
from tests.billing.conftest import add_credit, bill_cluster


def test_it_is_scheduled_every_meter_interval():
    entry = settings.CELERY_BEAT_SCHEDULE["billing-meter"]

    assert entry == {
        "task": "clusters.stops.run_meter",
        "schedule": settings.RUNCRATE_METER_SECONDS,
    }


def test_it_charges_and_stops_in_one_run(owner):
    add_credit(owner.project, "5.00", at=timezone.now() - timedelta(days=1))
    cluster = bill_cluster(
        owner.project, size=2, price="6.00", at=timezone.now() - timedelta(hours=1)
    )

    with lifecycle.dispatching_to(lifecycle.CollectingDispatcher()):
        summary = run_meter.apply().get()

    assert summary["records_charged"] == 2
    assert Decimal(summary["amount_charged"]) >= Decimal("12.00")
    assert summary["stopped_for_balance"] == [cluster.pk]
    assert balance_of(owner.project.pk) < 0
    cluster.refresh_from_db()
    assert (cluster.status, cluster.stop_reason) == (Cluster.Status.TERMINATING, "balance")
