"""Acceptance on the Ethernet we sell (issue 18, D3; in rounds since issue 38): the batch measures
in rounds of pairs that never share a link (`measure_turn` and `measure_peer` in the agent's
answers), against a minimum from the machine type's expected link, and a slow link fails the
cluster naming the node it belongs to, with its peer and the peer's own figure."""

from __future__ import annotations

import pytest

from clusters.lifecycle import agent_token
from clusters.lifecycle.rules import MEASURE_TURN_SECONDS, acceptance_minimum_mbit
from clusters.machines import runcrate_agent
from clusters.machines.simulated import SimulatedDriver
from clusters.models import Cluster, Node
from clusters.telemetry.agent_service import check_in_seconds
from offers.models import Location, MachineType
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
    acceptance = {
        "latency_ms": 0.3,
        "bandwidth_mbit": 900.0,
        "method": "iperf3",
        "error": None,
        "shared": "nfs" if n.index else None,
        "shared_error": None,
    }
    return post(
        client, n, "network", {"reachability": dict.fromkeys(peers, True), "acceptance": acceptance}
    )


def network_of(project, clock, monkeypatch, *, at_once: int | None):
    """A 5-node cluster whose agents all checked in: every node in step `network`, none has
    reported (the simulated agents' reports are held back; the test's requests are the agents),
    in a location whose fabric carries `at_once` measurements at once (None: a round's all)."""
    monkeypatch.setattr(SimulatedDriver, "network_due", lambda self, n, **kw: False)
    machine_type = inventory(hosts=5, boot_seconds=BOOT)
    Location.objects.filter(pk=machine_type.location_id).update(measurements_at_once=at_once)
    with Sim() as sim:
        cluster = create(project, machine_type, nodes=5)
        sim.run_until(clock, at(BOOT * 1.25))
        assert set(cluster.nodes.values_list("step", flat=True)) == {Node.Step.NETWORK}
        yield cluster, sim


@pytest.fixture
def in_network(project, clock, monkeypatch):
    yield from network_of(project, clock, monkeypatch, at_once=None)


@pytest.fixture
def one_at_a_time(project, clock, monkeypatch):
    yield from network_of(project, clock, monkeypatch, at_once=1)


def test_the_nodes_measure_in_rounds_each_told_its_peer(in_network, client):
    cluster, sim = in_network
    # Five nodes: round 1 pairs node-0 -> node-1 and node-2 -> node-3, round 2 node-1 -> node-2
    # and node-3 -> node-4, round 3 node-4 -> node-0 (clusters/lifecycle/rounds.py).
    assert turns(client, cluster) == {
        "node-0": True,
        "node-1": False,
        "node-2": True,
        "node-3": False,
        "node-4": False,
    }
    told = {
        n.name: post(client, n, "check-in", {"gpus": []})["measure_peer"]
        for n in cluster.nodes.order_by("index")
    }
    assert {name: peer["name"] for name, peer in told.items()} == {
        "node-0": "node-1",
        "node-1": "node-2",
        "node-2": "node-3",
        "node-3": "node-4",
        "node-4": "node-0",
    }
    assert told["node-2"]["private_ip"] == node(cluster, 3).private_ip

    for measuring in (["node-0", "node-2"], ["node-1", "node-3"], ["node-4"]):
        seen = turns(client, cluster)
        assert sorted(name for name, turn in seen.items() if turn) == measuring, seen
        for name in measuring:
            answer = report(client, cluster, name)
            assert answer["measure_turn"] is False  # a node that reported does not measure again
            assert answer["measure_peer"] is None
            sim.tick()  # the reconciler judges each report as it comes

    assert set(turns(client, cluster).values()) == {False}
    sim.tick()
    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.READY
    rows = cluster.acceptance["nodes"]
    assert [(row["name"], row["round"], row["peer"]) for row in rows] == [
        ("node-0", 1, "node-1"),
        ("node-1", 2, "node-2"),
        ("node-2", 1, "node-3"),
        ("node-3", 2, "node-4"),
        ("node-4", 3, "node-0"),
    ]
    assert rows[4]["bandwidth_mbit"] == 900.0


def test_a_round_waits_for_every_sender_of_the_round_before_it(in_network, client):
    cluster, _ = in_network
    report(client, cluster, "node-0")
    # node-2 is measuring (it has not reported): round 2 waits, however often they ask.
    for _ in range(3):
        assert turns(client, cluster) == {
            "node-0": False,
            "node-1": False,
            "node-2": True,
            "node-3": False,
            "node-4": False,
        }
    report(client, cluster, "node-2")
    assert turns(client, cluster) | {"node-4": None} == {
        "node-0": False,
        "node-1": True,
        "node-2": False,
        "node-3": True,
        "node-4": None,
    }
    assert turns(client, cluster)["node-4"] is False  # round 3


def test_the_network_step_allows_a_turn_for_each_round_not_each_worker(in_network):
    cluster, _ = in_network
    last = max(cluster.nodes.values_list("agent_at", flat=True))
    deadlines = set(cluster.nodes.values_list("step_deadline", flat=True))
    # Five nodes: three rounds (an odd batch), where turns for four workers took four.
    assert deadlines == {last + (BOOT + 3 * MEASURE_TURN_SECONDS) * (at(1) - at(0))}


def test_a_location_that_carries_one_measurement_at_once_gets_them_one_by_one(
    one_at_a_time, client
):
    cluster, sim = one_at_a_time
    # Five nodes, one at once: each round's pairs in waves of one, in the rounds' order; the
    # rounds and peers as ever (round 1: 0 -> 1, 2 -> 3; round 2: 1 -> 2, 3 -> 4; 3: 4 -> 0).
    for measuring in ("node-0", "node-2", "node-1", "node-3", "node-4"):
        for _ in range(2):  # however often they ask
            seen = turns(client, cluster)
            assert [name for name, turn in seen.items() if turn] == [measuring], seen
        report(client, cluster, measuring)
        sim.tick()

    sim.tick()
    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.READY
    rows = cluster.acceptance["nodes"]
    assert [(row["name"], row["round"], row["peer"]) for row in rows] == [
        ("node-0", 1, "node-1"),
        ("node-1", 2, "node-2"),
        ("node-2", 1, "node-3"),
        ("node-3", 2, "node-4"),
        ("node-4", 3, "node-0"),
    ]


def test_the_network_step_allows_a_turn_for_each_wave(one_at_a_time):
    cluster, _ = one_at_a_time
    last = max(cluster.nodes.values_list("agent_at", flat=True))
    deadlines = set(cluster.nodes.values_list("step_deadline", flat=True))
    # Five measurements one at a time: five waves.
    assert deadlines == {last + (BOOT + 5 * MEASURE_TURN_SECONDS) * (at(1) - at(0))}


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
    # Named alone, with the peer it measured to (round 1: node-2 -> node-3) and the peer's own
    # figure (node-3 -> node-0 in round 2), which tells its link from the peer's.
    assert message.startswith("node-2 moves 1,200 Mbit/s to node-3 over the private network")
    assert "in round 1; node-3's own figure is 8,000 Mbit/s" in message
    assert "at least 2,500 Mbit/s" in message and "10,000 Mbit/s link" in message
    assert "node-1" not in message and "node-0" not in message  # the healthy others


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


def test_a_slow_figure_whose_peer_never_reports_stands_at_the_deadline(project, clock, monkeypatch):
    # node-2's figure (to node-3, round 1) is slow; node-3 never reports, so the figure it is
    # compared with never comes: node-2 waits, and at the deadline its own figure stands.
    monkeypatch.setattr(SimulatedDriver, "acceptance", slow_node(2, 1200.0))
    monkeypatch.setattr(
        SimulatedDriver, "network_due", lambda self, n, *, now, last_agent_at: n.index != 3
    )
    machine_type = inventory(hosts=4, boot_seconds=BOOT)
    MachineType.objects.filter(pk=machine_type.pk).update(link_mbit=10_000)
    with Sim() as sim:
        cluster = create(project, machine_type, nodes=4)
        last_agent = at(BOOT * 1.25)
        allowed = BOOT + 2 * MEASURE_TURN_SECONDS  # four nodes: two rounds
        sim.run_until(clock, last_agent + (allowed - 1) * (at(1) - at(0)))
        cluster.refresh_from_db()
        assert cluster.status == Cluster.Status.PROVISIONING  # node-2 waits, named by nobody
        assert node(cluster, 2).network_at is None
        sim.run_until(clock, last_agent + allowed * (at(1) - at(0)))

    assert_failed_cleanly(cluster, machine_type)
    assert (cluster.failure_reason, cluster.failure_node) == ("acceptance_failed", "node-2")
    message = cluster.failure_message
    assert message.startswith("node-2 moves 1,200 Mbit/s to node-3 over the private network")
    assert "own figure" not in message  # node-3 reported none


def test_a_node_waiting_to_measure_checks_in_every_second_until_it_reported(in_network, client):
    cluster, sim = in_network
    seconds = {
        n.name: post(client, n, "check-in", {"gpus": []})["check_in_seconds"]
        for n in cluster.nodes.order_by("index")
    }
    # Waiting for its peers or its round, each is asked to check in every second, not every 5 s.
    assert seconds == dict.fromkeys(seconds, 1.0)
    answer = report(client, cluster, "node-0")
    assert answer["check_in_seconds"] is None  # it reported: the agent's own interval again
    assert post(client, node(cluster, 0), "check-in", {"gpus": []})["check_in_seconds"] is None


def test_the_waiting_check_ins_of_a_big_cluster_are_bounded_per_second():
    waiting = Node(status=Node.Status.STARTING, step=Node.Step.AGENT)
    # Just checked in (its step moves on to network at the next pass) or waiting to measure:
    # at most 16 check-ins a second from one cluster's waiting nodes, never slower than 5 s.
    assert [check_in_seconds(waiting, n) for n in (2, 16, 32, 64, 254)] == [1, 1, 2, 4, 5]
    done = Node(status=Node.Status.JOINED, step=Node.Step.DONE)
    assert check_in_seconds(done, 8) is None
