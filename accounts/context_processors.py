"""`may` in every template: what the request's member may do, asked of the permission table
(accounts/permissions.py), so what a role may not do is not shown (`{% if may.billing_view %}`).
Lazy: a page that asks nothing reads nothing, and the request's own project has read the role
already."""

from django.http import HttpRequest

from accounts.permissions import Abilities


def abilities(request: HttpRequest) -> dict[str, object]:
    # `request.project_context` is a lazy object (accounts/middleware.py): read only when asked;
    # a request the middleware did not see has none.
    return {"may": Abilities(getattr(request, "project_context", None))}
