"""What the audit log hears from below (docs/audit.md): accounts' own notes
(`accounts.history`), and Django's sign-ins, sign-outs and failed sign-ins."""

from typing import Any

from django.contrib.auth import signals as auth_signals
from django.http import HttpRequest

from accounts import history
from accounts.models import Membership, Project, User
from audit import log
from audit.models import Entry


def connect() -> None:
    history.noted.connect(_noted, dispatch_uid="audit.noted")
    auth_signals.user_logged_in.connect(_signed_in, dispatch_uid="audit.signed_in")
    auth_signals.user_logged_out.connect(_signed_out, dispatch_uid="audit.signed_out")
    auth_signals.user_login_failed.connect(_failed, dispatch_uid="audit.failed")


def _noted(sender: object, **kwargs: Any) -> None:
    """A note of accounts'; one about a person themselves (their two-factor sign-in) with no
    project of its own is written in each project they are in."""
    kwargs.pop("signal", None)
    person = kwargs["obj"]
    if kwargs["project"] is None and isinstance(person, User):
        for project in _projects_of(person):
            log.note(**{**kwargs, "project": project})
        return
    log.note(**kwargs)


def _projects_of(user: User) -> list[Project]:
    """A person's sign-in shows in the log of each project they are in."""
    return [
        membership.project
        for membership in Membership.objects.filter(user=user).select_related("project")
    ]


def _signed_in(sender: object, request: HttpRequest | None, user: User, **kwargs: Any) -> None:
    """A sign-in the site served (the test client's force_login serves none)."""
    if not log.is_serving():
        return
    for project in _projects_of(user):
        log.note(summary="signed in", obj=user, project=project, user=user)


def _signed_out(sender: object, request: HttpRequest | None, user: User | None, **kw: Any) -> None:
    if not isinstance(user, User) or not log.is_serving():
        return
    for project in _projects_of(user):
        log.note(summary="signed out", obj=user, project=project, user=user)


def _failed(
    sender: object, credentials: dict[str, Any], request: HttpRequest | None = None, **kwargs: Any
) -> None:
    """A wrong password for a known email: in its projects' logs, refused. An unknown email
    has no project to be written in (the login throttle counts it)."""
    email = str(credentials.get("username") or credentials.get("email") or "")
    user = User.objects.filter(email__iexact=email).first() if email else None
    if user is None:
        return
    for project in _projects_of(user):
        log.note(
            summary="failed to sign in (wrong password)",
            obj=user,
            project=project,
            user=user,
            outcome=Entry.Outcome.REFUSED,
        )
