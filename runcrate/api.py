"""The JSON API root: `/api/v1/`, bearer API keys with scopes, one error path.

Success is `{"data": …}` (lists add `"meta"`, built by `list_envelope`/`paginated`); an error is
`{"error": {"code": "snake_case", "message": "a sentence"}}` with a 4xx status. Every refusal in
the product subclasses `runcrate.errors.Refused`; the one handler here renders it, so no
endpoint converts refusals by hand. Every operation declares the scope its key needs
(`auth=needs(Scope.CREATE)`); one that forgets needs a key with every scope and no limits.
"""

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from django.db.models import Exists, OuterRef, QuerySet
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from ninja import Field, NinjaAPI, Schema
from ninja.errors import AuthenticationError, HttpError
from ninja.errors import ValidationError as NinjaValidationError
from ninja.security import HttpBearer

from accounts.models import ApiKey, Membership, hash_api_key
from runcrate.errors import Refused

Scope = ApiKey.Scope

# Writing last_used_at on every call would turn each read into a write; a minute is precise
# enough for "last used" and keeps the hot path read-only.
LAST_USED_PRECISION = timedelta(minutes=1)


class ApiError(Refused):
    """A refusal the API itself makes (a lookup that finds nothing, a forbidden call), with its
    status given; service functions raise their own `Refused` subclasses."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(code, message, status=status)


class KeyNotAllowed(Refused):
    """The key is valid but narrowed: the call needs a scope it lacks (`scope_missing`)."""

    STATUS = {"scope_missing": 403}


def money_str(value: Decimal | None) -> str | None:
    """Money as the API shows it: a decimal string with 2 places."""
    return None if value is None else f"{value:.2f}"


def utc_str(moment: datetime | None) -> str | None:
    """A time as the API shows it: ISO 8601 in UTC, with Z."""
    return None if moment is None else moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


class ErrorDetail(Schema):
    code: str
    message: str


class ErrorOut(Schema):
    """The body of every refusal, for the OpenAPI document."""

    error: ErrorDetail


class ListMeta(Schema):
    """The `meta` of a paginated list."""

    total: int = Field(description="How many objects match, across every page.")
    limit: int
    offset: int


def list_envelope(data: list, **meta: object) -> dict:
    """The one shape of every list: `{"data": [...], "meta": {...}}`."""
    return {"data": data, "meta": meta}


def paginated(
    queryset: QuerySet,
    *,
    limit: int,
    offset: int,
    render: Callable[[Any], Any] | None = None,
    **meta: object,
) -> dict:
    """One page of `queryset` (each row through `render`), with `total`, `limit`, `offset`."""
    rows = list(queryset[offset : offset + limit])
    data = [render(row) for row in rows] if render else rows
    return list_envelope(data, total=queryset.count(), limit=limit, offset=offset, **meta)


def describe_key(key: ApiKey) -> str:
    """What a key may do, for a refusal's message: its scopes and its limits."""
    terms = [f"the scopes {', '.join(key.granted_scopes)}"]
    if key.max_machines_per_cluster is not None:
        terms.append(f"at most {key.max_machines_per_cluster} machines per cluster")
    if key.max_usd_per_hour is not None:
        terms.append(f"at most ${money_str(key.max_usd_per_hour)} per hour")
    return f"The API key '{key.name}' ({key.prefix}…) has " + "; ".join(terms)


class ApiKeyAuth(HttpBearer):
    """A bearer API key that must hold `scope`; with scope None, every scope and no limits
    (what managing keys needs, and what an operation that declares nothing gets)."""

    def __init__(self, scope: str | None) -> None:
        super().__init__()
        self.scope = scope

    def authenticate(self, request: HttpRequest, token: str) -> ApiKey | None:
        if not token.startswith("rc_"):
            return None
        # key_hash is unique: get() spares the ORDER BY that first() would add (the model's
        # ordering), which costs as much as the rest of the lookup on every API call.
        try:
            key = (
                ApiKey.objects.select_related("project", "user")
                # In the same query: a user removed from the project loses its keys at once.
                .annotate(
                    is_member=Exists(
                        Membership.objects.filter(
                            project_id=OuterRef("project_id"), user_id=OuterRef("user_id")
                        )
                    )
                )
                .get(key_hash=hash_api_key(token), revoked_at__isnull=True, user__is_active=True)
            )
        except ApiKey.DoesNotExist:
            return None
        if not key.is_member:
            raise ApiError(
                401,
                "unauthenticated",
                f"The API key '{key.name}' ({key.prefix}…) is {key.user.email}'s, who is no "
                f"longer a member of the project {key.project.name!r}: it no longer opens the "
                "API. Ask an owner of the project to add them again, or use another key.",
            )
        now = timezone.now()
        if key.last_used_at is None or now - key.last_used_at > LAST_USED_PRECISION:
            ApiKey.objects.filter(pk=key.pk).update(last_used_at=now)
        request.user = key.user
        request.project = key.project  # type: ignore[attr-defined]
        self.check(request, key)
        return key

    def check(self, request: HttpRequest, key: ApiKey) -> None:
        call = f"{request.method} {request.path}"
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


api = NinjaAPI(
    title="Runcrate Clusters API",
    version="1",
    urls_namespace="api",
    # An operation that declares no scope fails closed: only a key with every scope and no
    # limits may call it.
    auth=ApiKeyAuth(None),
    docs_url="/docs",
)


def error_response(request: HttpRequest, status: int, code: str, message: str) -> HttpResponse:
    return api.create_response(
        request, {"error": {"code": code, "message": message}}, status=status
    )


def render(request: HttpRequest, schema: type[Schema], body: dict, *, status: int) -> HttpResponse:
    """`body` through `schema` and the API's renderer, as ninja renders what a view returns: for
    an answer that is kept and sent again byte for byte (an idempotent create's replay)."""
    context = {"request": request, "response_status": status}
    data = schema.model_validate(body, context=context).model_dump(context=context)
    return api.create_response(request, data, status=status)


@api.exception_handler(Refused)
def _refused(request: HttpRequest, exc: Refused) -> HttpResponse:
    """The one place a refusal becomes the error envelope, whatever app raised it."""
    return error_response(request, exc.status, exc.code, exc.message)


@api.exception_handler(AuthenticationError)
def _unauthenticated(request: HttpRequest, exc: AuthenticationError) -> HttpResponse:
    return error_response(
        request,
        401,
        "unauthenticated",
        "Send a valid API key as 'Authorization: Bearer rc_live_…'; this one is missing, "
        "unknown or revoked.",
    )


def _describe_validation_error(error: dict[str, Any]) -> str:
    location = [str(part) for part in error.get("loc", ()) if part not in ("body", "query", "path")]
    where = ".".join(location[1:] if location[:1] == ["payload"] else location)
    message = str(error.get("msg", "is invalid"))
    return f"{where}: {message}" if where else message


@api.exception_handler(NinjaValidationError)
def _invalid(request: HttpRequest, exc: NinjaValidationError) -> HttpResponse:
    message = "; ".join(_describe_validation_error(e) for e in exc.errors) or "Invalid request."
    return error_response(request, 422, "invalid_request", message)


@api.exception_handler(HttpError)
def _http_error(request: HttpRequest, exc: HttpError) -> HttpResponse:
    codes = {404: "not_found", 405: "method_not_allowed", 429: "rate_limited"}
    return error_response(
        request, exc.status_code, codes.get(exc.status_code, "bad_request"), str(exc)
    )


def mount_routers() -> None:
    """Attach every app's router. Called once, by the URLconf: were it called here at import,
    an app's api module imported first (it imports ApiError from here) would import itself
    half-initialised."""
    from accounts.api import router as accounts_router
    from billing.api import router as billing_router
    from clusters.api import router as clusters_router
    from offers.api import router as offers_router

    api.add_router("/", offers_router)
    api.add_router("/", accounts_router)
    api.add_router("/", clusters_router)
    api.add_router("/", billing_router)
    from clusters.agent.api import router as agent_router  # nodes' agents, by node token

    api.add_router("/", agent_router)
