"""The webhooks API: a project's signed webhooks and Slack channels, a test, and the log.

Listing and the log need the `read` scope, adding an endpoint and sending a test `create`,
removing one `terminate`, as for SSH keys; and every operation a role the permission table lets
manage notifications (owners and managers: 403 `role_forbidden` for a developer's key).
Everything is within the key's project: another project's endpoint is a 404. Refusals are 422
with a code (docs/notifications.md).
"""

from datetime import datetime
from typing import Annotated

from django.db.models import Prefetch
from django.utils import timezone
from ninja import Field, Query, Router, Schema, Status

from accounts.api_auth import Scope, needs
from accounts.requests import ApiRequest
from notifications import endpoints
from notifications.models import EVENT_TYPES, Attempt, Delivery, Endpoint
from runcrate import outages
from runcrate.api import ApiError, ErrorOut, ListMeta, Offset, paginated

router = Router(tags=["webhooks"])

ROLE_RULE = (
    " Owners and managers only (the permission table's `notifications.manage`): a developer's "
    "key gets 403 `role_forbidden`."
)


class WebhookIn(Schema):
    url: str = Field(
        description="https:// (http only in DEBUG); its host must resolve to public addresses.",
        json_schema_extra={"maxLength": 2000},
    )
    events: list[str] = Field(description=f"One or more of {', '.join(EVENT_TYPES)}.")
    kind: str = Field("webhook", description="webhook (signed JSON) or slack (incoming webhook).")


class WebhookOut(Schema):
    id: int
    kind: str
    url: str
    events: list[str]
    active: bool = Field(description="false once switched off after 3 days of failures.")
    failing_since: datetime | None
    created_at: datetime


class WebhookCreatedOut(WebhookOut):
    secret: str | None = Field(
        description="The signing secret of a webhook, shown this once (null for Slack)."
    )


class WebhookEnvelope(Schema):
    data: WebhookCreatedOut


class WebhookList(Schema):
    data: list[WebhookOut]
    meta: ListMeta


class AttemptOut(Schema):
    at: datetime
    status_code: int | None
    error: str


class DeliveryOut(Schema):
    id: int
    type: str
    event_id: int | None
    state: str = Field(description="pending, delivered or failed.")
    attempts: int
    next_attempt_at: datetime | None = Field(description="null unless pending.")
    last_status_code: int | None
    last_error: str
    delivered_at: datetime | None
    created_at: datetime
    tries: list[AttemptOut] = Field(description="Every attempt, oldest first.")
    body: dict


class DeliveryEnvelope(Schema):
    data: DeliveryOut


class DeliveryList(Schema):
    data: list[DeliveryOut]
    meta: ListMeta


def _webhook(endpoint: Endpoint, *, secret: bool = False) -> dict:
    shown = {
        "id": endpoint.pk,
        "kind": endpoint.kind,
        "url": endpoint.url,
        "events": endpoint.events,
        "active": endpoint.active,
        "failing_since": endpoint.failing_since,
        "created_at": endpoint.created_at,
    }
    if secret:
        shown["secret"] = endpoint.secret if endpoint.kind == Endpoint.Kind.WEBHOOK else None
    return shown


def _delivery(delivery: Delivery) -> dict:
    return {
        "id": delivery.pk,
        "type": delivery.event_type,
        "event_id": delivery.event_id,
        "state": delivery.state,
        "attempts": delivery.attempts,
        "next_attempt_at": delivery.next_try_at,
        "last_status_code": delivery.last_status_code,
        "last_error": delivery.last_error,
        "delivered_at": delivery.delivered_at,
        "created_at": delivery.created_at,
        "tries": list(delivery.tries.all()),
        "body": delivery.body,
    }


def _manage(request: ApiRequest) -> None:
    endpoints.require_manage(user=request.user, project=request.project)


def _endpoint(request: ApiRequest, webhook_id: int) -> Endpoint:
    _manage(request)
    endpoint = Endpoint.objects.filter(project=request.project, pk=webhook_id).first()
    if endpoint is None:
        raise ApiError(404, "not_found", f"Your project has no webhook {webhook_id}.")
    return endpoint


@router.get(
    "/webhooks",
    auth=needs(Scope.READ),
    response={200: WebhookList, 401: ErrorOut, 403: ErrorOut},
    summary="List webhooks and Slack channels",
    description="Oldest first; never a secret." + ROLE_RULE,
)
def list_webhooks(
    request: ApiRequest,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    offset: Offset = 0,
) -> dict:
    _manage(request)
    queryset = Endpoint.objects.filter(project=request.project).order_by("created_at", "pk")
    return paginated(queryset, limit=limit, offset=offset, render=_webhook)


@router.post(
    "/webhooks",
    auth=needs(Scope.CREATE),
    response={201: WebhookEnvelope, 401: ErrorOut, 403: ErrorOut, 422: ErrorOut},
    summary="Add a webhook or Slack channel",
    description="`secret` in the answer is shown this once: it signs every delivery "
    "(X-Runcrate-Signature, docs/notifications.md). Refusals, 422: `invalid_url`, "
    "`url_not_https`, `url_private`, `invalid_events`, `invalid_kind`, `too_many_endpoints`."
    + ROLE_RULE,
)
@outages.committing
def create_webhook(request: ApiRequest, payload: WebhookIn) -> Status:
    _manage(request)
    endpoint = endpoints.create_endpoint(
        project=request.project,
        user=request.user,
        url=payload.url,
        events=payload.events,
        kind=payload.kind,
    )
    return Status(201, {"data": _webhook(endpoint, secret=True)})


@router.delete(
    "/webhooks/{webhook_id}",
    auth=needs(Scope.TERMINATE),
    response={204: None, 401: ErrorOut, 403: ErrorOut, 404: ErrorOut},
    summary="Remove a webhook or Slack channel",
    description="Nothing more is sent to it; its delivery log goes with it." + ROLE_RULE,
)
@outages.committing
def delete_webhook(request: ApiRequest, webhook_id: int) -> Status:
    endpoints.remove_endpoint(endpoint=_endpoint(request, webhook_id))
    return Status(204, None)


@router.post(
    "/webhooks/{webhook_id}/test",
    auth=needs(Scope.CREATE),
    response={201: DeliveryEnvelope, 401: ErrorOut, 403: ErrorOut, 404: ErrorOut},
    summary="Send a test (ping) delivery now",
    description="A `ping` delivery, attempted at once; the answer is its log entry (a failure "
    "is retried like any other delivery). On a switched-off endpoint, a 2xx switches it on "
    "again." + ROLE_RULE,
)
def test_webhook(request: ApiRequest, webhook_id: int) -> Status:
    ping = endpoints.send_test(endpoint=_endpoint(request, webhook_id), now=timezone.now())
    ping = Delivery.objects.prefetch_related("tries").get(pk=ping.pk)
    return Status(201, {"data": _delivery(ping)})


@router.get(
    "/webhooks/{webhook_id}/deliveries",
    auth=needs(Scope.READ),
    response={200: DeliveryList, 401: ErrorOut, 403: ErrorOut, 404: ErrorOut},
    summary="The delivery log of a webhook",
    description="Newest first, each with its attempts and their status codes." + ROLE_RULE,
)
def list_deliveries(
    request: ApiRequest,
    webhook_id: int,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    offset: Offset = 0,
) -> dict:
    endpoint = _endpoint(request, webhook_id)
    queryset = (
        Delivery.objects.filter(endpoint=endpoint)
        .prefetch_related(Prefetch("tries", queryset=Attempt.objects.order_by("at", "pk")))
        .order_by("-created_at", "-pk")
    )
    return paginated(queryset, limit=limit, offset=offset, render=_delivery)
