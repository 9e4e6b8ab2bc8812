"""Acceptance on the Ethernet we sell (issue 18, D3): workers measure their way to node-0 one at
a time (`measure_turn` in the agent's answers), against a minimum from the machine type's
expected link, and a slow link fails the cluster naming the node it belongs to."""

from __future__ import annotations

import pytest

from clusters.lifecycle import agent_token
from clusters.lifecycle.rules import MEASURE_TURN_SECONDS, acceptance_minimum_mbit
from clusters.machines import runcrate_agent
from clusters.machines.simulated import SimulatedDriver
from clusters.models import Cluster, Node
from offers.models import MachineType
from tests.clusters.lifecycle_kit import Sim, assert_failed_cleanly, at, create, inventory, node
from tests.factories import MachineTypeFactory

BOOT = 180


def post(client, n: Node, path: str, body: dict) -> dict:
    response = client.post(
        f"/api/v1/agent/nodes/{n.pk}/{path}",
        body,
        content_type="application/json",
        headers={"authorization": f"Bearer {agent_token(n)}"},
    )
    assert response.status_code == 200, response.content
    return response.json()["data"]


def turns(client, cluster: Cluster) -> dict[str, bool]:
    """Each node's `measure_turn`, as its agent's next check-in is answered."""
    return {
        n.name: post(client, n, "check-in", {"gpus": []})["measure_turn"]
        for n in cluster.nodes.order_by("index")
    }


def report(client, cluster: Cluster, name: str) -> dict:
    n = cluster.nodes.get(index=int(name.removeprefix("node-")))
    peers = [p.name for p in cluster.nodes.exclude(pk=n.pk)]
    acceptance = None
    if n.index:
        acceptance = {
            "latency_ms": 0.3,
            "bandwidth_mbit": 900.0,
            "method": "iperf3",
            "error": None,
            "shared": "nfs",
            "shared_error": None,
        }
    return post(
        client, n, "network", {"reachability": dict.fromkeys(peers, True), "acceptance": acceptance}
    )


@pytest.fixture
def in_network(project, clock, monkeypatch):
    """A 5-node cluster whose agents all checked in: every node in step `network`, none has
    reported (the simulated agents' reports are held back; the test's requests are the agents)."""
    monkeypatch.setattr(SimulatedDriver, "network_due", lambda self, n, **kw: False)
    with Sim() as sim:
        cluster = create(project, inventory(hosts=5, boot_seconds=BOOT), nodes=5)
        sim.run_until(clock, at(BOOT * 1.25))
        assert set(cluster.nodes.values_list("step", flat=True)) == {Node.Step.NETWORK}
        yield cluster, sim


def test_workers_measure_one_at_a_time_in_order_and_the_head_never_waits(in_network, client):
    cluster, sim = in_network
    seen = turns(client, cluster)
    assert seen == {
        "node-0": True,
        "node-1": True,
        "node-2": False,
        "node-3": False,
        "node-4": False,
    }

    measured = []
    for _ in range(4):
        seen = turns(client, cluster)
        workers = [name for name, turn in seen.items() if turn and name != "node-0"]
        assert len(workers) == 1, seen  # never two workers at once, never none while one waits
        measured.append(workers[0])
        if workers[0] == "node-2":  # the head reports whenever it is done, not in a turn
            assert seen["node-0"] is True
            assert report(client, cluster, "node-0")["measure_turn"] is False
        answer = report(client, cluster, workers[0])
        assert answer["measure_turn"] is False  # a node that reported does not measure again
        sim.tick()  # the reconciler judges each report as it comes

    assert measured == ["node-1", "node-2", "node-3", "node-4"]
    assert set(turns(client, cluster).values()) == {False}
    sim.tick()
    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.READY
    assert cluster.acceptance["nodes"][4]["bandwidth_mbit"] == 900.0


def test_a_worker_waits_while_the_one_before_it_measures_even_after_later_ones_check_in(
    in_network, client
):
    cluster, _ = in_network
    report(client, cluster, "node-1")
    # node-2 is measuring (it has not reported): node-3 and node-4 wait, however often they ask.
    for _ in range(3):
        assert turns(client, cluster) == {
            "node-0": True,
            "node-1": False,
            "node-2": True,
            "node-3": False,
            "node-4": False,
        }
    report(client, cluster, "node-2")
    assert turns(client, cluster)["node-3"] is True


def test_the_network_step_allows_a_turn_for_each_worker(in_network):
    cluster, _ = in_network
    last = max(cluster.nodes.values_list("agent_at", flat=True))
    deadlines = set(cluster.nodes.values_list("step_deadline", flat=True))
    assert deadlines == {last + (BOOT + 4 * MEASURE_TURN_SECONDS) * (at(1) - at(0))}


def test_the_agent_tests_the_network_only_on_its_turn():
    state = {"status": "starting", "step": "network", "peers_ready": True}
    assert runcrate_agent.network_test_due(state | {"measure_turn": True})
    assert not runcrate_agent.network_test_due(state | {"measure_turn": False})
    # A dashboard from before the turns says nothing: the agent measures as it always did.
    assert runcrate_agent.network_test_due(state)


# --- the minimum from the machine type's link --------------------------------------------------


@pytest.mark.parametrize(
    ("interconnect", "link_mbit", "minimum"),
    [
        ("ethernet", None, 250),  # the 1 Gbit/s we sell at the least
        ("ethernet", 2000, 500),
        ("infiniband", None, 2500),  # the 10 Gbit/s front end of InfiniBand machines
        ("roce", 40000, 10000),
        ("ethernet", 100, 50),  # never below RUNCRATE_ACCEPTANCE_MIN_MBIT
    ],
)
def test_the_minimum_is_a_fraction_of_the_machine_types_link(db, interconnect, link_mbit, minimum):
    machine_type = MachineTypeFactory(interconnect=interconnect, link_mbit=link_mbit)
    assert acceptance_minimum_mbit(machine_type) == minimum


def test_the_fraction_and_the_floor_are_settings(db, settings):
    machine_type = MachineTypeFactory(link_mbit=2000)
    settings.RUNCRATE_ACCEPTANCE_LINK_FRACTION = 0.5
    assert acceptance_minimum_mbit(machine_type) == 1000
    settings.RUNCRATE_ACCEPTANCE_MIN_MBIT = 1500
    assert acceptance_minimum_mbit(machine_type) == 1500


def slow_node(index: int, mbit: float):
    original = SimulatedDriver.acceptance

    def acceptance(self, n):
        measured = original(self, n)
        if n.index == index:
            measured["bandwidth_mbit"] = mbit
        return measured

    return acceptance


def test_a_slow_link_fails_the_cluster_naming_its_node_with_both_figures(
    project, clock, monkeypatch
):
    monkeypatch.setattr(SimulatedDriver, "acceptance", slow_node(2, 1200.0))
    machine_type = inventory(hosts=4, boot_seconds=BOOT)
    MachineType.objects.filter(pk=machine_type.pk).update(link_mbit=10_000)
    with Sim() as sim:
        cluster = create(project, machine_type, nodes=4)
        sim.run_until(clock, at(BOOT * 2))

    assert_failed_cleanly(cluster, machine_type)
    assert (cluster.failure_reason, cluster.failure_node, cluster.failure_step) == (
        "acceptance_failed",
        "node-2",
        "network",
    )
    message = cluster.failure_message
    assert message.startswith("node-2 moves 1,200 Mbit/s to node-0")
    assert "at least 2,500 Mbit/s" in message and "10,000 Mbit/s link" in message
    for other in ("node-1", "node-3"):  # the healthy workers (8,000 Mbit/s) are not named
        assert other not in message


def test_the_same_figure_passes_on_the_link_class_it_is_healthy_for(project, clock, monkeypatch):
    monkeypatch.setattr(SimulatedDriver, "acceptance", slow_node(2, 1200.0))
    machine_type = inventory(hosts=4, boot_seconds=BOOT)  # Ethernet, 1 Gbit/s by default
    with Sim() as sim:
        cluster = create(project, machine_type, nodes=4)
        sim.run_until(clock, at(BOOT * 2))

    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.READY, cluster.failure_message
    expected = cluster.acceptance["expected"]
    assert (expected["link_mbit"], expected["min_bandwidth_mbit"]) == (1000, 250)
    assert node(cluster, 2).acceptance["bandwidth_mbit"] == 1200.0
