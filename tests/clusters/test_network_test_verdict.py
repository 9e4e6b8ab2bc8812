"""The network test's verdict is one rule on the server (lifecycle.network_test.verdict), which
the API's network_test carries and the CLI and the MCP server show: passed at the lower end of
what the Ethernet private network is expected to give, or below it."""

import pytest

from clusters.lifecycle.network_test import (
    BELOW_ETHERNET,
    MIN_AGENT_GBITS,
    MIN_NCCL_BUSBW_GBS,
    PASSED,
    verdict,
)


def nccl(peak):
    return {"state": "done", "method": "nccl", "peak_busbw_gbs": peak, "pairs": None}


def agent(*rates):
    pairs = [{"node": f"node-{i + 1}", "to": "node-0", "gbit_s": r} for i, r in enumerate(rates)]
    return {"state": "done", "method": "agent", "peak_busbw_gbs": None, "pairs": pairs}


@pytest.mark.parametrize(
    ("test", "expected"),
    [
        (nccl(0.21), PASSED),
        (nccl(MIN_NCCL_BUSBW_GBS), PASSED),  # the lower end of the expected range passes
        (nccl(0.09), BELOW_ETHERNET),
        (agent(1.8, 1.2), PASSED),
        (agent(1.8, MIN_AGENT_GBITS), PASSED),
        (agent(1.8, 0.4), BELOW_ETHERNET),  # one slow machine is enough
        (agent(1.8, None), BELOW_ETHERNET),  # a machine that could not be measured
        ({"state": "running", "method": None, "peak_busbw_gbs": None, "pairs": None}, None),
        ({"state": "failed", "method": None, "peak_busbw_gbs": None, "pairs": None}, None),
        (nccl(None), None),
    ],
)
def test_the_verdict_follows_the_one_rule(test, expected):
    assert verdict(**test) == expected
