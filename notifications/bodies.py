"""What each channel is sent for an event: a signed webhook's JSON, or a Slack message
(docs/notifications.md, "Bodies"). Which event type an event row is, is decided here once, from
the event's own rule (`Event.notification`) and its stop reasons."""

from django.conf import settings
from django.urls import reverse

from billing.models import Notice
from clusters.models import Cluster, Event
from notifications.models import PING, Endpoint
from runcrate.money import usd

# The email an event asks for (Event.notification) and the event type it is on a channel.
BY_NOTIFICATION = {
    "ready": "cluster.ready",
    "failed": "cluster.failed",
    "degraded": "cluster.degraded",
    "lost": "cluster.machine_lost",
    "unhealthy": "node.unhealthy",
    "idle": "cluster.idle",
    "replaced": "node.replaced",
    "replacement_failed": "node.replacement_failed",
}
STOPS = {Event.Reason.STOPPED_BALANCE, Event.Reason.STOPPED_BUDGET}

TITLES = {
    "cluster.ready": "is ready",
    "cluster.failed": "failed",
    "cluster.degraded": "is degraded",
    "cluster.machine_lost": "lost a machine",
    "cluster.stopped": "was stopped",
    "node.unhealthy": "has an unhealthy node",
    "cluster.idle": "has idle GPUs",
    "node.drained": "took a node out of scheduling",
    "node.replaced": "replaced a node",
    "node.replacement_failed": "could not replace a node",
}
NOTICES = {
    Notice.Kind.LOW_BALANCE: "billing.low_balance",
    Notice.Kind.BUDGET_WARNING: "billing.budget_warning",
}


def event_type(event: Event) -> str | None:
    """The channel event type of `event`, or None when channels are not told of it."""
    if event.reason in STOPS:
        return "cluster.stopped"
    if event.reason == Event.Reason.NODE_DRAINED:
        return "node.drained"  # told to channels only: the unhealthy email says it
    notification = event.notification
    return BY_NOTIFICATION.get(notification) if notification else None


def reasons_for(event_types: set[str]) -> list[str]:
    """The event reasons that are one of `event_types`, as `event_type` decides."""
    return [
        reason for reason in Event.Reason.values if event_type(Event(reason=reason)) in event_types
    ]


def cluster_url(cluster: Cluster) -> str:
    return settings.SITE_URL + reverse("clusters:detail", args=[cluster.pk])


def webhook_body(event: Event, kind: str) -> dict:
    cluster = event.cluster
    return {
        "id": f"evt_{event.pk}",
        "type": kind,
        "created": int(event.at.timestamp()),
        "data": {
            "cluster": {
                "id": cluster.pk,
                "name": cluster.name,
                "status": cluster.status,
                "size": cluster.size,
                "url": cluster_url(cluster),
            },
            "node": event.node.name if event.node else None,
            "reason": event.reason,
            "message": event.message,
        },
    }


def slack_body(event: Event, kind: str) -> dict:
    """A message in Slack's mrkdwn: the cluster linked, what happened, the event's words."""
    cluster = event.cluster
    link = f"<{cluster_url(cluster)}|{_slack_escape(cluster.name)}>"
    return {"text": f"*Cluster {link} {TITLES[kind]}*\n{_slack_escape(event.message)}"}


def _slack_escape(text: str) -> str:
    """Slack's three control characters, escaped as its docs ask."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def body_for(endpoint: Endpoint, event: Event, kind: str) -> dict:
    if endpoint.kind == Endpoint.Kind.SLACK:
        return slack_body(event, kind)
    return webhook_body(event, kind)


def notice_message(notice: Notice) -> str:
    """The billing email's news in a sentence (billing/limits.py sends the email itself)."""
    if notice.kind == Notice.Kind.LOW_BALANCE:
        return (
            f"The balance of {notice.project.name} covers less than an hour of what it runs; "
            "at zero its clusters are stopped."
        )
    environment = notice.environment
    name = environment.name if environment else "an"
    budget = usd(environment.monthly_budget) if environment else "its budget"
    return (
        f"The {name} environment of {notice.project.name} has spent 80% of its monthly budget "
        f"of {budget}; at the budget its clusters are stopped."
    )


def notice_body(endpoint: Endpoint, notice: Notice) -> dict:
    kind = NOTICES[Notice.Kind(notice.kind)]
    message = notice_message(notice)
    if endpoint.kind == Endpoint.Kind.SLACK:
        title = "Low balance" if notice.kind == Notice.Kind.LOW_BALANCE else "Budget at 80%"
        billing = f"<{settings.SITE_URL}/billing/|{_slack_escape(notice.project.name)}>"
        return {"text": f"*{title}: {billing}*\n{_slack_escape(message)}"}
    return {
        "id": f"ntc_{notice.pk}",
        "type": kind,
        "created": int(notice.sent_at.timestamp()),
        "data": {
            "project": {"id": notice.project_id, "name": notice.project.name},
            "environment": notice.environment.name if notice.environment else None,
            "message": message,
        },
    }


def ping_body(endpoint: Endpoint, *, created: int) -> dict:
    """The test delivery (*Send test*): no event, a message that says so."""
    message = "A test from Runcrate: this endpoint receives the project's notifications."
    if endpoint.kind == Endpoint.Kind.SLACK:
        return {"text": f"*Runcrate test*\n{message}"}
    return {
        "id": None,
        "type": PING,
        "created": created,
        "data": {"endpoint": {"id": endpoint.pk, "events": endpoint.events}, "message": message},
    }
