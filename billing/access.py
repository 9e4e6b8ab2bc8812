"""Who sees billing: the project's owners and managers; developers deploy clusters but see
neither the balance nor the bills (SPEC §5). The roles are the permission table's
(accounts/permissions.py, "billing.manage")."""

from accounts import permissions
from accounts.models import Project, User

BILLING_ROLES = permissions.roles_for("billing.manage")


def can_manage_billing(*, user: User, project: Project | None) -> bool:
    """No query for the request's own project, whose role is read already."""
    return permissions.allowed(permissions.role_of(user, project), "billing.manage")
