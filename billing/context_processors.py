"""The balance in the top bar of every page, and its banner (templates/billing/balance_*.html,
docs/billing.md "The top bar").

Read lazily: the query runs when a template reads `topbar_balance`, which only base.html's top bar
does, so htmx fragments and polls (which render no top bar) pay nothing for it."""

from weakref import WeakKeyDictionary

from django.http import HttpRequest
from django.utils.functional import SimpleLazyObject

from billing.usage import Summary, summary_for_member

# Each request's summary, for as long as the request lives.
_summaries: WeakKeyDictionary[HttpRequest, Summary | None] = WeakKeyDictionary()


def request_summary(request: HttpRequest) -> Summary | None:
    """The request's project's balance and burn rate, once per request, for a user who may see
    billing; None for anyone else (no project, a developer)."""
    if request not in _summaries:
        user = getattr(request, "user", None)
        project = getattr(request, "project", None)
        found = None
        if user is not None and user.is_authenticated and project:
            found = summary_for_member(project=project, user=user)
        _summaries[request] = found
    return _summaries[request]


def balance(request: HttpRequest) -> dict[str, object]:
    return {"topbar_balance": SimpleLazyObject(lambda: request_summary(request))}
