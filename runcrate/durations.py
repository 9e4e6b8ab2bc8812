"""Spans of time as a person reads them beside an amount: an uptime, what a balance covers, an
estimate. `45 s`, `12 min`, `5 h 20 min`, `3 days 4 h` (docs/clusters.md, docs/billing.md)."""

from datetime import timedelta
from decimal import Decimal

MINUTE = 60
HOUR = 3600
DAY = 86_400


Seconds = float | int | Decimal | timedelta | None


def _seconds(value: float | int | Decimal | timedelta) -> int:
    if isinstance(value, timedelta):
        return max(0, int(value.total_seconds()))
    return max(0, int(value))


def span(seconds: Seconds) -> str:
    """Whole units, rounded down, the two largest that matter: under a minute in seconds, under
    an hour in minutes, under two days in hours and minutes, then days and hours."""
    if seconds is None:
        return "—"
    total = _seconds(seconds)
    if total < MINUTE:
        return f"{total} s"
    if total < HOUR:
        return f"{total // MINUTE} min"
    if total < 2 * DAY:
        hours, minutes = divmod(total // MINUTE, 60)
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(total // HOUR, 24)
    return f"{days} days {hours} h" if hours else f"{days} days"


def about(seconds: Seconds) -> str:
    """An estimate: `span` to the nearest minute, half up (to the second under a minute)."""
    if seconds is None:
        return "—"
    total = _seconds(seconds)
    return span(total if total < MINUTE else (total + MINUTE // 2) // MINUTE * MINUTE)
