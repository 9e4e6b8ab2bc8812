"""Every state-changing route and API operation writes one audit entry (issue 24, item 4), with
the actor and channel right; the walk reads the URL conf and the API's schema, so a route added
later is called too, and fails here unless it is recorded or listed in audit/exempt.py with a
reason."""

import re

import pytest
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver

from audit import exempt
from audit.middleware import STATE_CHANGING
from audit.models import Entry
from runcrate.api import api
from runcrate.gunicorn_conf import redact

MISSING_ID = "987654"
_PARAMETER = re.compile(r"<(?:(\w+):)?(\w+)>")
_API_PARAMETER = re.compile(r"{(\w+)}")


def _page_routes(resolver=None, prefix="", namespace=""):
    """(a URL to call, the URL's name) for every page route: admin and the API apart."""
    resolver = resolver or get_resolver()
    for pattern in resolver.url_patterns:
        route = prefix + str(pattern.pattern)
        if isinstance(pattern, URLResolver):
            if route.startswith(("admin/", "api/")):
                continue
            inner = namespace + (f"{pattern.namespace}:" if pattern.namespace else "")
            yield from _page_routes(pattern, route, inner)
        elif isinstance(pattern, URLPattern) and pattern.name:
            yield "/" + _PARAMETER.sub(_fill, route), namespace + pattern.name


def _fill(found: re.Match) -> str:
    """A value each converter takes, naming nothing that exists: the view answers 404 or a
    refusal, and it still answered."""
    return MISSING_ID if found.group(1) == "int" else "nothing-here"


def _api_operations():
    """(method, URL, operation id) for every state-changing operation of the API's schema."""
    for path, operations in api.get_openapi_schema()["paths"].items():
        for method, operation in operations.items():
            if method.upper() in STATE_CHANGING:
                url = _API_PARAMETER.sub(MISSING_ID, path)
                yield method.upper(), url, operation["operationId"]


PAGES = sorted(set(_page_routes()))
OPERATIONS = sorted(set(_api_operations()))


def test_the_walk_reads_every_route():
    names = {name for _, name in PAGES}
    assert {"clusters:terminate", "billing:set_budget", "storage:delete"} <= names
    ids = {operation for _, _, operation in OPERATIONS}
    assert {"clusters_api_terminate_cluster", "billing_api_put_budget"} <= ids
    assert len(PAGES) > 40 and len(OPERATIONS) > 15


@pytest.mark.parametrize(("url", "name"), PAGES, ids=[name for _, name in PAGES])
def test_every_page_post_writes_one_entry(owner, url, name):
    client = Client()
    client.force_login(owner.user)

    # A JSON body: an empty form to the pages, and what the Stripe webhook reads.
    response = client.post(url, "{}", content_type="application/json")

    entries = list(Entry.objects.all())
    if exempt.exemption(path=url, action=name) is not None or response.status_code == 405:
        # Exempt with its reason, or a route that takes no POST (nothing changed).
        assert entries == []
        return
    assert len(entries) == 1, f"{name} ({url}, {response.status_code}) wrote {len(entries)}"
    (entry,) = entries
    assert (entry.actor, entry.channel, entry.action) == ("user", "dashboard", name)
    assert (entry.user, entry.user_email, entry.project) == (
        owner.user,
        owner.user.email,
        owner.project,
    )
    # The path as it came, but a secret in it (a reset or invitation link's token) redacted.
    assert (entry.method, entry.path) == ("POST", redact(url))
    assert_answer(entry, response)
    assert entry.ip == "127.0.0.1"


def assert_answer(entry: Entry, response) -> None:
    """Every entry is in words with its outcome: an action's own note (written before the
    answer, in its transaction: no status) when it succeeded, or the answer's status."""
    assert entry.summary
    if entry.status_code is None:
        assert (entry.outcome, response.status_code < 400) == ("done", True)
    else:
        assert entry.status_code == response.status_code
        expected = "done" if response.status_code < 400 else "refused"
        assert entry.outcome == (expected if response.status_code < 500 else "failed")


@pytest.mark.parametrize(
    ("method", "url", "operation"), OPERATIONS, ids=[op for _, _, op in OPERATIONS]
)
def test_every_api_operation_writes_one_entry(owner, method, url, operation):
    response = owner.api().generic(method, url, "{}", content_type="application/json")

    entries = list(Entry.objects.all())
    if exempt.exemption(path=url, action=operation) is not None:
        assert entries == []
        return
    assert response.status_code != 405
    assert len(entries) == 1, f"{operation} ({response.status_code}) wrote {len(entries)}"
    (entry,) = entries
    assert (entry.actor, entry.channel, entry.action) == ("api_key", "api", operation)
    assert (entry.user, entry.api_key_name, entry.project) == (owner.user, "test", owner.project)
    assert entry.api_key is not None and entry.api_key_ref == str(entry.api_key.pk)
    assert_answer(entry, response)


def test_every_exemption_names_a_route_that_exists_and_a_reason():
    names = {name for _, name in PAGES} | {operation for _, _, operation in OPERATIONS}
    assert set(exempt.EXEMPT_ACTIONS) <= names
    assert any(url.startswith(tuple(exempt.EXEMPT_PREFIXES)) for _, url, _ in OPERATIONS)
    reasons = [*exempt.EXEMPT_ACTIONS.values(), *exempt.EXEMPT_PREFIXES.values()]
    assert all(len(reason) > 30 for reason in reasons)
