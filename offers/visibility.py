"""Who sees which location: the one rule (docs/inventory.md, "Failure drills").

A failure-drill location (`Location.drill`) has hosts that fail on purpose. It is offered only
to staff and to a project staff flagged for drills (`Project.drills`); everyone else never sees
it: not on the offers page or the API's offers and GPUs, not on the create form, not in a
suggestion after a failure, not in the quote form's or the storage's list of locations. Every
one of those asks `sees_drills` (and filters with `visible_locations` or `visible`), so the
answer is the same on the web, the API, the CLI and the MCP server.
"""

from django.db.models import QuerySet

from accounts.models import Project, User
from offers.models import Location


def sees_drills(*, user: User | None, project: Project | None) -> bool:
    """Whether `user` in `project` is offered the failure-drill locations: staff always, others
    only in a project flagged for drills. Anyone else (an anonymous visitor, a new sign-up,
    a suggestion made for nobody in particular) is not."""
    if user is not None and getattr(user, "is_staff", False):
        return True
    return bool(project and getattr(project, "drills", False))


def visible_locations(*, drills: bool) -> QuerySet[Location]:
    """The locations one may be offered: every location with `drills`, else all but drills."""
    locations = Location.objects.all()
    return locations if drills else locations.filter(drill=False)


def visible(location: Location | None, *, drills: bool) -> bool:
    """Whether one location is offered (None, "any location", always is)."""
    return location is None or drills or not location.drill
