"""MCP `plan_replace_node` and `replace_node` (issue 36): the plan-token pattern of
`plan_cluster` and `create_cluster`, for a lost or unhealthy worker. The plan is the server's
(POST /api/v1/clusters/{id}/nodes/{name}/replace/plan) with its refusal otherwise; its token
replaces through another `runcrate mcp` server, for the planned machine only. `get_cluster`
shows the machine replaced, its replacement and the drain; the repair policy is set at create
(`repair_policy`) and changed with `set_repair_policy`."""

import pytest
from django.utils import timezone

from clusters import lifecycle
from clusters.models import Cluster, Node
from tests.cli.kit import ready_cluster
from tests.clusters.lifecycle_kit import inventory
from tests.mcp.kit import error_code, payload, talk, talk_while

pytestmark = pytest.mark.django_db(transaction=True)


def lose(cluster: Cluster, index: int = 1) -> Node:
    """Mark the worker node-INDEX lost (its agent went silent), as the reconciler would."""
    node = cluster.nodes.get(index=index)
    assert lifecycle.mark_lost(node_id=node.pk, last_heard=timezone.now(), why="test")
    return node


def call(env, tmp_path, tool: str, arguments: dict, *, name: str):
    """One tool call in a `runcrate mcp` server of its own, which then ends."""

    async def conversation(session):
        return await session.call_tool(tool, arguments)

    return talk(env, tmp_path, conversation, name=name)


def test_a_planned_token_replaces_the_lost_worker_through_another_server(
    env, tmp_path, account, ticker
):
    # Slurm: the lost machine is drained from its scheduling, which get_cluster shows.
    cluster = ready_cluster(account, ticker, hosts=3, price="20.00", software="slurm")
    lost = lose(cluster)
    node_1 = {"cluster": "train", "node": "node-1"}

    planned = payload(call(env, tmp_path, "plan_replace_node", node_1, name="planner"))
    token = planned["plan"]["plan_token"]

    async def conversation(session):
        replaced = await session.call_tool("replace_node", {**node_1, "plan_token": token})
        again = await session.call_tool("replace_node", {**node_1, "plan_token": token})
        waited = await session.call_tool(
            "wait_for_cluster", {"cluster": cluster.pk, "timeout_seconds": 30}
        )
        read = await session.call_tool("get_cluster", {"cluster": cluster.pk})
        return payload(replaced), again, payload(waited), payload(read)

    replaced, again, waited, read = talk_while(env, tmp_path, ticker, conversation)

    assert planned["can_replace"] is True and "error" not in planned
    plan = planned["plan"]
    assert (plan["node"], plan["private_ip"]) == ("node-1", lost.private_ip)
    assert (plan["price_per_hour"], plan["cluster_price_per_hour"]) == ("20.00", "40.00")
    assert plan["billing"].startswith("node-1's billing ended at its last heartbeat")
    new = Node.objects.get(cluster=cluster, replaces=lost)
    machines = {m["id"]: m for m in replaced["cluster"]["machines"]}
    assert machines[new.pk]["status"] == "starting" and machines[new.pk]["name"] == "node-1"
    # The same call again while the new machine starts: refused, never a second machine.
    assert error_code(again) == "replacement_in_progress"
    assert Node.objects.filter(cluster=cluster, replaces__isnull=False).count() == 1
    # The machine replaced is not one of the cluster's any more: 2 of 2 up, not 2 of 3.
    assert waited["ready"] is True and waited["message"] == "ready: 2 of 2 machines up", waited[
        "message"
    ]
    shown = {m["id"]: m for m in read["cluster"]["machines"]}
    assert read["cluster"]["repair_policy"] == "ask"
    assert shown[lost.pk]["replaced_by"] == new.pk
    assert shown[lost.pk]["drained"].startswith("it was lost")
    assert shown[new.pk]["replaces"] == lost.pk and shown[new.pk]["drained"] is None
    assert read["cluster"]["machines"] == account.api_data(f"/clusters/{cluster.pk}")["machines"]


def test_node_0_is_refused_at_the_plan_and_a_token_is_for_its_own_machine(
    env, tmp_path, account, ticker
):
    cluster = ready_cluster(account, ticker, hosts=3)
    lose(cluster)

    async def conversation(session):
        head = payload(
            await session.call_tool("plan_replace_node", {"cluster": "train", "node": "node-0"})
        )
        planned = payload(
            await session.call_tool("plan_replace_node", {"cluster": "train", "node": "node-1"})
        )
        token = planned["plan"]["plan_token"]
        other = await session.call_tool(
            "replace_node", {"cluster": "train", "node": "node-0", "plan_token": token}
        )
        missing = await session.call_tool("replace_node", {"cluster": "train", "node": "node-1"})
        return head, other, missing

    head, other, missing = talk(env, tmp_path, conversation)

    assert head["can_replace"] is False and "plan" not in head
    assert head["error"]["code"] == "head_not_replaceable"
    assert head["error"]["status"] == 409
    assert head["error"]["message"].startswith("node-0 is the cluster's head: it holds /shared")
    assert error_code(other) == "plan_mismatch"  # node-1's plan does not replace node-0
    assert missing.is_error and "plan_token" in missing.content[0].text  # the schema's
    assert not Node.objects.filter(cluster=cluster, replaces__isnull=False).exists()


def test_the_repair_policy_is_planned_created_and_changed(env, tmp_path, account):
    offer = inventory(hosts=2)
    args = {"offer_id": offer.slug, "nodes": 2, "name": "healing", "repair_policy": "auto"}

    async def conversation(session):
        plan = payload(await session.call_tool("plan_cluster", args))
        token = plan["plan"]["plan_token"]
        asking = {k: v for k, v in args.items() if k != "repair_policy"}
        other = await session.call_tool("create_cluster", {**asking, "plan_token": token})
        created = payload(await session.call_tool("create_cluster", {**args, "plan_token": token}))
        changed = payload(
            await session.call_tool(
                "set_repair_policy", {"cluster": "healing", "repair_policy": "ask"}
            )
        )
        bogus = await session.call_tool(
            "set_repair_policy", {"cluster": "healing", "repair_policy": "often"}
        )
        return plan, other, created, changed, bogus

    plan, other, created, changed, bogus = talk(env, tmp_path, conversation)

    assert plan["plan"]["repair_policy"] == "auto"
    assert error_code(other) == "plan_mismatch"  # planned auto, asked to create with ask
    assert created["cluster"]["repair_policy"] == "auto"
    assert changed["cluster"]["repair_policy"] == "ask"
    assert bogus.is_error and bogus.content[0].text.startswith("Error executing tool")
    cluster = Cluster.objects.get(project=account.project)
    assert cluster.repair_policy == Cluster.RepairPolicy.ASK
