"""The clusters' events become deliveries: the beat reads the event rows below (the same
outbox the emails are sent from, clusters/notifications.py) and writes one `Delivery` per
(endpoint, event) that the endpoint chose. The pair is unique in the database and written with
ON CONFLICT DO NOTHING, so running this twice, or on two workers at once, delivers once.

Only events since the endpoint was made, and within LOOKBACK of now, are read: a new endpoint
gets no history, and a beat that was down for less than LOOKBACK misses nothing.
"""

from dataclasses import dataclass
from datetime import datetime, timedelta

from clusters.models import Event
from notifications import bodies
from notifications.models import Delivery, Endpoint

LOOKBACK = timedelta(days=1)
BATCH = 500


@dataclass(frozen=True)
class Planned:
    """What one run of the outbox did."""

    events_read: int
    deliveries: int


def plan_deliveries(*, now: datetime, limit: int = BATCH) -> Planned:
    """Write the deliveries of new events for every active endpoint; four queries whatever the
    number of endpoints, events or deliveries."""
    endpoints = list(Endpoint.objects.filter(active=True).exclude(events=[]))
    if not endpoints:
        return Planned(events_read=0, deliveries=0)
    wanted = {kind for endpoint in endpoints for kind in endpoint.events}
    since = max(now - LOOKBACK, min(endpoint.created_at for endpoint in endpoints))
    events = list(
        Event.objects.filter(
            at__gte=since,
            reason__in=bodies.reasons_for(wanted),
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
    new = [
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
    created = Delivery.objects.bulk_create(new, ignore_conflicts=True)
    return Planned(events_read=len(events), deliveries=len(created))
