"""The API's bearer API keys with scopes: `auth=needs(Scope.CREATE)` on an operation, `FULL_KEY`
on those that manage keys (every scope and no limits, so a narrowed key cannot make a wider one).

The kernel's API toolkit (`runcrate.api`) knows no key: the project (config/urls.py) makes a key
with every scope the default of every operation as it mounts the routers, so one that forgets
its scope fails closed.
"""

from typing import cast

from django.http import HttpRequest
from django.utils import timezone
from ninja.security import HttpBearer

from accounts.keys import find_api_key
from accounts.models import ApiKey
from accounts.requests import ApiRequest
from runcrate import money
from runcrate.api import ApiError
from runcrate.errors import Refused

Scope = ApiKey.Scope


class KeyNotAllowed(Refused):
    """The key is valid but narrowed: the call needs a scope it lacks (`scope_missing`)."""

    STATUS = {"scope_missing": 403}


def describe_key(key: ApiKey) -> str:
    """What a key may do, for a refusal's message: its scopes and its limits."""
    terms = [f"the scopes {', '.join(key.granted_scopes)}"]
    if key.max_machines_per_cluster is not None:
        terms.append(f"at most {key.max_machines_per_cluster} machines per cluster")
    if key.max_usd_per_hour is not None:
        terms.append(f"at most {money.usd(key.max_usd_per_hour)} per hour")
    return f"The API key '{key.name}' ({key.prefix}…) has " + "; ".join(terms)


class ApiKeyAuth(HttpBearer):
    """A bearer API key that must hold `scope`; with scope None, every scope and no limits
    (what managing keys needs, and what an operation that declares nothing gets)."""

    def __init__(self, scope: str | None, *, call: str | None = None) -> None:
        super().__init__()
        self.scope = scope
        self.call = call  # what a refusal names as the call: the request's own by default

    def authenticate(self, request: HttpRequest, token: str) -> ApiKey | None:
        if not token.startswith("rc_"):
            return None
        key = find_api_key(token, now=timezone.now())
        if key is None:
            return None
        if not key.is_member:
            raise ApiError(
                401,
                "unauthenticated",
                f"The API key '{key.name}' ({key.prefix}…) is {key.user.email}'s, who is no "
                f"longer a member of the project {key.project.name!r}: it no longer opens the "
                "API. Ask an owner of the project to add them again, or use another key.",
            )
        request.user = key.user
        # What ApiRequest declares (accounts/requests.py); Django Ninja then sets `auth`. No
        # page's context: a session's, if the call came with one, is another user's project.
        typed = cast(ApiRequest, request)
        typed.project = key.project
        typed.project_context = None
        self.check(request, key)
        return key

    def check(self, request: HttpRequest, key: ApiKey) -> None:
        call = self.call or f"{request.method} {request.path}"
        if self.scope is None:
            if not key.is_unrestricted:
                raise KeyNotAllowed(
                    "scope_missing",
                    f"{call} needs a key with every scope ({', '.join(Scope.values)}) and no "
                    f"limits, so that a narrowed key cannot make a wider one. "
                    f"{describe_key(key)}.",
                )
        elif not key.has_scope(self.scope):
            raise KeyNotAllowed(
                "scope_missing",
                f"{call} needs the '{self.scope}' scope. {describe_key(key)}.",
            )


_SCOPED = {scope: ApiKeyAuth(scope) for scope in Scope.values}
FULL_KEY = ApiKeyAuth(None)


def needs(scope: str) -> ApiKeyAuth:
    """The auth of an operation that needs `scope` (`read`, `create`, `terminate`, `billing`)."""
    return _SCOPED[scope]


def needs_as(scope: str, call: str) -> ApiKeyAuth:
    """`needs(scope)` for an operation that answers as another would (`call`, such as "POST
    /api/v1/clusters" for the create's plan): its refusal names that call, word for word."""
    return ApiKeyAuth(scope, call=call)
