"""The plan is the server's (`POST /api/v1/clusters/plan`): `plan_cluster` says it can create
exactly when the create would succeed, with the create's own refusal otherwise, and its
`plan_token`, signed by the server, creates through any `runcrate mcp` process, for the planned
body only and for ten minutes.

This replaces the tests of the per-process confirmation token (`Plans`), which is gone: the
server signs and checks the token now."""

import json
from datetime import timedelta

import pytest

from accounts import keys
from clusters.models import Cluster
from tests.cli.kit import funded_account
from tests.clusters.lifecycle_kit import create, inventory
from tests.mcp.kit import error_code, payload, talk

pytestmark = pytest.mark.django_db(transaction=True)


def plan(env, tmp_path, arguments: dict, *, name: str = "planner", process: bool = False) -> dict:
    """Plan in a `runcrate mcp` server of its own (a real process with `process=True`), which
    then ends."""

    async def conversation(session):
        return payload(await session.call_tool("plan_cluster", arguments))

    return talk(env, tmp_path, conversation, name=name, process=process)


def create_with(env, tmp_path, arguments: dict, *, name: str = "creator", times: int = 1):
    """Create through another `runcrate mcp` server: the results of `times` calls."""

    async def conversation(session):
        return [await session.call_tool("create_cluster", arguments) for _ in range(times)]

    return talk(env, tmp_path, conversation, name=name)


def test_a_token_from_one_process_creates_through_another(env, tmp_path, account):
    offer = inventory(hosts=3)
    args = {"offer_id": offer.slug, "nodes": 2, "name": "moved"}

    # Planned in a real process, created through servers in this one: nothing of a plan stays
    # in the process that made it.
    planned = plan(env, tmp_path, args, process=True)
    token = planned["plan"]["plan_token"]
    first, again = create_with(env, tmp_path, {**args, "plan_token": token}, times=2)
    (later,) = create_with(env, tmp_path, {**args, "plan_token": token}, name="third")

    assert planned["can_create"] is True
    assert payload(first)["cluster"]["name"] == "moved"
    # The same token again, from the same process or a third one: the same cluster, never two.
    assert payload(again)["cluster"]["id"] == payload(first)["cluster"]["id"]
    assert payload(later)["cluster"]["id"] == payload(first)["cluster"]["id"]
    assert Cluster.objects.filter(project=account.project).count() == 1


def test_a_changed_body_is_plan_mismatch(env, tmp_path, account):
    offer = inventory(hosts=4)
    args = {"offer_id": offer.slug, "nodes": 2, "name": "planned"}
    token = plan(env, tmp_path, args)["plan"]["plan_token"]

    changes = [{"nodes": 3}, {"name": "other"}, {"software": "slurm"}, {"environment": "prod"}]

    async def conversation(session):
        changed = [
            await session.call_tool("create_cluster", {**args, **change, "plan_token": token})
            for change in changes
        ]
        forged = await session.call_tool(
            "create_cluster", {**args, "plan_token": token[:-4] + "AAAA"}
        )
        empty = await session.call_tool("create_cluster", {**args, "plan_token": ""})
        missing = await session.call_tool("create_cluster", args)
        return changed, forged, empty, missing

    changed, forged, empty, missing = talk(env, tmp_path, conversation, name="changer")

    assert [error_code(r) for r in changed] == ["plan_mismatch"] * len(changes)
    assert {r.structured_content["error"]["status"] for r in changed} == {422}
    assert error_code(forged) == "plan_mismatch"
    # No token at all never reaches the API: the tool's schema requires one.
    for refused in (empty, missing):
        assert refused.is_error and "plan_token" in refused.content[0].text
    assert not Cluster.objects.filter(project=account.project).exists()


def test_an_eleven_minute_old_token_is_plan_expired(env, tmp_path, account, clock):
    offer = inventory(hosts=3)
    args = {"offer_id": offer.slug, "nodes": 2, "name": "late"}
    token = plan(env, tmp_path, args)["plan"]["plan_token"]

    clock.shift(timedelta(minutes=11))  # the live server's clock: it runs in this process
    (late,) = create_with(env, tmp_path, {**args, "plan_token": token})

    assert error_code(late) == "plan_expired"
    assert late.structured_content["error"]["status"] == 422
    assert not Cluster.objects.filter(project=account.project).exists()


# --- the plan says "can create" exactly when the create would succeed -------------------------


def _low_balance(account, offer):
    poor = funded_account(balance="5.00")
    return poor.key, {"name": "poor"}


def _name_taken(account, offer):
    create(account.project, offer, name="taken")
    return account.key, {"name": "taken"}


def _bad_name(account, offer):
    return account.key, {"name": "Not_A_Label"}


def _unknown_environment(account, offer):
    return account.key, {"environment": "nowhere"}


def _too_many_machines(account, offer):
    return account.key, {"nodes": 5}  # the offer has 3 free


def _read_only_key(account, offer):
    _, key = keys.issue_api_key(
        user=account.user, project=account.project, name="reader", scopes=["read"]
    )
    return key, {}


def _machine_cap(account, offer):
    _, key = keys.issue_api_key(
        user=account.user, project=account.project, name="capped", max_machines_per_cluster=2
    )
    return key, {"nodes": 3}


@pytest.mark.parametrize(
    "refusal",
    [
        _low_balance,
        _name_taken,
        _bad_name,
        _unknown_environment,
        _too_many_machines,
        _read_only_key,
        _machine_cap,
    ],
)
def test_a_plan_that_cannot_create_is_the_creates_own_refusal(env, tmp_path, account, refusal):
    offer = inventory(hosts=3)
    key, change = refusal(account, offer)
    args = {"offer_id": offer.slug, "nodes": 2, "name": "wanted", **change}
    before = Cluster.objects.count()

    planned = plan({**env, "RUNCRATE_API_KEY": key}, tmp_path, args)
    created = account.api().post(
        "/api/v1/clusters",
        data=json.dumps(args),
        content_type="application/json",
        headers={"authorization": f"Bearer {key}"},
    )

    assert planned["can_create"] is False and "plan" not in planned
    refused = created.json()["error"]
    assert planned["error"] == {
        "code": refused["code"],
        "message": refused["message"],
        "status": created.status_code,
    }
    assert Cluster.objects.count() == before  # neither reserved anything
