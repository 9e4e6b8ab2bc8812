"""`runcrate mcp` driven by the MCP SDK's own client over stdio, against a live server: the tools,
their titles, annotations and schemas, compact structured answers, offers as the API gives
them, plan → create → wait → terminate on the simulated data center, SSH keys, the network
test's verdict, and the API's refusals as tool errors."""

import base64
import importlib.metadata
import threading

import pytest

from accounts.models import SshKey
from clusters.models import Cluster
from tests.cli.kit import drive_until, ready_cluster
from tests.clusters.lifecycle_kit import create, inventory
from tests.factories import HostFactory, MachineTypeFactory
from tests.mcp.kit import error_code, payload, talk, talk_while

pytestmark = pytest.mark.django_db(transaction=True)

# Each tool, and what is true of it: (readOnlyHint, destructiveHint, idempotentHint).
TOOLS = {
    "list_gpus": (True, False, True),
    "list_offers": (True, False, True),
    "plan_cluster": (True, False, True),
    "create_cluster": (False, False, True),  # the same token again: the same cluster
    "list_clusters": (True, False, True),
    "get_cluster": (True, False, True),
    "wait_for_cluster": (True, False, True),
    "get_connect_info": (True, False, True),
    "get_cluster_metrics": (True, False, True),
    "run_network_test": (False, False, False),  # each call measures again
    "plan_replace_node": (True, False, True),
    # The machine replaced is released; the same token again while the new one starts is
    # refused, never a second machine.
    "replace_node": (False, True, True),
    "set_repair_policy": (False, False, True),
    "plan_add_workers": (True, False, True),
    # The token binds the cluster's size: the same call again once they were added is
    # refused (plan_mismatch), never a second add.
    "add_workers": (False, False, True),
    "terminate_cluster": (False, True, True),
    "list_volumes": (True, False, True),
    "get_balance": (True, False, True),
    "list_ssh_keys": (True, False, True),
    "add_ssh_key": (False, False, True),  # the same key again: ssh_key_exists, nothing added
}


def public_key(seed: int) -> str:
    """A well-formed OpenSSH ed25519 public key line."""
    blob = b"\x00\x00\x00\x0bssh-ed25519\x00\x00\x00\x20" + bytes([seed]) * 32
    return f"ssh-ed25519 {base64.b64encode(blob).decode()} agent@laptop"


def test_every_tool_has_a_title_annotations_and_schemas(env, tmp_path):
    async def conversation(session):
        info = await session.initialize()
        return info, (await session.list_tools()).tools

    info, listed = talk(env, tmp_path, conversation)
    tools = {tool.name: tool for tool in listed}

    assert info.server_info.version == importlib.metadata.version("runcrate-clusters-cli")
    assert set(tools) == set(TOOLS)
    for name, (read_only, destructive, idempotent) in TOOLS.items():
        tool = tools[name]
        assert tool.title, name
        hints = tool.annotations
        assert (hints.read_only_hint, hints.destructive_hint, hints.idempotent_hint) == (
            read_only,
            destructive,
            idempotent,
        ), name
        assert hints.open_world_hint is False, name  # only the caller's own project
        assert tool.output_schema and tool.output_schema["type"] == "object", name
    create_schema = tools["create_cluster"].input_schema
    assert set(create_schema["required"]) == {"offer_id", "nodes", "name", "plan_token"}
    nodes = create_schema["properties"]["nodes"]
    assert (nodes["type"], nodes["minimum"], nodes["maximum"]) == ("integer", 2, 64)
    software = create_schema["properties"]["software"]
    assert software["enum"] == ["none", "slurm", "kubernetes", "ray"]
    assert software["default"] == "none"
    assert tools["list_offers"].input_schema["properties"]["nodes"]["maximum"] == 64
    wait = tools["wait_for_cluster"].input_schema["properties"]["timeout_seconds"]
    assert wait["maximum"] == 50 and wait["default"] == 50
    events = tools["get_cluster"].input_schema["properties"]["events"]
    assert events["type"] == "boolean" and events["default"] is False
    assert "billed per second" in tools["create_cluster"].description
    assert "Free" in tools["plan_cluster"].description
    plan_output = tools["plan_cluster"].output_schema["properties"]
    assert {"can_create", "plan", "error"} <= set(plan_output)


def test_out_of_bounds_arguments_are_refused_before_the_api(env, tmp_path, account):
    offer = inventory(hosts=2)

    async def conversation(session):
        one = await session.call_tool("list_offers", {"gpu": offer.gpu.slug, "nodes": 1})
        many = await session.call_tool("list_offers", {"gpu": offer.gpu.slug, "nodes": 65})
        docker = await session.call_tool(
            "plan_cluster",
            {"offer_id": offer.slug, "nodes": 2, "name": "x", "software": "docker"},
        )
        return one, many, docker

    for refused in talk(env, tmp_path, conversation):
        assert refused.is_error
        assert refused.content[0].text.startswith("Error executing tool")


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
    args = {"offer_id": offer.slug, "nodes": 2, "name": "agent"}
    # The beat runs in this thread while the conversation runs in another; the conversation
    # stops it before it terminates, so the answer's state is known: no tick can end the
    # machines between the terminate and its answer.
    gate, stopped = threading.Lock(), threading.Event()

    def beat() -> None:
        with gate:
            if not stopped.is_set():
                ticker()

    async def conversation(session):
        plan = payload(await session.call_tool("plan_cluster", args))
        token = plan["plan"]["plan_token"]
        created = payload(await session.call_tool("create_cluster", {**args, "plan_token": token}))
        cluster_id = created["cluster"]["id"]
        waited = payload(
            await session.call_tool(
                "wait_for_cluster", {"cluster": cluster_id, "timeout_seconds": 30}
            )
        )
        connect = payload(await session.call_tool("get_connect_info", {"cluster": "agent"}))
        with gate:  # a tick under way ends first
            stopped.set()
        terminated = payload(await session.call_tool("terminate_cluster", {"cluster": cluster_id}))
        return plan, created, waited, connect, terminated

    plan, created, waited, connect, terminated = talk_while(env, tmp_path, beat, conversation)

    assert plan["can_create"] is True and "error" not in plan
    planned = plan["plan"]
    assert planned["price_per_hour"] == "50.00" and planned["machine_price_per_hour"] == "25.00"
    assert planned["hours_covered"] == "200.00"  # 10,000 USD at 50 USD an hour, nothing running
    assert planned["gpus_total"] == 16 and planned["nodes"] == 2 and planned["name"] == "agent"
    assert planned["network"]["interconnect"] == "ethernet"
    assert created["cluster"]["status"] == "provisioning"
    assert waited["settled"] is True and waited["ready"] is True
    assert waited["cluster"]["status"] == "ready"
    assert connect["connect"]["hostfile"]["content"] == "node-0 slots=8\nnode-1 slots=8\n"
    cluster = Cluster.objects.get(project=account.project)
    assert terminated["cluster"]["status"] == "terminating"
    assert cluster.status == Cluster.Status.TERMINATING
    assert cluster.ready_at is not None and cluster.name == "agent"

    def ended(_seconds: float) -> bool:
        cluster.refresh_from_db()
        return cluster.status == Cluster.Status.TERMINATED

    drive_until(ended, drive=ticker, timeout=30)  # the beat again: the machines stop


def test_get_cluster_gives_its_events_only_when_asked(env, tmp_path, account):
    cluster = create(account.project, inventory(hosts=2), name="quiet")

    async def conversation(session):
        plain = payload(await session.call_tool("get_cluster", {"cluster": cluster.pk}))
        full = await session.call_tool("get_cluster", {"cluster": "quiet", "events": True})
        return plain, payload(full), len(full.content[0].text)

    plain, full, size = talk(env, tmp_path, conversation)

    api = account.api_data(f"/clusters/{cluster.pk}")
    assert "events" not in plain["cluster"]
    assert full["cluster"]["events"] == api["events"] and api["events"]
    assert plain["cluster"] == {k: v for k, v in full["cluster"].items() if k != "events"}
    assert size < 3000


def test_it_lists_and_adds_ssh_keys(env, tmp_path, account):
    async def conversation(session):
        added = payload(
            await session.call_tool("add_ssh_key", {"public_key": public_key(7), "name": "laptop"})
        )
        again = await session.call_tool("add_ssh_key", {"public_key": public_key(7)})
        garbage = await session.call_tool("add_ssh_key", {"public_key": "not a key"})
        listed = payload(await session.call_tool("list_ssh_keys", {}))
        return added, again, garbage, listed

    added, again, garbage, listed = talk(env, tmp_path, conversation)

    assert added["ssh_key"]["name"] == "laptop"
    assert added["ssh_key"]["fingerprint"].startswith("SHA256:")
    assert error_code(again) == "ssh_key_exists"
    assert error_code(garbage) == "invalid_ssh_key"
    assert listed["ssh_keys"] == account.api_data("/ssh-keys")
    assert added["ssh_key"]["id"] in {k["id"] for k in listed["ssh_keys"]}
    assert account.project.ssh_keys.filter(name="laptop").exists()


def test_create_cluster_installs_the_keys_it_names(env, tmp_path, account):
    offer = inventory(hosts=2)
    chosen = account.project.ssh_keys.first()
    other = SshKey.objects.create(
        project=account.project, name="other", public_key=public_key(9), fingerprint="SHA256:o"
    )
    args = {"offer_id": offer.slug, "nodes": 2, "name": "keyed", "ssh_key_ids": [chosen.pk]}

    async def conversation(session):
        plan = payload(await session.call_tool("plan_cluster", args))
        token = plan["plan"]["plan_token"]
        return plan, payload(
            await session.call_tool("create_cluster", {**args, "plan_token": token})
        )

    plan, created = talk(env, tmp_path, conversation)

    assert plan["plan"]["ssh_key_ids"] == [chosen.pk]
    cluster = Cluster.objects.get(pk=created["cluster"]["id"])
    installed = set(cluster.ssh_keys.values_list("pk", flat=True))
    assert installed == {chosen.pk} and other.pk not in installed


def test_the_network_test_answers_its_figures_with_a_verdict(env, tmp_path, account, ticker, sim):
    cluster = ready_cluster(account, ticker, name="measured")

    async def conversation(session):
        arguments = {"cluster": cluster.pk, "timeout_seconds": 20}
        result = payload(await session.call_tool("run_network_test", arguments))
        read = payload(await session.call_tool("get_cluster", {"cluster": cluster.pk}))
        return result, read

    # The test's task runs once the tool has started it, as a worker would.
    result, read = talk_while(env, tmp_path, sim.dispatcher.run, conversation)

    test = result["network_test"]
    assert result["finished"] is True and test["state"] == "done"
    assert test["method"] == "nccl" and test["peak_busbw_gbs"] >= 0.1
    assert test["verdict"] == "passed"
    assert "0.1 GB/s" in test["verdict_rule"]
    assert result["message"] == "Network test done: passed."
    assert read["cluster"]["network_test"]["verdict"] == "passed"


def test_api_refusals_are_tool_errors_with_the_apis_code(env, tmp_path, account):
    cluster = create(account.project, inventory(hosts=2), name="young")

    async def conversation(session):
        missing = await session.call_tool("get_cluster", {"cluster": 999999})
        early = await session.call_tool("run_network_test", {"cluster": cluster.pk})
        balance = await session.call_tool("get_balance", {})
        return missing, early, balance

    missing, early, balance = talk(env, tmp_path, conversation)

    assert error_code(missing) == "not_found"
    assert missing.structured_content["error"]["status"] == 404
    api = account.api().get("/api/v1/clusters/999999").json()["error"]
    assert missing.content[0].text == f"not_found: {api['message']}"
    assert error_code(early) == "invalid_state"
    assert payload(balance)["balance"]["balance"] == "10000.00"
