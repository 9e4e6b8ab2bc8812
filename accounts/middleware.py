from collections.abc import Callable

from django.http import HttpRequest, HttpResponse
from django.utils.functional import SimpleLazyObject

from accounts.projects import project_for


class ProjectMiddleware:
    """Sets `request.project`, the project every lookup of a logged-in request is scoped to."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.user.is_authenticated:
            user = request.user
            request.project = SimpleLazyObject(lambda: project_for(user))  # type: ignore[attr-defined]
        else:
            request.project = None  # type: ignore[attr-defined]
        return self.get_response(request)
