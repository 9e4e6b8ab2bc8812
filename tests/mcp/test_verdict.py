"""The network test's verdict: one rule (mcp_server.VERDICT_RULE), from the figures the server
gives, since the server says what Ethernet is expected to give but sets no threshold."""

import pytest

from runcrate_cli.mcp_server import (
    BELOW_ETHERNET,
    MIN_AGENT_GBITS,
    MIN_NCCL_BUSBW_GBS,
    PASSED,
    network_verdict,
    progress,
)


def nccl(peak):
    return {"state": "done", "method": "nccl", "peak_busbw_gbs": peak, "pairs": None}


def agent(*rates):
    pairs = [{"node": f"node-{i + 1}", "to": "node-0", "gbit_s": r} for i, r in enumerate(rates)]
    return {"state": "done", "method": "agent", "peak_busbw_gbs": None, "pairs": pairs}


@pytest.mark.parametrize(
    ("test", "verdict"),
    [
        (nccl(0.21), PASSED),
        (nccl(MIN_NCCL_BUSBW_GBS), PASSED),  # the lower end of the expected range passes
        (nccl(0.09), BELOW_ETHERNET),
        (agent(1.8, 1.2), PASSED),
        (agent(1.8, MIN_AGENT_GBITS), PASSED),
        (agent(1.8, 0.4), BELOW_ETHERNET),  # one slow machine is enough
        (agent(1.8, None), BELOW_ETHERNET),  # a machine that could not be measured
        ({"state": "running", "method": None}, None),
        ({"state": "failed", "method": None, "error": "node-1 is down"}, None),
        (nccl(None), None),
    ],
)
def test_the_verdict_follows_the_one_rule(test, verdict):
    assert network_verdict(test) == verdict


def machines(*steps):
    return [
        {"name": f"node-{i}", "step": step, "status": "joined" if step == "done" else "starting"}
        for i, step in enumerate(steps)
    ]


def test_progress_counts_steps_in_machines_and_names_the_step_furthest_behind():
    starting = {"status": "provisioning", "nodes": 2, "machines": machines("running", "agent")}
    halfway = {"status": "installing", "nodes": 2, "machines": machines("done", "network")}
    ready = {"status": "ready", "nodes": 2, "machines": machines("done", "done")}

    assert progress(starting) == (0.25, 2, "provisioning: 0 of 2 machines up, step running")
    assert progress(halfway) == (1.5, 2, "installing: 1 of 2 machines up, step network")
    assert progress(ready) == (2.0, 2, "ready: 2 of 2 machines up")
