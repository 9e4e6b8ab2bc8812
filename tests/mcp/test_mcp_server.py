"""`runcrate mcp` driven by the MCP SDK's own client over stdio, against a live server: the tools
and their schemas, offers as the API gives them, plan → create → wait → terminate on the
simulated data center, and a create refused without the plan's token."""

import json
import sys
from concurrent import futures
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal

import anyio
import pytest
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from accounts import keys
from clusters.models import Cluster
from tests.cli.kit import REPO, drive_until
from tests.clusters.lifecycle_kit import create, inventory
from tests.factories import HostFactory, MachineTypeFactory
from tests.mcp.aio import run_async

pytestmark = pytest.mark.django_db(transaction=True)

TOOLS = {
    "list_gpus",
    "list_offers",
    "plan_cluster",
    "create_cluster",
    "list_clusters",
    "get_cluster",
    "wait_for_cluster",
    "get_connect_info",
    "run_network_test",
    "terminate_cluster",
    "list_volumes",
    "get_balance",
}
SESSION_SECONDS = 60


def talk(env, tmp_path, conversation):
    """Start `runcrate mcp` over stdio, run `conversation(session)` and return its result."""

    async def main():
        server = StdioServerParameters(
            command=sys.executable, args=["-m", "runcrate_cli", "mcp"], env=env, cwd=REPO
        )
        with anyio.fail_after(SESSION_SECONDS), (tmp_path / "mcp.err").open("w") as errlog:
            async with (
                stdio_client(server, errlog=errlog) as (read, write),
                ClientSession(read, write) as session,
            ):
                await session.initialize()
                return await conversation(session)

    return run_async(main)


def talk_while_ticking(env, tmp_path, ticker, conversation):
    """The same, in a thread, while this thread drives the simulated data center."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        future = pool.submit(talk, env, tmp_path, conversation)
        drive_until(
            lambda seconds: bool(futures.wait([future], timeout=seconds).done),
            drive=ticker,
            timeout=SESSION_SECONDS + 5,
        )
        return future.result()


def payload(result) -> dict:
    """A tool's answer: the JSON its text content carries."""
    assert not result.is_error, result.content[0].text
    return json.loads(result.content[0].text)


def test_it_lists_the_tools_with_their_input_schemas(env, tmp_path):
    async def conversation(session):
        return (await session.list_tools()).tools

    tools = {tool.name: tool for tool in talk(env, tmp_path, conversation)}

    assert set(tools) == TOOLS
    offers = tools["list_offers"].input_schema
    assert offers["properties"]["gpu"]["type"] == "string"
    assert offers["properties"]["nodes"]["type"] == "integer"
    assert offers["properties"]["include_community"] == {
        "default": False,
        "description": "Also list community hosts (independent operators: no secrets).",
        "title": "Include Community",
        "type": "boolean",
    }
    assert set(offers["required"]) == {"gpu", "nodes"}
    create_schema = tools["create_cluster"].input_schema
    assert "confirmation_token" in create_schema["required"]
    assert "billed per second" in tools["create_cluster"].description
    assert "Free" in tools["plan_cluster"].description
    wait_schema = tools["wait_for_cluster"].input_schema["properties"]["timeout_seconds"]
    assert wait_schema["default"] == 600


def test_list_offers_with_community_hosts_matches_the_api(env, tmp_path, account):
    datacenter = inventory(hosts=2)
    community = MachineTypeFactory(gpu=datacenter.gpu, community=True)
    HostFactory.create_batch(2, machine_type=community)

    async def conversation(session):
        args = {"gpu": datacenter.gpu.slug, "nodes": 2}
        with_community = await session.call_tool("list_offers", {**args, "include_community": True})
        without = await session.call_tool("list_offers", args)
        return payload(with_community), payload(without)

    with_community, without = talk(env, tmp_path, conversation)

    api = f"/offers?gpu={datacenter.gpu.slug}&nodes=2"
    assert with_community["offers"] == account.api_data(api + "&include_community=true")
    assert {o["id"] for o in with_community["offers"]} == {datacenter.slug, community.slug}
    assert without["offers"] == account.api_data(api)
    assert [o["id"] for o in without["offers"]] == [datacenter.slug]


def test_it_plans_creates_waits_for_and_terminates_a_cluster(env, tmp_path, account, ticker):
    offer = inventory(hosts=3, price="25.00")
    plan_args = {"gpu": offer.gpu.slug, "offer_id": offer.slug, "nodes": 2, "name": "agent"}

    async def conversation(session):
        plan = payload(await session.call_tool("plan_cluster", plan_args))
        created = payload(
            await session.call_tool(
                "create_cluster",
                {
                    "offer_id": offer.slug,
                    "nodes": 2,
                    "name": "agent",
                    "confirmation_token": plan["confirmation_token"],
                },
            )
        )
        cluster_id = created["cluster"]["id"]
        waited = payload(
            await session.call_tool(
                "wait_for_cluster", {"cluster": cluster_id, "timeout_seconds": 30}
            )
        )
        connect = payload(await session.call_tool("get_connect_info", {"cluster": "agent"}))
        terminated = payload(await session.call_tool("terminate_cluster", {"cluster": cluster_id}))
        return plan, created, waited, connect, terminated

    plan, created, waited, connect, terminated = talk_while_ticking(
        env, tmp_path, ticker, conversation
    )

    assert plan["price_per_hour"] == "50.00" and plan["machine_price_per_hour"] == "25.00"
    assert plan["hours_covered"] == "200.00"  # 10,000 USD at 50 USD an hour
    assert plan["free_machines"] == 3
    assert plan["offer"]["id"] == offer.slug
    assert plan["network"]["interconnect"] == "ethernet"
    assert "1-2 Gbit/s" in plan["network"]["expected"]
    assert "Slurm job arrays" in plan["network"]["suits"]
    assert plan["can_create"] is True and plan["problems"] == []
    assert created["cluster"]["status"] == "provisioning"
    assert waited["settled"] is True and waited["ready"] is True
    assert waited["cluster"]["status"] == "ready"
    assert connect["connect"]["hostfile"]["content"] == "node-0 slots=8\nnode-1 slots=8\n"
    cluster = Cluster.objects.get(project=account.project)
    # This thread ticks the simulated data center while the tool runs, and its machines stop at
    # once: the answer may already see the end the terminate began (CI's run saw "terminated").
    assert terminated["cluster"]["status"] in ("terminating", "terminated")
    assert cluster.status in (Cluster.Status.TERMINATING, Cluster.Status.TERMINATED)
    assert cluster.ready_at is not None and cluster.name == "agent"


def test_create_cluster_is_refused_without_the_plans_token(env, tmp_path, account):
    offer = inventory(hosts=3)
    create_args = {"offer_id": offer.slug, "nodes": 2, "name": "sneaky"}
    plan_args = {"gpu": offer.gpu.slug, **create_args}

    async def conversation(session):
        none = await session.call_tool("create_cluster", {**create_args, "confirmation_token": ""})
        forged = await session.call_tool(
            # Well formed (digits, a dot, 64 lowercase hex), signed by nobody.
            "create_cluster",
            {**create_args, "confirmation_token": "9999999999." + "ab" * 32},
        )
        plan = payload(await session.call_tool("plan_cluster", plan_args))
        bigger = await session.call_tool(
            "create_cluster",
            {**create_args, "nodes": 3, "confirmation_token": plan["confirmation_token"]},
        )
        renamed = await session.call_tool(
            "create_cluster",
            {**create_args, "name": "other", "confirmation_token": plan["confirmation_token"]},
        )
        return none, forged, bigger, renamed

    results = talk(env, tmp_path, conversation)

    codes = [r.structured_content["error"]["code"] for r in results]
    assert all(r.is_error for r in results)
    assert codes == [
        "confirmation_required",
        "confirmation_mismatch",
        "confirmation_mismatch",
        "confirmation_mismatch",
    ]
    assert "plan_cluster" in results[0].content[0].text
    assert not Cluster.objects.filter(project=account.project).exists()


def test_a_plan_for_an_offer_that_cannot_start_gives_no_token(env, tmp_path, account):
    offer = inventory(hosts=1)

    async def conversation(session):
        return payload(
            await session.call_tool(
                "plan_cluster",
                {"gpu": offer.gpu.slug, "offer_id": offer.slug, "nodes": 2, "name": "x"},
            )
        )

    plan = talk(env, tmp_path, conversation)

    assert plan["can_create"] is False
    assert "cannot start 2 machines now" in plan["problems"][0]
    assert "confirmation_token" not in plan


def test_api_refusals_are_tool_errors_with_the_apis_code(env, tmp_path, account):
    cluster = create(account.project, inventory(hosts=2), name="young")

    async def conversation(session):
        missing = await session.call_tool("get_cluster", {"cluster": 999999})
        early = await session.call_tool("run_network_test", {"cluster": cluster.pk})
        balance = await session.call_tool("get_balance", {})
        return missing, early, balance

    missing, early, balance = talk(env, tmp_path, conversation)

    assert missing.is_error
    assert missing.structured_content["error"]["code"] == "not_found"
    assert missing.structured_content["error"]["status"] == 404
    api = account.api().get("/api/v1/clusters/999999").json()["error"]
    assert missing.content[0].text == f"not_found: {api['message']}"
    assert early.is_error
    assert early.structured_content["error"]["code"] == "invalid_state"
    assert Decimal(payload(balance)["balance"]["balance"]) == Decimal("10000.00")


def test_the_same_token_twice_gives_the_same_cluster(env, tmp_path, account):
    offer = inventory(hosts=4)
    create_args = {"offer_id": offer.slug, "nodes": 2, "name": "retried"}

    async def conversation(session):
        plan = payload(
            await session.call_tool("plan_cluster", {"gpu": offer.gpu.slug, **create_args})
        )
        args = {**create_args, "confirmation_token": plan["confirmation_token"]}
        first = payload(await session.call_tool("create_cluster", args))
        again = payload(await session.call_tool("create_cluster", args))
        return first, again

    first, again = talk(env, tmp_path, conversation)

    assert first["cluster"]["id"] == again["cluster"]["id"]
    assert Cluster.objects.filter(project=account.project).count() == 1


def test_a_read_only_key_plans_but_cannot_create(env, tmp_path, account):
    offer = inventory(hosts=2)
    _, read_only = keys.issue_api_key(
        user=account.user, project=account.project, name="agent", scopes=["read"]
    )
    create_args = {"offer_id": offer.slug, "nodes": 2, "name": "nope"}

    async def conversation(session):
        plan = payload(
            await session.call_tool("plan_cluster", {"gpu": offer.gpu.slug, **create_args})
        )
        args = {**create_args, "confirmation_token": plan["confirmation_token"]}
        return plan, await session.call_tool("create_cluster", args)

    plan, refused = talk({**env, "RUNCRATE_API_KEY": read_only}, tmp_path, conversation)

    assert plan["balance"] is None and plan["balance_note"]  # no billing scope: no balance
    assert refused.is_error
    assert refused.structured_content["error"]["code"] == "scope_missing"
    assert refused.structured_content["error"]["status"] == 403
    assert not Cluster.objects.filter(project=account.project).exists()
