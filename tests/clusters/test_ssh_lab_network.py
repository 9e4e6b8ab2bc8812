"""The network test on the lab's real hosts: a ready 2-host cluster (software none), the test
run through the action and its task as a user's button would, measured by the real agent
program on node-1 against node-0's real sink over the real WireGuard network (the lab's hosts
have no nccl-tests). Skipped, with the reason, where the lab cannot start."""

from __future__ import annotations

import pytest

from clusters import lifecycle
from clusters.models import Cluster, Event
from tests.clusters.lifecycle_kit import Sim, create
from tests.clusters.test_ssh_lab import (
    agent_logs,
    drive,
    machine_type,
    project_with,
    terminate_and_check,
)

pytestmark = [pytest.mark.lab, pytest.mark.django_db(transaction=True)]


def test_the_network_test_measures_node_1_to_node_0_with_the_agent(fleet, user_key):
    lab = fleet
    cluster = create(project_with(user_key), machine_type("lab-h100x2-vm"), nodes=2)
    drive(cluster, Cluster.Status.READY, Cluster.Status.FAILED)
    assert cluster.status == Cluster.Status.READY, cluster.failure_message

    with Sim() as sim:
        lifecycle.run_network_test(cluster=cluster)
        sim.dispatcher.run()  # the task: the driver's measurement, then the write-back

    cluster.refresh_from_db()
    test = cluster.network_test
    assert test["state"] == "done", f"{test.get('error')}\n{agent_logs(cluster)}"
    assert test["method"] == "agent" and test["simulated"] is False
    [pair] = test["results"]["pairs"]
    assert (pair["node"], pair["to"]) == ("node-1", "node-0")
    assert pair["gbit_s"] > 0, pair
    assert pair["tool"] in ("iperf3", "tcp-stream")
    assert pair["latency_ms"] is not None and pair["error"] is None
    done = cluster.events.get(reason=Event.Reason.NETWORK_TEST_DONE)
    assert "node-1 → node-0" in done.message
    # What the API gives, from the same result.
    report = lifecycle.network_test_report(cluster)
    assert report["pairs"] == [pair] and report["state"] == "done"
    # Nothing of the test keeps running on the host: the agent ran from stdin and exited
    # (the bracket keeps pgrep from finding the shell that runs it).
    node_1 = cluster.nodes.select_related("host").get(index=1).host.name
    leftover = lab.exec(node_1, "pgrep -f -- '--network-tes[t]'", check=False)
    assert leftover.returncode == 1, leftover.stdout

    terminate_and_check(lab, cluster)
