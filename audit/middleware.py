"""One audit entry for every state-changing request (docs/audit.md): the action's own, written
by `audit.note` in its transaction while the view ran, or else one written here after the view
(a refusal, a route with no words of its own), so no view can forget. Which requests are
exempt, and why: audit/exempt.py."""

import logging
from collections.abc import Callable

from django.http import HttpRequest, HttpResponse

from accounts.models import User
from audit import exempt, log
from audit.models import Entry

logger = logging.getLogger(__name__)

STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})


class AuditMiddleware:
    """After AuthenticationMiddleware: the signed-in user is read before the view, since a
    logout ends it; an API key's user is known only after (the API's auth sets it)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.method not in STATE_CHANGING:
            return self.get_response(request)
        user = request.user if request.user.is_authenticated else None
        # Before the view: a delete in admin leaves no object to read the project from after.
        admin_project = None
        if log.is_admin_path(request):
            try:
                admin_project = log.admin_project(request)
            except Exception:
                logger.exception("could not read the project of %s", request.path)
        with log.serving(request):
            response = self.get_response(request)
        try:
            if self._noted(request, response):
                return response
            if response.status_code != 405 and not self._exempt(request):
                log.write_for_request(
                    request,
                    response,
                    user=user if isinstance(user, User) else None,
                    admin_project=admin_project,
                )
        except Exception:  # what the log cannot write never fails what it records
            logger.exception("could not write the audit entry for %s", request.path)
        return response

    @staticmethod
    def _noted(request: HttpRequest, response: HttpResponse) -> bool:
        """Whether the view's action wrote its own entry: a success did, in its transaction; a
        refusal after a note may have rolled it back, so it is looked for."""
        noted = log.noted(request)
        if not noted or response.status_code < 400:
            return bool(noted)
        return Entry.objects.filter(pk__in=noted).exists()

    @staticmethod
    def _exempt(request: HttpRequest) -> bool:
        match = request.resolver_match
        if match is None:  # no route answered it: nothing changed
            return True
        action = log.action_of(request, match)
        return exempt.exemption(path=request.path, action=action) is not None
