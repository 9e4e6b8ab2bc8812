"""A bounded fuzz of the whole API from its own OpenAPI document (schemathesis): valid and
invalid requests to every operation, in this process, with a real API key. No answer is a 5xx,
every answer is JSON with `data` or `error {code, message}`, and every status and body is one
the document declares. Deterministic (derandomized, no example database) and bounded by count
(EXAMPLES_PER_OPERATION per operation and mode), never by the clock: about a minute here, more
on a busy machine; `-m "not fuzz"` leaves it out."""

import json

import pytest
import schemathesis
from django.core.handlers.wsgi import WSGIHandler
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from clusters import lifecycle
from tests.clusters.front import credit, machine_type_with_hosts, ssh_key
from tests.factories import ClusterFactory

pytestmark = pytest.mark.fuzz

EXAMPLES_PER_OPERATION = 40
REVOKE_KEY = "DELETE /api/v1/keys/{key_id}"
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


@pytest.fixture
def wsgi_app(db):
    """Django's own WSGI handler, called in this thread inside the test's transaction. Like
    Django's test client, it must not close that connection at the end of each request."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    with lifecycle.dispatching_to(lifecycle.CollectingDispatcher()):
        yield WSGIHandler()
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


@pytest.fixture
def project_with_things(owner):
    """Something for the generated ids to find: an offer with hosts, credit, an SSH key, and a
    cluster with machines, so the cluster answers carry the machines' schema (two classes of one
    name once made every such answer violate its documented schema)."""
    credit(owner.project, "500.00")
    ssh_key(owner.project)
    machine_type = machine_type_with_hosts(free=4, slug="use2-h100x8-vm")
    ClusterFactory(project=owner.project, machine_type=machine_type, machines=True)
    return owner


def assert_the_envelope(response, operation: str) -> None:
    [content_type] = response.headers.get("content-type", [""])
    assert content_type.startswith("application/json") or (
        response.status_code == 204 and not response.content
    ), f"{operation} answered {response.status_code} without JSON"
    if response.status_code == 204:
        return
    body = json.loads(response.content)
    if response.status_code < 400:
        assert "data" in body, f"{operation}: {body}"
    else:
        assert set(body) == {"error"}, f"{operation}: {body}"
        assert set(body["error"]) == {"code", "message"}, f"{operation}: {body}"
        assert body["error"]["code"] and body["error"]["message"], f"{operation}: {body}"


def test_it_answers_every_generated_request_within_the_envelope(project_with_things, wsgi_app):
    schema = schemathesis.openapi.from_wsgi("/api/v1/openapi.json", wsgi_app)
    auth = {"Authorization": f"Bearer {project_with_things.key}"}
    sent = 0

    operations = [result.ok() for result in schema.get_all_operations()]
    # Revoking a key may revoke the one the fuzz calls with: that operation goes last.
    operations.sort(key=lambda operation: operation.label == REVOKE_KEY)
    for operation in operations:
        for mode in (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE):

            @settings(
                max_examples=EXAMPLES_PER_OPERATION,
                derandomize=True,
                database=None,
                deadline=None,
                phases=[Phase.explicit, Phase.generate],
                suppress_health_check=list(HealthCheck),
            )
            @given(case=operation.as_strategy(generation_mode=mode))
            def answer_within_the_envelope(case):
                nonlocal sent
                response = case.call(app=wsgi_app, headers=auth)
                sent += 1
                case.validate_response(response, checks=CHECKS)
                assert_the_envelope(response, f"{case.method} {case.formatted_path}")

            answer_within_the_envelope()

    assert sent > 300
