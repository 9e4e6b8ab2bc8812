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
from dataclasses import dataclass
from datetime import datetime

from django.db import transaction
from django.db.models import Max, OuterRef, QuerySet, Subquery

from accounts import history, permissions
from accounts.models import ApiKey, Membership, Project, SshKey, User
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


# --- the team page and the API: list, change a role, remove --------------------------------------


def members_of(project: Project) -> QuerySet[Membership]:
    """The project's memberships with `key_last_used`: the newest use of the member's API keys
    in this project (one query for the whole list)."""
    newest = (
        ApiKey.objects.filter(project_id=OuterRef("project_id"), user_id=OuterRef("user_id"))
        .values("user_id")
        .annotate(newest=Max("last_used_at"))
        .values("newest")
    )
    return (
        project.memberships.select_related("user")
        .annotate(key_last_used=Subquery(newest))
        .order_by("user__email")
    )


def last_activity(membership: Membership) -> datetime | None:
    """The later of the member's last login and their keys' last use (`members_of`)."""
    seen = [membership.user.last_login, getattr(membership, "key_last_used", None)]
    return max((moment for moment in seen if moment is not None), default=None)


@dataclass(frozen=True)
class MemberRow:
    """A row of the team page: the membership and when the member was last active."""

    membership: Membership
    last_activity: datetime | None


def rows_of(project: Project) -> list[MemberRow]:
    """The team page's rows, in `members_of`'s order and from its one query."""
    return [MemberRow(m, last_activity(m)) for m in members_of(project)]


def _locked(project: Project, membership: Membership) -> Membership:
    """The membership read again under a lock on the project row (owner counts are decided
    there, so two changes cannot each leave the other the last owner)."""
    Project.objects.select_for_update().filter(pk=project.pk).first()
    return Membership.objects.select_related("user").get(pk=membership.pk, project=project)


def _owners_after(project: Project, *, without: int, plus: Iterable[int] = ()) -> list[int]:
    owners = project.memberships.filter(role=OWNER).exclude(user_id=without)
    return [*owners.values_list("user_id", flat=True), *plus]


def change_role(*, project: Project, by: User, membership: Membership, role: str) -> Membership:
    """Give the member `role`. Managers change developers and managers; only an owner makes or
    unmakes owners; the last owner stays one."""
    if role not in Membership.Role.values:
        raise MembershipRefused(
            "invalid_role",
            f"There is no role {str(role)[:20]!r}: a role is one of "
            f"{', '.join(Membership.Role.values)}.",
        )
    with transaction.atomic():
        membership = _locked(project, membership)
        touches_owner = OWNER in (role, membership.role)
        permissions.require(by, project, "team.make_owner" if touches_owner else "team.change_role")
        if membership.role == role:
            return membership
        if membership.role == OWNER:
            check_keeps_an_owner(
                project, owners_after=_owners_after(project, without=membership.user_id)
            )
        history.note(
            summary=f"changed the role of {membership.user.email} to {role}",
            obj=membership,
            object_name=membership.user.email,
            project=project,
            changes={"role": history.change(membership.role, role)},
        )
        membership.role = role
        membership.save(update_fields=["role"])  # its post_save forgets the member's cached keys
    return membership


def remove_member(*, project: Project, by: User, membership: Membership) -> None:
    """Remove the member (or let a member leave). Their API keys of this project stop at the next
    request (the membership's post_delete forgets them, and a key whose user is no member is
    refused); their sessions no longer reach the project; their SSH keys are removed from it;
    their clusters stay with it."""
    with transaction.atomic():
        membership = _locked(project, membership)
        if membership.user_id != by.pk:
            action = "team.remove_owner" if membership.role == OWNER else "team.remove"
            permissions.require(by, project, action)
        if membership.role == OWNER:
            check_keeps_an_owner(
                project, owners_after=_owners_after(project, without=membership.user_id)
            )
        left = membership.user_id == by.pk
        history.note(
            summary="left the project" if left else f"removed {membership.user.email}",
            obj=membership,
            object_name=membership.user.email,
            project=project,
            changes={"role": history.change(membership.role, None)},
        )
        membership.delete()
        # Their SSH keys go too: no new cluster lets them in. Clusters already running keep
        # the keys they were created with (Cluster.key_holders says whose) until they end.
        SshKey.objects.filter(project=project, created_by_id=membership.user_id).delete()
