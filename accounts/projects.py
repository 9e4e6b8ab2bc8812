"""Projects: the billing unit every object is scoped to."""

from typing import TypeVar

from django.db import transaction
from django.db.models import Case, Model, QuerySet, Subquery, Value, When
from django.http import Http404, HttpRequest
from django.shortcuts import get_object_or_404

from accounts.models import Environment, Membership, Project, User
from accounts.requests import ProjectContext, ProjectRequest

DEFAULT_ENVIRONMENT = "default"

M = TypeVar("M", bound=Model)


# The session key of the project a user in several projects switched to (the top bar's form,
# accounts/views.py `switch_project`).
SESSION_KEY = "runcrate_project_id"


def _memberships(user: User, chosen: int | None) -> QuerySet[Membership]:
    """The user's memberships, the chosen project's first, then the oldest: a choice of a
    project the user has left falls back to their first, as with no choice at all."""
    memberships = Membership.objects.filter(user=user)
    if chosen is None:
        return memberships.order_by("pk")
    first = Case(When(project_id=chosen, then=Value(0)), default=Value(1))
    return memberships.order_by(first, "pk")


def chosen_project_id(request: HttpRequest) -> int | None:
    session = getattr(request, "session", None)
    value = session.get(SESSION_KEY) if session is not None else None
    return value if isinstance(value, int) else None


def context_for(user: User, chosen: int | None = None) -> ProjectContext:
    """The project the user acts in (the one chosen, a project id, if they are its member,
    else their first) with their role in it and every project of theirs, from one query."""
    memberships = list(_memberships(user, chosen).select_related("project"))
    if not memberships:
        return ProjectContext(project=None, role=None, switchable=[])
    return ProjectContext(
        project=memberships[0].project,
        role=memberships[0].role,
        switchable=[m.project for m in memberships],
    )


def project_for(user: User, chosen: int | None = None) -> Project | None:
    """The project the user acts in (`context_for`)."""
    return context_for(user, chosen).project


@transaction.atomic
def create_project(*, owner: User, name: str) -> Project:
    """A new project with its `default` environment, owned by `owner`."""
    project = Project.objects.create(name=name)
    Environment.objects.create(project=project, name=DEFAULT_ENVIRONMENT)
    Membership.objects.create(project=project, user=owner, role=Membership.Role.OWNER)
    return project


def require_project(request: ProjectRequest) -> Project:
    """The request's project, or a 404 for a user in none (removed from the last one).

    `request.project` is a lazy object (accounts/middleware.py): it is never `is None`, but it
    is falsy when the user has no project."""
    project = request.project
    if not project:
        raise Http404("Your user belongs to no project.")
    return project


def get_for_project(request: ProjectRequest, queryset: QuerySet[M], **lookup: object) -> M:
    """Look an object up within the request's project: anything else is a 404."""
    return get_object_or_404(queryset, project=require_project(request), **lookup)


def in_project(request: ProjectRequest, queryset: QuerySet[M]) -> QuerySet[M]:
    """`queryset` narrowed to the request's project inside its own query: the project is a
    subquery (the one `project_for` picks), not a row read first.
    A user in no project matches nothing. For answers that must cost one query, the poll's."""
    first = _memberships(request.user, chosen_project_id(request)).values("project_id")[:1]
    return queryset.filter(project_id=Subquery(first))
