"""The MCP server's `list_offers` and `plan_cluster` give what each machine has (issue 37;
docs/inventory.md, "Machine specs"), as the API gives it, and their output schema names it."""

import pytest

from tests.factories import GpuModelFactory, HostFactory, LocationFactory, MachineTypeFactory
from tests.mcp.kit import payload, talk

pytestmark = pytest.mark.django_db(transaction=True)

SPECS = {
    "vcpus": 208,
    "memory_gib": 1800,
    "nvme_gib": 2048,
    "gpu_link": "nvlink",
    "os_image": "Ubuntu 22.04",
    "driver_version": "570",
    "cuda_version": "12.8",
}
WORDS = "208 vCPUs · 1.8 TiB RAM · 2 TiB NVMe · NVLink · Ubuntu 22.04 · driver 570 · CUDA 12.8"


def test_list_offers_and_the_plan_give_each_machines_specs(env, tmp_path, account):
    machine_type = MachineTypeFactory(
        slug="use2-h100x8-bm",
        gpu=GpuModelFactory(slug="h100-sxm"),
        location=LocationFactory(code="us-east-2"),
        **SPECS,
    )
    HostFactory.create_batch(2, machine_type=machine_type)

    async def conversation(session):
        tools = {tool.name: tool for tool in (await session.list_tools()).tools}
        offers = await session.call_tool("list_offers", {"gpu": "h100-sxm", "nodes": 2})
        plan = await session.call_tool(
            "plan_cluster", {"offer_id": machine_type.slug, "nodes": 2, "name": "train"}
        )
        return tools, payload(offers), payload(plan)

    tools, offers, plan = talk(env, tmp_path, conversation)

    [offer] = offers["offers"]
    assert offer["specs"] == {**SPECS, "summary": WORDS}
    assert offer == account.api_data("/offers?gpu=h100-sxm&nodes=2")[0]
    assert plan["plan"]["specs"]["summary"] == WORDS
    assert "specs" in tools["list_offers"].description
    schema = tools["list_offers"].output_schema
    assert (
        "MachineSpecs" in schema["$defs"]
        and "summary" in schema["$defs"]["MachineSpecs"]["properties"]
    )
