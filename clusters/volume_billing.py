"""The volumes' storage on the ledger: the meter's other half (docs/billing.md "Volume storage",
docs/volumes.md). Billing prices it and writes the lines (billing/meter.py); the volumes are
the clusters' rows, so charging them happens here: billing never imports clusters.

A volume is charged per second from `created_at` up to now (or its deletion), rounded once over
its whole life like a machine, onto one storage line per volume per day (UTC).
"""

from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime

from django.db import connection, transaction
from django.db.models import F, Q, QuerySet
from django.utils import timezone

from billing.meter import (
    BATCH_SIZE,
    ChargeResult,
    Debit,
    billed_seconds,
    cents,
    days,
    post_storage_lines,
    storage_cost_in_cents,
)
from clusters.models import Volume


def _chargeable_volumes(queryset: QuerySet, now: datetime) -> QuerySet:
    """Live volumes, and deleted ones not yet charged to their deletion."""
    return queryset.filter(
        Q(deleted_at__isnull=True) | Q(charged_until__lt=F("deleted_at")), charged_until__lt=now
    )


def _charge_volumes(volumes: Iterable, now: datetime) -> ChargeResult:
    """Charge locked volumes up to `now` (or their deletion) onto their per-day storage lines.

    Like machines, a volume's cost is computed over its whole life from `created_at`, so its
    debits add up to the rounded cost of everything it stored, however often this runs."""
    lines: dict[tuple[int, datetime], Debit] = defaultdict(lambda: Debit(project_id=0))
    names: dict[int, str] = {}
    changed = []
    result = ChargeResult()
    for volume in volumes:
        until = min(now, volume.deleted_at) if volume.deleted_at else now
        if until <= volume.charged_until:
            continue
        price, size, created = volume.price_per_gb_month, volume.size_gb, volume.created_at
        seconds_before = billed_seconds(created, volume.charged_until)
        cents_before = storage_cost_in_cents(price, size, seconds_before)
        for day, piece_end in days(volume.charged_until, until):
            seconds_after = billed_seconds(created, piece_end)
            cents_after = storage_cost_in_cents(price, size, seconds_after)
            line = lines[(volume.pk, day)]
            line.project_id = volume.project_id
            line.cents += cents_after - cents_before
            line.machine_seconds += seconds_after - seconds_before
            seconds_before, cents_before = seconds_after, cents_after
        volume.charged_until = until
        volume.charged_amount = cents(cents_before)
        names[volume.pk] = volume.name
        changed.append(volume)
        result.records += 1
        result.project_ids.add(volume.project_id)
    if changed:
        # Volumes are few next to machines: Django's own bulk update is fast enough here.
        Volume.objects.bulk_update(changed, ["charged_until", "charged_amount"])
    result.amount = post_storage_lines(lines, names, now)
    return result


def charge_storage(
    *,
    now: datetime | None = None,
    volume_ids: Iterable[int] | None = None,
    batch_size: int = BATCH_SIZE,
) -> ChargeResult:
    """Charge every volume's storage up to `now` (or its deletion), batch by batch; with
    `volume_ids`, only those (waiting for a meter that holds them). Safe to run twice and on
    several workers at once: a batch another meter holds is skipped, and a volume is only
    charged past its own `charged_until`."""
    now = now or timezone.now()
    queryset = Volume.objects.all()
    if volume_ids is not None:
        queryset = queryset.filter(pk__in=list(volume_ids))
    result = ChargeResult()
    after_pk = 0
    while True:
        with transaction.atomic():
            chargeable = _chargeable_volumes(queryset.filter(pk__gt=after_pk), now)
            if connection.features.has_select_for_update_skip_locked and volume_ids is None:
                chargeable = chargeable.select_for_update(skip_locked=True)
            else:
                chargeable = chargeable.select_for_update()
            batch = list(chargeable.order_by("pk")[:batch_size])
            if batch:
                result.add(_charge_volumes(batch, now))
        if len(batch) < batch_size:
            return result
        after_pk = batch[-1].pk
