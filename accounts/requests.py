"""The requests our views and API operations receive, typed: Django's `HttpRequest` with the
attributes our middleware and the API's auth set on it, as django-htmx's example app types
`request.htmx` with `HtmxHttpRequest`. Only annotations: a view is still handed Django's own
request object, and nothing here is checked at run time.

Views behind `login_required` take a `ProjectRequest`, others that read `htmx` an `HtmxRequest`;
API operations (every one declares an `ApiKeyAuth`) take an `ApiRequest`. Django Ninja reads an
operation's parameters from its signature but passes the request whatever the first argument is
annotated with."""

from dataclasses import dataclass

from django.http import HttpRequest
from django_htmx.middleware import HtmxDetails

from accounts.models import ApiKey, Project, User


@dataclass(frozen=True)
class ProjectContext:
    """The request's project with what the query that found it read along
    (accounts/projects.py `context_for`): the user's role in it, which
    `accounts.permissions.request_role` answers without a query of its own, and every project
    of the user, for the top bar's switcher. For a user in no project: `None`, `None`, `[]`."""

    project: Project | None
    role: str | None
    switchable: list[Project]


class HtmxRequest(HttpRequest):
    """Any request: django-htmx's middleware sets `htmx` on every one (falsy unless htmx sent
    it)."""

    htmx: HtmxDetails


class AnonymousRequest(HtmxRequest):
    """A logged-out request, as `accounts.middleware.ProjectMiddleware` leaves it."""

    project: None
    project_context: None


class ProjectRequest(HtmxRequest):
    """A logged-in user's request.

    `project` is set by `accounts.middleware.ProjectMiddleware`: a lazy object, read (one query)
    only where a view uses it. For a user in no project (removed from their last one) it is
    falsy, never `None`: a view reaches it through `accounts.projects.require_project`, which
    answers 404 for that user, before it uses the project.

    `project_context` is the same middleware's, as lazy (the project's own query): the project
    with the user's role in it and their other projects. An API call has none (`None`): its
    project is its key's (`ApiRequest`)."""

    user: User
    project: Project
    project_context: ProjectContext | None


class ApiRequest(ProjectRequest):
    """An API call authenticated by a key: the API's auth sets `user` to the key's user and
    `project` to the key's project (always a real one), and Django Ninja sets `auth` to the key
    the auth returned."""

    auth: ApiKey
