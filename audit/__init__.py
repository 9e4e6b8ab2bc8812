"""The audit log (docs/audit.md): one `Entry` per state-changing request, written by
`audit.middleware.AuditMiddleware`, and the system's own actions (`system`).

A view that knows what it changed says so with `audit.record(request, changes=...)`; the
middleware writes the request's one entry after the view, with those changes. Both functions
live in `audit.log`; they are named here too, imported when called, because Django imports this
package before the models are ready.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from django.http import HttpRequest

    from accounts.models import Project


def record(request: "HttpRequest", *, changes: dict[str, Any]) -> None:
    from audit import log

    log.record(request, changes=changes)


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
