"""Who sees billing: the project's owners and managers; developers deploy clusters but see
neither the balance nor the bills (SPEC §5). The roles are the permission table's
(accounts/permissions.py, "billing.manage")."""

from accounts import permissions
from accounts.models import Membership, Project, User

BILLING_ROLES = permissions.roles_for("billing.manage")


def can_manage_billing(*, user: User, project: Project | None) -> bool:
    if project is None or not user.is_authenticated:
        return False
    return Membership.objects.filter(project=project, user=user, role__in=BILLING_ROLES).exists()
