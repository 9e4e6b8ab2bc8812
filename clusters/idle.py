"""The idle notice (issue 23, docs/metrics.md): being built."""

from __future__ import annotations

from datetime import datetime


def notice_idle(*, now: datetime | None = None) -> int:
    """Placeholder until the idle notice lands: notices nothing."""
    return 0
