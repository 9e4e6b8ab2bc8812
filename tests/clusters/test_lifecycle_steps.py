"""SPEC §3's step table, row by row, with time_machine moving the clock: each step's deadline,
each fault failing the whole cluster at the right step and instant, all or nothing."""

from datetime import timedelta

import pytest
import time_machine

from billing.models import UsageRecord
from clusters.lifecycle.rules import MEASURE_TURN_SECONDS
from clusters.machines.base import CheckResult, CheckState
from clusters.machines.simulated import SimulatedDriver
from clusters.models import Cluster, Event, Node
from offers.models import Host
from tests.clusters.lifecycle_kit import (
    T0,
    Sim,
    assert_failed_cleanly,
    at,
    create,
    free_hosts,
    inventory,
    node,
)

BOOT = 180  # seconds: a VM's default boot time


def failure_event(cluster: Cluster) -> Event:
    return cluster.events.get(reason=cluster.failure_reason)


# --- the happy path -------------------------------------------------------------------------


def test_it_joins_every_node_and_starts_billing_for_all_at_one_instant(project, clock):
    machine_type = inventory(hosts=3, boot_seconds=BOOT)
    with Sim() as sim:
        cluster = create(project, machine_type, nodes=3)
        node0 = node(cluster, 0)
        assert node0.step == Node.Step.RUNNING
        assert node0.step_deadline == at(2 * BOOT)  # 2 × boot from the reservation
        assert node0.private_ip == "10.77.0.1"
        assert Host.objects.filter(machine_type=machine_type, state="reserved").count() == 3

        sim.run_until(clock, at(BOOT - 5))
        assert node(cluster, 2).step == Node.Step.RUNNING

        sim.run_until(clock, at(BOOT))
        node0 = node(cluster, 0)
        assert node0.step == Node.Step.AGENT
        assert node0.running_at == at(BOOT)
        assert node0.step_deadline == at(2 * BOOT)  # 1 × boot from running

        sim.run_until(clock, at(BOOT * 1.25))  # the agents check in
        node0 = node(cluster, 0)
        assert node0.step == Node.Step.NETWORK
        assert node0.agent_at == at(BOOT * 1.25)
        assert len(node0.gpus) == 8
        # 1 × boot from the moment the last agent checked in, and a turn for each wave of
        # measurements (three nodes: an odd batch, three rounds, each one wave where the
        # location gives no measurements_at_once; clusters/lifecycle/rounds.py)
        assert node0.step_deadline == at(BOOT * 2.25 + 3 * MEASURE_TURN_SECONDS)

        sim.run_until(clock, at(BOOT * 1.5))

    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.READY
    assert cluster.joined_at == cluster.ready_at == at(BOOT * 1.5)
    records = UsageRecord.objects.filter(cluster=cluster)
    assert records.count() == 3
    assert {r.started_at for r in records} == {cluster.joined_at}
    assert {r.price_per_hour for r in records} == {machine_type.price_per_hour}
    assert set(cluster.nodes.values_list("status", flat=True)) == {Node.Status.JOINED}
    assert Host.objects.filter(machine_type=machine_type, state="in_use").count() == 3
    reasons = list(cluster.events.values_list("reason", flat=True))
    assert reasons[0] == "created" and reasons[-2:] == ["joined", "ready"]
    assert reasons.count("machine_running") == reasons.count("network_ok") == 3


def test_it_runs_the_simulation_faster_but_keeps_the_real_deadlines(project, clock, settings):
    settings.RUNCRATE_SIM_SPEED = 10
    machine_type = inventory(hosts=2, boot_seconds=BOOT)
    with Sim() as sim:
        cluster = create(project, machine_type)
        assert node(cluster, 0).step_deadline == at(2 * BOOT)
        sim.run_until(clock, at(BOOT / 10 * 1.5), every=4.5)
    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.READY
    assert cluster.joined_at == at(27)


# --- running ----------------------------------------------------------------------------


def test_it_fails_a_machine_that_never_boots_at_twice_its_boot_time(project, clock):
    machine_type = inventory(hosts=3, boot_seconds=BOOT, faults={1: "boot"})
    with Sim() as sim:
        cluster = create(project, machine_type, nodes=3)
        sim.run_until(clock, at(2 * BOOT - 1))
        cluster.refresh_from_db()
        assert cluster.status == Cluster.Status.PROVISIONING
        assert node(cluster, 0).step == Node.Step.NETWORK  # the healthy ones moved on

        sim.run_until(clock, at(2 * BOOT))

    assert_failed_cleanly(cluster, machine_type)
    assert (cluster.failure_reason, cluster.failure_node, cluster.failure_step) == (
        "boot_timeout",
        "node-1",
        "running",
    )
    event = failure_event(cluster)
    assert event.at == at(2 * BOOT)
    assert event.node.name == "node-1" and event.step == "running"
    assert "node-1" in event.message and "6 minutes" in event.message
    assert node(cluster, 1).status == Node.Status.FAILED
    assert node(cluster, 0).status == Node.Status.ENDED


def test_it_fails_a_machine_that_comes_up_then_crashes(project, clock):
    machine_type = inventory(hosts=2, boot_seconds=BOOT, faults={0: "crash"})
    with Sim() as sim:
        cluster = create(project, machine_type)
        sim.run_until(clock, at(BOOT))
        assert node(cluster, 0).step == Node.Step.AGENT  # it came up
        sim.run_until(clock, at(BOOT + BOOT / 8 - 0.5))
        cluster.refresh_from_db()
        assert cluster.status == Cluster.Status.PROVISIONING
        sim.run_until(clock, at(BOOT + BOOT / 8))

    assert_failed_cleanly(cluster, machine_type)
    assert (cluster.failure_reason, cluster.failure_node, cluster.failure_step) == (
        "machine_failed",
        "node-0",
        "agent",
    )
    assert failure_event(cluster).at == at(BOOT + BOOT / 8)
    assert "stopped responding" in cluster.failure_message


# --- agent ------------------------------------------------------------------------------


def test_it_fails_an_agent_that_never_checks_in_one_boot_time_after_running(project, clock):
    machine_type = inventory(hosts=4, boot_seconds=BOOT, faults={3: "agent"})
    with Sim() as sim:
        cluster = create(project, machine_type, nodes=4)
        sim.run_until(clock, at(2 * BOOT - 1))
        assert node(cluster, 3).step == Node.Step.AGENT
        assert node(cluster, 3).step_deadline == at(2 * BOOT)
        sim.run_until(clock, at(2 * BOOT))

    assert_failed_cleanly(cluster, machine_type)
    assert (cluster.failure_reason, cluster.failure_node, cluster.failure_step) == (
        "agent_timeout",
        "node-3",
        "agent",
    )
    event = failure_event(cluster)
    assert event.node.name == "node-3" and event.step == "agent" and event.at == at(2 * BOOT)


def test_it_fails_a_machine_with_the_wrong_gpus(project, clock, monkeypatch):
    original = SimulatedDriver.agent_gpus
    monkeypatch.setattr(SimulatedDriver, "agent_gpus", lambda self, n: original(self, n)[:4])
    machine_type = inventory(hosts=2, boot_seconds=BOOT)
    with Sim() as sim:
        cluster = create(project, machine_type)
        sim.run_until(clock, at(BOOT * 1.25))

    assert_failed_cleanly(cluster, machine_type)
    assert cluster.failure_reason == "hardware_mismatch"
    assert cluster.failure_step == "agent"
    assert "reports 4 GPUs" in cluster.failure_message
    assert "NVIDIA H100" in failure_event(cluster).output


# --- network ----------------------------------------------------------------------------


def test_it_fails_a_node_that_cannot_reach_a_peer_with_the_matrix(project, clock):
    machine_type = inventory(hosts=3, boot_seconds=BOOT, faults={1: "network"})
    with Sim() as sim:
        cluster = create(project, machine_type, nodes=3)
        sim.run_until(clock, at(BOOT * 1.5 - 1))
        cluster.refresh_from_db()
        assert cluster.status == Cluster.Status.PROVISIONING
        sim.run_until(clock, at(BOOT * 1.5))

    assert_failed_cleanly(cluster, machine_type)
    assert (cluster.failure_reason, cluster.failure_node, cluster.failure_step) == (
        "network_unreachable",
        "node-1",
        "network",
    )
    assert "node-1 cannot reach node-2" in cluster.failure_message
    matrix = failure_event(cluster).output.splitlines()
    assert matrix[0].split()[-3:] == ["node-0", "node-1", "node-2"]
    assert matrix[2].split() == ["node-1", "ok", "-", "FAIL"]


def test_it_fails_a_node_whose_network_report_never_comes(project, clock, monkeypatch):
    monkeypatch.setattr(
        SimulatedDriver,
        "network_due",
        lambda self, n, *, now, last_agent_at: n.index != 1,
    )
    machine_type = inventory(hosts=2, boot_seconds=BOOT)
    with Sim() as sim:
        cluster = create(project, machine_type)
        last_agent = at(BOOT * 1.25)
        allowed = BOOT + 2 * MEASURE_TURN_SECONDS  # the boot time, and the two rounds
        sim.run_until(clock, last_agent + timedelta(seconds=allowed - 1))
        cluster.refresh_from_db()
        assert cluster.status == Cluster.Status.PROVISIONING
        assert node(cluster, 0).network_at is not None
        sim.run_until(clock, last_agent + timedelta(seconds=allowed))

    assert_failed_cleanly(cluster, machine_type)
    assert (cluster.failure_reason, cluster.failure_node, cluster.failure_step) == (
        "network_timeout",
        "node-1",
        "network",
    )
    assert "?" in failure_event(cluster).output


# --- floors and caps --------------------------------------------------------------------


def test_it_never_gives_a_step_less_than_the_minimum(project, clock, settings):
    settings.RUNCRATE_MIN_STEP_SECONDS = 30
    machine_type = inventory(hosts=2, boot_seconds=5, faults={0: "boot"})
    with Sim() as sim:
        cluster = create(project, machine_type)
        assert node(cluster, 0).step_deadline == at(30)  # not 2 × 5 s
        sim.run_until(clock, at(29), every=5)
        cluster.refresh_from_db()
        assert cluster.status == Cluster.Status.PROVISIONING
        assert node(cluster, 1).step == Node.Step.NETWORK
        assert node(cluster, 1).step_deadline is None  # waits for node-0's agent
        sim.run_until(clock, at(30))
    assert_failed_cleanly(cluster, machine_type)
    assert cluster.failure_reason == "boot_timeout"
    assert "at least 30 seconds" in cluster.failure_message


@pytest.mark.parametrize(("slow_boot", "minutes"), [(False, 25), (True, 45)])
def test_it_waits_for_nothing_past_the_clusters_limit(project, clock, slow_boot, minutes):
    machine_type = inventory(hosts=2, boot_seconds=1800, slow_boot=slow_boot, faults={1: "boot"})
    with Sim() as sim:
        cluster = create(project, machine_type)
        limit = at(minutes * 60)
        assert cluster.give_up_at == limit
        assert node(cluster, 1).step_deadline == limit  # 2 × 30 min, capped
        sim.run_until(clock, limit - timedelta(seconds=1), every=300)
        cluster.refresh_from_db()
        assert cluster.status == Cluster.Status.PROVISIONING
        sim.run_until(clock, limit)
    assert_failed_cleanly(cluster, machine_type)
    assert failure_event(cluster).at == limit
    assert f"nothing waits past {minutes} minutes" in cluster.failure_message


# --- installing ----------------------------------------------------------------------------


@pytest.mark.parametrize("software", ["slurm", "kubernetes", "ray"])
def test_it_installs_the_software_and_checks_it_before_ready(project, clock, software):
    machine_type = inventory(hosts=2, boot_seconds=BOOT)
    with Sim() as sim:
        cluster = create(project, machine_type, software=software)
        sim.run_until(clock, at(BOOT * 1.5))
        cluster.refresh_from_db()
        assert cluster.status == Cluster.Status.INSTALLING
        assert cluster.joined_at == at(BOOT * 1.5)
        assert UsageRecord.objects.filter(cluster=cluster).count() == 2  # billed from joining
        assert node(cluster, 0).step == Node.Step.INSTALL
        assert node(cluster, 0).driver_state["check"]["state"] == "pending"

        sim.run_until(clock, at(BOOT * 2))  # the software settles s/2 after installing

    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.READY
    assert cluster.ready_at == at(BOOT * 2)
    assert set(cluster.nodes.values_list("step", flat=True)) == {Node.Step.DONE}
    check = node(cluster, 0).driver_state["check"]
    assert check["state"] == "ready" and check["ready"] == ["node-0", "node-1"]
    assert list(cluster.events.values_list("reason", flat=True))[-2:] == ["installed", "ready"]


def test_it_degrades_a_cluster_whose_install_fails_and_keeps_billing(project, clock):
    machine_type = inventory(hosts=3, boot_seconds=BOOT, faults={2: "install"})
    with Sim() as sim:
        cluster = create(project, machine_type, nodes=3, software="slurm")
        sim.run_until(clock, at(BOOT * 2))

    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.DEGRADED
    event = cluster.events.get(reason="install_failed")
    assert event.node.name == "node-2" and event.step == "install"
    assert "FAILED" in event.output
    assert event.notification == "degraded"
    assert UsageRecord.objects.filter(cluster=cluster, ended_at__isnull=True).count() == 3
    assert Host.objects.filter(machine_type=machine_type, state="in_use").count() == 3
    assert free_hosts(machine_type) == 0


def test_it_degrades_a_cluster_whose_software_never_becomes_ready(project, clock, monkeypatch):
    def never_ready(self, node, *, plan, now):
        return CheckResult(
            state=CheckState.PENDING,
            ready_nodes=frozenset({"node-0"}),
            problems={"node-1": "state idle* (needs idle)"},
            output="node-0|idle|gpu:h100:8\nnode-1|idle*|gpu:h100:8\n",
        )

    monkeypatch.setattr(SimulatedDriver, "check", never_ready)
    machine_type = inventory(hosts=2, boot_seconds=BOOT)
    with Sim() as sim:
        cluster = create(project, machine_type, software="slurm")
        joined = at(BOOT * 1.5)
        sim.run_until(clock, joined)
        assert node(cluster, 1).step_deadline == joined + timedelta(minutes=15)
        sim.run_until(clock, joined + timedelta(minutes=15) - timedelta(seconds=5), every=300)
        cluster.refresh_from_db()
        assert cluster.status == Cluster.Status.INSTALLING
        sim.run_until(clock, joined + timedelta(minutes=15))

    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.DEGRADED
    event = cluster.events.get(reason="install_timeout")
    assert event.node.name == "node-1"
    assert "idle*" in event.message and "idle*" in event.output


# --- cost -----------------------------------------------------------------------------------


def advance_queries(project, size: int, at_seconds: float, *, reports_first: bool) -> int:
    """Queries of the one `advance` that moves every node of a `size`-node cluster at once;
    with `reports_first`, of the one write-back that lands every agent's network report and
    advances the cluster on them (it joins)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from clusters import lifecycle

    machine_type = inventory(hosts=size, boot_seconds=BOOT)
    with time_machine.travel(T0, tick=False) as clock, Sim() as sim:
        cluster = create(project, machine_type, nodes=size)
        sim.run_until(clock, at(at_seconds - 1))
        clock.move_to(at(at_seconds))
        if reports_first:  # the agents' network reports are handed out; nobody has run them
            lifecycle.advance(cluster_id=cluster.pk)
            leases = [(node_id, token) for node_id, action, token in sim.dispatcher.work]
            assert {action for _, action, _ in sim.dispatcher.work} == {"network"}
            assert len(leases) == size
            with CaptureQueriesContext(connection) as queries:
                assert lifecycle.do_work(action="network", leases=leases) == size
            cluster.refresh_from_db()
            assert cluster.status == Cluster.Status.READY  # every node joined in this pass
            return len(queries.captured_queries)
        with CaptureQueriesContext(connection) as queries:
            done = lifecycle.advance(cluster_id=cluster.pk)
    assert len(done) >= size  # every node moved in this one pass
    return len(queries.captured_queries)


def test_it_sees_every_machine_up_in_the_same_queries_for_any_size(project):
    assert advance_queries(project, 2, BOOT, reports_first=False) == advance_queries(
        project, 16, BOOT, reports_first=False
    )


def test_it_joins_any_size_in_the_same_queries(project):
    joining = [advance_queries(project, size, BOOT * 1.5, reports_first=True) for size in (2, 16)]
    assert joining[0] == joining[1]
    assert Cluster.objects.filter(status="ready").count() == 2
