from __future__ import annotations

from datetime import datetime

from django.db import models
from django.utils import timezone


class Beat(models.Model):
    """When a periodic task last ran (the tick, the meter): `/readyz` fails when one is overdue,
    because a dead beat scheduler otherwise means, silently, that nothing is charged, stopped
    or advanced."""

    name = models.CharField(max_length=40, primary_key=True)
    last_ran_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.name} at {self.last_ran_at:%Y-%m-%d %H:%M:%S}"

    @classmethod
    def record(cls, name: str, at: datetime | None = None) -> None:
        """One UPDATE every time but the first (the tick runs every 2 s)."""
        at = at or timezone.now()
        if not cls.objects.filter(name=name).update(last_ran_at=at):
            cls.objects.update_or_create(name=name, defaults={"last_ran_at": at})
