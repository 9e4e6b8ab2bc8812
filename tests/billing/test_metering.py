"""billing.metering, what clusters call: machines and volumes are opened at an instant, closed at
an instant (a lost machine's refunded past it), and charged; read back from the database."""

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.db import transaction
from django.db.models import Sum

from billing import meter, metering
from billing.models import LedgerEntry, MeterMark, StorageRecord, UsageRecord, balance_of
from clusters.models import Cluster, Node, Volume
from tests.billing.conftest import add_credit
from tests.factories import ClusterFactory, LocationFactory, MachineTypeFactory, ProjectFactory

T0 = datetime(2026, 3, 10, 9, 0, tzinfo=UTC)

pytestmark = pytest.mark.django_db


def joined_cluster(project, *, size: int = 3, price: str = "36.00") -> Cluster:
    """A ready cluster with `size` joined machines and no usage record yet."""
    return ClusterFactory(
        project=project,
        machine_type=MachineTypeFactory(price_per_hour=Decimal(price)),
        size=size,
        status=Cluster.Status.READY,
        joined_at=T0,
        ready_at=T0,
        machines=True,
        machines__status=Node.Status.JOINED,
        machines__step=Node.Step.DONE,
    )


def opened(cluster: Cluster, *, at=T0) -> list[int]:
    node_ids = list(cluster.nodes.order_by("index").values_list("pk", flat=True))
    metering.open_machines(
        project_id=cluster.project_id,
        cluster_id=cluster.pk,
        node_ids=node_ids,
        price_per_hour=cluster.machine_type.price_per_hour,
        at=at,
    )
    return node_ids


def records(cluster: Cluster) -> list[tuple]:
    return list(
        UsageRecord.objects.filter(cluster=cluster)
        .order_by("node__index")
        .values_list("node_id", "price_per_hour", "started_at", "ended_at", "charged_until")
    )


def usage_total(cluster: Cluster) -> Decimal:
    total = LedgerEntry.objects.filter(kind="usage", cluster=cluster).aggregate(t=Sum("amount"))
    return -(total["t"] or Decimal("0"))


def test_it_opens_a_record_per_machine_in_one_insert(django_assert_num_queries):
    cluster = joined_cluster(ProjectFactory())
    node_ids = list(cluster.nodes.order_by("index").values_list("pk", flat=True))

    with django_assert_num_queries(1):
        metering.open_machines(
            project_id=cluster.project_id,
            cluster_id=cluster.pk,
            node_ids=node_ids,
            price_per_hour=Decimal("36.00"),
            at=T0,
        )

    assert records(cluster) == [(pk, Decimal("36.00"), T0, None, T0) for pk in node_ids]
    assert {r.project_id for r in UsageRecord.objects.filter(cluster=cluster)} == {
        cluster.project_id
    }


def test_it_opens_nothing_for_no_machines(django_assert_num_queries):
    cluster = joined_cluster(ProjectFactory())
    with django_assert_num_queries(0):
        metering.open_machines(
            project_id=cluster.project_id,
            cluster_id=cluster.pk,
            node_ids=[],
            price_per_hour=Decimal("36.00"),
            at=T0,
        )
    assert records(cluster) == []


def test_it_closes_a_cluster_at_an_instant_and_charges_it_to_then_on_commit(
    django_capture_on_commit_callbacks,
):
    project = ProjectFactory()
    cluster = joined_cluster(project)
    opened(cluster)
    meter.charge_accrued(now=T0 + timedelta(minutes=5))
    end = T0 + timedelta(minutes=10)

    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        metering.close_cluster(cluster_id=cluster.pk, at=end)

    assert {row[3] for row in records(cluster)} == {end}
    assert usage_total(cluster) == Decimal("9.00")  # 3 machines × 5 min × 36 USD/h: not yet
    assert len(callbacks) == 1
    callbacks[0]()
    assert usage_total(cluster) == Decimal("18.00")  # 3 × 10 minutes at 36 USD/h
    assert {row[4] for row in records(cluster)} == {end}
    meter.charge_accrued(now=T0 + timedelta(hours=2))  # ended: nothing more
    assert usage_total(cluster) == Decimal("18.00")
    assert balance_of(project.pk) == Decimal("-18.00")


def test_closing_a_cluster_leaves_machines_ended_before_at_their_end(
    django_capture_on_commit_callbacks,
):
    cluster = joined_cluster(ProjectFactory(), size=2)
    first, _ = opened(cluster)
    UsageRecord.objects.filter(node_id=first).update(ended_at=T0 + timedelta(minutes=1))

    with django_capture_on_commit_callbacks(execute=True):
        metering.close_cluster(cluster_id=cluster.pk, at=T0 + timedelta(minutes=9))

    assert [row[3] for row in records(cluster)] == [
        T0 + timedelta(minutes=1),
        T0 + timedelta(minutes=9),
    ]
    assert usage_total(cluster) == Decimal("6.00")  # 1 + 9 minutes at 36 USD/h


def test_it_closes_a_lost_machine_in_the_past_and_refunds_what_was_charged_past_it(
    django_capture_on_commit_callbacks,
):
    project = ProjectFactory()
    cluster = joined_cluster(project, size=2)
    _, lost = opened(cluster)
    meter.charge_accrued(now=T0 + timedelta(minutes=1))
    meter.charge_accrued(now=T0 + timedelta(minutes=10))

    with django_capture_on_commit_callbacks(execute=True):
        refunded = metering.close_machine(
            cluster_id=cluster.pk,
            node_id=lost,
            project_id=project.pk,
            at=T0 + timedelta(minutes=4),
            refund_note="Refund: lost past its last heartbeat",
        )

    assert refunded == Decimal("3.60")  # 6 minutes at 36 USD/h
    record = UsageRecord.objects.get(node_id=lost)
    assert (record.ended_at, record.charged_until, record.charged_amount) == (
        T0 + timedelta(minutes=4),
        T0 + timedelta(minutes=4),
        Decimal("2.40"),
    )
    refund = LedgerEntry.objects.get(kind=LedgerEntry.Kind.ADJUSTMENT)
    assert (refund.amount, refund.note, refund.project_id) == (
        Decimal("3.60"),
        "Refund: lost past its last heartbeat",
        project.pk,
    )
    other = UsageRecord.objects.exclude(node_id=lost).get()
    assert other.ended_at is None  # only the lost machine ends
    meter.charge_accrued(now=T0 + timedelta(minutes=20))
    assert balance_of(project.pk) == -(Decimal("12.00") + Decimal("2.40"))


def test_a_lost_machine_not_charged_past_its_end_gets_no_refund(
    django_capture_on_commit_callbacks,
):
    project = ProjectFactory()
    cluster = joined_cluster(project, size=1)
    [lost] = opened(cluster)
    meter.charge_accrued(now=T0 + timedelta(minutes=2))

    with django_capture_on_commit_callbacks(execute=True):
        refunded = metering.close_machine(
            cluster_id=cluster.pk,
            node_id=lost,
            project_id=project.pk,
            at=T0 + timedelta(minutes=5),
            refund_note="unused",
        )

    assert refunded == Decimal("0.00")
    assert not LedgerEntry.objects.filter(kind=LedgerEntry.Kind.ADJUSTMENT).exists()
    assert usage_total(cluster) == Decimal("3.00")  # charged on commit up to its end
    assert UsageRecord.objects.get().charged_until == T0 + timedelta(minutes=5)


def test_hold_makes_and_locks_the_marks():
    clusters = [joined_cluster(ProjectFactory(), size=1) for _ in range(2)]
    with transaction.atomic():
        metering.hold([c.pk for c in clusters])
        assert set(MeterMark.objects.values_list("cluster_id", flat=True)) == {
            c.pk for c in clusters
        }


def test_charge_on_commit_needs_one_of_a_cluster_or_records():
    with pytest.raises(ValueError):
        metering.charge_on_commit()
    with pytest.raises(ValueError):
        metering.charge_on_commit(cluster_id=1, record_ids=[1])


def test_charge_on_commit_charges_the_given_records_only(django_capture_on_commit_callbacks):
    cluster = joined_cluster(ProjectFactory(), size=2)
    first, _ = opened(cluster)
    UsageRecord.objects.filter(node_id=first).update(ended_at=T0 + timedelta(minutes=30))
    record = UsageRecord.objects.get(node_id=first)

    with django_capture_on_commit_callbacks(execute=True):
        metering.charge_on_commit(record_ids=[record.pk])

    record.refresh_from_db()
    assert (record.charged_until, record.charged_amount) == (
        T0 + timedelta(minutes=30),
        Decimal("18.00"),
    )
    assert usage_total(cluster) == Decimal("18.00")


# ---- volumes ----------------------------------------------------------------------------------


def bare_volume(project, *, size_gb: int = 1000, name: str = "datasets") -> Volume:
    return Volume.objects.create(
        project=project,
        name=name,
        location=LocationFactory(volume_price_per_gb_month=Decimal("0.10")),
        size_gb=size_gb,
        price_per_gb_month=Decimal("0.10"),
        created_at=T0,
    )


def test_it_opens_a_volumes_storage_and_charges_it_per_day():
    project = ProjectFactory()
    add_credit(project, "100.00", at=T0)
    volume = bare_volume(project)

    metering.open_storage(
        project_id=project.pk,
        volume_id=volume.pk,
        size_gb=1000,
        price_per_gb_month=Decimal("0.10"),
        at=T0,
    )
    result = metering.charge_accrued(now=T0 + timedelta(days=1, hours=3))

    assert (result.volumes, result.storage) == (1, Decimal("3.75"))
    assert (result.records, result.amount) == (0, Decimal("0.00"))  # no machine
    record = StorageRecord.objects.get(volume=volume)
    assert (record.started_at, record.ended_at, record.charged_until, record.charged_amount) == (
        T0,
        None,
        T0 + timedelta(days=1, hours=3),
        Decimal("3.75"),
    )
    assert balance_of(project.pk) == Decimal("96.25")


def test_it_closes_a_volumes_storage_and_charges_it_to_then_on_commit(
    django_capture_on_commit_callbacks,
):
    project = ProjectFactory()
    volume = bare_volume(project)
    metering.open_storage(
        project_id=project.pk,
        volume_id=volume.pk,
        size_gb=1000,
        price_per_gb_month=Decimal("0.10"),
        at=T0,
    )
    end = T0 + timedelta(hours=10)

    with django_capture_on_commit_callbacks(execute=True):
        metering.close_storage(volume_id=volume.pk, at=end)
    with django_capture_on_commit_callbacks(execute=True):
        metering.close_storage(volume_id=volume.pk, at=end + timedelta(hours=1))  # no change

    record = StorageRecord.objects.get(volume=volume)
    assert (record.ended_at, record.charged_until, record.charged_amount) == (
        end,
        end,
        Decimal("1.39"),  # 10 hours of 100 USD per 720 hours
    )
    metering.charge_accrued(now=T0 + timedelta(days=3))
    assert balance_of(project.pk) == Decimal("-1.39")


def test_one_run_charges_machines_and_storage_alike():
    project = ProjectFactory()
    cluster = joined_cluster(project, size=2, price="36.00")
    opened(cluster)
    volume = bare_volume(project)
    metering.open_storage(
        project_id=project.pk,
        volume_id=volume.pk,
        size_gb=1000,
        price_per_gb_month=Decimal("0.10"),
        at=T0,
    )

    result = metering.charge_accrued(now=T0 + timedelta(hours=1))

    assert (result.records, result.amount) == (2, Decimal("72.00"))
    assert (result.volumes, result.storage) == (1, Decimal("0.14"))
    assert result.project_ids == {project.pk}
    assert balance_of(project.pk) == Decimal("-72.14")
