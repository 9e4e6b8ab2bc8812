"""What `/readyz` checks: the database, the broker, that the beat's periodic work runs, and that
workers take the `machines` and the `releases` queues (their heartbeats,
`clusters.tasks.machines_heartbeat` and `clusters.tasks.releases_heartbeat`)."""

from __future__ import annotations

from datetime import timedelta

from django.db import connection
from django.utils import timezone

from runcrate import beats
from runcrate.models import Beat

# What each beat's answer adds when it never ran or is overdue: which process to look at.
MISSING = {
    "tick": "is the beat scheduler (celery beat) running?",
    "meter": "is the beat scheduler (celery beat) running?",
    "machines": "is a worker for the machines queue (celery worker -Q machines) running?",
    "releases": "is a worker for the releases queue (celery worker -Q releases) running?",
}


def beat_limits() -> dict[str, timedelta]:
    """How long each periodic task may go without running before the deployment is not ready
    (runcrate/beats.py `overdue_after`)."""
    return {name: beats.overdue_after(name) for name in beats.OVERDUE_PERIODS}


def check_database() -> str:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except Exception as error:  # any driver's error: the answer is "down", with its words
        return f"down: {type(error).__name__}: {error}".strip()[:200]
    return "ok"


def check_broker() -> str:
    # The current Celery app is the project's (config/celery.py), the one every shared_task
    # sends through; the kernel names no app of the project's.
    from celery import current_app as app

    try:
        with app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=2)
    except Exception as error:  # kombu raises its own and the transport's errors
        return f"down: {type(error).__name__}: {error}".strip()[:200]
    return "ok"


def check_beats(database: str) -> dict[str, str]:
    if database != "ok":
        return {name: "unknown: the database is down" for name in beat_limits()}
    now = timezone.now()
    last = dict(Beat.objects.values_list("name", "last_ran_at"))
    found = {}
    for name, limit in beat_limits().items():
        at = last.get(name)
        if at is None:
            found[name] = f"never ran: {MISSING[name]}"
        elif now - at > limit:
            found[name] = f"overdue: last ran {int((now - at).total_seconds())} s ago"
            if name in ("machines", "releases"):  # the tick says when the beat itself is down
                found[name] += f": {MISSING[name]}"
        else:
            found[name] = "ok"
    return found


def readiness() -> dict[str, str]:
    database = check_database()
    return {"database": database, "broker": check_broker(), **check_beats(database)}
