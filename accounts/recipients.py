"""Who is told about a project's things (docs/notifications.md, "Who is told"): one rule that
every email and notification path asks, at the moment it sends.

Only the project's members are told, read from the membership rows when the email goes out,
never from who made the thing: a member removed from the project, or a deactivated user, hears
nothing more about it (a cluster's email carries every node's SSH command). The thing's maker
while a member; else the project's owners.
"""

from collections.abc import Iterable

from django.db.models import Q

from accounts.models import Membership

OWNER = Membership.Role.OWNER


def told_about(project_id: int, *, maker_id: int | None) -> list[str]:
    """The emails told about a thing of the project that `maker_id` made (a cluster, a
    webhook): the maker while an active member, else the project's active owners. One query."""
    rows = list(
        Membership.objects.filter(project_id=project_id, user__is_active=True)
        .filter(Q(role=OWNER) | Q(user_id=maker_id))
        .order_by("user_id")
        .values_list("user_id", "role", "user__email")
    )
    maker = [email for user_id, _, email in rows if maker_id is not None and user_id == maker_id]
    return maker or [email for _, role, email in rows if role == OWNER]


def members_among(project_id: int, user_ids: Iterable[int | None]) -> list[str]:
    """The emails of those of `user_ids` who are active members of the project now."""
    wanted = {user_id for user_id in user_ids if user_id is not None}
    if not wanted:
        return []
    return list(
        Membership.objects.filter(project_id=project_id, user_id__in=wanted, user__is_active=True)
        .order_by("user_id")
        .values_list("user__email", flat=True)
    )
