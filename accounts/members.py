"""Who may leave: a project always keeps an owner, and a user is deleted only once nothing they
started still runs (docs/accounts.md, "Owners and deleting users").

A project whose last owner went would be nobody's: no one could see its clusters, top it up or
stop them, while they kept billing. So a change that would leave a project without an owner is
refused with the reason (the admin's forms and its delete screens call these functions), and
so is deleting a user who still has live clusters; staff end those first, or deactivate the
user instead (no log-in, their API keys refused at once, their projects untouched).

Clusters are the higher layer's rows: they are read here through the project's own relation
(`Project.clusters`), as billing reads them, never by importing the clusters app.
"""

from collections.abc import Iterable

from django.db import transaction
from django.db.models import QuerySet

from accounts.models import Membership, Project, User
from runcrate.errors import Refused

OWNER = Membership.Role.OWNER


class MembershipRefused(Refused):
    STATUS = {"live_clusters": 409, "last_owner": 409, "no_owner": 422}


def _live_clusters(project: Project) -> QuerySet:
    clusters = project.clusters
    return clusters.filter(status__in=clusters.model.LIVE)


def has_another_owner(project: Project, *, than: User | int) -> bool:
    user_id = than if isinstance(than, int) else than.pk
    return project.memberships.filter(role=OWNER).exclude(user_id=user_id).exists()


def reasons_to_keep_user(user: User) -> list[str]:
    """Why `user` may not be deleted now, one sentence each; empty when they may."""
    reasons = []
    for membership in user.memberships.select_related("project").order_by("pk"):
        project = membership.project
        live = list(
            _live_clusters(project).filter(created_by_id=user.pk).values_list("name", flat=True)
        )
        if live:
            reasons.append(
                f"{user.email} still has live clusters in the project {project.name!r}: "
                f"{', '.join(sorted(live))}. Terminate them first; they would keep running "
                "and billing with nobody who started them."
            )
        if membership.role == OWNER and not has_another_owner(project, than=user):
            if project.memberships.exclude(user_id=user.pk).exists():
                reasons.append(
                    f"{user.email} is the only owner of the project {project.name!r}: make "
                    "another member its owner first."
                )
            else:
                reasons.append(
                    f"{user.email} is the only member of the project {project.name!r}, which "
                    "would be left with no owner: add another owner first, or deactivate the "
                    "user instead (they can no longer log in and their API keys stop at once)."
                )
    return reasons


def check_user_deletable(user: User) -> None:
    """Raise MembershipRefused (the reasons in one message) unless `user` may be deleted."""
    reasons = reasons_to_keep_user(user)
    if reasons:
        code = "live_clusters" if "live clusters" in reasons[0] else "last_owner"
        raise MembershipRefused(code, " ".join(reasons))


def delete_users(users: Iterable[User]) -> None:
    """Delete `users`, each checked under a lock on their projects' rows, or none of them."""
    with transaction.atomic():
        for user in users:
            project_ids = user.memberships.values_list("project_id", flat=True)
            list(Project.objects.select_for_update().filter(pk__in=list(project_ids)))
            check_user_deletable(user)
            user.delete()


def check_keeps_an_owner(project: Project, *, owners_after: Iterable[int]) -> None:
    """Raise MembershipRefused unless the project has an owner after a change; `owners_after`
    are the users who will be its owners."""
    if not list(owners_after):
        raise MembershipRefused(
            "no_owner",
            f"The project {project.name!r} needs an owner: keep one member in the owner role "
            "(make another member its owner before removing or changing this one).",
        )
