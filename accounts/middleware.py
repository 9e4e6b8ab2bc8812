from collections.abc import Callable
from typing import cast

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.utils.functional import SimpleLazyObject

from accounts import otp
from accounts.models import Project, User
from accounts.projects import chosen_project_id, project_for
from accounts.requests import AnonymousRequest, ProjectRequest


class ProjectMiddleware:
    """Sets `request.project`, the project every lookup of a logged-in request is scoped to."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        # What ProjectRequest declares (accounts/requests.py): a lazy project, read (one query)
        # only where a view uses it, and falsy for a user in no project (require_project).
        if request.user.is_authenticated:
            user, chosen = request.user, chosen_project_id(request)
            lazy = cast(Project, SimpleLazyObject(lambda: project_for(user, chosen)))
            cast(ProjectRequest, request).project = lazy
        else:
            cast(AnonymousRequest, request).project = None
        return self.get_response(request)


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
