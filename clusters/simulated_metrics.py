"""The simulated data center's metrics (issue 23, docs/metrics.md): being built."""

from __future__ import annotations

from datetime import datetime


def report(*, now: datetime | None = None) -> int:
    """Placeholder until the simulated figures land: reports nothing."""
    return 0
