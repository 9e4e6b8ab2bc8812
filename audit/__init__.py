"""The audit log (docs/audit.md): one `Entry` per action, in words.

An action's home writes its entry with `audit.note(summary=..., obj=..., changes=...)` inside
the transaction of its change (accounts, below this app, through `accounts.history.note`), so
the change cannot commit without it; `audit.middleware.AuditMiddleware` writes one after the
view for a state-changing request that noted none (a refusal, a route with no words of its
own). The system's own actions: `system`. A view that knows what it changed on a route with no
note says so with `audit.record(request, changes=...)`. These live in `audit.log`; they are
named here too, imported when called, because Django imports this package before the models
are ready.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from django.http import HttpRequest

    from accounts.models import Project


def record(request: "HttpRequest", *, changes: dict[str, Any]) -> None:
    from audit import log

    log.record(request, changes=changes)


def note(
    *,
    summary: str,
    obj: object = None,
    object_type: str = "",
    object_name: str = "",
    project: "Project | None" = None,
    changes: dict[str, Any] | None = None,
    outcome: str = "done",
    action: str = "",
) -> None:
    from audit import log

    log.note(
        action=action,
        summary=summary,
        obj=obj,
        object_type=object_type,
        object_name=object_name,
        project=project,
        changes=changes,
        outcome=outcome,
    )


def change(before: object, after: object) -> dict[str, object]:
    """One field's before → after, as the log keeps it: accounts.history.change, the one home
    (accounts, below this app, words its own changes with it)."""
    from accounts import history

    return history.change(before, after)


def system(
    *,
    project: "Project | None",
    action: str,
    object_type: str = "",
    object_id: object = "",
    changes: dict[str, Any] | None = None,
) -> None:
    from audit import log

    log.system(
        project=project,
        action=action,
        object_type=object_type,
        object_id=object_id,
        changes=changes,
    )
