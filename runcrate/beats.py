"""When a periodic task of ours is late, in one place (docs/architecture.md, "Health"). Two
judgements, on purpose apart, both from the task's own period (`period`):

- **missed** (`missed_after`): a run that comes this long after the one before means the task
  did not run in between. `Beat.record` writes the gap as an `Outage`, and `our_downtime` reads
  a beat this late now as an outage still going on: time no machine's step deadline counts.
  Short (three periods, at least 5 s), so that our own outages are never charged to a machine.
- **overdue** (`overdue_after`): the deployment is not ready (`/readyz` answers 503 and says
  which process to look at). Long (ten ticks, three meter periods, at least
  RUNCRATE_BEAT_OVERDUE_MIN_SECONDS), so that a busy queue or a slow meter run does not take
  the deployment out of its load balancer.

Settings only: the kernel's models and health checks ask here; nothing here asks them.
"""

from datetime import timedelta

from django.conf import settings

# A run this many of its periods after the last one missed a run (never under the floor: a
# busy queue delays a run by a few seconds).
MISSED_PERIODS = 3
MISSED_FLOOR_SECONDS = 5.0
# A task this many of its periods without a run is overdue: the deployment is not ready.
OVERDUE_PERIODS = {"tick": 10, "machines": 10, "releases": 10, "meter": 3}


def period(name: str) -> float:
    """How often each periodic task runs, in seconds: the `machines` and `releases` heartbeats
    are sent as often as the tick (CELERY_BEAT_SCHEDULE, config/settings.py)."""
    return {
        "tick": settings.RUNCRATE_TICK_SECONDS,
        "machines": settings.RUNCRATE_TICK_SECONDS,
        "releases": settings.RUNCRATE_TICK_SECONDS,
        "meter": settings.RUNCRATE_METER_SECONDS,
    }[name]


def missed_after(every: float) -> timedelta:
    """A run this long after the one before means the task did not run in between: three of
    its periods, never less than 5 s."""
    return timedelta(seconds=max(MISSED_PERIODS * every, MISSED_FLOOR_SECONDS))


def overdue_after(name: str) -> timedelta:
    """How long the task `name` may go without running before the deployment is not ready."""
    seconds = OVERDUE_PERIODS[name] * period(name)
    return timedelta(seconds=max(settings.RUNCRATE_BEAT_OVERDUE_MIN_SECONDS, seconds))
