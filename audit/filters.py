"""The log's one query: a project's entries narrowed by who, what, which cluster and when, read
from the page's form and the API's query parameters alike (docs/audit.md)."""

from dataclasses import dataclass
from datetime import UTC, datetime

from django.db.models import Q, QuerySet

from accounts.models import Project
from audit.models import Entry


@dataclass(frozen=True)
class EntryFilter:
    who: str = ""  # part of a user's email or an API key's name
    action: str = ""  # part of the action ("clusters:") or of its words ("revoked")
    cluster: str = ""  # a cluster's id
    since: datetime | None = None
    until: datetime | None = None


def in_utc(moment: datetime) -> datetime:
    """A filter's time as the database compares it: in UTC (a naive one read as UTC). Raises
    ValueError with words for a time UTC cannot hold (year 1 at +05:00), and the database never
    sees an offset it refuses (PostgreSQL holds at most ±15:59; Python allows ±23:59)."""
    aware = moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
    try:
        return aware.astimezone(UTC)
    except OverflowError:
        raise ValueError(f"{moment.isoformat()} is out of range once in UTC.") from None


def entries(*, project: Project, by: EntryFilter) -> QuerySet[Entry]:
    """The project's entries, newest first: never another project's."""
    queryset = Entry.objects.filter(project=project)
    if by.who:
        queryset = queryset.filter(
            Q(user_email__icontains=by.who) | Q(api_key_name__icontains=by.who)
        )
    if by.action:
        queryset = queryset.filter(Q(action__icontains=by.action) | Q(summary__icontains=by.action))
    if by.cluster:
        queryset = queryset.filter(object_type="cluster", object_id=by.cluster)
    if by.since is not None:
        queryset = queryset.filter(at__gte=by.since)
    if by.until is not None:
        queryset = queryset.filter(at__lt=by.until)
    return queryset.order_by("-at", "-pk")
