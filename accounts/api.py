"""The accounts API: who the key belongs to, and the project's SSH keys."""

from datetime import datetime
from typing import Annotated

from django.http import HttpRequest
from ninja import Field, Query, Router, Schema, Status

from accounts import keys
from accounts.models import SshKey
from runcrate.api import ApiError, ErrorOut, ListMeta

router = Router(tags=["accounts"])


class ProjectOut(Schema):
    id: int
    name: str
    environments: list[str]


class ApiKeyOut(Schema):
    name: str
    prefix: str


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
    created_at: datetime

    @staticmethod
    def resolve_type(obj: SshKey) -> str:
        return obj.key_type


class SshKeyEnvelope(Schema):
    data: SshKeyOut


class SshKeyList(Schema):
    data: list[SshKeyOut]
    meta: ListMeta


class SshKeyIn(Schema):
    name: str = Field("", description="Defaults to the key's comment.", max_length=200)
    public_key: str = Field(description="One OpenSSH public key line: 'TYPE BASE64 [comment]'.")


def _refused(refusal: keys.KeyRefused) -> ApiError:
    return ApiError(refusal.status, refusal.code, refusal.message)


@router.get("/me", response={200: MeEnvelope, 401: ErrorOut}, summary="The key's user and project")
def me(request: HttpRequest) -> dict:
    project = request.project  # type: ignore[attr-defined]
    key = request.auth  # type: ignore[attr-defined]
    return {
        "data": {
            "email": request.user.email,
            "name": request.user.name,
            "project": {
                "id": project.pk,
                "name": project.name,
                "environments": list(project.environments.values_list("name", flat=True)),
            },
            "api_key": {"name": key.name, "prefix": key.prefix},
        }
    }


@router.get("/ssh-keys", response={200: SshKeyList, 401: ErrorOut}, summary="List SSH keys")
def list_ssh_keys(
    request: HttpRequest,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    offset: Annotated[int, Query(ge=0)] = 0,
) -> dict:
    queryset = SshKey.objects.filter(project=request.project).order_by("name", "pk")  # type: ignore[attr-defined]
    return {
        "data": list(queryset[offset : offset + limit]),
        "meta": {"total": queryset.count(), "limit": limit, "offset": offset},
    }


@router.post(
    "/ssh-keys",
    response={201: SshKeyEnvelope, 401: ErrorOut, 409: ErrorOut, 422: ErrorOut},
    summary="Add an SSH key",
    description="Refused with 422 `invalid_ssh_key` (the message says what is wrong) or 409 "
    "`ssh_key_exists` when the project already has the key.",
)
def create_ssh_key(request: HttpRequest, payload: SshKeyIn) -> tuple[int, dict]:
    try:
        key = keys.add_ssh_key(
            project=request.project,  # type: ignore[attr-defined]
            user=request.user,
            name=payload.name,
            public_key=payload.public_key,
        )
    except keys.KeyRefused as refusal:
        raise _refused(refusal) from None
    return Status(201, {"data": key})


def _ssh_key(request: HttpRequest, key_id: int) -> SshKey:
    key = SshKey.objects.filter(project=request.project, pk=key_id).first()  # type: ignore[attr-defined]
    if key is None:
        raise ApiError(404, "not_found", f"Your project has no SSH key {key_id}.")
    return key


@router.get(
    "/ssh-keys/{key_id}",
    response={200: SshKeyEnvelope, 401: ErrorOut, 404: ErrorOut},
    summary="One SSH key",
)
def get_ssh_key(request: HttpRequest, key_id: int) -> dict:
    return {"data": _ssh_key(request, key_id)}


@router.delete(
    "/ssh-keys/{key_id}",
    response={204: None, 401: ErrorOut, 404: ErrorOut},
    summary="Remove an SSH key",
    description="Clusters already running keep the key on their machines until they end.",
)
def delete_ssh_key(request: HttpRequest, key_id: int) -> tuple[int, None]:
    keys.remove_ssh_key(key=_ssh_key(request, key_id))
    return Status(204, None)
