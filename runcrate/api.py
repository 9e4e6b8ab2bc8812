"""The JSON API toolkit: the `/api/v1/` NinjaAPI instance, the envelope, one error path.

Success is `{"data": …}` (lists add `"meta"`, built by `list_envelope`/`paginated`); an error is
`{"error": {"code": "snake_case", "message": "a sentence"}}` with a 4xx status. Every refusal in
the product subclasses `runcrate.errors.Refused`; the one handler here renders it, so no
endpoint converts refusals by hand. Every operation declares the scope its key needs
(`auth=needs(Scope.CREATE)`, accounts/api_auth.py); one that forgets needs a key with every
scope and no limits, the default the project (config/urls.py) gives as it mounts the routers.
This module imports no app: the kernel's (docs/architecture.md, "Layers").

No answer under /api/v1/ is anything but that JSON (docs/api.md "Every answer is the
envelope"): a bug is a logged 500 `internal_error` without its traceback, our own outage (the
database or the broker not answering, `runcrate/outages.py`) a 503 `service_unavailable` with
`Retry-After`, and what no endpoint answered (no route, a method the path does not take) is
made the envelope by `EnvelopeMiddleware`. Bodies are read by `BodyParser`, which refuses
what no input may hold.
"""

import json
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from decimal import Decimal
from http import HTTPStatus
from typing import Annotated, Any

import orjson
from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse
from ninja import Field, NinjaAPI, Query, Router, Schema
from ninja.errors import AuthenticationError, HttpError
from ninja.errors import ValidationError as NinjaValidationError
from ninja.operation import Operation
from ninja.params.models import BodyModel
from ninja.parser import Parser
from ninja.renderers import JSONRenderer
from ninja.responses import NinjaJSONEncoder
from pydantic import BaseModel, ConfigDict

from runcrate import money, outages
from runcrate.errors import Refused
from runcrate.text import check_json, too_deep

logger = logging.getLogger(__name__)

# Where the API is mounted (config/urls.py): every answer under it is the envelope.
PREFIX = "/api/v1/"


def is_api(request: HttpRequest) -> bool:
    return request.path_info.startswith(PREFIX)


class ApiError(Refused):
    """A refusal the API itself makes (a lookup that finds nothing, a forbidden call), with its
    status given; service functions raise their own `Refused` subclasses."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(code, message, status=status)


def money_str(value: Decimal | None) -> str | None:
    """Money as the API shows it: a decimal string with 2 places (runcrate/money.py `plain`)."""
    return money.plain(value)


def exact_money_str(value: Decimal | None) -> str | None:
    """A rate derived from prices (USD per GPU-hour) as the API shows it: exact, with at least
    2 places and no more than it needs ("2.50", "0.31125"), so a client compares what the
    picker sorts by, not a rounding of it."""
    if value is None:
        return None
    cents = value.quantize(Decimal("0.01"))
    return f"{cents:.2f}" if cents == value else format(value.normalize(), "f")


def utc_str(moment: datetime | None) -> str | None:
    """A time as the API shows it: ISO 8601 in UTC, with Z."""
    return None if moment is None else moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


class RowOut(BaseModel):
    """A part of an answer that repeats with the size of what it describes (a cluster's
    machines, their GPUs, its events), built as a dict by its endpoint: validated by pydantic
    alone. ninja's `Schema` reads each field of each object through a getter in Python (made
    for model instances), which at 64 machines was most of a cluster's answer time; a dict
    needs none of it. The same OpenAPI document either way."""

    model_config = ConfigDict(from_attributes=True)


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


# Rows a list may skip: far more than any project has, and far less than the 2**63 that
# overflows the database's OFFSET.
MAX_OFFSET = 10**9
Offset = Annotated[
    int, Query(ge=0, le=MAX_OFFSET, description=f"Rows to skip: 0 to {MAX_OFFSET:,}.")
]


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
    """One page of `queryset` (each row through `render`), with `total`, `limit`, `offset`.
    Operations declare `offset: Offset`; an offset beyond MAX_OFFSET is refused here too."""
    if not 0 <= offset <= MAX_OFFSET or limit < 1:
        raise ApiError(
            422,
            "invalid_request",
            f"offset is 0 to {MAX_OFFSET:,} and limit at least 1; got {offset} and {limit}.",
        )
    rows = list(queryset[offset : offset + limit])
    data = [render(row) for row in rows] if render else rows
    return list_envelope(data, total=queryset.count(), limit=limit, offset=offset, **meta)


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not a number JSON allows")


class BodyParser(Parser):
    """JSON bodies, refused before any endpoint sees them when they hold what no input may
    (`runcrate.text`: NUL and other control characters, lone surrogates, numbers beyond a
    float, nesting deeper than 32 levels). Ninja answers whatever this raises as 400 "Cannot
    parse request body", with this as its cause: `_http_error` answers the cause."""

    def parse_body(self, request: HttpRequest) -> Any:
        if not request.body.strip():
            # No body is an empty object: an endpoint whose fields are all optional (a
            # replacement's plan_token) is called without one, and a required field is named
            # by the validation's 422, not "Expecting value".
            return {}
        try:
            data = json.loads(request.body, parse_constant=_refuse_constant)
        except RecursionError:  # json's parser recurses once per level
            raise too_deep(name="the body") from None
        except ValueError as error:  # not JSON, not UTF-8, NaN, Infinity
            raise ApiError(400, "invalid_json", f"The body is not valid JSON: {error}.") from None
        check_json(data, name="the body")
        return data


class Renderer(JSONRenderer):
    """ninja's JSON renderer, through orjson: what json.dumps took most of at 64 machines
    (the API detail's 160 kB: issue 38). Dates, times, decimals and what else JSON has no type
    for are written by ninja's own encoder (`NinjaJSONEncoder`, Django's: an ISO date with
    `Z`, a decimal as a string), as before; the text has no spaces between its parts."""

    _default = staticmethod(NinjaJSONEncoder().default)
    _options = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_NON_STR_KEYS

    def render(self, request: HttpRequest, data: Any, *, response_status: int) -> bytes:
        return orjson.dumps(data, default=self._default, option=self._options)


# Folders that arrange an app's code by what each part does (clusters/web, clusters/telemetry):
# an operation's id leaves them out. Ids are public (clients name their methods after them, and
# the audit log keeps them on every entry), so moving a module into such a folder changes none.
ARRANGING_FOLDERS = frozenset({"web", "telemetry"})


class Api(NinjaAPI):
    def get_openapi_operation_id(self, operation: Operation) -> str:
        """`<app>_<module>_<function>`: ninja's own id, without the arranging folders."""
        module = operation.view_func.__module__.split(".")
        kept = [part for part in module if part not in ARRANGING_FOLDERS]
        return "_".join([*kept, operation.view_func.__name__])


api = Api(
    title="Runcrate Clusters API",
    version="1",
    urls_namespace="api",
    # No default auth here: the kernel knows no key. config/urls.py gives every operation that
    # declares none a key with every scope and no limits (it fails closed) as it mounts them.
    docs_url="/docs",
    parser=BodyParser(),
    renderer=Renderer(),
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
    cause = exc.__cause__  # what BodyParser raised, wrapped by ninja in a 400
    if isinstance(cause, Refused):
        return _refused(request, cause)
    codes = {404: "not_found", 405: "method_not_allowed", 429: "rate_limited"}
    return error_response(
        request, exc.status_code, codes.get(exc.status_code, "bad_request"), str(exc)
    )


@api.exception_handler(RequestDataTooBig)
def _too_large(request: HttpRequest, exc: RequestDataTooBig) -> HttpResponse:
    return error_response(request, 413, "body_too_large", _too_large_message())


@api.exception_handler(Http404)
def _not_found(request: HttpRequest, exc: Http404) -> HttpResponse:
    return error_response(request, 404, "not_found", str(exc) or "Nothing is there.")


INTERNAL_ERROR = (
    "The request failed on our side; it was logged, and nothing in it was at fault. It may or "
    "may not have taken effect: read the object back before sending it again."
)


def unavailable_response(request: HttpRequest) -> HttpResponse:
    """Our outage as the envelope: 503 `service_unavailable`, with when to send it again."""
    response = error_response(request, 503, "service_unavailable", outages.UNAVAILABLE_MESSAGE)
    response["Retry-After"] = str(outages.RETRY_AFTER_SECONDS)
    return response


@api.exception_handler(Exception)
def _crashed(request: HttpRequest, exc: Exception) -> HttpResponse:
    """A bug, not a refusal: logged with its traceback, answered without it (DEBUG too). The
    database or the broker not answering is no bug: 503, logged as a warning."""
    if outages.is_outage(exc):
        logger.warning("%s %s: unavailable (%s)", request.method, request.path, exc)
        return unavailable_response(request)
    logger.exception("%s %s failed", request.method, request.path)
    return error_response(request, 500, "internal_error", INTERNAL_ERROR)


def _too_large_message() -> str:
    return (
        f"The body is larger than {settings.DATA_UPLOAD_MAX_MEMORY_SIZE:,} bytes, the most "
        "any call takes."
    )


class EnvelopeMiddleware:
    """Every error answer under /api/v1/ is the envelope, also those no endpoint made: a path
    with no route (404), a method the path does not take (405, ninja's plain text), a request
    Django refused before the API saw it (400, 413), a crash outside an endpoint (500, HTML
    or, with DEBUG, a traceback page) and an outage outside one (the 503 page of
    `runcrate.middleware.server_error`, its `Retry-After` kept). JSON answers pass untouched."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if (
            response.status_code < 400
            or not is_api(request)
            or response.get("Content-Type", "").startswith("application/json")
        ):
            return response
        code, message = self._explain(request, response)
        answer = error_response(request, response.status_code, code, message)
        for header in ("Allow", "Retry-After"):
            if response.has_header(header):
                answer[header] = response[header]
        return answer

    @staticmethod
    def _explain(request: HttpRequest, response: HttpResponse) -> tuple[str, str]:
        status = response.status_code
        call = f"{request.method} {request.path}"
        if status == 404:
            return "not_found", f"There is no {call} in this API: see {PREFIX}docs."
        if status == 405:
            allowed = response.get("Allow", "")
            return "method_not_allowed", f"{call} is not an operation; this path takes {allowed}."
        if status == 413:
            return "body_too_large", _too_large_message()
        if status == 503:
            return "service_unavailable", outages.UNAVAILABLE_MESSAGE
        if status >= 500:
            return "internal_error", INTERNAL_ERROR
        try:
            phrase = HTTPStatus(status).phrase
        except ValueError:
            phrase = "Bad Request"
        return "_".join(phrase.lower().split()), f"{call} was refused: {phrase}."


def declare_error_answers(router: Router) -> None:
    """Add to each operation's OpenAPI answers the envelope for the statuses any operation of
    its kind can give, beside the refusals it declares itself: 422 (a query string with a
    control character, a parameter of the wrong shape), 500 and 503 (our outage) for all; 401
    and 403 behind an auth (an API key); 404 with a path parameter; 400 (not JSON) and 413 (too
    large) with a body."""
    for path_view in router.path_operations.values():
        for operation in path_view.operations:
            statuses = {422, 500, 503}
            if operation.auth_callbacks:
                statuses |= {401, 403}
            if "{" in operation.path:
                statuses.add(404)
            if any(issubclass(model, BodyModel) for model in operation.models):
                statuses |= {400, 413}
            for status in statuses - operation.response_models.keys():
                operation.response_models[status] = operation._create_response_model(ErrorOut)
