"""Input refused before any view, form or API endpoint reads it; our own outages answered 503."""

import logging
import sys
from collections.abc import Callable

from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.template import loader
from django.views import defaults

from runcrate import outages
from runcrate.api import error_response, is_api, unavailable_response
from runcrate.text import InvalidText, check_text

logger = logging.getLogger(__name__)

FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")


class RefuseControlCharacters:
    """A path, a query string or a form field holding NUL, another control character or a lone
    surrogate (runcrate/text.py) is refused here, once for every page and API call: 422
    `invalid_text` in the envelope under /api/v1/, 400 for a page. Views read request.GET,
    request.POST and their path's arguments as they come, and a NUL that reached PostgreSQL
    was a 500. JSON bodies are checked where the API parses them (`runcrate.api.BodyParser`)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        try:
            self._check(request)
        except InvalidText as refusal:
            if is_api(request):
                return error_response(request, refusal.status, refusal.code, refusal.message)
            return HttpResponseBadRequest(refusal.message, content_type="text/plain; charset=utf-8")
        return self.get_response(request)

    @staticmethod
    def _check(request: HttpRequest) -> None:
        check_text(request.path_info, where="The path", one_line=True)
        for name, values in request.GET.lists():
            check_text(name, where="A query parameter's name", one_line=True)
            for value in values:
                check_text(value, where=f"The query parameter {name}", one_line=True)
        # The API takes JSON; a page's form may span lines (a quote's notes).
        form = request.method == "POST" and request.content_type in FORM_TYPES
        if form and not is_api(request):
            for name, values in request.POST.lists():
                check_text(name, where="A form field's name")
                for value in values:
                    check_text(value, where=f"The field {name}")


def unavailable_page(request: HttpRequest) -> HttpResponse:
    """The 503 page, standalone like the 500 page: the database it would read the navigation
    and the balance from is what is missing."""
    if is_api(request):
        return unavailable_response(request)
    html = loader.get_template("503.html").render({"retry_after": outages.RETRY_AFTER_SECONDS})
    response = HttpResponse(html, status=503)
    response["Retry-After"] = str(outages.RETRY_AFTER_SECONDS)
    return response


class AnswerOutages:
    """A view that met one of our outages (`runcrate/outages.py`: the database or the broker
    not answering) answers 503 with `Retry-After`, not 500: nothing in the request was wrong,
    and the same request a moment later works. What fails outside a view (a middleware reading
    the session) reaches `server_error`, Django's handler500, which tells the two apart too."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not outages.is_outage(exception):
            return None  # a bug: Django's 500 path logs it
        logger.warning("%s %s: unavailable (%s)", request.method, request.path, exception)
        return unavailable_page(request)


def server_error(request: HttpRequest) -> HttpResponse:
    """handler500: an outage is the 503 page (the API's envelope once EnvelopeMiddleware sees
    it), anything else the 500 page."""
    if outages.is_outage(sys.exc_info()[1]):
        return unavailable_page(request)
    return defaults.server_error(request)
