"""MCP `get_cluster_metrics` (issue 23, item 7): each live node's health and its GPUs' latest
figures, the window summed up per node (min, mean, max utilisation) instead of every point, a
window enum in its input schema, read-only, and the API's refusals as tool errors."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from clusters.telemetry import simulated_metrics
from tests.cli.kit import ready_cluster
from tests.mcp.kit import error_code, payload, talk

pytestmark = pytest.mark.django_db(transaction=True)


def test_it_answers_latest_figures_health_and_a_summary_of_the_window(
    env, tmp_path, account, ticker, clock
):
    cluster = ready_cluster(account, ticker, gpus=8)
    node_0, node_1 = cluster.nodes.order_by("index")
    cluster.health_problems = {
        "ecc": {"node": "node-1", "message": "node-1 GPU 3: 2 uncorrectable ECC errors."}
    }
    cluster.idle_since = timezone.now() - timedelta(minutes=45)  # as the idle notice sets it
    cluster.save(update_fields=["health_problems", "idle_since"])
    moments = []
    for _ in range(40):  # ten minutes of reports, every 15 s
        clock.shift(timedelta(seconds=15))
        moments.append(timezone.now())
        simulated_metrics.report()

    async def conversation(session):
        tools = {tool.name: tool for tool in (await session.list_tools()).tools}
        by_name = await session.call_tool("get_cluster_metrics", {"cluster": "train"})
        by_id = await session.call_tool(
            "get_cluster_metrics", {"cluster": cluster.pk, "window": "1h"}
        )
        return (
            tools["get_cluster_metrics"],
            payload(by_name),
            len(by_name.content[0].text),
            (payload(by_id)),
        )

    tool, data, size, hour = talk(env, tmp_path, conversation)

    assert tool.title and tool.annotations.read_only_hint is True
    assert tool.annotations.destructive_hint is False and tool.annotations.open_world_hint is False
    window = tool.input_schema["properties"]["window"]
    assert window["enum"] == ["15m", "1h", "24h", "7d"] and window["default"] == "15m"
    assert set(tool.output_schema["properties"]) >= {"nodes", "window", "idle_since", "message"}

    assert data["cluster_id"] == cluster.pk and data["window"] == "15m"
    first, second = data["nodes"]
    assert first["health"] == {"status": "healthy", "problems": []}
    assert second["health"] == {
        "status": "unhealthy",
        "problems": ["node-1 GPU 3: 2 uncorrectable ECC errors."],
    }
    last = moments[-1]
    assert [g["utilization_percent"] for g in first["gpus"]] == [
        simulated_metrics.utilization(node_0.pk, i, last) for i in range(8)
    ]
    assert first["gpus"][0]["throttle"] is not None  # the API's other figures come along
    # The window in three numbers, from every report of every GPU.
    sent = [simulated_metrics.utilization(node_1.pk, i, m) for m in moments for i in range(8)]
    summary = second["utilization"]
    assert summary["samples"] == len(sent) == 320
    assert (summary["min"], summary["max"]) == (min(sent), max(sent))
    assert summary["mean"] == pytest.approx(sum(sent) / len(sent))
    assert "series" not in second
    assert "unhealthy: node-1" in data["message"] and "2 live nodes" in data["message"]
    # The page's idle notice, in its words, ten minutes of reports later.
    assert data["idle_notice"].startswith("16 GPUs idle for 55 min, costing $")
    assert data["idle_notice"] + " (nothing is stopped)" in data["message"]
    # Far smaller than the API's answer, which carries every point.
    api = account.api_data(f"/clusters/{cluster.pk}/metrics")
    assert size * 5 < len(json.dumps(api, separators=(",", ":")))
    # The hour reads the minutes' rollups: none yet (the beat has not run), so no samples.
    assert hour["window"] == "1h" and hour["nodes"][0]["utilization"]["samples"] == 0


def test_it_refuses_an_unknown_cluster_and_another_window(env, tmp_path, account):
    async def conversation(session):
        unknown = await session.call_tool("get_cluster_metrics", {"cluster": "nowhere"})
        wrong = await session.call_tool("get_cluster_metrics", {"cluster": 1, "window": "2d"})
        return unknown, wrong

    unknown, wrong = talk(env, tmp_path, conversation)

    assert error_code(unknown) == "not_found"
    assert wrong.is_error and "window" in wrong.content[0].text
