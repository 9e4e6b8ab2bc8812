"""The clusters' events become deliveries: the beat reads the event rows below (the same
outbox the emails are sent from, clusters/notifications.py), and billing's notices (the
`Notice` row each low-balance or budget email writes), and writes one `Delivery` per
(endpoint, event or notice) that the endpoint chose. The pair is unique in the database and
written with ON CONFLICT DO NOTHING, so running this twice, or on two workers at once,
delivers once.

Only events since the endpoint was made, and within LOOKBACK of now, are read: a new endpoint
gets no history, and a beat that was down for less than LOOKBACK misses nothing.
"""

from dataclasses import dataclass
from datetime import datetime, timedelta

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


def plan_deliveries(*, now: datetime, limit: int = BATCH) -> Planned:
    """Write the deliveries of new events and billing notices for every active endpoint; the
    same queries whatever the number of endpoints, events or deliveries."""
    endpoints = list(Endpoint.objects.filter(active=True).exclude(events=[]))
    if not endpoints:
        return Planned(deliveries=0)
    since = max(now - LOOKBACK, min(endpoint.created_at for endpoint in endpoints))
    new = _event_deliveries(endpoints, since=since, now=now, limit=limit)
    new += _notice_deliveries(endpoints, since=since, now=now, limit=limit)
    Delivery.objects.bulk_create(new, ignore_conflicts=True)
    return Planned(deliveries=len(new))


def _event_deliveries(
    endpoints: list[Endpoint], *, since: datetime, now: datetime, limit: int
) -> list[Delivery]:
    wanted = {kind for endpoint in endpoints for kind in endpoint.events}
    reasons = bodies.reasons_for(wanted)
    if not reasons:
        return []
    events = list(
        Event.objects.filter(
            at__gte=since,
            reason__in=reasons,
            cluster__project_id__in={endpoint.project_id for endpoint in endpoints},
        )
        # An event already planned was planned for every endpoint active then: skip it, so a
        # burst of more than `limit` events is read on by the next runs.
        .exclude(
            pk__in=Delivery.objects.filter(event__isnull=False, created_at__gte=since).values(
                "event_id"
            )
        )
        .select_related("cluster", "node")
        .order_by("at", "pk")[:limit]
    )
    done = set(
        Delivery.objects.filter(event__in=events, endpoint__in=endpoints).values_list(
            "endpoint_id", "event_id"
        )
    )
    return [
        Delivery(
            endpoint=endpoint,
            event=event,
            event_type=kind,
            body=bodies.body_for(endpoint, event, kind),
            created_at=now,
            next_attempt_at=now,
        )
        for event in events
        if (kind := bodies.event_type(event)) is not None
        for endpoint in endpoints
        if endpoint.project_id == event.cluster.project_id
        and event.at >= endpoint.created_at
        and endpoint.wants(kind)
        and (endpoint.pk, event.pk) not in done
    ]


def _notice_deliveries(
    endpoints: list[Endpoint], *, since: datetime, now: datetime, limit: int
) -> list[Delivery]:
    """Billing's notices (billing.Notice rows, written as its emails go out) for the endpoints
    that chose billing.low_balance or billing.budget_warning."""
    kinds = [
        notice_kind
        for notice_kind, kind in bodies.NOTICES.items()
        if any(endpoint.wants(kind) for endpoint in endpoints)
    ]
    if not kinds:
        return []
    notices = list(
        Notice.objects.filter(
            sent_at__gte=since,
            kind__in=kinds,
            project_id__in={endpoint.project_id for endpoint in endpoints},
        )
        .exclude(
            pk__in=Delivery.objects.filter(notice__isnull=False, created_at__gte=since).values(
                "notice_id"
            )
        )
        .select_related("project", "environment")
        .order_by("sent_at", "pk")[:limit]
    )
    return [
        Delivery(
            endpoint=endpoint,
            notice=notice,
            event_type=bodies.NOTICES[Notice.Kind(notice.kind)],
            body=bodies.notice_body(endpoint, notice),
            created_at=now,
            next_attempt_at=now,
        )
        for notice in notices
        for endpoint in endpoints
        if endpoint.project_id == notice.project_id
        and notice.sent_at >= endpoint.created_at
        and endpoint.wants(bodies.NOTICES[Notice.Kind(notice.kind)])
    ]
