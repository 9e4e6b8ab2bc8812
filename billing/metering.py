"""Metering: what clusters ask billing to bill (docs/billing.md).

Billing owns every metered item and every row that records one: a machine's usage record
(`UsageRecord`), a volume's storage record (`StorageRecord`), the meter's marks and the ledger
lines they are charged onto. Clusters decide what to stop and when (the lifecycle, the volumes);
they tell billing through these functions, with ids and instants, and never write those rows
themselves (tests/billing/test_owns_metering.py reads the code for it).

- `open_machines` / `open_storage`: an item is billed from an instant.
- `close_cluster` / `close_machine` / `close_storage`: it stops being billed at an instant (a
  lost machine's, possibly past: what was charged beyond it is refunded).
- `hold`: no meter charges these clusters until the caller's transaction commits.
- `charge_on_commit`: an ended item is charged up to its end once the caller commits, not at
  the meter's next run.
- `charge_accrued`: the meter's run: every kind of item, up to now (billing/meter.py holds the
  rounding rule and the set-based charge).

Every function takes part in the caller's transaction; the charges after a commit run in their
own.
"""

from collections.abc import Iterable, Sequence
from datetime import datetime
from decimal import Decimal

from django.db import transaction

from billing import meter
from billing.meter import BATCH_SIZE, ChargeResult
from billing.models import StorageRecord, UsageRecord

__all__ = [
    "ChargeResult",
    "charge_accrued",
    "charge_on_commit",
    "close_cluster",
    "close_machine",
    "close_storage",
    "hold",
    "open_machines",
    "open_storage",
]


# ---- machines ---------------------------------------------------------------------------------


def open_machines(
    *,
    project_id: int,
    cluster_id: int,
    node_ids: Sequence[int],
    price_per_hour: Decimal,
    at: datetime,
) -> None:
    """The machines `node_ids` of the cluster are billed from `at` at `price_per_hour`: one
    usage record each, in one insert."""
    if not node_ids:
        return
    UsageRecord.objects.bulk_create(
        [
            UsageRecord(
                project_id=project_id,
                cluster_id=cluster_id,
                node_id=node_id,
                price_per_hour=price_per_hour,
                started_at=at,
                charged_until=at,
            )
            for node_id in node_ids
        ]
    )


def hold(cluster_ids: Iterable[int]) -> None:
    """No meter charges these clusters until the caller's transaction ends: their meter marks
    are locked (made when missing), in one order, waiting for a meter that holds them. For a
    caller that must hold them before it decides what to close; `close_cluster` and
    `close_machine` hold their own cluster anyway."""
    meter.lock_marks(cluster_ids)


def close_cluster(*, cluster_id: int, at: datetime) -> None:
    """Every machine of the cluster still billed stops being billed at `at` (a terminate, a
    stop, a failure), and is charged up to its end once the caller's transaction commits.

    The cluster is held first (`hold`): a meter that ran between this end and the charge would
    charge the machines as running, past `at` (the charge would refund it, but the ledger would
    show both)."""
    meter.lock_marks([cluster_id])
    UsageRecord.objects.filter(cluster_id=cluster_id, ended_at__isnull=True).update(ended_at=at)
    charge_on_commit(cluster_id=cluster_id)


def close_machine(
    *, cluster_id: int, node_id: int, project_id: int, at: datetime, refund_note: str
) -> Decimal:
    """The machine `node_id` stops being billed at `at` (a lost machine: its last heartbeat),
    which may be in the past: what the ledger already charged past `at` is refunded, an
    adjustment line with `refund_note` as its note, and it is charged up to its end once the
    caller's transaction commits. Returns the refund.

    Its cluster is held first, so that no meter charges it until the refund commits."""
    refunded = Decimal("0.00")
    meter.lock_marks([cluster_id])
    records = meter.settled(
        UsageRecord.objects.select_for_update().filter(node_id=node_id, ended_at__isnull=True)
    )
    for record in records:
        end = max(at, record.started_at)
        if record.charged_until > end:
            over = meter.cost_between(record, end, record.charged_until)
            if meter.refund_line(project_id=project_id, amount=over, note=refund_note):
                refunded += over
            record.charged_amount -= over
            record.charged_until = end
        record.ended_at = end
        record.save(update_fields=["ended_at", "charged_until", "charged_amount"])
    charge_on_commit(record_ids=[record.pk for record in records])
    return refunded


def charge_on_commit(*, cluster_id: int | None = None, record_ids: list[int] | None = None) -> None:
    """Once the caller's transaction commits, charge the cluster's ended machines (or the usage
    records `record_ids`) up to their end, rather than at the meter's next run."""
    if (cluster_id is None) == (record_ids is None):
        raise ValueError("charge_on_commit needs either a cluster_id or record_ids.")

    def charge() -> None:
        if cluster_id is not None:
            meter.charge_usage(cluster_id=cluster_id)
        else:
            meter.charge_usage(record_ids=record_ids)

    # robust: a failed charge is logged and left to the meter; it never undoes the end.
    transaction.on_commit(charge, robust=True)


# ---- volumes' storage -------------------------------------------------------------------------


def open_storage(
    *,
    project_id: int,
    volume_id: int,
    size_gb: int,
    price_per_gb_month: Decimal,
    at: datetime,
) -> None:
    """The volume's `size_gb` GB are billed from `at` at `price_per_gb_month` (a storage month
    is 30 days: billing/meter.py)."""
    StorageRecord.objects.create(
        project_id=project_id,
        volume_id=volume_id,
        size_gb=size_gb,
        price_per_gb_month=price_per_gb_month,
        started_at=at,
        charged_until=at,
    )


def close_storage(*, volume_id: int, at: datetime) -> None:
    """The volume stops being billed at `at` (its deletion), and is charged up to then once the
    caller's transaction commits. Closing a closed volume changes nothing."""
    StorageRecord.objects.filter(volume_id=volume_id, ended_at__isnull=True).update(ended_at=at)

    def charge() -> None:
        meter.charge_storage(volume_ids=[volume_id])

    transaction.on_commit(charge, robust=True)


# ---- the meter's run --------------------------------------------------------------------------


def charge_accrued(*, now: datetime | None = None, batch_size: int = BATCH_SIZE) -> ChargeResult:
    """The meter's run: charge every kind of metered item up to now (or an earlier `now`), the
    machines (`billing.meter.charge_accrued`), then the volumes' storage
    (`billing.meter.charge_storage`). Safe to run twice and on several workers at once."""
    result = meter.charge_accrued(now=now, batch_size=batch_size)
    result.add(meter.charge_storage(now=now, batch_size=batch_size))
    return result
