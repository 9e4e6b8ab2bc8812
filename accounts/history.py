"""What accounts tells the audit log (docs/audit.md, "How entries are written"): the audit app
sits above accounts, so accounts cannot call it; it says what happened here and the audit log,
connected at start (audit/apps.py), writes the entry at once, in the caller's transaction.
A failure to write is raised, so the change it records rolls back with it."""

from typing import Any

from django.dispatch import Signal

from accounts.models import Project, User

# Sent with the `note` arguments; audit.log.note is its one receiver.
noted = Signal()


def note(
    *,
    summary: str,
    obj: object = None,
    object_type: str = "",
    object_name: str = "",
    project: Project | None = None,
    changes: dict[str, Any] | None = None,
    outcome: str = "done",
    user: User | None = None,
) -> None:
    """Record `summary` ("revoked API key `ci`") on `obj` in the audit log, now: call it inside
    the transaction of the change it records."""
    noted.send(
        sender=None,
        summary=summary,
        obj=obj,
        object_type=object_type,
        object_name=object_name,
        project=project,
        changes=changes,
        outcome=outcome,
        user=user,
    )


def change(before: object, after: object) -> dict[str, object]:
    """One field's before → after, as the log keeps it (text, or None for nothing)."""
    return {"before": _text(before), "after": _text(after)}


def _text(value: object) -> object:
    if value is None or isinstance(value, bool | int | str | list):
        return value
    return str(value)
