"""Inviting people into a project by email (docs/accounts.md, "Members and invitations").

The link carries a random token; the table keeps only its SHA-256 (as for API keys), so a
leaked table opens nothing and an altered link matches no row. A link is single use (accepting
stamps `accepted_at`) and valid for `VALID_FOR`. Who may invite which role is the permission
table's (accounts/permissions.py): an owner any role, a manager developers and managers.
"""

import hashlib
import secrets
from datetime import datetime, timedelta
from urllib.parse import urlsplit

from django.core.exceptions import ValidationError
from django.core.validators import validate_email
from django.db import IntegrityError, transaction
from django.db.models import QuerySet
from django.urls import Resolver404, resolve, reverse

from accounts import history, permissions
from accounts.models import Invitation, Membership, Project, User
from accounts.signup import normalize_email
from runcrate.emails import send_templated
from runcrate.errors import Refused

VALID_FOR = timedelta(days=7)


class InvitationRefused(Refused):
    STATUS = {
        "already_member": 409,
        "invitation_invalid": 404,
        "invitation_used": 410,
        "invitation_expired": 410,
        "wrong_account": 403,
    }


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def link_path(token: str) -> str:
    return reverse("accounts:invitation", args=[token])


def pending(project: Project, *, now: datetime) -> QuerySet[Invitation]:
    return project.invitations.filter(accepted_at__isnull=True, expires_at__gt=now).order_by(
        "email", "pk"
    )


def clean_role(role: str) -> str:
    if role not in Membership.Role.values:
        raise InvitationRefused(
            "invalid_role",
            f"There is no role {str(role)[:20]!r}: a role is one of "
            f"{', '.join(Membership.Role.values)}.",
            field="role",
        )
    return role


def clean_email(email: str) -> str:
    email = normalize_email(email)
    try:
        validate_email(email)
    except ValidationError:
        raise InvitationRefused(
            "invalid_email", f"{email[:100]!r} is not an email address.", field="email"
        ) from None
    return email


def invite(*, project: Project, by: User, email: str, role: str, now: datetime) -> Invitation:
    """Invite `email` with `role` and email them the link once the invitation commits; an
    earlier pending invitation of the same email is replaced (its link stops working)."""
    role = clean_role(role)
    permissions.require(by, project, permissions.invite_action(role))
    email = clean_email(email)
    if project.memberships.filter(user__email__iexact=email).exists():
        raise InvitationRefused(
            "already_member",
            f"{email} is already a member of {project.name!r}: change their role instead.",
            field="email",
        )
    token = secrets.token_urlsafe(32)
    with transaction.atomic():
        project.invitations.filter(email=email, accepted_at__isnull=True).delete()
        invitation = Invitation.objects.create(
            project=project,
            email=email,
            role=role,
            invited_by=by,
            token_hash=_hash(token),
            created_at=now,
            expires_at=now + VALID_FOR,
        )
        history.note(
            summary=f"invited {email} as {role}",
            obj=invitation,
            object_name=email,
            project=project,
            changes={"role": history.change(None, role)},
        )
        transaction.on_commit(lambda: _send(invitation, token))
    return invitation


def _send(invitation: Invitation, token: str) -> None:
    send_templated(
        template="member-invitation",
        to=[invitation.email],
        context={"invitation": invitation, "path": link_path(token)},
    )


def find(token: str, *, now: datetime) -> Invitation:
    """The invitation of a link, or InvitationRefused saying why the link does not work."""
    invitation = (
        Invitation.objects.select_related("project", "invited_by")
        .filter(token_hash=_hash(token))
        .first()
    )
    if invitation is None:
        raise InvitationRefused(
            "invitation_invalid",
            "This invitation link is not valid: it may have been mistyped, or the invitation "
            "was withdrawn or sent again. Ask the project's owner for a new one.",
        )
    if invitation.accepted_at is not None:
        raise InvitationRefused(
            "invitation_used",
            "This invitation has already been used. Log in to reach the project, or ask its "
            "owner for a new invitation.",
        )
    if now >= invitation.expires_at:
        raise InvitationRefused(
            "invitation_expired",
            f"This invitation expired on {invitation.expires_at:%d %B %Y}. Ask the project's "
            "owner to send a new one.",
        )
    return invitation


def from_link(url: str, *, now: datetime) -> Invitation | None:
    """The working invitation whose link `url` is (a sign-up's `next`), or None: sign-up fills
    in the invited email from it, so the account made is the one the invitation lets join."""
    try:
        match = resolve(urlsplit(url).path)
    except Resolver404:
        return None
    if match.view_name != "accounts:invitation":
        return None
    try:
        return find(match.kwargs["token"], now=now)
    except InvitationRefused:
        return None


def accept(*, token: str, user: User, now: datetime) -> Membership:
    """Join the invitation's project as `user`, whose email must be the one invited."""
    with transaction.atomic():
        invitation = find(token, now=now)
        invitation = Invitation.objects.select_for_update().get(pk=invitation.pk)
        if invitation.accepted_at is not None:  # accepted in another tab a moment ago
            find(token, now=now)
        if user.email.lower() != invitation.email.lower():
            raise InvitationRefused(
                "wrong_account",
                f"This invitation is for {invitation.email}, and you are logged in as "
                f"{user.email}. Log out and log in (or sign up) as {invitation.email}.",
            )
        invitation.accepted_at = now
        invitation.accepted_by = user
        invitation.save(update_fields=["accepted_at", "accepted_by"])
        try:
            with transaction.atomic():
                membership = Membership.objects.create(
                    project=invitation.project, user=user, role=invitation.role, created_at=now
                )
        except IntegrityError:  # already a member: the invitation is spent, the role kept
            return Membership.objects.get(project=invitation.project, user=user)
        history.note(
            summary=f"joined the project as {invitation.role} (invited by "
            f"{invitation.invited_by.email if invitation.invited_by else 'a former member'})",
            obj=membership,
            object_name=user.email,
            project=invitation.project,
            changes={"role": history.change(None, invitation.role)},
            user=user,
        )
        return membership


def revoke(*, invitation: Invitation, by: User) -> None:
    permissions.require(by, invitation.project, permissions.invite_action(invitation.role))
    with transaction.atomic():
        invitation.delete()
        history.note(
            summary=f"withdrew the invitation of {invitation.email}",
            obj=invitation,
            object_name=invitation.email,
            project=invitation.project,
            changes={"role": history.change(invitation.role, None)},
        )
