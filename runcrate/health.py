"""What `/readyz` checks: the database, the broker, and that the beat's periodic work runs."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db import connection
from django.utils import timezone


def beat_limits() -> dict[str, timedelta]:
    """How long each periodic task may go without running before the deployment is not ready:
    several of its periods, and never less than a minute."""
    return {
        "tick": timedelta(seconds=max(60.0, 10 * settings.RUNCRATE_TICK_SECONDS)),
        "meter": timedelta(seconds=max(60.0, 3 * settings.RUNCRATE_METER_SECONDS)),
    }


def check_database() -> str:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except Exception as error:  # any driver's error: the answer is "down", with its words
        return f"down: {type(error).__name__}: {error}".strip()[:200]
    return "ok"


def check_broker() -> str:
    from runcrate.celery import app

    try:
        with app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=2)
    except Exception as error:  # kombu raises its own and the transport's errors
        return f"down: {type(error).__name__}: {error}".strip()[:200]
    return "ok"


def check_beats(database: str) -> dict[str, str]:
    if database != "ok":
        return {name: "unknown: the database is down" for name in beat_limits()}
    from runcrate.models import Beat

    now = timezone.now()
    last = dict(Beat.objects.values_list("name", "last_ran_at"))
    found = {}
    for name, limit in beat_limits().items():
        at = last.get(name)
        if at is None:
            found[name] = "never ran: is the beat scheduler (celery beat) running?"
        elif now - at > limit:
            found[name] = f"overdue: last ran {int((now - at).total_seconds())} s ago"
        else:
            found[name] = "ok"
    return found


def readiness() -> dict[str, str]:
    database = check_database()
    return {"database": database, "broker": check_broker(), **check_beats(database)}
