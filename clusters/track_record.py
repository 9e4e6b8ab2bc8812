"""The track record per machine type (issue 13; docs/offers.md, "Track record"): how its
clusters of the last 30 days started, read from the clusters' own events and written to
`offers.TrackRecord`, which the offers read in their own query (offers sits below clusters).

Per cluster created in the window, its events in order decide what it counts as:

- **started**: it became ready at some point (its first `ready` event); its time to ready is
  that event's time less the cluster's creation, retries of a failed install included.
- **failed before ready**: no `ready`, and a failure event (any of `Event.FAILURES` but the
  staff-only `release_failed`) came before any terminate or stop; it counts at that event's
  step (`running`, `agent`, `network`, `install`).
- **withdrawn**: terminated by its user or stopped for balance or budget before it was ready or
  failed. It says nothing about the location, so it is not counted (kept as `withdrawn`).
- **still starting**: none of these yet; not counted until it is decided.

Quoted clusters count like self-serve ones: they run on the same machines.
"""

import math
import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal

from django.db import transaction
from django.utils import timezone

from clusters.models import Cluster, Event
from offers.models import TRACK_RECORD_DAYS, TrackRecord

Reason = Event.Reason

COUNTED_FAILURES = Event.FAILURES - Event.STAFF_ONLY
WITHDRAWALS = {Reason.TERMINATE_REQUESTED, Reason.STOPPED_BALANCE, Reason.STOPPED_BUDGET}
DECIDING = {Reason.READY} | COUNTED_FAILURES | WITHDRAWALS
UNKNOWN_STEP = "unknown"


@dataclass
class _Tally:
    ready_seconds: list[float] = field(default_factory=list)
    failures: Counter = field(default_factory=Counter)
    withdrawn: int = 0
    bandwidths: list[float] = field(default_factory=list)

    @property
    def clusters(self) -> int:
        return len(self.ready_seconds) + sum(self.failures.values())


def _whole_seconds(seconds: float) -> int:
    return int(Decimal(str(seconds)).quantize(Decimal(1), rounding=ROUND_HALF_UP))


def percentile_95(values: list[float]) -> float:
    """The 95th percentile by nearest rank: the smallest value that at least 95% of the values
    are at or under (one of the values, never an interpolation)."""
    ordered = sorted(values)
    return ordered[math.ceil(0.95 * len(ordered)) - 1]


def compute_track_records(*, now: datetime) -> dict[int, _Tally]:
    """Machine type id -> its tally over the `TRACK_RECORD_DAYS` days before `now`, in two
    queries: the deciding events, and the acceptance reports."""
    since = now - timedelta(days=TRACK_RECORD_DAYS)
    in_window = {"cluster__created_at__gte": since, "cluster__created_at__lt": now}
    rows = (
        Event.objects.filter(**in_window, reason__in=DECIDING, at__lte=now)
        .order_by("at", "pk")
        .values_list(
            "cluster_id", "cluster__machine_type_id", "cluster__created_at", "reason", "step", "at"
        )
    )
    tallies: dict[int, _Tally] = defaultdict(_Tally)
    first_ready: dict[int, tuple[int, float]] = {}
    decided_before_ready: dict[int, tuple[int, str, str]] = {}
    for cluster_id, type_id, created_at, reason, step, at in rows:
        if reason == Reason.READY:
            first_ready.setdefault(cluster_id, (type_id, (at - created_at).total_seconds()))
        elif cluster_id not in first_ready:
            decided_before_ready.setdefault(cluster_id, (type_id, reason, step))
    for type_id, seconds in first_ready.values():
        tallies[type_id].ready_seconds.append(seconds)
    for cluster_id, (type_id, reason, step) in decided_before_ready.items():
        if cluster_id in first_ready:
            continue  # it failed an install, then became ready on a retry: it started
        if reason in WITHDRAWALS:
            tallies[type_id].withdrawn += 1
        else:
            tallies[type_id].failures[step or UNKNOWN_STEP] += 1

    reports = Cluster.objects.filter(
        created_at__gte=since, created_at__lt=now, joined_at__isnull=False
    ).values_list("machine_type_id", "acceptance")
    for type_id, report in reports:
        for node in (report or {}).get("nodes", []):
            bandwidth = node.get("bandwidth_mbit")
            if isinstance(bandwidth, int | float) and not isinstance(bandwidth, bool):
                tallies[type_id].bandwidths.append(float(bandwidth))
    return dict(tallies)


def refresh_track_records(*, now: datetime | None = None) -> int:
    """Write every machine type's track record as of `now` and drop those with no cluster in
    the window; returns how many were written. Safe to run twice and concurrently: rows are
    upserted by machine type, and the last writer's answer stands."""
    now = now or timezone.now()
    tallies = compute_track_records(now=now)
    records = [
        TrackRecord(
            machine_type_id=type_id,
            clusters=tally.clusters,
            started=len(tally.ready_seconds),
            withdrawn=tally.withdrawn,
            ready_median_seconds=(
                _whole_seconds(statistics.median(tally.ready_seconds))
                if tally.ready_seconds
                else None
            ),
            ready_p95_seconds=(
                _whole_seconds(percentile_95(tally.ready_seconds)) if tally.ready_seconds else None
            ),
            failures_by_step=dict(sorted(tally.failures.items())),
            bandwidth_median_mbit=(
                statistics.median(tally.bandwidths) if tally.bandwidths else None
            ),
            computed_at=now,
        )
        for type_id, tally in sorted(tallies.items())
    ]
    with transaction.atomic():
        TrackRecord.objects.exclude(machine_type_id__in=list(tallies)).delete()
        TrackRecord.objects.bulk_create(
            records,
            update_conflicts=True,
            unique_fields=["machine_type"],
            update_fields=[
                "clusters",
                "started",
                "withdrawn",
                "ready_median_seconds",
                "ready_p95_seconds",
                "failures_by_step",
                "bandwidth_median_mbit",
                "computed_at",
            ],
        )
    return len(records)
