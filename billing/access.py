"""Who sees billing: the project's owners and managers; developers deploy clusters but see
neither the balance nor the bills (SPEC §5). The roles are the permission table's
(accounts/permissions.py, "billing.manage")."""

from accounts import permissions
from accounts.models import Project, User

BILLING_ROLES = permissions.roles_for("billing.manage")


def can_manage_billing(*, user: User, project: Project | None) -> bool:
    """One query: the user's role in the project (`role_manages_billing` for a role at hand)."""
    return role_manages_billing(permissions.role_of(user, project))


def role_manages_billing(role: str | None) -> bool:
    """Whether a member in `role` sees billing: for a role already read, such as a page's
    (`accounts.permissions.request_role`, no query)."""
    return permissions.allowed(role, "billing.manage")
