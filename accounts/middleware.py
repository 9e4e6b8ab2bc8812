from collections.abc import Callable
from typing import cast

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.utils.functional import SimpleLazyObject

from accounts import otp
from accounts.models import Project, User
from accounts.projects import SESSION_KEY, chosen_project_id, context_for
from accounts.requests import AnonymousRequest, ProjectContext, ProjectRequest
from runcrate.emails import PROJECT_PARAM


class ProjectMiddleware:
    """Sets `request.project`, the project every lookup of a logged-in request is scoped to,
    and `request.project_context`, the same project with the user's role and projects."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        # What ProjectRequest declares (accounts/requests.py): a lazy project, read (one query)
        # only where a view uses it, and falsy for a user in no project (require_project).
        if request.user.is_authenticated:
            user, asked = request.user, _asked_project(request)
            chosen = asked if asked is not None else chosen_project_id(request)

            def find() -> ProjectContext:
                context = context_for(user, chosen)
                project = context.project
                # A link that names a project of the user's (an email's) switches to it, as
                # the top bar's switcher does; one that names another project is ignored.
                if asked is not None and project and project.pk == asked:
                    request.session[SESSION_KEY] = asked
                return context

            found = cast(ProjectContext, SimpleLazyObject(find))
            typed = cast(ProjectRequest, request)
            typed.project_context = found
            typed.project = cast(Project, SimpleLazyObject(lambda: found.project))
        else:
            anonymous = cast(AnonymousRequest, request)
            anonymous.project = None
            anonymous.project_context = None
        return self.get_response(request)


def _asked_project(request: HttpRequest) -> int | None:
    raw = request.GET.get(PROJECT_PARAM, "")
    return int(raw) if raw.isdigit() and len(raw) < 12 else None


class TwoFactorRequired:
    """Sends a member of a project that requires two-factor sign-in, who has not set it up, to
    the setup page before any other page. It reads the flag on the user's row (loaded by every
    logged-in request), so it costs no query, and a device only when a project requires one.
    The API (bearer keys, no session) is not affected."""

    OPEN_PREFIXES = ("/accounts/security/", "/accounts/logout/", "/accounts/login/", "/api/")

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        user = request.user
        if (
            user.is_authenticated
            and not self._open(request.path)
            and otp.required_but_missing(cast(User, user))
        ):
            return redirect("accounts:security")
        return self.get_response(request)

    def _open(self, path: str) -> bool:
        static = "/" + settings.STATIC_URL.lstrip("/")
        return path.startswith((*self.OPEN_PREFIXES, static))
