"""The accounts API: who the key belongs to, the project's SSH keys, its API keys and members."""

from datetime import datetime
from decimal import Decimal
from typing import Annotated

from django.utils import timezone
from ninja import Field, Query, Router, Schema, Status

from accounts import invitations, keys, members, permissions
from accounts.api_auth import FULL_KEY, Scope, needs
from accounts.models import ApiKey, Membership, SshKey
from accounts.requests import ApiRequest
from runcrate import outages
from runcrate.api import (
    ApiError,
    ErrorOut,
    ListMeta,
    Offset,
    money_str,
    paginated,
)

router = Router(tags=["accounts"])


class ProjectOut(Schema):
    id: int
    name: str
    environments: list[str]


class ApiKeyOut(Schema):
    name: str
    prefix: str
    scopes: list[str] = Field(description="What the key may do: read, create, terminate, billing.")
    max_machines_per_cluster: int | None = Field(description="null: no limit.")
    max_usd_per_hour: str | None = Field(
        description="USD per hour across the live clusters the key created; null: no limit."
    )


class MeOut(Schema):
    email: str
    name: str
    project: ProjectOut
    api_key: ApiKeyOut


class MeEnvelope(Schema):
    data: MeOut


class SshKeyOut(Schema):
    id: int
    name: str
    type: str = Field(description="ssh-ed25519, ssh-rsa, ecdsa-sha2-nistp256, …")
    fingerprint: str = Field(description="As `ssh-keygen -lf` prints it: SHA256:…")
    public_key: str = Field(description="The key in OpenSSH's one-line format.")
    owner: str = Field(
        description="The email of the member who added it; empty for a shared key (staff's, or "
        "a deleted user's). A new cluster gets its creator's own and the shared keys by default."
    )
    created_at: datetime

    @staticmethod
    def resolve_type(obj: SshKey) -> str:
        return obj.key_type

    @staticmethod
    def resolve_owner(obj: SshKey) -> str:
        return obj.created_by.email if obj.created_by_id and obj.created_by else ""


class SshKeyEnvelope(Schema):
    data: SshKeyOut


class SshKeyList(Schema):
    data: list[SshKeyOut]
    meta: ListMeta


class SshKeyIn(Schema):
    name: str = Field("", description="Defaults to the key's comment.", max_length=200)
    public_key: str = Field(description="One OpenSSH public key line: 'TYPE BASE64 [comment]'.")


def _key_terms(key: ApiKey) -> dict:
    return {
        "scopes": key.granted_scopes,
        "max_machines_per_cluster": key.max_machines_per_cluster,
        "max_usd_per_hour": money_str(key.max_usd_per_hour),
    }


@router.get(
    "/me",
    auth=needs(Scope.READ),
    response={200: MeEnvelope, 401: ErrorOut, 403: ErrorOut},
    summary="The key's user and project",
)
def me(request: ApiRequest) -> dict:
    project = request.project
    key = request.auth
    return {
        "data": {
            "email": request.user.email,
            "name": request.user.name,
            "project": {
                "id": project.pk,
                "name": project.name,
                "environments": list(project.environments.values_list("name", flat=True)),
            },
            "api_key": {"name": key.name, "prefix": key.prefix, **_key_terms(key)},
        }
    }


@router.get(
    "/ssh-keys",
    auth=needs(Scope.READ),
    response={200: SshKeyList, 401: ErrorOut, 403: ErrorOut},
    summary="List SSH keys",
)
def list_ssh_keys(
    request: ApiRequest,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    offset: Offset = 0,
) -> dict:
    queryset = SshKey.objects.filter(project=request.project).select_related("created_by")
    return paginated(queryset.order_by("name", "pk"), limit=limit, offset=offset)


@router.post(
    "/ssh-keys",
    auth=needs(Scope.CREATE),
    response={201: SshKeyEnvelope, 401: ErrorOut, 403: ErrorOut, 409: ErrorOut, 422: ErrorOut},
    summary="Add an SSH key",
    description="Refused with 422 `invalid_ssh_key` (the message says what is wrong) or 409 "
    "`ssh_key_exists` when the project already has the key.",
)
@outages.committing
def create_ssh_key(request: ApiRequest, payload: SshKeyIn) -> Status:
    key = keys.add_ssh_key(
        project=request.project,
        user=request.user,
        name=payload.name,
        public_key=payload.public_key,
    )
    return Status(201, {"data": key})


def _ssh_key(request: ApiRequest, key_id: int) -> SshKey:
    found = SshKey.objects.filter(project=request.project, pk=key_id)
    key = found.select_related("created_by").first()
    if key is None:
        raise ApiError(404, "not_found", f"Your project has no SSH key {key_id}.")
    return key


@router.get(
    "/ssh-keys/{key_id}",
    auth=needs(Scope.READ),
    response={200: SshKeyEnvelope, 401: ErrorOut, 403: ErrorOut, 404: ErrorOut},
    summary="One SSH key",
)
def get_ssh_key(request: ApiRequest, key_id: int) -> dict:
    return {"data": _ssh_key(request, key_id)}


@router.delete(
    "/ssh-keys/{key_id}",
    auth=needs(Scope.TERMINATE),
    response={204: None, 401: ErrorOut, 403: ErrorOut, 404: ErrorOut},
    summary="Remove an SSH key",
    description="Clusters already running keep the key on their machines until they end. A "
    "developer removes only their own keys: another member's is 403 `role_forbidden`.",
)
@outages.committing
def delete_ssh_key(request: ApiRequest, key_id: int) -> Status:
    keys.remove_ssh_key(key=_ssh_key(request, key_id), by=request.user)
    return Status(204, None)


# --- API keys ----------------------------------------------------------------------------------

KEYS_RULE = (
    "Needs a key with every scope and no limits (a narrowed key cannot make a wider one, nor "
    "revoke its way around its limits); otherwise 403 `scope_missing`."
)


class ApiKeyDetailOut(Schema):
    id: int
    name: str
    prefix: str = Field(description="The first characters, to tell keys apart.")
    scopes: list[str]
    max_machines_per_cluster: int | None
    max_usd_per_hour: str | None
    created_by: str = Field(description="The email of the user the key acts as.")
    created_at: datetime
    last_used_at: datetime | None
    revoked_at: datetime | None = Field(description="null while the key works.")


class ApiKeyCreatedOut(ApiKeyDetailOut):
    key: str = Field(description="The key itself, shown this once: only its hash is kept.")


class ApiKeyCreatedEnvelope(Schema):
    data: ApiKeyCreatedOut


class ApiKeyList(Schema):
    data: list[ApiKeyDetailOut]
    meta: ListMeta


class ApiKeyIn(Schema):
    # The limits are documented here and refused by accounts.keys (422 invalid_name, …).
    name: str = Field(
        description="What uses the key, so you know which one to revoke.",
        json_schema_extra={"maxLength": keys.NAME_MAX_LENGTH},
    )
    scopes: list[str] | None = Field(
        None, description="Any of read, create, terminate, billing; default: all of them."
    )
    max_machines_per_cluster: int | None = Field(
        None,
        description="At most this many machines in a cluster it creates or grows.",
        json_schema_extra={"minimum": 1, "maximum": keys.MAX_MACHINES_LIMIT},
    )
    max_usd_per_hour: Decimal | None = Field(
        None,
        description='USD as a decimal string, like "10.00": at most this much per hour across '
        "the live clusters the key created.",
    )


def _api_key(key: ApiKey, raw: str | None = None) -> dict:
    shown = {
        "id": key.pk,
        "name": key.name,
        "prefix": key.prefix,
        **_key_terms(key),
        "created_by": key.user.email,
        "created_at": key.created_at,
        "last_used_at": key.last_used_at,
        "revoked_at": key.revoked_at,
    }
    return shown if raw is None else {**shown, "key": raw}


@router.get(
    "/keys",
    auth=FULL_KEY,
    response={200: ApiKeyList, 401: ErrorOut, 403: ErrorOut},
    summary="List the project's API keys",
    description="Every key of the project, working ones first, without their secrets. " + KEYS_RULE,
)
def list_api_keys(
    request: ApiRequest,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    offset: Offset = 0,
) -> dict:
    queryset = keys.project_api_keys(request.project)
    return paginated(queryset, limit=limit, offset=offset, render=_api_key)


@router.post(
    "/keys",
    auth=FULL_KEY,
    response={201: ApiKeyCreatedEnvelope, 401: ErrorOut, 403: ErrorOut, 422: ErrorOut},
    summary="Create an API key",
    description="A key for the caller's project, acting as the caller's user, with the scopes "
    "and limits asked for; `key` in the answer is shown this once. Refusals: 422 "
    "`invalid_name`, `invalid_scope`, `invalid_limit`. " + KEYS_RULE,
)
@outages.committing
def create_api_key(request: ApiRequest, payload: ApiKeyIn) -> Status:
    key, raw = keys.issue_api_key(
        user=request.user,
        project=request.project,
        name=payload.name,
        scopes=payload.scopes,
        max_machines_per_cluster=payload.max_machines_per_cluster,
        max_usd_per_hour=payload.max_usd_per_hour,
    )
    return Status(201, {"data": _api_key(key, raw)})


@router.delete(
    "/keys/{key_id}",
    auth=FULL_KEY,
    response={204: None, 401: ErrorOut, 403: ErrorOut, 404: ErrorOut},
    summary="Revoke an API key",
    description="At once: the next call with it answers 401. Revoking a revoked key changes "
    "nothing (204). Another project's key is a 404. A member revokes their own keys; another "
    "member's needs an owner or a manager, an owner's an owner (403 `role_forbidden`). "
    + KEYS_RULE,
)
@outages.committing
def revoke_api_key(request: ApiRequest, key_id: int) -> Status:
    key = keys.project_api_keys(request.project).filter(pk=key_id).first()
    if key is None:
        raise ApiError(404, "not_found", f"Your project has no API key {key_id}.")
    keys.revoke_api_key(key=key, by=request.user)
    return Status(204, None)


# --- members (docs/api.md, "Members") ---------------------------------------------------------

MEMBERS_RULE = (
    "The key acts with the current role of the member who made it (403 `role_forbidden` "
    "names the role needed: owners and managers manage the team, only owners touch owners). "
    + KEYS_RULE
)


class MemberOut(Schema):
    id: int = Field(description="The membership's id, for PATCH and DELETE.")
    email: str
    name: str
    role: str = Field(description="owner, manager or developer.")
    joined_at: datetime
    last_activity: datetime | None = Field(
        description="The later of the last login and the last use of their API keys here."
    )


class MemberEnvelope(Schema):
    data: MemberOut


class MemberList(Schema):
    data: list[MemberOut]
    meta: ListMeta


class InvitationOut(Schema):
    id: int
    email: str
    role: str
    expires_at: datetime


class InvitationEnvelope(Schema):
    data: InvitationOut


class InviteIn(Schema):
    email: str = Field(max_length=254)
    role: str = Field(description="owner, manager or developer.")


class MemberPatch(Schema):
    role: str = Field(description="owner, manager or developer.")


def _member_out(membership: Membership) -> dict:
    return {
        "id": membership.pk,
        "email": membership.user.email,
        "name": membership.user.name,
        "role": membership.role,
        "joined_at": membership.created_at,
        "last_activity": members.last_activity(membership),
    }


def _membership(request: ApiRequest, member_id: int) -> Membership:
    membership = members.members_of(request.project).filter(pk=member_id).first()
    if membership is None:
        raise ApiError(404, "not_found", f"Your project has no member {member_id}.")
    return membership


@router.get(
    "/members",
    auth=FULL_KEY,
    response={200: MemberList, 401: ErrorOut, 403: ErrorOut},
    summary="List the project's members",
    description=MEMBERS_RULE,
)
def list_members(
    request: ApiRequest,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    offset: Offset = 0,
) -> dict:
    permissions.require(request.user, request.project, "team.view")
    queryset = members.members_of(request.project)
    return paginated(queryset, limit=limit, offset=offset, render=_member_out)


@router.post(
    "/members",
    auth=FULL_KEY,
    response={201: InvitationEnvelope, 401: ErrorOut, 403: ErrorOut, 409: ErrorOut, 422: ErrorOut},
    summary="Invite a member by email",
    description="Emails a single-use link valid 7 days; the invitee joins with `role` once "
    "they log in or sign up with that email. Refusals: 409 `already_member`, 422 "
    "`invalid_email`, `invalid_role`. " + MEMBERS_RULE,
)
@outages.committing
def invite_member(request: ApiRequest, payload: InviteIn) -> Status:
    invitation = invitations.invite(
        project=request.project,
        by=request.user,
        email=payload.email,
        role=payload.role,
        now=timezone.now(),
    )
    return Status(201, {"data": invitation})


@router.patch(
    "/members/{member_id}",
    auth=FULL_KEY,
    response={
        200: MemberEnvelope,
        401: ErrorOut,
        403: ErrorOut,
        404: ErrorOut,
        409: ErrorOut,
        422: ErrorOut,
    },
    summary="Change a member's role",
    description="422 `no_owner` when it would leave the project without an owner. " + MEMBERS_RULE,
)
@outages.committing
def change_member(request: ApiRequest, member_id: int, payload: MemberPatch) -> dict:
    membership = members.change_role(
        project=request.project,
        by=request.user,
        membership=_membership(request, member_id),
        role=payload.role,
    )
    return {"data": _member_out(_membership(request, membership.pk))}


@router.delete(
    "/members/{member_id}",
    auth=FULL_KEY,
    response={204: None, 401: ErrorOut, 403: ErrorOut, 404: ErrorOut, 422: ErrorOut},
    summary="Remove a member",
    description="Their API keys for the project answer 401 from the next call; their clusters "
    "stay. A member may remove themselves (leave); 422 `no_owner` for the last owner. "
    + MEMBERS_RULE,
)
@outages.committing
def remove_member(request: ApiRequest, member_id: int) -> Status:
    members.remove_member(
        project=request.project, by=request.user, membership=_membership(request, member_id)
    )
    return Status(204, None)
