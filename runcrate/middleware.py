"""Input refused before any view, form or API endpoint reads it."""

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest

from runcrate.api import error_response, is_api
from runcrate.text import InvalidText, check_text

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
