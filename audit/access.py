"""Who sees a project's audit log: its owners and managers (SPEC §5), as the permission table
says (accounts/permissions.py, "audit.view")."""

from accounts import permissions
from accounts.models import Project, User

ACTION = "audit.view"


def require_audit(*, user: User, project: Project | None) -> None:
    """The permission table's refusal (403 `role_forbidden` in the API) for anyone else."""
    permissions.require(user, project, ACTION)
