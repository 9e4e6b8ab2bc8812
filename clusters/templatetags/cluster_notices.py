"""`{% load cluster_notices %}`: the cluster page's notices (templates/clusters/parts/notices.html)
in the words of the functions that decide them, so the page and the API say the same."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from django import template

from clusters.models import Cluster, Node
from clusters.telemetry import health, idle

register = template.Library()


@register.simple_tag
def idle_notice(
    cluster: Cluster, nodes: Iterable[Node] | None = None, now: datetime | None = None
) -> str:
    """The idle notice's words, or "" (clusters.telemetry.idle.notice_text)."""
    return idle.notice_text(cluster, nodes=nodes, now=now)


@register.simple_tag
def gpu_problems(cluster: Cluster) -> list[str]:
    """The open GPU problems' messages (clusters.telemetry.health.gpu_problem_messages)."""
    return health.gpu_problem_messages(cluster)
