"""The plan is the server's (`POST /api/v1/clusters/plan`, docs/api.md "Planning a create"):
it takes the create's body, runs every check the create runs and reserves nothing. For each
refusal the plan answers exactly what the create then answers (status, code and message);
otherwise it answers the plan and a `plan_token` that any process honours, bound to the body,
the project and the key, and valid 10 minutes."""

from datetime import timedelta
from decimal import Decimal

import pytest
import time_machine
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from accounts import keys
from accounts.models import Environment, SshKey
from clusters import lifecycle
from clusters.models import Cluster
from offers.models import Host, MachineType
from tests.billing.conftest import bill_cluster
from tests.clusters.front import credit, machine_type_with_hosts, ssh_key
from tests.factories import LocationFactory

SLUG = "use2-h100x8-vm"
PLAN, CREATE = "/api/v1/clusters/plan", "/api/v1/clusters"


@pytest.fixture(autouse=True)
def _work_in_memory():
    with lifecycle.dispatching_to(lifecycle.CollectingDispatcher()):
        yield


@pytest.fixture
def offer(owner) -> MachineType:
    """6 free machines of 8 GPUs at 24 USD an hour, an SSH key and 500 USD."""
    ssh_key(owner.project)
    credit(owner.project, "500.00")
    return machine_type_with_hosts(
        free=6,
        slug=SLUG,
        price_per_hour=Decimal("24.00"),
        gpus_per_machine=8,
        location=LocationFactory(code="us-east-2"),
    )


def agent(person, **terms) -> Client:
    _, raw = keys.issue_api_key(user=person.user, project=person.project, name="agent", **terms)
    return Client(headers={"authorization": f"Bearer {raw}"})


def body(**fields) -> dict:
    return {"name": "train", "offer_id": SLUG, "nodes": 2, "software": "none", **fields}


def post(client: Client, path: str, data: dict):
    return client.post(path, data, content_type="application/json")


def answer(response) -> tuple[int, str, str]:
    error = response.json()["error"]
    return response.status_code, error["code"], error["message"]


def reserved() -> int:
    return Host.objects.exclude(state=Host.State.FREE).count()


def _balance_below_the_floor(owner, offer):
    credit(owner.project, "-495.00")  # 5 USD: under the 10 USD floor
    return owner.api(), body()


def _below_an_hour_with_a_cluster_running(owner, offer):
    bill_cluster(owner.project, size=2, price="10.00")  # 20 USD/h already running
    credit(owner.project, "-460.00")  # 40 USD: under one hour of 48 USD/h
    return owner.api(), body()


def _read_only_key(owner, offer):
    return agent(owner, scopes=["read"]), body()


def _machine_cap(owner, offer):
    return agent(owner, max_machines_per_cluster=2), body(nodes=3)


def _usd_cap(owner, offer):
    return agent(owner, max_usd_per_hour="40"), body()


def _bad_name(owner, offer):
    return owner.api(), body(name="Not_A-Label")


def _name_in_use(owner, offer):
    bill_cluster(owner.project, name="train", price="1.00")
    return owner.api(), body()


def _unknown_environment(owner, offer):
    return owner.api(), body(environment="staging")


def _budget_reached(owner, offer):
    Environment.objects.filter(project=owner.project).update(monthly_budget=Decimal("0.00"))
    return owner.api(), body()


def _not_enough_machines(owner, offer):
    return owner.api(), body(nodes=7)


def _no_ssh_keys(owner, offer):
    SshKey.objects.filter(project=owner.project).delete()
    return owner.api(), body()


REFUSALS = {
    _balance_below_the_floor: (402, "insufficient_balance"),
    _below_an_hour_with_a_cluster_running: (402, "insufficient_balance"),
    _read_only_key: (403, "scope_missing"),
    _machine_cap: (403, "key_limit_exceeded"),
    _usd_cap: (403, "key_limit_exceeded"),
    _bad_name: (422, "invalid_name"),
    _name_in_use: (409, "name_taken"),
    _unknown_environment: (404, "unknown_environment"),
    _budget_reached: (402, "budget_reached"),
    _not_enough_machines: (409, "not_enough_machines"),
    _no_ssh_keys: (422, "no_ssh_keys"),
}


@pytest.mark.parametrize("case", list(REFUSALS), ids=lambda case: case.__name__.strip("_"))
def test_the_plan_refuses_exactly_as_the_create_does(owner, offer, case):
    client, request = case(owner, offer)
    before = (reserved(), Cluster.objects.count())

    planned = answer(post(client, PLAN, request))
    assert (reserved(), Cluster.objects.count()) == before  # the plan reserved nothing
    created = answer(post(client, CREATE, request))

    assert planned[:2] == REFUSALS[case]
    assert planned == created  # the same status, code and message
    assert (reserved(), Cluster.objects.count()) == before


def test_a_plan_says_what_the_cluster_costs_beside_what_already_runs(owner, offer):
    bill_cluster(owner.project, size=2, price="12.00")  # 24 USD/h already running
    held = reserved()

    response = post(owner.api(), PLAN, body(software="slurm"))

    assert response.status_code == 200, response.content
    plan = response.json()["data"]
    assert reserved() == held and not Cluster.objects.filter(name="train").exists()
    assert (plan["nodes"], plan["gpus_per_machine"], plan["gpus_total"]) == (2, 8, 16)
    assert plan["price_per_hour"] == "48.00"
    assert plan["machine_price_per_hour"] == "24.00"
    assert plan["price_per_gpu_hour"] == "3.00"
    assert (plan["balance"], plan["running_price_per_hour"]) == ("500.00", "24.00")
    assert plan["hours_covered"] == "6.94"  # 500 / (48 + 24), not 500 / 48
    assert plan["balance_needed"] == "48.00"
    assert plan["ssh_key_ids"] == list(owner.project.ssh_keys.values_list("pk", flat=True))
    assert plan["ready_estimate_seconds"] > 0
    assert plan["network"]["interconnect"] == "ethernet" and "LoRA" in plan["network"]["suits"]
    assert plan["plan_token"]


def test_a_key_that_does_not_see_billing_plans_without_the_balance(owner, offer):
    plan = post(agent(owner, scopes=["read", "create"]), PLAN, body()).json()["data"]

    assert plan["balance"] is plan["running_price_per_hour"] is plan["hours_covered"] is None
    assert plan["price_per_hour"] == "48.00" and plan["plan_token"]


def test_a_plan_reads_the_balance_only_for_whoever_is_shown_it(owner, offer):
    sees, blind = agent(owner), agent(owner, scopes=["read", "create"])
    post(sees, PLAN, body())  # the first request of each warms what is cached
    post(blind, PLAN, body())

    with CaptureQueriesContext(connection) as shown:
        post(sees, PLAN, body())
    with CaptureQueriesContext(connection) as hidden:
        post(blind, PLAN, body())

    # usage.summary's two queries (the balance, the burn rate), for the billing key alone.
    assert len(shown) - len(hidden) == 2, [q["sql"] for q in shown]


def test_a_planned_body_creates_with_its_token(owner, offer):
    client = agent(owner)
    token = post(client, PLAN, body()).json()["data"]["plan_token"]

    response = post(client, CREATE, {**body(), "plan_token": token})

    assert response.status_code == 201, response.content
    assert Cluster.objects.get(name="train").size == 2


@pytest.mark.parametrize(
    "changed",
    [{"nodes": 3}, {"name": "other"}, {"software": "slurm"}, {"environment": "default"}],
    ids=["nodes", "name", "software", "same-defaults"],
)
def test_a_create_whose_body_differs_from_the_plan_is_refused(owner, offer, changed):
    client = agent(owner)
    token = post(client, PLAN, body()).json()["data"]["plan_token"]

    response = post(client, CREATE, {**body(), **changed, "plan_token": token})

    if changed == {"environment": "default"}:  # the default written out is the same body
        assert response.status_code == 201
        return
    assert answer(response)[:2] == (422, "plan_mismatch")
    assert reserved() == 0 and not Cluster.objects.exists()


def test_another_keys_or_a_forged_token_is_refused(owner, offer):
    token = post(agent(owner), PLAN, body()).json()["data"]["plan_token"]

    assert answer(post(agent(owner), CREATE, {**body(), "plan_token": token}))[:2] == (
        422,
        "plan_mismatch",
    )
    forged = token[:-4] + ("AAAA" if not token.endswith("AAAA") else "BBBB")
    assert answer(post(owner.api(), CREATE, {**body(), "plan_token": forged}))[:2] == (
        422,
        "plan_mismatch",
    )
    assert not Cluster.objects.exists()


def test_a_plan_lasts_ten_minutes(owner, offer):
    client = agent(owner)
    with time_machine.travel(timezone.now(), tick=False) as clock:
        plan = post(client, PLAN, body()).json()["data"]
        clock.shift(timedelta(minutes=11))

        status, code, message = answer(post(client, CREATE, {**body(), **plan_token(plan)}))

    assert (status, code) == (422, "plan_expired")
    assert "10 minutes" in message
    assert not Cluster.objects.exists()


def test_a_plan_made_before_a_key_rotation_is_honoured_after_it(owner, offer, settings):
    client = agent(owner)
    token = post(client, PLAN, body()).json()["data"]["plan_token"]

    settings.SECRET_KEY_FALLBACKS = [settings.SECRET_KEY]
    settings.SECRET_KEY = "a-new-secret-key-" + "x" * 40

    assert post(client, CREATE, {**body(), "plan_token": token}).status_code == 201


def test_the_plan_is_in_the_openapi_document(owner):
    schema = Client().get("/api/v1/openapi.json").json()

    operation = schema["paths"]["/api/v1/clusters/plan"]["post"]
    assert operation["summary"] == "Plan a create"
    create = schema["paths"]["/api/v1/clusters"]["post"]
    assert operation["requestBody"] == create["requestBody"]


def plan_token(plan: dict) -> dict:
    return {"plan_token": plan["plan_token"]}
