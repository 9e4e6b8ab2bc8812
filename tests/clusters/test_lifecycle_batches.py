"""How per-node work is handed out: a driver that batches (the simulated data center) gets one
task per piece of work for a cluster's nodes, any other driver one task per node."""

import pytest

from clusters import lifecycle
from clusters.machines.simulated import SimulatedDriver
from clusters.models import Cluster, Node
from tests.clusters.lifecycle_kit import T0, Sim, create, inventory

BOOT = 180


class Recording(lifecycle.CollectingDispatcher):
    def __init__(self) -> None:
        super().__init__()
        self.handed: list[tuple[str, int]] = []  # (action, nodes in the task)

    def node_work(self, action, leases):
        self.handed.append((action.split(":")[0], len(leases)))
        super().node_work(action, leases)


def boot(project, clock, *, nodes: int) -> tuple[Cluster, Recording]:
    machine_type = inventory(hosts=nodes, boot_seconds=BOOT)
    sim = Sim()
    sim.dispatcher = Recording()
    with sim:
        cluster = create(project, machine_type, nodes=nodes)
        sim.run_until(clock, T0.replace(minute=5), every=15)
    cluster.refresh_from_db()
    return cluster, sim.dispatcher


def test_it_hands_a_clusters_nodes_each_piece_of_work_in_one_task(project, clock):
    cluster, dispatcher = boot(project, clock, nodes=4)

    assert cluster.status == Cluster.Status.READY
    assert dispatcher.handed == [("start", 4), ("agent", 4), ("network", 4)]


def test_it_hands_a_slow_drivers_nodes_one_task_each(project, clock, monkeypatch):
    monkeypatch.setattr(SimulatedDriver, "batches_work", False)  # as the ssh driver does
    cluster, dispatcher = boot(project, clock, nodes=3)

    assert cluster.status == Cluster.Status.READY
    assert sorted(dispatcher.handed) == sorted(
        [(kind, 1) for kind in ("start", "agent", "network") for _ in range(3)]
    )
    assert set(cluster.nodes.values_list("status", flat=True)) == {Node.Status.JOINED}


@pytest.mark.parametrize("taken_back", [0, 1])
def test_a_batch_writes_back_only_the_results_whose_lease_still_holds(project, clock, taken_back):
    machine_type = inventory(hosts=2, boot_seconds=BOOT)
    with Sim() as sim:
        cluster = create(project, machine_type, nodes=2)
        lifecycle.advance(cluster_id=cluster.pk)
        leases = [(node_id, token) for node_id, _, token in sim.dispatcher.work]
        sim.dispatcher.work.clear()
        taken = leases[taken_back]
        Node.objects.filter(pk=taken[0]).update(lease_token="someone-else")

        assert lifecycle.do_work(action="start", leases=leases) == 1

    kept = Node.objects.get(pk=leases[1 - taken_back][0])
    lost = Node.objects.get(pk=taken[0])
    assert kept.driver_state["start"]["ok"] and kept.lease_token == ""
    assert "start" not in lost.driver_state and lost.lease_token == "someone-else"


def test_the_simulated_agent_reports_through_the_agents_own_checks(project, clock):
    # Its report goes through clusters.telemetry.agent_service as the HTTP endpoints' does: a token
    # that
    # is not the node's is refused, and the refusal is what the write-back records.
    machine_type = inventory(hosts=2, boot_seconds=BOOT)
    with Sim() as sim:
        cluster = create(project, machine_type, nodes=2)
        sim.tick()  # started
        clock.move_to(T0.replace(minute=4))
        lifecycle.advance(cluster_id=cluster.pk)  # the machines run; the agents are due
        handed = [w for w in sim.dispatcher.work if w[1] == "agent"]
        assert len(handed) == 2
        Node.objects.filter(pk=handed[0][0]).update(agent_token_hash="0" * 64)
        sim.dispatcher.run()

    refused = Node.objects.get(pk=handed[0][0])
    heard = Node.objects.get(pk=handed[1][0])
    assert refused.agent_at is None
    assert refused.driver_state["agent"]["ok"] is False
    assert "AgentRefused" in refused.driver_state["agent"]["error"]
    assert heard.agent_at is not None and heard.gpus
    assert heard.driver_state["agent"]["ok"] is True
