"""A project's channels: who may manage them, add one (its URL checked, its events chosen),
list them with how they fare, remove one, send it a test. The pages, the API and the admin
call these; none re-implements the rules."""

from datetime import datetime
from urllib.parse import urlsplit

from django.db import transaction
from django.db.models import OuterRef, Q, QuerySet, Subquery

import audit
from accounts import permissions
from accounts.models import Project, User
from notifications import addresses, bodies, delivery
from notifications.models import EVENT_TYPES, PING, Attempt, Delivery, Endpoint
from runcrate.errors import Refused

MAX_ENDPOINTS = 20  # per project
# The permission table's action (accounts/permissions.py): owners and managers.
MANAGE = "notifications.manage"


class EndpointRefused(Refused):
    """`invalid_kind`, `invalid_events`, `too_many_endpoints`."""

    STATUS = {"invalid_kind": 422, "invalid_events": 422, "too_many_endpoints": 422}


def require_manage(*, user: User, project: Project | None) -> None:
    """The permission table's refusal (403 `role_forbidden` in the API) for anyone else."""
    permissions.require(user, project, MANAGE)


def check_events(events: object) -> list[str]:
    if (
        not isinstance(events, list)
        or not events
        or not all(isinstance(kind, str) for kind in events)
    ):
        raise EndpointRefused(
            "invalid_events",
            f"events is a list of one or more of {', '.join(EVENT_TYPES)}.",
            field="events",
        )
    unknown = [kind for kind in events if kind not in EVENT_TYPES]
    if unknown:
        raise EndpointRefused(
            "invalid_events",
            f"Unknown event type {', '.join(map(repr, unknown))}: choose from "
            f"{', '.join(EVENT_TYPES)}.",
            field="events",
        )
    return [kind for kind in EVENT_TYPES if kind in events]


def create_endpoint(
    *, project: Project, user: User, url: str, events: object, kind: str = Endpoint.Kind.WEBHOOK
) -> Endpoint:
    """A new endpoint, active; its secret is read from it this once by the caller."""
    if kind not in Endpoint.Kind.values:
        raise EndpointRefused(
            "invalid_kind", f"kind is webhook or slack, not {kind!r}.", field="kind"
        )
    chosen = check_events(events)
    addresses.check_url(url)
    if Endpoint.objects.filter(project=project).count() >= MAX_ENDPOINTS:
        raise EndpointRefused(
            "too_many_endpoints",
            f"A project has at most {MAX_ENDPOINTS} endpoints; remove one first.",
        )
    with transaction.atomic():
        endpoint = Endpoint.objects.create(
            project=project, kind=kind, url=url, events=chosen, created_by=user
        )
        audit.note(
            summary=f"added a {endpoint.get_kind_display()} notification channel to "
            f"{endpoint_host(endpoint)}",
            obj=endpoint,
            object_name=endpoint_host(endpoint),
            changes={"events": audit.change(None, chosen)},
        )
    return endpoint


def endpoint_host(endpoint: Endpoint) -> str:
    """What the audit log names an endpoint by: its URL's host (a Slack URL's path is its
    secret)."""
    return urlsplit(endpoint.url).hostname or endpoint.get_kind_display()


def endpoints_of(project: Project) -> QuerySet[Endpoint]:
    """The project's endpoints, oldest first, each with `last_success_at` and `last_failure_at`:
    its latest attempt answered with a 2xx, and its latest one that was not (another status, a
    timeout, a refused address), None when there was none. One query, however many there are."""
    tries = Attempt.objects.filter(delivery__endpoint=OuterRef("pk")).order_by("-at", "-pk")
    succeeded = Q(status_code__gte=200, status_code__lt=300)
    return (
        Endpoint.objects.filter(project=project)
        .annotate(
            last_success_at=Subquery(tries.filter(succeeded).values("at")[:1]),
            last_failure_at=Subquery(tries.exclude(succeeded).values("at")[:1]),
        )
        .order_by("created_at", "pk")
    )


def remove_endpoint(*, endpoint: Endpoint) -> None:
    """Gone with its log: nothing is sent to it any more."""
    with transaction.atomic():
        audit.note(
            summary=f"removed the {endpoint.get_kind_display()} notification channel to "
            f"{endpoint_host(endpoint)}",
            obj=endpoint,
            object_name=endpoint_host(endpoint),
            changes={"events": audit.change(list(endpoint.events), None)},
        )
        endpoint.delete()


def send_test(*, endpoint: Endpoint, now: datetime) -> Delivery:
    """A `ping` delivery, attempted now (and retried like any other when it fails). A test that
    a switched-off endpoint answers with a 2xx switches it on again: the receiver works."""
    ping = Delivery.objects.create(
        endpoint=endpoint,
        event_type=PING,
        body=bodies.ping_body(endpoint, created=int(now.timestamp())),
        created_at=now,
        next_attempt_at=now,
    )
    outcome = delivery.attempt(ping, now=now)
    if outcome is not None and outcome.delivered and not endpoint.active:
        if Endpoint.objects.filter(pk=endpoint.pk, active=False).update(active=True):
            endpoint.active = True
    elif not endpoint.active:
        # Nothing retries a switched-off endpoint's deliveries: this one ends here.
        Delivery.objects.filter(pk=ping.pk, state=Delivery.State.PENDING).update(
            state=Delivery.State.FAILED
        )
    return ping
