from collections.abc import Callable
from typing import cast

from django.http import HttpRequest, HttpResponse
from django.utils.functional import SimpleLazyObject

from accounts.models import Project
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
