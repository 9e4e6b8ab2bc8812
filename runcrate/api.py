"""The JSON API root: `/api/v1/`, bearer API keys, one error shape.

Success is `{"data": …}` (lists add `"meta"`); an error is
`{"error": {"code": "snake_case", "message": "a sentence"}}` with a 4xx status.
"""

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from ninja import Field, NinjaAPI, Schema
from ninja.errors import AuthenticationError, HttpError
from ninja.errors import ValidationError as NinjaValidationError
from ninja.security import HttpBearer

from accounts.models import ApiKey, hash_api_key

# Writing last_used_at on every call would turn each read into a write; a minute is precise
# enough for "last used" and keeps the hot path read-only.
LAST_USED_PRECISION = timedelta(minutes=1)


class ApiError(Exception):
    """A refusal with a stable code, raised by endpoints and service functions alike."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


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


class ApiKeyAuth(HttpBearer):
    def authenticate(self, request: HttpRequest, token: str) -> ApiKey | None:
        if not token.startswith("rc_"):
            return None
        # key_hash is unique: get() spares the ORDER BY that first() would add (the model's
        # ordering), which costs as much as the rest of the lookup on every API call.
        try:
            key = ApiKey.objects.select_related("project", "user").get(
                key_hash=hash_api_key(token), revoked_at__isnull=True, user__is_active=True
            )
        except ApiKey.DoesNotExist:
            return None
        now = timezone.now()
        if key.last_used_at is None or now - key.last_used_at > LAST_USED_PRECISION:
            ApiKey.objects.filter(pk=key.pk).update(last_used_at=now)
        request.user = key.user
        request.project = key.project  # type: ignore[attr-defined]
        return key


api = NinjaAPI(
    title="Runcrate Clusters API",
    version="1",
    urls_namespace="api",
    auth=ApiKeyAuth(),
    docs_url="/docs",
)


def error_response(request: HttpRequest, status: int, code: str, message: str) -> HttpResponse:
    return api.create_response(
        request, {"error": {"code": code, "message": message}}, status=status
    )


@api.exception_handler(ApiError)
def _api_error(request: HttpRequest, exc: ApiError) -> HttpResponse:
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
