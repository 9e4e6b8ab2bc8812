"""Who may do what in a project: one table of actions and the roles allowed each (SPEC §5).

Views, the API, the templates and the admin ask `allowed(role, action)` (or `require`, which
raises the refusal the API answers as 403 `role_forbidden`); no other module lists roles for an
action. A role is read from the membership row on every call (`role_of`), never from a cache or
a key, so an API key acts with its maker's current role: a demoted manager's key is demoted at
the next request.
"""

from accounts.models import Membership, Project, User
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
    "clusters.manage": (EVERYONE, "manage clusters"),
    "volumes.manage": (EVERYONE, "manage volumes"),
    "keys.own": (EVERYONE, "keep their own SSH and API keys"),
}


class PermissionRefused(Refused):
    """The member's role does not allow the action; the message names the roles that do."""

    STATUS = {"role_forbidden": 403}


def roles_for(action: str) -> tuple[str, ...]:
    """The roles allowed `action`; a KeyError for an action not in the table (fail loudly)."""
    return TABLE[action][0]


def allowed(role: str | None, action: str) -> bool:
    return role is not None and role in roles_for(action)


def role_of(user: User, project: Project | None) -> str | None:
    """The user's role in the project now (one query), None for a non-member. The request's
    own project (accounts.projects.project_for) already read it with the membership it was
    found by: no query then."""
    if project is None or not user.is_authenticated:
        return None
    known = getattr(project, "member_role", None)
    if known is not None and known[0] == user.pk:
        return known[1]
    return (
        Membership.objects.filter(project=project, user=user).values_list("role", flat=True).first()
    )


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
