"""The balance in the top bar of every page, and its banner (templates/billing/balance_*.html,
docs/billing.md "The top bar").

Read lazily: the query runs when a template reads `topbar_balance` or `balance_banner`, which
only base.html's top bar does, so htmx fragments and polls (which render no top bar) pay nothing
for it."""

from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from weakref import WeakKeyDictionary

from django.http import HttpRequest
from django.utils import timezone
from django.utils.functional import SimpleLazyObject

from billing.usage import Summary, summary_for_member

# Each request's summary, for as long as the request lives.
_summaries: WeakKeyDictionary[HttpRequest, Summary | None] = WeakKeyDictionary()

# The banner dismissed: the cookie holds the state it was dismissed in (`banner_state`).
BANNER_COOKIE = "balance_banner_dismissed"
BANNER_COOKIE_SECONDS = 86_400


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


def banner_level(summary: Summary) -> str | None:
    """How short the balance runs: `out` (nothing left), `low` (a cluster runs and the balance
    covers less than the policy's threshold, billing/policy.py `runway_warns`); None when the
    banner has nothing to say (nothing runs, or the balance covers enough)."""
    if not summary.runway_warns:
        return None
    return "out" if summary.balance <= 0 else "low"


@dataclass(frozen=True)
class RunwayBanner:
    """What the banner says: the balance, what runs, and when the running clusters stop."""

    balance: Decimal
    burn_rate: Decimal
    seconds_remaining: Decimal
    runs_out_at: datetime  # when the balance reaches zero at this burn rate: the stop

    @property
    def out(self) -> bool:
        return self.balance <= 0


def banner_state(request: HttpRequest) -> str | None:
    """The banner's state for this request: the project, the level and the day (UTC). A
    dismissed banner stays away while this stays the same, so it comes back when the balance
    runs shorter (or recovers and runs short again) and the next day."""
    summary = request_summary(request)
    level = banner_level(summary) if summary is not None else None
    if level is None:
        return None
    project = getattr(request, "project", None)
    return f"{getattr(project, 'pk', '')}.{level}.{timezone.now():%Y%m%d}"


def banner_summary(request: HttpRequest) -> RunwayBanner | None:
    """What the banner shows; None when it has nothing to say or was dismissed."""
    state = banner_state(request)
    summary = request_summary(request)
    if state is None or summary is None or request.COOKIES.get(BANNER_COOKIE) == state:
        return None
    seconds = summary.seconds_remaining or Decimal(0)
    return RunwayBanner(
        balance=summary.balance,
        burn_rate=summary.burn_rate,
        seconds_remaining=seconds,
        runs_out_at=timezone.now() + timedelta(seconds=int(seconds)),
    )


def balance(request: HttpRequest) -> dict[str, object]:
    return {
        "topbar_balance": SimpleLazyObject(lambda: request_summary(request)),
        "balance_banner": SimpleLazyObject(lambda: banner_summary(request)),
    }
