"""How often one may try to log in, sign up or ask for a password reset (docs/security.md).

Counted by django-ratelimit in the cache, in fixed windows, twice: per account (the email typed,
whether an account has it or not, so a refusal tells nothing about who has one) and per client
address. A login counts only its failures; a sign-up and a reset count every request.

Fail closed: limits that cannot be counted, because the cache does not answer, refuse the
attempt (`LimitsUnavailable`, 503) rather than let it through uncounted; a password could
otherwise be guessed without limit for as long as the cache is away. They count in the
`limits` cache (settings.RATELIMIT_USE_CACHE), one that raises where the default forgives.
"""

import ipaddress
from dataclasses import dataclass

from django.conf import settings
from django.http import HttpRequest
from django_ratelimit.core import get_usage

from accounts.signup import normalize_email
from runcrate.cache import UNAVAILABLE
from runcrate.durations import minutes_to_wait
from runcrate.errors import Refused


@dataclass(frozen=True)
class Limit:
    group: str
    rate: str  # django-ratelimit's "count/period", e.g. "5/15m"
    per: str  # "account" or "address"


LIMITS = {
    "login": (
        Limit("login-account", "5/15m", "account"),
        Limit("login-address", "30/15m", "address"),
    ),
    "signup": (
        Limit("signup-account", "5/h", "account"),
        Limit("signup-address", "10/h", "address"),
    ),
    "password_reset": (
        Limit("reset-account", "3/h", "account"),
        Limit("reset-address", "10/h", "address"),
    ),
}
TOO_MANY = {
    "login": "Too many failed logins",
    "signup": "Too many sign-ups",
    "password_reset": "Too many password reset requests",
}


PAUSED = {
    "login": "Logging in",
    "signup": "Signing up",
    "password_reset": "Asking for a password reset",
}
# How long a client is asked to wait while the limits cannot be counted.
UNAVAILABLE_RETRY_SECONDS = 30


class Throttled(Refused):
    """An attempt the limits refuse: one too many (429), or limits that cannot be counted just
    now (503). `seconds_left` is what `Retry-After` says."""

    STATUS = {"rate_limited": 429, "limits_unavailable": 503}
    seconds_left: int


class LimitsUnavailable(Throttled):
    def __init__(self, *, action: str) -> None:
        super().__init__(
            "limits_unavailable",
            f"{PAUSED[action]} is paused for a moment: we cannot count attempts right now, "
            "which is our side, not yours. Try again in a minute.",
        )
        self.seconds_left = UNAVAILABLE_RETRY_SECONDS


class RateLimited(Throttled):
    def __init__(self, *, action: str, per: str, seconds_left: int) -> None:
        whose = "for this account" if per == "account" else "from your address"
        wait = minutes_to_wait(seconds_left)
        super().__init__("rate_limited", f"{TOO_MANY[action]} {whose}: try again in {wait}.")
        self.seconds_left = seconds_left


def client_address(request: HttpRequest) -> str:
    """The client's address: REMOTE_ADDR, or behind a proxy the last address it added to
    RUNCRATE_CLIENT_IP_HEADER. An IPv6 client counts by its /64, as one host's many addresses."""
    raw = request.META.get("REMOTE_ADDR", "")
    header = settings.RUNCRATE_CLIENT_IP_HEADER
    if header:
        forwarded = request.META.get("HTTP_" + header.upper().replace("-", "_"), "")
        raw = forwarded.split(",")[-1].strip() or raw
    try:
        address = ipaddress.ip_address(raw)
    except ValueError:
        return raw or "unknown"
    if address.version == 6:
        return str(ipaddress.ip_network(f"{address}/64", strict=False).network_address)
    return str(address)


def _usage(
    action: str, limit: Limit, request: HttpRequest, email: str, *, increment: bool
) -> dict | None:
    value = normalize_email(email) if limit.per == "account" else client_address(request)
    if not value:
        return None  # no email typed: only the address counts, not one account for all blanks
    try:
        usage = get_usage(
            request,
            group=limit.group,
            key=lambda group, request: value,
            rate=limit.rate,
            increment=increment,
        )
    except UNAVAILABLE:
        raise LimitsUnavailable(action=action) from None
    if usage is None or usage["time_left"] < 0:
        # django-ratelimit's own answer for a count the cache did not give (RATELIMIT_FAIL_OPEN
        # off): refused the same way.
        raise LimitsUnavailable(action=action)
    return usage


def check(action: str, request: HttpRequest, *, email: str) -> None:
    """Raise RateLimited when a limit of `action` is used up, LimitsUnavailable when the limits
    cannot be read; counts nothing."""
    for limit in LIMITS[action]:
        usage = _usage(action, limit, request, email, increment=False)
        if usage is not None and usage["count"] >= usage["limit"]:
            raise RateLimited(action=action, per=limit.per, seconds_left=usage["time_left"])


def count(action: str, request: HttpRequest, *, email: str) -> None:
    """Count one attempt of `action` (a failed login) against each of its limits; raise
    LimitsUnavailable when it cannot be counted."""
    for limit in LIMITS[action]:
        _usage(action, limit, request, email, increment=True)


def take(action: str, request: HttpRequest, *, email: str) -> None:
    """Count this request, and raise RateLimited when it is one too many (LimitsUnavailable
    when it cannot be counted)."""
    check(action, request, email=email)
    count(action, request, email=email)
