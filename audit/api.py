"""`GET /api/v1/audit`: the project's audit log, newest first, paginated like every list, with
the page's filters as query parameters. Owners' and managers' keys only (403 `role_forbidden`)."""

from datetime import datetime
from typing import Annotated

from ninja import Field, Query, Router, Schema

from accounts.api_auth import Scope, needs
from accounts.requests import ApiRequest
from audit.access import require_audit
from audit.filters import EntryFilter, entries, in_utc
from audit.models import Entry
from runcrate.api import ApiError, ErrorOut, ListMeta, Offset, paginated, utc_str

router = Router(tags=["audit"])


class EntryOut(Schema):
    id: int
    at: str = Field(description="When, ISO 8601 in UTC.")
    actor: str = Field(description="user, api_key, staff or system.")
    user: str | None = Field(description="The user's email (an API key's owner).")
    api_key: str | None = Field(description="The API key's name, when a key acted.")
    channel: str = Field(description="dashboard, api, cli, mcp, admin or system.")
    ip: str | None
    method: str
    path: str
    summary: str = Field(
        description='What happened, in words: "created cluster `devs` (4 × 8×H100, Slurm)".'
    )
    outcome: str = Field(
        description="done (written in the change's own transaction), refused or failed."
    )
    action: str = Field(description="The URL's name or the API operation id.")
    object_type: str
    object_id: str
    object_name: str = Field(description="The object's name when it happened, kept.")
    status_code: int | None = Field(
        description="The answer's status; none for an action's own entry, written before it."
    )
    changes: dict = Field(description="Before and after, where the action says.")


class EntryList(Schema):
    data: list[EntryOut]
    meta: ListMeta


@router.get(
    "/audit",
    auth=needs(Scope.READ),
    response={200: EntryList, 401: ErrorOut, 403: ErrorOut, 422: ErrorOut},
    summary="The audit log, newest first",
)
def list_audit(
    request: ApiRequest,
    who: Annotated[str, Query(max_length=254, description="Part of an email or key name.")] = "",
    action: Annotated[
        str, Query(max_length=200, description="Part of the action or of its words.")
    ] = "",
    cluster: Annotated[int | None, Query(ge=1, le=2**62, description="A cluster's id.")] = None,
    since: Annotated[datetime | None, Query(description="From this time on.")] = None,
    until: Annotated[datetime | None, Query(description="Before this time.")] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    offset: Offset = 0,
) -> dict:
    require_audit(user=request.user, project=request.project)
    by = EntryFilter(
        who=who,
        action=action,
        cluster=str(cluster) if cluster else "",
        since=_moment("since", since),
        until=_moment("until", until),
    )
    return paginated(
        entries(project=request.project, by=by), limit=limit, offset=offset, render=_out
    )


def _moment(name: str, moment: datetime | None) -> datetime | None:
    if moment is None:
        return None
    try:
        return in_utc(moment)
    except ValueError as error:
        raise ApiError(422, "invalid_request", f"{name}: {error}") from None


def _out(entry: Entry) -> dict:
    return {
        "id": entry.pk,
        "at": utc_str(entry.at),
        "actor": entry.actor,
        "user": entry.user_email or None,
        "api_key": entry.api_key_name or None,
        "channel": entry.channel,
        "ip": entry.ip,
        "method": entry.method,
        "path": entry.path,
        "summary": entry.words,
        "outcome": entry.result,
        "action": entry.action,
        "object_type": entry.object_type,
        "object_id": entry.object_id,
        "object_name": entry.object_name,
        "status_code": entry.status_code,
        "changes": entry.changes,
    }
