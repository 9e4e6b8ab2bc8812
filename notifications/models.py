"""A project's notification channels beyond email, and what was sent to them
(docs/notifications.md).

An `Endpoint` is a signed webhook or a Slack incoming webhook that chose its event types; a
`Delivery` is one event (or a test ping) for one endpoint, with its attempts: the log the API
shows. Deliveries are made from the clusters' event rows by the beat (notifications/outbox.py)
and sent by notifications/delivery.py.
"""

import secrets
from datetime import datetime, timedelta

from django.conf import settings
from django.db import models
from django.utils import timezone
from django.utils.text import Truncator

# Every event type a channel may choose (docs/notifications.md, "Events"); `ping` is the test.
EVENT_TYPES = [
    "cluster.ready",
    "cluster.failed",
    "cluster.degraded",
    "cluster.machine_lost",
    "cluster.stopped",
    "node.unhealthy",
    "node.drained",
    "node.replaced",
    "node.replacement_failed",
    "cluster.idle",
    "billing.low_balance",
    "billing.budget_warning",
]
PING = "ping"

# How long a delivery is retried, and after how long failing an endpoint is switched off.
RETRY_FOR = timedelta(hours=24)
SWITCH_OFF_AFTER = timedelta(days=3)
# The characters of a URL the pages show.
SHORT_URL_LENGTH = 60


def new_secret() -> str:
    """An endpoint's signing key: an HMAC key the receiver holds too, so it is kept as it is
    (unlike a password), and shown to the user once, at create."""
    return "whsec_" + secrets.token_hex(32)


class Endpoint(models.Model):
    class Kind(models.TextChoices):
        WEBHOOK = "webhook", "Signed webhook"
        SLACK = "slack", "Slack"

    project = models.ForeignKey(
        "accounts.Project", on_delete=models.CASCADE, related_name="webhook_endpoints"
    )
    kind = models.CharField(max_length=8, choices=Kind.choices, default=Kind.WEBHOOK)
    url = models.CharField(max_length=2000, help_text="Checked by notifications/addresses.py.")
    events = models.JSONField(default=list, help_text="The event types it receives.")
    secret = models.CharField(max_length=80, default=new_secret, editable=False)
    active = models.BooleanField(default=True)
    failing_since = models.DateTimeField(
        null=True, blank=True, help_text="Since when every attempt failed; null: it works."
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["created_at", "pk"]

    def __str__(self) -> str:
        return f"{self.get_kind_display()} {self.url}"

    def wants(self, event_type: str) -> bool:
        return event_type == PING or event_type in self.events

    @property
    def short_url(self) -> str:
        """The URL as the pages show it, cut with an ellipsis when long: a Slack URL ends in its
        token, its secret, which stays mostly off the screen."""
        return Truncator(self.url).chars(SHORT_URL_LENGTH)

    @property
    def switch_off_at(self) -> datetime | None:
        """When the beat switches this endpoint off if nothing it is sent succeeds before
        (notifications/delivery.py `switch_off_failing`); None while it works, or once off."""
        if not self.active or self.failing_since is None:
            return None
        return self.failing_since + SWITCH_OFF_AFTER


class Delivery(models.Model):
    class State(models.TextChoices):
        PENDING = "pending"  # due at next_attempt_at
        DELIVERED = "delivered"
        FAILED = "failed"  # retried for RETRY_FOR without a 2xx, or its endpoint switched off

    endpoint = models.ForeignKey(Endpoint, on_delete=models.CASCADE, related_name="deliveries")
    event_type = models.CharField(max_length=32)
    event = models.ForeignKey(
        "clusters.Event", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # A billing notice (low balance, 80% of a budget) instead of a cluster's event.
    notice = models.ForeignKey(
        "billing.Notice", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    body = models.JSONField(help_text="What is POSTed, as JSON.")
    state = models.CharField(max_length=10, choices=State.choices, default=State.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(default=timezone.now)
    next_attempt_at = models.DateTimeField(default=timezone.now)
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    last_status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-pk"]
        constraints = [
            # One delivery per (endpoint, event): the beat running twice sends nothing twice.
            models.UniqueConstraint(
                fields=["endpoint", "event"],
                condition=models.Q(event__isnull=False),
                name="delivery_once_per_event",
            ),
            models.UniqueConstraint(
                fields=["endpoint", "notice"],
                condition=models.Q(notice__isnull=False),
                name="delivery_once_per_notice",
            ),
        ]
        indexes = [
            models.Index(
                fields=["next_attempt_at"],
                condition=models.Q(state="pending"),
                name="delivery_due",
            )
        ]

    def __str__(self) -> str:
        return f"{self.event_type} to {self.endpoint_id} ({self.state})"

    @property
    def next_try_at(self) -> datetime | None:
        """When it is attempted next: None once delivered or failed."""
        return self.next_attempt_at if self.state == self.State.PENDING else None


class Attempt(models.Model):
    """One POST of a delivery: the log's lines, so a retried delivery shows each try."""

    delivery = models.ForeignKey(Delivery, on_delete=models.CASCADE, related_name="tries")
    at = models.DateTimeField(default=timezone.now)
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    error = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["at", "pk"]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.status_code or self.error}"
