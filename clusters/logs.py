"""Logs and jobs (issue 23, docs/metrics.md): being built."""

from __future__ import annotations

from typing import Any

from clusters.models import Cluster


def tab_context(cluster: Cluster) -> dict[str, Any]:
    """What the Logs & jobs tab shows (placeholder until it lands)."""
    return {}
