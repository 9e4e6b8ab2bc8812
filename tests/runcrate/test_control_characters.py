"""No input holds NUL, another control character or a lone surrogate: every JSON body (in any
string, key or nested value), query string, path and form field is refused with a clear answer
before it reaches the database, which on PostgreSQL answered a NUL with a 500. Run these with
DATABASE_URL set to see that (SQLite stores a NUL without complaint)."""

import json
from datetime import UTC, datetime

import pytest
import time_machine
from django.test import Client

from accounts.models import ApiKey, SshKey
from billing.models import LedgerEntry
from clusters import lifecycle
from clusters.lifecycle import agent_token
from clusters.models import Cluster, Volume
from offers.models import QuoteRequest
from runcrate.text import check_json, refused_character
from tests.clusters.lifecycle_kit import Sim, create, inventory, new_project, node
from tests.factories import GpuModelFactory, LocationFactory

NUL = "\x00"


@pytest.fixture(autouse=True)
def _nothing_to_celery():
    with lifecycle.dispatching_to(lifecycle.CollectingDispatcher()):
        yield


@pytest.fixture(autouse=True)
def _today():
    with time_machine.travel(datetime(2026, 3, 10, 12, tzinfo=UTC), tick=False):
        yield


@pytest.fixture
def catalog(db):
    GpuModelFactory(slug="h100-sxm", name="H100 SXM 80GB", memory_gib=80)
    LocationFactory(code="us-east-2", name="Columbus, Ohio")


@pytest.fixture
def agent_node(db):
    _, project = new_project()
    with Sim():
        cluster = create(project, inventory(hosts=2, boot_seconds=180), nodes=2)
    return node(cluster, 1)


def quote(**overrides) -> dict:
    return {
        "gpu": "h100-sxm",
        "nodes": 128,
        "interconnect": "infiniband",
        "location": "us-east-2",
        "start_date": "2026-04-01",
        "duration_weeks": 12,
        "contact_name": "Ada Lovelace",
        "contact_email": "ada@example.com",
        "notes": "Pre-training.",
        **overrides,
    }


CLUSTER = {"name": "train", "offer_id": "use2-h100x8-vm", "nodes": 2}
VOLUME = {"name": "data", "location": "us-east-2", "size_gb": 10}
SSH_KEY = {"name": "laptop", "public_key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGk laptop"}

# (method, path, body, the field named in the refusal): a NUL in each text the API takes.
BODIES = [
    ("POST", "/api/v1/clusters", {**CLUSTER, "name": f"train{NUL}"}, "name"),
    ("POST", "/api/v1/clusters", {**CLUSTER, "offer_id": f"use2{NUL}"}, "offer_id"),
    ("POST", "/api/v1/clusters", {**CLUSTER, "software": f"slurm{NUL}"}, "software"),
    ("POST", "/api/v1/clusters", {**CLUSTER, "environment": f"default{NUL}"}, "environment"),
    ("POST", "/api/v1/volumes", {**VOLUME, "name": f"data{NUL}"}, "name"),
    ("POST", "/api/v1/volumes", {**VOLUME, "location": f"us-east-2{NUL}"}, "location"),
    ("POST", "/api/v1/ssh-keys", {**SSH_KEY, "name": f"lap{NUL}top"}, "name"),
    ("POST", "/api/v1/ssh-keys", {**SSH_KEY, "public_key": f"ssh-ed25519 {NUL}"}, "public_key"),
    ("POST", "/api/v1/keys", {"name": f"ci{NUL}"}, "name"),
    ("POST", "/api/v1/keys", {"name": "ci", "scopes": [f"read{NUL}"]}, "scopes[0]"),
    ("POST", "/api/v1/quotes", quote(gpu=f"h100-sxm{NUL}"), "gpu"),
    ("POST", "/api/v1/quotes", quote(interconnect=f"roce{NUL}"), "interconnect"),
    ("POST", "/api/v1/quotes", quote(location=f"us-east-2{NUL}"), "location"),
    ("POST", "/api/v1/quotes", quote(contact_name=f"Ada{NUL}"), "contact_name"),
    ("POST", "/api/v1/quotes", quote(contact_email=f"ada{NUL}@example.com"), "contact_email"),
    ("POST", "/api/v1/quotes", quote(notes=f"70B{NUL} model"), "notes"),
    ("POST", "/api/v1/quotes", quote(notes="a bell \x07"), "notes"),
    ("POST", "/api/v1/quotes", quote(notes="half a pair \ud800"), "notes"),
    ("POST", "/api/v1/quotes", {**quote(), f"extra{NUL}": 1}, "a key of the body"),
    ("PUT", "/api/v1/environments/default/budget", {"amount": f"50{NUL}"}, "amount"),
]


def written() -> tuple[int, ...]:
    return tuple(
        model.objects.count()
        for model in (Cluster, Volume, SshKey, ApiKey, QuoteRequest, LedgerEntry)
    )


@pytest.mark.parametrize(
    ("method", "path", "body", "field"), BODIES, ids=[f"{b[1]}:{b[3]}" for b in BODIES]
)
def test_it_refuses_a_control_character_in_any_text_of_a_body(
    owner, catalog, method, path, body, field
):
    before = written()

    response = owner.api().generic(method, path, json.dumps(body), content_type="application/json")

    assert response.status_code == 422, response.content
    error = response.json()["error"]
    assert error["code"] == "invalid_text"
    assert error["message"].startswith(f"{field} holds ")
    assert written() == before


@pytest.mark.parametrize(
    ("where", "body", "field"),
    [
        ("check-in", {"gpus": [{"name": f"H100{NUL}", "memory_total_mib": 81559}]}, "gpus[0].name"),
        ("check-in", {"gpus": [], "nvidia_smi": f"H100{NUL}, 81559, GPU-1, 550"}, "nvidia_smi"),
        ("check-in", {"gpus": [], "wireguard_public_key": f"{NUL}"}, "wireguard_public_key"),
        ("check-in", {"gpus": [], "hostname": f"lab-1{NUL}"}, "hostname"),
        ("network", {"reachability": {f"node-0{NUL}": True}}, "a key of reachability"),
        ("network", {"reachability": {}, "acceptance": {"error": NUL}}, "acceptance.error"),
    ],
)
def test_it_refuses_a_control_character_an_agent_sends_and_records_nothing(
    agent_node, where, body, field
):
    response = Client().post(
        f"/api/v1/agent/nodes/{agent_node.pk}/{where}",
        body,
        content_type="application/json",
        headers={"authorization": f"Bearer {agent_token(agent_node)}"},
    )

    assert response.status_code == 422
    error = response.json()["error"]
    assert error["code"] == "invalid_text" and error["message"].startswith(f"{field} holds ")
    agent_node.refresh_from_db()
    assert agent_node.agent_at is None and agent_node.network_reported_at is None


@pytest.mark.parametrize(
    ("method", "path", "named"),
    [
        ("GET", "/api/v1/offers?gpu=h100%00&nodes=2", "The query parameter gpu"),
        ("GET", "/api/v1/billing/usage?month=2026-03%00", "The query parameter month"),
        ("GET", "/api/v1/clusters?limit=5%0A", "The query parameter limit"),
        ("GET", "/api/v1/gpus?%00=1", "A query parameter's name"),
        ("PUT", "/api/v1/environments/de%00fault/budget", "The path"),
        ("DELETE", "/api/v1/clusters/1/machines/node-0%00", "The path"),
    ],
)
def test_it_refuses_a_control_character_in_a_query_string_or_a_path(owner, method, path, named):
    response = owner.api().generic(method, path, "{}", content_type="application/json")

    assert response.status_code == 422
    error = response.json()["error"]
    assert error["code"] == "invalid_text" and error["message"].startswith(named)


def test_it_refuses_a_control_character_in_a_page_query_or_form(owner, catalog):
    client = owner.browser_client()

    picker = client.get("/offers/?gpu=h100%00")
    new_cluster = client.post("/clusters/new/", {"offer": f"use2{NUL}", "nodes": "2"})
    form = client.post("/offers/quote/", {**quote(), "notes": f"70B{NUL} model"})

    for response in (picker, new_cluster, form):
        assert response.status_code == 400
        assert "holds the control character U+0000" in response.content.decode()
    assert not QuoteRequest.objects.exists()


def test_it_keeps_tabs_and_line_breaks_in_text_that_spans_lines(owner, catalog):
    notes = "Pre-training a 70B model.\r\n\tThen fine-tuning."

    api = owner.api().post("/api/v1/quotes", quote(notes=notes), content_type="application/json")
    page = owner.browser_client().post("/offers/quote/", {**quote(), "notes": notes})

    assert api.status_code == 201 and page.status_code == 302
    assert list(QuoteRequest.objects.values_list("notes", flat=True)) == [notes, notes]


def test_it_says_which_character_it_refused():
    assert refused_character("fine\ttext\n") is None
    assert refused_character("fine\ttext", one_line=True) == "the control character U+0009"
    assert refused_character("a\x7fb") == "the control character U+007F"
    assert refused_character("\udc80") == "a lone surrogate U+DC80"
    assert refused_character("café ☕ 日本") is None
    check_json({"deep": [{"ok": ["fine", 1, 2.5, None, True]}]})
