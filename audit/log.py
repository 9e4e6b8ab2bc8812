"""Writing the audit log (docs/audit.md): who acted, through which channel, on what, in words.

`note` writes an action's entry at once, inside the transaction of the change it records (the
action's own home calls it: `clusters.lifecycle`, `accounts.keys` through `accounts.history`,
`billing.budgets`...), so a change cannot commit without its entry: a failure to write raises
and rolls the change back. It reads who acted from the request being served (`serving`, set by
the middleware), or is the system's when none is. `write_for_request` writes, after the view,
the one entry of a request that noted none (a refusal, a route with no words of its own); a
failure there is logged and never fails the answer.
"""

import contextvars
import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.apps import apps
from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models, transaction
from django.http import HttpRequest, HttpResponse
from django.urls import Resolver404, ResolverMatch, resolve

from accounts.models import ApiKey, Project, User
from audit.models import Entry
from runcrate.api import api
from runcrate.gunicorn_conf import redact

logger = logging.getLogger(__name__)

# Where a view's `audit.record` leaves its before/after for the middleware.
CHANGES_ATTRIBUTE = "_audit_changes"
# What the client distribution sends (cli/runcrate_cli/client.py): "runcrate-cli/1".
USER_AGENT_CHANNELS = {"runcrate-cli/": Entry.Channel.CLI, "runcrate-mcp/": Entry.Channel.MCP}
ADMIN_PREFIX = "/admin/"  # where config/urls.py mounts admin
_PARAMETER = re.compile(r"<(?:\w+:)?(\w+)>")
# The name of the object an admin page acts on, read before the view.
ADMIN_NAME_ATTRIBUTE = "_audit_admin_name"
# The pks of the entries `note` wrote for the request.
NOTED_ATTRIBUTE = "_audit_noted"
_serving: contextvars.ContextVar[HttpRequest | None] = contextvars.ContextVar(
    "audit_serving", default=None
)
# What an object is called in the log, by model (app_label.model_name); others by model name.
OBJECT_TYPES = {
    "accounts.apikey": "api_key",
    "accounts.sshkey": "ssh_key",
    "accounts.membership": "member",
    "accounts.invitation": "invitation",
    "accounts.environment": "environment",
    "accounts.project": "project",
    "notifications.endpoint": "channel",
}


@contextmanager
def serving(request: HttpRequest) -> Iterator[None]:
    """`request` is the one whose actor `note` names, for the block (the middleware's)."""
    token = _serving.set(request)
    try:
        yield
    finally:
        _serving.reset(token)


def is_serving() -> bool:
    return _serving.get() is not None


def note(
    *,
    summary: str,
    obj: object = None,
    object_type: str = "",
    object_name: str = "",
    project: Project | None = None,
    changes: dict[str, Any] | None = None,
    outcome: str = Entry.Outcome.DONE,
    user: User | None = None,
    action: str = "",
) -> Entry:
    """Write the entry of what just happened, now, in the caller's transaction: `summary` in
    words ("revoked API key `ci`"), `obj` the model it happened to (its name kept), `changes`
    before → after. The actor is the request being served (its key, its user, staff in admin)
    or `user` where the request has none yet (a sign-in); with neither, the system, whose
    `action` names what it did (`clusters:stop_balance`). Raises
    when it cannot write: the change it records must not commit without it."""
    request = _serving.get()
    kind, object_id, name, owner = _object_fields(obj)
    if project is None and owner is None and request is not None:
        owner = _project_of(request, key=_key_of(request))
    fields: dict[str, Any] = {
        "project": project or owner,
        "summary": summary[:500],
        "object_type": object_type or kind,
        "object_id": object_id,
        "object_name": (object_name or name)[:200],
        "changes": changes or {},
        "outcome": outcome,
    }
    fields.update(_actor_fields(request, user=user, project=fields["project"]))
    fields["action"] = fields["action"] or action
    entry = Entry.objects.create(**fields)
    if request is not None:
        setattr(request, NOTED_ATTRIBUTE, [*getattr(request, NOTED_ATTRIBUTE, []), entry.pk])
    return entry


def _object_fields(obj: object) -> tuple[str, str, str, Project | None]:
    """The object's type, id, name and project, as the log keeps them."""
    if not isinstance(obj, models.Model):
        return "", "", "", None
    meta = obj._meta
    kind = OBJECT_TYPES.get(f"{meta.app_label}.{meta.model_name}", meta.model_name or "")
    name = getattr(obj, "name", "") or getattr(obj, "email", "") or ""
    if isinstance(obj, Project):
        return kind, str(obj.pk), str(name), obj
    # An environment is named by its name in its URLs (`environments/<name>/`) and entries.
    object_id = str(name) if kind == "environment" else str(obj.pk)
    project_id = getattr(obj, "project_id", None)
    project = getattr(obj, "project", None) if project_id else None
    return kind, object_id, str(name), project if isinstance(project, Project) else None


def _actor_fields(
    request: HttpRequest | None, *, user: User | None, project: Project | None
) -> dict[str, Any]:
    if request is None and user is None:
        return {"actor": Entry.Actor.SYSTEM, "channel": Entry.Channel.SYSTEM, "action": ""}
    key = _key_of(request) if request is not None else None
    signed_in = getattr(request, "user", None)
    if user is None:
        user = key.user if key else signed_in if isinstance(signed_in, User) else None
    if request is None:
        return _who(actor=Entry.Actor.USER, channel=Entry.Channel.SYSTEM, user=user, key=None)
    match = request.resolver_match or _resolve(request)
    is_admin = is_admin_path(request)
    actor = Entry.Actor.API_KEY if key else Entry.Actor.STAFF if is_admin else Entry.Actor.USER
    return {
        **_who(
            actor=actor,
            channel=channel_of(request, key=key, is_admin=is_admin),
            user=user,
            key=key,
        ),
        "ip": client_ip(request),
        "method": request.method or "",
        "path": redact(request.path)[:2000],
        "action": action_of(request, match)[:200],
    }


def _key_of(request: HttpRequest) -> ApiKey | None:
    key = getattr(request, "auth", None)
    return key if isinstance(key, ApiKey) else None


def _who(*, actor: str, channel: str, user: User | None, key: ApiKey | None) -> dict[str, Any]:
    return {
        "actor": actor,
        "channel": channel,
        "user": user,
        "user_email": user.email if user else "",
        "api_key": key,
        "api_key_ref": str(key.pk) if key else "",
        "api_key_name": key.name if key else "",
    }


def _resolve(request: HttpRequest) -> ResolverMatch | None:
    try:
        return resolve(request.path_info)
    except Resolver404:
        return None


def noted(request: HttpRequest) -> list[int]:
    """The pks of the entries `note` wrote while serving `request`."""
    return list(getattr(request, NOTED_ATTRIBUTE, []))


def humanized(action: str) -> str:
    """An action with no words of its own, as words: `clusters:run_network_test` is "run
    network test", `admin:clusters_cluster_change` "changed cluster in admin"."""
    name = action.rsplit(":", 1)[-1]
    if action.startswith("admin:"):
        for suffix, verb in (("_change", "changed"), ("_add", "added"), ("_delete", "deleted")):
            if name.endswith(suffix):
                model = name.removesuffix(suffix).split("_", 1)[-1]
                return f"{verb} {model.replace('_', ' ')} in admin"
        return f"{name.replace('_', ' ')} in admin"
    for prefix in ("clusters_api_", "accounts_api_", "billing_api_", "notifications_api_"):
        name = name.removeprefix(prefix)
    return name.replace("_", " ")


def record(request: HttpRequest, *, changes: dict[str, Any]) -> None:
    """Say what the request changed (`{"monthly_budget": {"before": "500.00", "after":
    "50.00"}}`): the middleware writes it with the request's one entry."""
    setattr(request, CHANGES_ATTRIBUTE, {**getattr(request, CHANGES_ATTRIBUTE, {}), **changes})


def system(
    *,
    project: Project | None,
    action: str,
    object_type: str = "",
    object_id: object = "",
    changes: dict[str, Any] | None = None,
) -> Entry | None:
    """An action of the system itself (no person): `cluster.stopped_balance` on a cluster."""
    return _write(
        project=project,
        actor=Entry.Actor.SYSTEM,
        channel=Entry.Channel.SYSTEM,
        action=action,
        object_type=object_type,
        object_id=str(object_id),
        changes=changes or {},
    )


def write_for_request(
    request: HttpRequest,
    response: HttpResponse,
    *,
    user: User | None,
    admin_project: Project | None = None,
) -> Entry | None:
    """The request's one entry, from what its view left on it; `user` is who was signed in
    before the view (a logout ends the session the view ran in), `admin_project` the project of
    the object an admin page acts on, read before the view."""
    key = getattr(request, "auth", None)
    key = key if isinstance(key, ApiKey) else None
    if key is not None:
        user = key.user
    if user is None:
        return None
    match = request.resolver_match
    action = action_of(request, match)
    object_type, object_id = object_of(match)
    is_admin = match is not None and match.namespace == "admin"
    return _write(
        project=admin_project if is_admin else _project_of(request, key=key),
        actor=(Entry.Actor.API_KEY if key else Entry.Actor.STAFF if is_admin else Entry.Actor.USER),
        channel=channel_of(request, key=key, is_admin=is_admin),
        user=user,
        api_key=key,
        ip=client_ip(request),
        method=request.method or "",
        path=redact(request.path)[:2000],  # an invitation's token is no history
        action=action,
        object_type=object_type,
        object_id=object_id,
        object_name=getattr(request, ADMIN_NAME_ATTRIBUTE, "")[:200] if is_admin else "",
        status_code=response.status_code,
        changes=getattr(request, CHANGES_ATTRIBUTE, {}),
        summary=humanized(action)[:500],
        outcome=_outcome(response.status_code),
    )


def _outcome(status_code: int) -> str:
    if status_code < 400:
        return Entry.Outcome.DONE
    return Entry.Outcome.REFUSED if status_code < 500 else Entry.Outcome.FAILED


def action_of(request: HttpRequest, match: ResolverMatch | None) -> str:
    """The URL pattern's name ("clusters:terminate"), or for the API the operation id of the
    method called ("clusters_api_terminate_cluster"): an API path names every method's
    operations alike."""
    if match is None:
        return request.path[:200]
    if match.namespace == "api" and match.route:
        path = "/" + _PARAMETER.sub(r"{\1}", match.route)
        operations = _operation_ids().get(path, {})
        return operations.get((request.method or "").lower(), match.view_name)
    return match.view_name


def object_of(match: ResolverMatch | None) -> tuple[str, str]:
    """The object the URL names: its type from the collection before the first parameter
    (`clusters/<int:pk>/` a cluster) or from the parameter's own name (`<cluster_id>`)."""
    if match is None or not match.kwargs:
        return "", ""
    segments = match.route.split("/")
    for index, segment in enumerate(segments):
        found = _PARAMETER.search(segment)
        if found is None:
            continue
        name = found.group(1)
        value = str(match.kwargs.get(name, ""))[:200]
        if name.endswith("_id") and name != "object_id":
            return name.removesuffix("_id"), value
        collection = segments[index - 1] if index else ""
        return collection.removesuffix("s")[:64], value
    return "", ""


def channel_of(request: HttpRequest, *, key: ApiKey | None, is_admin: bool) -> str:
    if is_admin:
        return Entry.Channel.ADMIN
    agent = request.headers.get("User-Agent", "")
    for prefix, channel in USER_AGENT_CHANNELS.items():
        if agent.startswith(prefix):
            return channel
    return Entry.Channel.API if key else Entry.Channel.DASHBOARD


def client_ip(request: HttpRequest) -> str | None:
    """REMOTE_ADDR, or behind the proxy the project trusts (RUNCRATE_CLIENT_IP_HEADER, as the
    login throttle reads it) the last address that proxy added."""
    raw = request.META.get("REMOTE_ADDR", "")
    header = settings.RUNCRATE_CLIENT_IP_HEADER
    if header:
        forwarded = request.META.get("HTTP_" + header.upper().replace("-", "_"), "")
        raw = forwarded.split(",")[-1].strip() or raw
    try:
        return models.GenericIPAddressField().to_python(raw) or None
    except Exception:
        return None


def _project_of(request: HttpRequest, *, key: ApiKey | None) -> Project | None:
    if key is not None:
        return key.project
    project = getattr(request, "project", None)
    return project if project else None  # a user in no project has a falsy lazy project


def is_admin_path(request: HttpRequest) -> bool:
    return request.path_info.startswith(ADMIN_PREFIX)


def admin_project(request: HttpRequest) -> Project | None:
    """The project of the object an admin page acts on (`admin:clusters_cluster_change`), so
    the project's owners see staff's actions on it; None for a page that names no object."""
    try:
        match = resolve(request.path_info)
    except Resolver404:
        return None
    if "object_id" not in match.kwargs:
        return None
    for model in apps.get_models():
        label = f"{model._meta.app_label}_{model._meta.model_name}_"
        if match.url_name and match.url_name.startswith(label):
            try:
                row = model._default_manager.filter(pk=match.kwargs["object_id"]).first()
            except (ValueError, ValidationError):  # a pk admin itself will answer 404 for
                return None
            # Its name as it was, kept with the entry (a delete leaves none to read after).
            setattr(request, ADMIN_NAME_ATTRIBUTE, str(_object_fields(row)[2] or row or ""))
            if isinstance(row, Project):
                return row
            project_id = getattr(row, "project_id", None)
            return Project.objects.filter(pk=project_id).first() if project_id else None
    return None


_OPERATIONS: dict[str, dict[str, str]] = {}


def _operation_ids() -> dict[str, dict[str, str]]:
    """Path → method → operation id, from the API's own schema, read once."""
    if not _OPERATIONS:
        schema = api.get_openapi_schema()
        for path, operations in schema["paths"].items():
            _OPERATIONS[path] = {
                method: operation["operationId"] for method, operation in operations.items()
            }
    return _OPERATIONS


def _write(
    *,
    project: Project | None,
    actor: str,
    channel: str,
    action: str,
    user: User | None = None,
    api_key: ApiKey | None = None,
    **fields: Any,
) -> Entry | None:
    try:
        # A savepoint: a failed write must not break the transaction of what it records.
        with transaction.atomic():
            return Entry.objects.create(
                project=project,
                actor=actor,
                channel=channel,
                action=action[:200],
                user=user,
                user_email=user.email if user else "",
                api_key=api_key,
                api_key_ref=str(api_key.pk) if api_key else "",
                api_key_name=api_key.name if api_key else "",
                **fields,
            )
    except Exception:
        logger.exception("could not write the audit entry for %s", action)
        return None
