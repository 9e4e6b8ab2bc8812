"""Durations for people, in one place: spans beside an amount (an uptime, what a balance
covers, an estimate: `45 s`, `12 min`, `5 h 20 min`, `3 days 4 h`), a countdown that ticks on
the cluster page (`2m 10s`), an age in a list (`12 min`), a limit in a sentence (`90 seconds`,
`6 minutes`), and machine time to the second (`12:04:09`) (docs/clusters.md, docs/billing.md).
Templates read them through
`{% load durations %}`, the API and emails call them, and the page's script fills the
countdown's own shapes, which the server hands it (`COUNTDOWN_FORMAT`)."""

import math
from datetime import datetime, timedelta
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


def clock(seconds: Seconds) -> str:
    """Hours, minutes and seconds, exact: `0:00:55`, `12:04:09`, `1,250:00:00`. What the
    Billing page writes machine time in, so four machines' times add up to their line's, as
    hours rounded one by one would not (docs/billing.md)."""
    if seconds is None:
        return "—"
    hours, rest = divmod(_seconds(seconds), HOUR)
    minutes, secs = divmod(rest, MINUTE)
    return f"{hours:,}:{minutes:02d}:{secs:02d}"


# A countdown's shapes, by the largest unit left, filled with whole hours `h`, minutes `m` and
# seconds `s` (each rounded down; `ss` is `s` in two digits). The cluster page hands them to its
# script (`data-countdown-format`, static/js/app.js), so the clock that ticks there says what
# the server says.
COUNTDOWN_FORMAT = {"hours": "{h}h {m}m", "minutes": "{m}m {ss}s", "seconds": "{s}s"}


def countdown(seconds: float | int) -> str:
    """`2m 10s`, `45s`, `1h 5m`: the time left to a deadline, read at a glance."""
    hours, rest = divmod(max(0, int(seconds)), HOUR)
    minutes, secs = divmod(rest, MINUTE)
    shape = "hours" if hours else "minutes" if minutes else "seconds"
    return COUNTDOWN_FORMAT[shape].format(h=hours, m=minutes, s=secs, ss=f"{secs:02d}")


def age(since: datetime, now: datetime) -> str:
    """How long ago, as a list shows it: `just now`, `12 min`, `5 h`, `3 d`."""
    seconds = int((now - since).total_seconds())
    if seconds < MINUTE:
        return "just now"
    if seconds < HOUR:
        return f"{seconds // MINUTE} min"
    if seconds < DAY:
        return f"{seconds // HOUR} h"
    return f"{seconds // DAY} d"


def in_words(seconds: float) -> str:
    """A limit in a sentence: `90 seconds` under two minutes, else `6 minutes`, `7.5 minutes`."""
    seconds = round(seconds)
    if seconds < 2 * MINUTE:
        return f"{seconds} seconds"
    minutes = seconds / MINUTE
    return f"{minutes:.0f} minutes" if minutes == int(minutes) else f"{minutes:.1f} minutes"


def about(seconds: Seconds) -> str:
    """An estimate: `span` to the nearest minute, half up (to the second under a minute)."""
    if seconds is None:
        return "—"
    total = _seconds(seconds)
    return span(total if total < MINUTE else (total + MINUTE // 2) // MINUTE * MINUTE)


def whole_minutes(seconds: int) -> int:
    """Whole minutes, half up (89 s is 1, 90 s is 2): a time to ready as the offers word it."""
    return (max(0, seconds) + MINUTE // 2) // MINUTE


def about_minutes(seconds: Seconds) -> str:
    """An estimate in whole minutes: `about 4 min`, `under 1 min` (under half a minute)."""
    if seconds is None:
        return "—"
    whole = whole_minutes(_seconds(seconds))
    return f"about {whole} min" if whole else "under 1 min"


def minutes_to_wait(seconds: float) -> str:
    """How long to wait, in whole minutes up and at least one: `1 minute`, `3 minutes` (a
    refusal's "try again in …": never sooner than it may)."""
    minutes = max(1, math.ceil(seconds / MINUTE))
    return f"{minutes} minute" if minutes == 1 else f"{minutes} minutes"
