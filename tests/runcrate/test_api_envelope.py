"""Every answer under /api/v1/ is JSON: `{"data": …}` or `{"error": {"code", "message"}}`,
also for a path with no route, a method a path does not take, a body too large or not JSON, and
a crash, with DEBUG on or off, and for the agents' endpoints too."""

import json
import logging

import pytest
from django.http import Http404
from django.test import Client

from clusters.lifecycle import agent_token
from runcrate import middleware
from runcrate.api import INTERNAL_ERROR
from tests.clusters.lifecycle_kit import Sim, create, inventory, new_project, node


def envelope(response, status: int) -> dict:
    """The error of an answer that must be the envelope with `status`."""
    assert response.status_code == status, response.content[:300]
    assert response["Content-Type"].startswith("application/json")
    body = json.loads(response.content)
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}
    assert body["error"]["message"]
    return body["error"]


@pytest.fixture(params=[False, True], ids=["debug-off", "debug-on"])
def debug(request, settings):
    settings.DEBUG = request.param
    return request.param


@pytest.fixture
def agent_node(db):
    _, project = new_project()
    with Sim():
        cluster = create(project, inventory(hosts=2, boot_seconds=180), nodes=2)
    return node(cluster, 1)


def post_json(client: Client, path: str, body: str | bytes, **headers):
    return client.generic("POST", path, body, content_type="application/json", headers=headers)


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/api/v1/nothing-here"),
        ("GET", "/api/v1/"),
        ("POST", "/api/v1/clusters/1/nothing"),
        ("GET", "/api/v1/agent/nodes/1/nothing"),
    ],
)
def test_it_answers_a_path_with_no_route_with_not_found(owner, debug, method, path):
    response = owner.api().generic(method, path)

    error = envelope(response, 404)
    assert error["code"] == "not_found"
    assert path in error["message"]


def test_it_answers_a_method_a_path_does_not_take_with_the_envelope_and_allow(owner, debug):
    response = owner.api().patch("/api/v1/clusters")

    error = envelope(response, 405)
    assert error["code"] == "method_not_allowed"
    assert set(response["Allow"].replace(" ", "").split(",")) == {"GET", "POST"}
    assert "PATCH /api/v1/clusters" in error["message"]


def test_it_answers_a_body_over_the_limit_with_413(owner, agent_node, settings, debug):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    body = json.dumps({"name": "x" * 2000, "location": "us-east-2", "size_gb": 10})

    volume = post_json(owner.api(), "/api/v1/volumes", body)
    agent = post_json(
        Client(),
        f"/api/v1/agent/nodes/{agent_node.pk}/check-in",
        json.dumps({"nvidia_smi": "x" * 2000}),
        authorization=f"Bearer {agent_token(agent_node)}",
    )

    for response in (volume, agent):
        error = envelope(response, 413)
        assert error["code"] == "body_too_large"
        assert "1,000 bytes" in error["message"]


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"{not json", "not valid JSON"),
        (b'{"name": NaN}', "NaN is not a number JSON allows"),
        (b'{"name": Infinity}', "Infinity"),
        (b"\xff\xfe", "not valid JSON"),
    ],
)
def test_it_answers_a_body_that_is_not_json_with_400(owner, body, says):
    response = post_json(owner.api(), "/api/v1/volumes", body)

    error = envelope(response, 400)
    assert error["code"] == "invalid_json"
    assert says in error["message"]


def test_it_refuses_a_body_nested_too_deep_even_past_pythons_stack(owner, agent_node):
    depth = 100_000
    deep = "[" * depth + "]" * depth
    just_too_deep = json.dumps({"reachability": {}, "acceptance": json.loads("[" * 32 + "]" * 32)})

    volume = post_json(owner.api(), "/api/v1/volumes", deep)
    agent = post_json(
        Client(),
        f"/api/v1/agent/nodes/{agent_node.pk}/network",
        just_too_deep,
        authorization=f"Bearer {agent_token(agent_node)}",
    )

    for response in (volume, agent):
        error = envelope(response, 422)
        assert error["code"] == "too_deep"
        assert "32 levels" in error["message"]
    agent_node.refresh_from_db()
    assert agent_node.network_reported_at is None


def test_it_refuses_a_number_beyond_a_float(owner, agent_node):
    response = post_json(
        Client(),
        f"/api/v1/agent/nodes/{agent_node.pk}/check-in",
        '{"gpus": [{"name": "H100", "memory_total_mib": 1e400}]}',
        authorization=f"Bearer {agent_token(agent_node)}",
    )

    error = envelope(response, 422)
    assert error["code"] == "invalid_number"
    assert "gpus[0].memory_total_mib" in error["message"]
    agent_node.refresh_from_db()
    assert agent_node.agent_at is None


def test_it_answers_a_crash_in_an_endpoint_with_internal_error_and_no_traceback(
    owner, debug, monkeypatch, caplog
):
    def broken(**kwargs):
        raise RuntimeError("the secret internals")

    monkeypatch.setattr("offers.api.gpu_cards", broken)

    with caplog.at_level(logging.ERROR, logger="runcrate.api"):
        response = owner.api().get("/api/v1/gpus")

    error = envelope(response, 500)
    assert error == {"code": "internal_error", "message": INTERNAL_ERROR}
    assert b"secret internals" not in response.content and b"Traceback" not in response.content
    assert "GET /api/v1/gpus failed" in caplog.text and "the secret internals" in caplog.text


def test_it_answers_a_crash_in_an_agents_endpoint_with_internal_error(agent_node, monkeypatch):
    def broken(**kwargs):
        raise RuntimeError("agent side")

    monkeypatch.setattr("clusters.telemetry.agent_api.agent_check_in", broken)

    response = post_json(
        Client(),
        f"/api/v1/agent/nodes/{agent_node.pk}/check-in",
        json.dumps({"gpus": []}),
        authorization=f"Bearer {agent_token(agent_node)}",
    )

    assert envelope(response, 500)["code"] == "internal_error"
    assert b"agent side" not in response.content


def test_it_answers_a_crash_before_any_endpoint_with_the_envelope(owner, debug, monkeypatch):
    def broken(request):
        raise RuntimeError("in a middleware")

    monkeypatch.setattr(middleware.RefuseControlCharacters, "_check", staticmethod(broken))
    client = Client(raise_request_exception=False, headers={"authorization": f"Bearer {owner.key}"})

    response = client.get("/api/v1/me")

    error = envelope(response, 500)
    assert error["code"] == "internal_error"
    assert b"in a middleware" not in response.content


def test_it_answers_http404_raised_inside_an_endpoint_with_the_envelope(owner, monkeypatch):
    def missing(**kwargs):
        raise Http404("No such GPU card.")

    monkeypatch.setattr("offers.api.gpu_cards", missing)

    error = envelope(owner.api().get("/api/v1/gpus"), 404)
    assert error == {"code": "not_found", "message": "No such GPU card."}


def test_it_leaves_the_endpoints_own_answers_and_the_docs_alone(owner):
    refused = owner.api().get("/api/v1/clusters/999999")
    docs = Client().get("/api/v1/docs")

    assert envelope(refused, 404) == {
        "code": "not_found",
        "message": "There is no cluster 999999 in your project.",
    }
    assert docs.status_code == 200 and docs["Content-Type"].startswith("text/html")


def test_it_keeps_pages_outside_the_api_as_they_are(client, db):
    response = client.get("/no-such-page/")

    assert response.status_code == 404
    assert not response["Content-Type"].startswith("application/json")
