"""The audit log's rows (docs/audit.md). Append-only: nothing in the product updates or deletes
an entry, and admin shows them read-only. The actor's user and key are kept as foreign keys for
filtering and as text, so an entry of a deleted key or user still says who acted."""

from django.conf import settings
from django.db import models
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString

OBJECT_KINDS = {
    "api_key": "API key",
    "ssh_key": "SSH key",
    "channel": "notification channel",
    "user": "person",
}


def _shown(value: object) -> str:
    """A value of a change as the page shows it: none, yes/no, a list joined."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list):
        return ", ".join(str(item) for item in value) or "none"
    return str(value)


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

    class Outcome(models.TextChoices):
        DONE = "done", "Done"  # written in the change's own transaction: it happened
        REFUSED = "refused", "Refused"  # answered 4xx, or a failed sign-in or code
        FAILED = "failed", "Failed"  # answered 5xx: nothing changed

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
    # The entry in words (docs/audit.md): "created cluster `devs` (4 × H100, Slurm)". Empty on
    # entries written before words were (0001): those read from their action.
    summary = models.CharField(max_length=500, blank=True)
    # The object's name when the action happened, kept: a removed key still says which.
    object_name = models.CharField(max_length=200, blank=True)
    outcome = models.CharField(max_length=16, choices=Outcome.choices, blank=True)

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

    @property
    def words(self) -> str:
        """What happened, in words; an entry from before words (0001) falls back to its action
        and answer."""
        if self.summary:
            return self.summary
        answer = f" ({self.status_code})" if self.status_code else ""
        return f"{self.method} {self.action}{answer}".strip()

    @property
    def words_html(self) -> SafeString:
        """The words for the page: a name between backticks as code, the rest escaped."""
        parts = self.words.split("`")
        if len(parts) % 2 == 0:  # an odd backtick: plain text
            return format_html("{}", self.words)
        template = "".join("<code>{}</code>" if i % 2 else "{}" for i in range(len(parts)))
        return format_html(template, *parts)

    @property
    def object_kind(self) -> str:
        """The object's kind as a person reads it: "API key", "notification channel"."""
        return OBJECT_KINDS.get(self.object_type, self.object_type.replace("_", " "))

    @property
    def object_label(self) -> str:
        """The object's name, kept; an entry from before names were kept says its kind and id."""
        if self.object_name:
            return self.object_name
        return f"{self.object_kind} {self.object_id}".strip()

    @property
    def change_lines(self) -> list[tuple[str, str]]:
        """Each change as (what, "before → after"); a change kept in another shape, as it is."""
        lines = []
        for name, change in (self.changes or {}).items():
            if isinstance(change, dict) and {"before", "after"} <= change.keys():
                text = f"{_shown(change['before'])} → {_shown(change['after'])}"
            else:
                text = str(change)
            lines.append((str(name).replace("_", " "), text))
        return lines

    @property
    def result(self) -> str:
        """done, refused or failed; an entry from before 0002 reads it from its answer."""
        if self.outcome or self.status_code is None:
            return self.outcome
        if self.status_code < 400:
            return self.Outcome.DONE
        return self.Outcome.REFUSED if self.status_code < 500 else self.Outcome.FAILED

    @property
    def where(self) -> str:
        """From where: the channel and the address."""
        channel = self.get_channel_display()
        return f"{channel} from {self.ip}" if self.ip else channel
