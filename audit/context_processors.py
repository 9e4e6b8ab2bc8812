"""Whether the top bar links the audit log: owners and managers only. Lazy, so only a page that
renders the top bar asks (one query)."""

from django.http import HttpRequest
from django.utils.functional import SimpleLazyObject

from audit.access import can_see_audit


def audit_link(request: HttpRequest) -> dict[str, object]:
    def visible() -> bool:
        user = getattr(request, "user", None)
        project = getattr(request, "project", None)
        if user is None or not user.is_authenticated or not project:
            return False
        return can_see_audit(user=user, project=project)

    return {"audit_link": SimpleLazyObject(visible)}
