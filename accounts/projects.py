"""Projects: the billing unit every object is scoped to."""

from typing import TypeVar

from django.db import transaction
from django.db.models import Model, QuerySet, Subquery
from django.http import Http404
from django.shortcuts import get_object_or_404

from accounts.models import Environment, Membership, Project, User
from accounts.requests import ProjectRequest

DEFAULT_ENVIRONMENT = "default"

M = TypeVar("M", bound=Model)


def project_for(user: User) -> Project | None:
    membership = (
        Membership.objects.select_related("project").filter(user=user).order_by("pk").first()
    )
    return membership.project if membership else None


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
    subquery (the user's first membership, as `project_for` picks it), not a row read first.
    A user in no project matches nothing. For answers that must cost one query, the poll's."""
    first = Membership.objects.filter(user=request.user).order_by("pk").values("project_id")[:1]
    return queryset.filter(project_id=Subquery(first))
