"""The clusters' events become deliveries: the beat reads the event rows below (the same
outbox the emails are sent from, clusters/notifications.py), and billing's notices (the
`Notice` row each low-balance or budget email writes), and writes one `Delivery` per
(endpoint, event or notice) that the endpoint chose. The pair is unique in the database and
written with ON CONFLICT DO NOTHING, so running this twice, or on two workers at once,
delivers once.

Only events since the endpoint was made, and within LOOKBACK of now, are read: a new endpoint
gets no history, and a beat that was down for less than LOOKBACK misses nothing.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db.models import QuerySet

from billing.models import Notice
from clusters.models import Event
from notifications import bodies
from notifications.models import Delivery, Endpoint

LOOKBACK = timedelta(days=1)
BATCH = 500


@dataclass(frozen=True)
class Planned:
    """What one run of the outbox did: the deliveries it wrote."""

    deliveries: int


@dataclass(frozen=True)
class Source:
    """One outbox the deliveries come from, and how each of its rows becomes one."""

    field: str  # Delivery's foreign key to the row: "event" or "notice"
    kind: Callable[[Any], str | None]  # the row's event type, None for one never delivered
    project_id: Callable[[Any], int]
    at: Callable[[Any], datetime]
    body: Callable[[Endpoint, Any, str], dict]


EVENTS = Source(
    field="event",
    kind=bodies.event_type,
    project_id=lambda event: event.cluster.project_id,
    at=lambda event: event.at,
    body=bodies.body_for,
)
NOTICES = Source(
    field="notice",
    kind=lambda notice: bodies.NOTICES[Notice.Kind(notice.kind)],
    project_id=lambda notice: notice.project_id,
    at=lambda notice: notice.sent_at,
    body=lambda endpoint, notice, _kind: bodies.notice_body(endpoint, notice),
)


def plan_deliveries(*, now: datetime, limit: int = BATCH) -> Planned:
    """Write the deliveries of new events and billing notices for every active endpoint; the
    same queries whatever the number of endpoints, events or deliveries."""
    endpoints = list(Endpoint.objects.filter(active=True).exclude(events=[]))
    if not endpoints:
        return Planned(deliveries=0)
    since = max(now - LOOKBACK, min(endpoint.created_at for endpoint in endpoints))
    new = _deliveries(endpoints, _new_events(endpoints, since=since, limit=limit), EVENTS, now)
    new += _deliveries(endpoints, _new_notices(endpoints, since=since, limit=limit), NOTICES, now)
    Delivery.objects.bulk_create(new, ignore_conflicts=True)
    return Planned(deliveries=len(new))


def _deliveries(
    endpoints: list[Endpoint], rows: Sequence[Event | Notice], source: Source, now: datetime
) -> list[Delivery]:
    """A delivery of each row to each endpoint of its project that chose its kind, made no
    earlier than the row and not yet given it."""
    if not rows:
        return []
    done = set(
        Delivery.objects.filter(
            **{f"{source.field}__in": rows}, endpoint__in=endpoints
        ).values_list("endpoint_id", f"{source.field}_id")
    )
    return [
        Delivery(
            endpoint=endpoint,
            **{source.field: row},
            event_type=kind,
            body=source.body(endpoint, row, kind),
            created_at=now,
            next_attempt_at=now,
        )
        for row in rows
        if (kind := source.kind(row)) is not None
        for endpoint in endpoints
        if endpoint.project_id == source.project_id(row)
        and source.at(row) >= endpoint.created_at
        and endpoint.wants(kind)
        and (endpoint.pk, row.pk) not in done
    ]


def _planned(field: str, since: datetime) -> QuerySet:
    """The ids of the rows of one outbox already planned. A row planned once was planned for
    every endpoint active then: skipping it lets a burst of more than `limit` rows be read on
    by the next runs."""
    return Delivery.objects.filter(**{f"{field}__isnull": False}, created_at__gte=since).values(
        f"{field}_id"
    )


def _new_events(endpoints: list[Endpoint], *, since: datetime, limit: int) -> list[Event]:
    reasons = bodies.reasons_for({kind for endpoint in endpoints for kind in endpoint.events})
    if not reasons:
        return []
    return list(
        Event.objects.filter(
            at__gte=since,
            reason__in=reasons,
            cluster__project_id__in={endpoint.project_id for endpoint in endpoints},
        )
        .exclude(pk__in=_planned("event", since))
        .select_related("cluster", "node")
        .order_by("at", "pk")[:limit]
    )


def _new_notices(endpoints: list[Endpoint], *, since: datetime, limit: int) -> list[Notice]:
    """Billing's notices (billing.Notice rows, written as its emails go out), when an endpoint
    chose billing.low_balance or billing.budget_warning."""
    kinds = [
        notice_kind
        for notice_kind, kind in bodies.NOTICES.items()
        if any(endpoint.wants(kind) for endpoint in endpoints)
    ]
    if not kinds:
        return []
    return list(
        Notice.objects.filter(
            sent_at__gte=since,
            kind__in=kinds,
            project_id__in={endpoint.project_id for endpoint in endpoints},
        )
        .exclude(pk__in=_planned("notice", since))
        .select_related("project", "environment")
        .order_by("sent_at", "pk")[:limit]
    )
