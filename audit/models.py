"""The audit log's rows (docs/audit.md). Append-only: nothing in the product updates or deletes
an entry, and admin shows them read-only. The actor's user and key are kept as foreign keys for
filtering and as text, so an entry of a deleted key or user still says who acted."""

from django.conf import settings
from django.db import models
from django.utils import timezone


class Entry(models.Model):
    class Actor(models.TextChoices):
        USER = "user", "User"
        API_KEY = "api_key", "API key"
        STAFF = "staff", "Staff"
        SYSTEM = "system", "System"

    class Channel(models.TextChoices):
        DASHBOARD = "dashboard", "Dashboard"
        API = "api", "API"
        CLI = "cli", "CLI"
        MCP = "mcp", "MCP"
        ADMIN = "admin", "Admin"
        SYSTEM = "system", "System"

    project = models.ForeignKey(
        "accounts.Project", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    at = models.DateTimeField(default=timezone.now, db_index=True)
    actor = models.CharField(max_length=16, choices=Actor.choices)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    user_email = models.CharField(max_length=254, blank=True)
    api_key = models.ForeignKey(
        "accounts.ApiKey", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    api_key_ref = models.CharField(max_length=64, blank=True)  # the key's id, kept as text
    api_key_name = models.CharField(max_length=200, blank=True)
    channel = models.CharField(max_length=16, choices=Channel.choices)
    ip = models.GenericIPAddressField(null=True, blank=True)
    method = models.CharField(max_length=8, blank=True)
    path = models.CharField(max_length=2000, blank=True)
    action = models.CharField(max_length=200)
    object_type = models.CharField(max_length=64, blank=True)
    object_id = models.CharField(max_length=200, blank=True)
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    changes = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-at", "-pk"]
        indexes = [models.Index(fields=["project", "-at"])]
        verbose_name_plural = "entries"

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.who} {self.action}"

    @property
    def who(self) -> str:
        """The actor as a person reads it: the system, a key's name and its owner, or a user."""
        if self.actor == self.Actor.SYSTEM:
            return "the system"
        if self.actor == self.Actor.API_KEY:
            return f"API key {self.api_key_name!r} ({self.user_email})"
        if self.actor == self.Actor.STAFF:
            return f"staff {self.user_email}"
        return self.user_email
