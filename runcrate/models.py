from __future__ import annotations

from datetime import datetime, timedelta

from django.db import models, transaction
from django.utils import timezone

from runcrate.beats import missed_after, period

# The beats that are our own machinery for the machines' steps: the tick (the beat scheduler,
# the broker and the default worker) and `machines` (the beat, the broker and a worker of the
# `machines` queue, which runs every start, check-in, install and wipe). While either does not
# run, no machine's step deadline counts (clusters/lifecycle/rules.py, docs/lifecycle.md).
OUR_OWN_BEATS = ("tick", "machines")
# Outages are kept this long: a node waits for at most 45 minutes of machine time, and no
# deadline looks further back than its node's reservation.
KEEP_OUTAGES = timedelta(days=7)


class Beat(models.Model):
    """When a periodic task last ran (the tick, the meter, the `machines` heartbeat): `/readyz`
    fails when one is overdue, because a dead beat scheduler otherwise means, silently, that
    nothing is charged, stopped or advanced. A run that comes late records the gap as an
    `Outage`."""

    name = models.CharField(max_length=40, primary_key=True)
    last_ran_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.name} at {self.last_ran_at:%Y-%m-%d %H:%M:%S}"

    @classmethod
    def record(cls, name: str, at: datetime | None = None, *, every: float | None = None) -> None:
        """One UPDATE every time but the first (the tick runs every 2 s). Given its period
        (`every`), a run that comes later than `missed_after` it after the last one also records
        the time between as an outage: from when the task should have run again to now."""
        at = at or timezone.now()
        if every is None:
            if not cls.objects.filter(name=name).update(last_ran_at=at):
                cls.objects.update_or_create(name=name, defaults={"last_ran_at": at})
            return
        on_time = cls.objects.filter(name=name, last_ran_at__gte=at - missed_after(every))
        if on_time.update(last_ran_at=at):
            return
        with transaction.atomic():  # the outage and the beat that ends it land together
            last = (
                cls.objects.select_for_update()
                .filter(name=name)
                .values_list("last_ran_at", flat=True)
                .first()
            )
            if last is not None and at - last > missed_after(every):
                Outage.objects.create(
                    name=name, started_at=last + timedelta(seconds=every), ended_at=at
                )
                Outage.objects.filter(ended_at__lt=at - KEEP_OUTAGES).delete()
            cls.objects.update_or_create(name=name, defaults={"last_ran_at": at})


class Outage(models.Model):
    """A span in which one of our periodic tasks did not run (`Beat.record` writes it when the
    run after it comes): our own time, which no machine's step deadline counts."""

    name = models.CharField(max_length=40)
    started_at = models.DateTimeField()
    ended_at = models.DateTimeField(db_index=True)

    def __str__(self) -> str:
        return f"{self.name} down {self.started_at:%H:%M:%S}-{self.ended_at:%H:%M:%S}"


def our_downtime(*, since: datetime, now: datetime) -> list[tuple[datetime, datetime]]:
    """The spans since `since` in which our own machinery for the machines (`OUR_OWN_BEATS`)
    did not run, merged and in order: the recorded outages, and one still going on (a beat
    that is late now runs to `now`). A beat that never ran says nothing: no outage.

    The beats are read before the outages: a late beat that has just run committed its outage
    with it, so either the beat still looks late (its span runs to now) or the outage is seen."""
    spans = []
    for name, last in Beat.objects.filter(name__in=OUR_OWN_BEATS).values_list(
        "name", "last_ran_at"
    ):
        every = period(name)
        if now - last > missed_after(every):
            spans.append((last + timedelta(seconds=every), now))
    recorded = Outage.objects.filter(
        name__in=OUR_OWN_BEATS, ended_at__gt=since, started_at__lt=now
    ).values_list("started_at", "ended_at")
    spans.extend(recorded)
    merged: list[tuple[datetime, datetime]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged
