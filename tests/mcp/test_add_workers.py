"""MCP `plan_add_workers` and `add_workers` (issue 37): the plan-token pattern of `plan_cluster`
and `create_cluster`, for machines added to a ready cluster. The plan is the server's
(POST /api/v1/clusters/{id}/workers/plan) with its refusal otherwise; its token adds through
another `runcrate mcp` server, for the planned count only, and once: the same call again adds
nothing more."""

import pytest

from accounts.models import Environment
from clusters.models import Node
from tests.cli.kit import ready_cluster
from tests.mcp.kit import error_code, payload, talk

pytestmark = pytest.mark.django_db(transaction=True)


def live(cluster) -> int:
    return cluster.nodes.filter(status__in=Node.LIVE).count()


def test_a_planned_token_adds_the_workers_through_another_server_once(
    env, tmp_path, account, ticker
):
    cluster = ready_cluster(account, ticker, hosts=4, price="20.00")

    async def plan(session):
        return payload(
            await session.call_tool("plan_add_workers", {"cluster": "train", "count": 2})
        )

    planned = talk(env, tmp_path, plan, name="planner")
    token = planned["plan"]["plan_token"]

    async def add(session):
        asked = {"cluster": cluster.pk, "count": 2, "plan_token": token}
        other = await session.call_tool("add_workers", {**asked, "count": 1})
        added = await session.call_tool("add_workers", asked)
        again = await session.call_tool("add_workers", asked)
        return other, payload(added), again

    other, added, again = talk(env, tmp_path, add)

    assert planned["can_add"] is True and "error" not in planned
    plan = planned["plan"]
    assert (plan["count"], plan["machines_now"], plan["machines_after"]) == (2, 2, 4)
    assert plan["added_price_per_hour"] == "40.00"
    assert (plan["price_per_hour"], plan["new_price_per_hour"]) == ("40.00", "80.00")
    assert plan["billing"].startswith("+$40.00/h: each is billed from the moment it is up")
    assert error_code(other) == "plan_mismatch"  # planned 2, asked for 1: nothing added
    names = [m["name"] for m in added["cluster"]["machines"]]
    assert names == ["node-0", "node-1", "node-2", "node-3"]
    assert error_code(again) == "plan_mismatch"  # the cluster grew since: never twice
    assert live(cluster) == 4


def test_the_plan_says_why_it_cannot_and_the_add_needs_a_token(env, tmp_path, account, ticker):
    cluster = ready_cluster(account, ticker, hosts=3, price="20.00")
    Environment.objects.filter(pk=cluster.environment_id).update(monthly_budget=0)

    async def conversation(session):
        refused = payload(
            await session.call_tool("plan_add_workers", {"cluster": "train", "count": 1})
        )
        missing = await session.call_tool("add_workers", {"cluster": "train", "count": 1})
        return refused, missing

    refused, missing = talk(env, tmp_path, conversation)

    assert refused["can_add"] is False and "plan" not in refused
    assert refused["error"]["code"] == "budget_reached" and refused["error"]["status"] == 402
    assert "its whole monthly budget of $0.00" in refused["error"]["message"]
    assert missing.is_error and "plan_token" in missing.content[0].text  # the schema's
    assert live(cluster) == 2
