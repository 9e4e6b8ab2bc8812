"""Who may do what in a project: one table of actions and the roles allowed each (SPEC §5).

Views, the API, the templates and the admin ask `allowed(role, action)` (or `require`, which
raises the refusal the API answers as 403 `role_forbidden`); no other module lists roles for an
action. A role is read from the membership row on every call (`role_of`), never from a cache or
a key, so an API key acts with its maker's current role: a demoted manager's key is demoted at
the next request.
"""

from collections.abc import Callable
from functools import wraps

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpResponse

from accounts.models import Membership, Project, User
from accounts.projects import require_project
from accounts.requests import ProjectContext, ProjectRequest
from runcrate.errors import Refused

Role = Membership.Role
OWNER, MANAGER, DEVELOPER = Role.OWNER, Role.MANAGER, Role.DEVELOPER
EVERYONE = (OWNER, MANAGER, DEVELOPER)
MANAGERS = (OWNER, MANAGER)

# action -> the roles allowed it, and what the action is in a refusal's sentence.
TABLE: dict[str, tuple[tuple[str, ...], str]] = {
    "team.view": (MANAGERS, "see the team"),
    "team.invite_owner": ((OWNER,), "invite owners"),
    "team.invite_manager": (MANAGERS, "invite members"),
    "team.invite_developer": (MANAGERS, "invite members"),
    "team.change_role": (MANAGERS, "change a member's role"),
    "team.make_owner": ((OWNER,), "make a member an owner"),
    "team.remove": (MANAGERS, "remove members"),
    "team.remove_owner": ((OWNER,), "remove an owner"),
    "billing.view": (MANAGERS, "see billing"),
    "billing.manage": (MANAGERS, "manage billing"),
    "budgets.manage": (MANAGERS, "manage budgets"),
    "project.delete": ((OWNER,), "delete the project"),
    "project.require_two_factor": ((OWNER,), "require two-factor sign-in of every member"),
    "audit.view": (MANAGERS, "see the audit log"),
    "notifications.manage": (MANAGERS, "manage webhooks and Slack channels"),
    "clusters.manage": (EVERYONE, "manage clusters"),
    "volumes.manage": (EVERYONE, "manage volumes"),
    "keys.own": (EVERYONE, "keep their own SSH and API keys"),
    "keys.remove_others": (MANAGERS, "remove another member's SSH key or revoke their API key"),
    "keys.remove_owners": ((OWNER,), "remove an owner's SSH key or revoke their API key"),
}


class PermissionRefused(Refused):
    """The member's role does not allow the action; the message names the roles that do."""

    STATUS = {"role_forbidden": 403}


def roles_for(action: str) -> tuple[str, ...]:
    """The roles allowed `action`; a KeyError for an action not in the table (fail loudly)."""
    return TABLE[action][0]


def abilities_of(role: str) -> list[str]:
    """What `role` may do, in the table's words and order, each said once ("see billing",
    "manage clusters", ...): the members page's legend and the admin's column."""
    return list(dict.fromkeys(what for roles, what in TABLE.values() if role in roles))


def legend() -> list[tuple[str, list[str]]]:
    """Every role's label with what it may do, owner first."""
    return [(str(role.label), abilities_of(role)) for role in Role]


def allowed(role: str | None, action: str) -> bool:
    return role is not None and role in roles_for(action)


def role_of(user: User, project: Project | None) -> str | None:
    """The user's role in the project now (one query), None for a non-member."""
    if project is None or not user.is_authenticated:
        return None
    return (
        Membership.objects.filter(project=project, user=user).values_list("role", flat=True).first()
    )


def request_role(request: ProjectRequest) -> str | None:
    """The user's role in the request's project. A page's request read it with the membership
    its project was found by (`request.project_context`, accounts/projects.py `context_for`):
    no query of its own. An API call's is read from the row (`role_of`)."""
    context = request.project_context
    if context is not None:
        return context.role
    return role_of(request.user, request.project)


def _roles_sentence(roles: tuple[str, ...]) -> str:
    words = [str(role) for role in roles]
    article = "an" if words[0][0] in "aeiou" else "a"
    if len(words) == 1:
        return f"Only {article} {words[0]}"
    return f"Only {article} {', '.join(words[:-1])} or a {words[-1]}"


def refusal(action: str, role: str | None = None) -> PermissionRefused:
    """The refusal of `action`: "Only an owner or a manager may invite members."."""
    roles, what = TABLE[action]
    suffix = f" Your role in this project is {role}." if role else ""
    return PermissionRefused("role_forbidden", f"{_roles_sentence(roles)} may {what}.{suffix}")


def require(user: User, project: Project | None, action: str) -> str:
    """The user's role, or PermissionRefused when it does not allow `action`."""
    role = role_of(user, project)
    if not allowed(role, action):
        raise refusal(action, role)
    assert role is not None
    return role


def invite_action(role: str) -> str:
    """The action inviting (or making) a member with `role` needs."""
    return {
        OWNER: "team.invite_owner",
        MANAGER: "team.invite_manager",
        DEVELOPER: "team.invite_developer",
    }[Role(role)]


def require_page(request: ProjectRequest, action: str) -> Project:
    """The request's project when the member's role allows `action`; else the 403 page with
    the table's sentence (PermissionDenied), or the 404 of a user in no project."""
    project = require_project(request)
    role = request_role(request)
    if not allowed(role, action):
        raise PermissionDenied(refusal(action, role).message)
    return project


def page_requires(action: str) -> Callable:
    """A view's decorator: logged in, acting in a project, and in a role the table allows
    `action`. Anyone else gets the 403 page with the table's sentence ("Only an owner or a
    manager may see billing. Your role in this project is developer."): the page exists, so a
    member is told why it is not theirs, rather than shown a 404. No query of its own: the
    request's project already read the role (`request_role`)."""
    roles_for(action)  # an action not in the table fails at import, not at the first request

    def decorator(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
        @login_required
        @wraps(view)
        def wrapper(request: ProjectRequest, *args, **kwargs) -> HttpResponse:
            require_page(request, action)
            return view(request, *args, **kwargs)

        return wrapper

    return decorator


class Abilities:
    """What the request's member may do, for the templates: `{% if may.billing_view %}` asks
    the table for "billing.view" (the first underscore is the action's dot). The role is the
    one the request's project was found with (`request.project_context`, lazy): a page that
    asks nothing reads nothing; a logged-out request (no context) may do nothing."""

    def __init__(self, context: ProjectContext | None) -> None:
        self._context = context  # maybe the request's lazy context: not read until asked

    @property
    def role(self) -> str | None:
        return self._context.role if self._context is not None else None

    def __getitem__(self, key: str) -> bool:
        action = key.replace("_", ".", 1)
        if action not in TABLE:
            raise KeyError(f"No action {action!r} in the permission table.")
        return allowed(self.role, action)
