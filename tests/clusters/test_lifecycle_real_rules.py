"""The rules the real machines brought (SPEC §3): the GPU model in the hardware check, acceptance
before billing, a start the driver refuses, node transitions, and lost machines. On the
simulated data center, with the clock moved by time_machine."""

from datetime import timedelta

import pytest
from django.core import mail
from django.utils import timezone

from billing import ledger, meter
from billing.models import UsageRecord
from clusters import lifecycle
from clusters.errors import ClusterRefused
from clusters.lifecycle.work import node_plan_for
from clusters.machines.base import DriverError, MachineState, Observation
from clusters.machines.simulated import SimulatedDriver
from clusters.models import Cluster, Event, IllegalTransition, Node
from clusters.notifications import send_pending_cluster_emails
from clusters.telemetry.agent_service import agent_check_in
from offers.models import Host
from tests.clusters.lifecycle_kit import (
    Sim,
    assert_failed_cleanly,
    at,
    create,
    free_hosts,
    inventory,
    node,
)

BOOT = 180


def ready(project, clock, *, nodes=2):
    machine_type = inventory(hosts=nodes + 1, boot_seconds=BOOT)
    sim = Sim()
    with sim:
        cluster = create(project, machine_type, nodes=nodes)
        sim.run_until(clock, at(BOOT * 2))
    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.READY
    return cluster, machine_type, sim


def test_it_fails_a_node_whose_gpus_are_another_model_with_the_same_memory(
    project, clock, monkeypatch
):
    def a100s(self, n):
        return [{**gpu, "name": "NVIDIA A100-SXM4-80GB"} for gpu in original(self, n)]

    original = SimulatedDriver.agent_gpus
    monkeypatch.setattr(SimulatedDriver, "agent_gpus", a100s)
    machine_type = inventory(hosts=2, boot_seconds=BOOT)  # sells H100 SXM 80GB
    with Sim() as sim:
        cluster = create(project, machine_type)
        sim.run_until(clock, at(BOOT * 1.25))

    assert_failed_cleanly(cluster, machine_type)
    assert (cluster.failure_reason, cluster.failure_step) == ("hardware_mismatch", "agent")
    assert "reports NVIDIA A100-SXM4-80GB" in cluster.failure_message
    assert machine_type.gpu.name in cluster.failure_message


def test_it_keeps_the_acceptance_report_before_billing_starts(project, clock):
    cluster, machine_type, _ = ready(project, clock)
    report = cluster.acceptance
    assert report["measured_at"] == cluster.joined_at.isoformat()
    assert report["expected"]["gpus_per_machine"] == machine_type.gpus_per_machine
    rows = {row["name"]: row for row in report["nodes"]}
    # Two nodes measure each other in two rounds: node-0 -> node-1, then node-1 -> node-0.
    assert (rows["node-0"]["round"], rows["node-0"]["peer"]) == (1, "node-1")
    assert (rows["node-1"]["round"], rows["node-1"]["peer"]) == (2, "node-0")
    assert rows["node-0"]["bandwidth_mbit"] == 1600.0
    assert rows["node-1"]["bandwidth_mbit"] == 1600.0 and rows["node-1"]["latency_ms"] == 0.25
    assert rows["node-1"]["reachability"] == {"node-0": True}
    assert len(rows["node-1"]["gpus"]) == machine_type.gpus_per_machine
    ok = Event.objects.get(cluster=cluster, node__index=1, reason="network_ok")
    assert "1,600 Mbit/s and 0.25 ms to node-0 in round 2" in ok.message


def test_it_fails_a_node_that_moves_too_little_to_its_peer(project, clock, monkeypatch, settings):
    settings.RUNCRATE_ACCEPTANCE_MIN_MBIT = 2000
    machine_type = inventory(hosts=2, boot_seconds=BOOT)
    with Sim() as sim:
        cluster = create(project, machine_type)
        sim.run_until(clock, at(BOOT * 2))

    assert_failed_cleanly(cluster, machine_type)
    # Both links are under the floor: each node is slow on its own figure, node-0 (round 1)
    # is named first, with its peer's own figure.
    assert (cluster.failure_reason, cluster.failure_node, cluster.failure_step) == (
        "acceptance_failed",
        "node-0",
        "network",
    )
    message = cluster.failure_message
    assert message.startswith("node-0 moves 1,600 Mbit/s to node-1")
    assert "node-1's own figure is 1,600 Mbit/s" in message and "2,000" in message
    assert not UsageRecord.objects.filter(cluster=cluster).exists()


def test_it_fails_a_worker_that_could_not_mount_shared_from_node_0(project, clock, monkeypatch):
    def no_mount(self, n):
        measured = original(self, n)
        if n.index:
            measured |= {"shared": None, "shared_error": "sshfs: exit 1: Connection refused"}
        return measured

    original = SimulatedDriver.acceptance
    monkeypatch.setattr(SimulatedDriver, "acceptance", no_mount)
    machine_type = inventory(hosts=2, boot_seconds=BOOT)  # virtual machines: /shared is shared
    with Sim() as sim:
        cluster = create(project, machine_type)
        sim.run_until(clock, at(BOOT * 2))

    assert_failed_cleanly(cluster, machine_type)
    assert (cluster.failure_reason, cluster.failure_node) == ("acceptance_failed", "node-1")
    assert cluster.failure_message == (
        "node-1 could not mount /shared from node-0 (sshfs: exit 1: Connection refused)."
    )


def test_the_acceptance_report_says_how_each_worker_mounts_shared(project, clock):
    cluster, _, _ = ready(project, clock)
    rows = {row["name"]: row for row in cluster.acceptance["nodes"]}
    assert (rows["node-0"]["shared"], rows["node-1"]["shared"]) == (None, "simulated")


def test_it_fails_a_node_whose_driver_refuses_the_start_for_good(project, clock, monkeypatch):
    def refuse(self, n, *, agent_token, plan):
        if n.index == 1:
            raise DriverError("lab-2 offered host key SHA256:x", reason="host_key_mismatch")
        return original(self, n, agent_token=agent_token, plan=plan)

    original = SimulatedDriver.start
    monkeypatch.setattr(SimulatedDriver, "start", refuse)
    machine_type = inventory(hosts=2, boot_seconds=BOOT)
    with Sim() as sim:
        cluster = create(project, machine_type)
        sim.tick()
        sim.tick()

    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.FAILED
    assert (cluster.failure_reason, cluster.failure_node) == ("host_key_mismatch", "node-1")
    assert "offered host key SHA256:x" in cluster.failure_message
    # The host that offered another key is never wiped (never touched) and never free again
    # until staff look: it goes offline at once; the other is wiped and free.
    states = dict(Host.objects.filter(nodes__cluster=cluster).values_list("nodes__index", "state"))
    assert states == {0: Host.State.FREE, 1: Host.State.OFFLINE}
    event = Event.objects.get(cluster=cluster, reason="release_failed")
    assert "never touched" in event.message and event.node.index == 1
    assert not UsageRecord.objects.filter(cluster=cluster).exists()


def test_it_fails_a_machine_that_cannot_be_started_three_times(project, clock, monkeypatch):
    def unreachable(self, n, *, agent_token, plan):
        raise DriverError("could not connect to 203.0.113.7:22: timed out")

    monkeypatch.setattr(SimulatedDriver, "start", unreachable)
    machine_type = inventory(hosts=2, boot_seconds=BOOT)
    with Sim() as sim:
        cluster = create(project, machine_type)
        for attempt in range(lifecycle.START_ATTEMPTS):
            cluster.refresh_from_db()
            assert cluster.status == Cluster.Status.PROVISIONING, attempt
            sim.tick()
            clock.shift(lifecycle.RETRY_AFTER)
        sim.tick()

    assert_failed_cleanly(cluster, machine_type)
    assert cluster.failure_reason == "machine_failed"
    assert "could not connect to 203.0.113.7:22: timed out" in cluster.failure_message


def test_a_node_refuses_a_move_its_transition_table_does_not_have(db):
    n = Node(index=0, status=Node.Status.STARTING, step=Node.Step.RUNNING)
    with pytest.raises(IllegalTransition):
        n.move_to(step=Node.Step.INSTALL)  # skipping agent and network
    with pytest.raises(IllegalTransition):
        n.move_to(status=Node.Status.LOST)  # only a joined node can be lost
    n.move_to(step=Node.Step.AGENT)
    n.move_to(status=Node.Status.ENDED)
    with pytest.raises(IllegalTransition):
        n.move_to(status=Node.Status.JOINED)  # an ended node never comes back
    assert (n.status, n.step) == (Node.Status.ENDED, Node.Step.AGENT)


# --- lost machines ---------------------------------------------------------------------------


def silence(monkeypatch, index: int):
    """The agent of node-`index` stops heartbeating (a simulated agent is otherwise always
    heard)."""
    original = SimulatedDriver.last_heard

    def last_heard(self, n, *, now):
        return n.heartbeat_at if n.index == index else original(self, n, now=now)

    monkeypatch.setattr(SimulatedDriver, "last_heard", last_heard)


def test_a_ready_cluster_whose_agent_falls_silent_is_degraded_and_stops_paying_for_it(
    project, clock, monkeypatch, settings
):
    cluster, machine_type, sim = ready(project, clock)
    lost = node(cluster, 1)
    clock.shift(timedelta(seconds=90))
    with sim:  # its agent heartbeats once after the cluster is ready, then falls silent
        agent_check_in(node=lost.pk, token=lifecycle.agent_token(lost), gpus=[])
    lost.refresh_from_db()
    last_heartbeat = lost.heartbeat_at
    assert last_heartbeat == clock_now()
    silence(monkeypatch, 1)
    # The meter charges on while nobody knows yet: up to the moment the watch notices.
    clock.move_to(last_heartbeat + timedelta(seconds=settings.RUNCRATE_HEARTBEAT_LOST_SECONDS - 1))
    assert lifecycle.watch_heartbeats() == []  # not silent long enough
    # (The meter charges up to the database's clock, which time_machine does not move: the
    # test says the moment.)
    meter.charge_usage(cluster_id=cluster.pk, until=clock_now())
    before = ledger.balance(project=project)
    clock.move_to(last_heartbeat + timedelta(seconds=settings.RUNCRATE_HEARTBEAT_LOST_SECONDS))
    with sim:
        assert lifecycle.watch_heartbeats() == [f"{cluster.pk}/node-1"]
        sim.dispatcher.run()

    cluster.refresh_from_db()
    lost.refresh_from_db()
    assert cluster.status == Cluster.Status.DEGRADED
    assert lost.status == Node.Status.LOST and lost.ended_at == last_heartbeat
    record = UsageRecord.objects.get(node=lost)
    assert record.ended_at == last_heartbeat and record.charged_until == last_heartbeat
    # What the meter had charged past the last heartbeat came back as a refund.
    price = machine_type.price_per_hour
    overcharge = meter.cost(price, settings.RUNCRATE_HEARTBEAT_LOST_SECONDS - 1)
    assert overcharge > 0
    assert ledger.balance(project=project) == before + overcharge
    event = Event.objects.get(cluster=cluster, reason="machine_lost")
    assert event.node == lost and "silent for" in event.message
    # Its host is wiped and released to staff, quarantined with why (docs/lifecycle.md,
    # "Repair"); the other machine keeps running and billed.
    assert lost.holds_host is False and lost.host.state == Host.State.OFFLINE
    assert lost.host.quarantine_reason.startswith("Lost: its agent has been silent for")
    assert node(cluster, 0).status == Node.Status.JOINED
    assert UsageRecord.objects.get(node=node(cluster, 0)).ended_at is None
    assert free_hosts(machine_type) == 1  # the spare; the lost machine's host waits for staff

    assert send_pending_cluster_emails() >= 1
    lost_mail = [m for m in mail.outbox if "node-1 was lost" in m.subject]
    assert len(lost_mail) == 1 and "last heartbeat" in lost_mail[0].body


def test_the_watch_leaves_heard_nodes_and_other_statuses_alone(project, clock, settings):
    cluster, _, _ = ready(project, clock)
    clock.shift(timedelta(seconds=settings.RUNCRATE_HEARTBEAT_LOST_SECONDS * 3))
    # Simulated agents are always heard: their heartbeat moves on, nothing is lost.
    assert lifecycle.watch_heartbeats() == []
    assert all(n.heartbeat_at == clock_now() for n in cluster.nodes.all())
    assert lifecycle.watch_heartbeats() == []
    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.READY


def test_the_watch_costs_one_query_when_every_heartbeat_is_fresh(
    project, clock, django_assert_num_queries
):
    ready(project, clock, nodes=3)
    with django_assert_num_queries(1):
        assert lifecycle.watch_heartbeats() == []


def test_lost_needs_a_joined_node_of_a_ready_or_degraded_cluster(project, clock):
    cluster, _, _ = ready(project, clock)
    n = node(cluster, 1)
    with Sim():
        lifecycle.terminate(cluster=cluster)
        assert not lifecycle.mark_lost(node_id=n.pk, last_heard=clock_now(), why="test")
    n.refresh_from_db()
    assert n.status == Node.Status.ENDED
    assert not Event.objects.filter(cluster=cluster, reason="machine_lost").exists()


def clock_now():
    from django.utils import timezone

    return timezone.now()


def test_a_joining_worker_gets_every_other_machine_its_plan_again(project, clock, monkeypatch):
    applied = []
    original = SimulatedDriver.start

    def start(self, n, *, agent_token, plan):
        applied.append((n.name, sorted(plan["hosts"])))
        return original(self, n, agent_token=agent_token, plan=plan)

    cluster, _, sim = ready(project, clock)
    monkeypatch.setattr(SimulatedDriver, "start", start)
    with sim:
        lifecycle.add_workers(cluster=cluster, count=1)
        sim.run_until(clock, clock_now() + timedelta(seconds=BOOT * 2))
    assert Event.objects.filter(cluster=cluster, reason="worker_joined").count() == 1
    everyone = ["node-0", "node-1", "node-2"]
    # node-2's own start, then node-0 and node-1 again, each with node-2 in /etc/hosts.
    assert applied[0][0] == "node-2"
    assert sorted(applied[1:]) == [("node-0", everyone), ("node-1", everyone)]
    assert node(cluster, 0).driver_state["replan"]["ok"] is True


def test_a_driver_can_name_the_reason_a_machine_failed(project, clock, monkeypatch):
    def observe(self, n, *, now):
        if n.index == 1:
            return Observation(MachineState.FAILED, message="gone dark", reason="machine_gone")
        return original(self, n, now=now)

    original = SimulatedDriver.observe
    monkeypatch.setattr(SimulatedDriver, "observe", observe)
    machine_type = inventory(hosts=2, boot_seconds=BOOT)
    with Sim() as sim:
        cluster = create(project, machine_type)
        sim.tick()
        sim.tick()
    assert_failed_cleanly(cluster, machine_type)
    assert (cluster.failure_reason, cluster.failure_node) == ("machine_gone", "node-1")
    assert cluster.failure_message == "gone dark"


def test_a_lost_machine_is_taken_out_of_the_others_plans(project, clock):
    """D9: the machines left stop naming a lost one in /etc/hosts and the hostfile."""
    cluster, _, _ = ready(project, clock, nodes=3)
    lost = node(cluster, 2)
    with Sim() as sim:
        assert lifecycle.mark_lost(node_id=lost.pk, last_heard=timezone.now(), why="gone silent")
        handed = sorted((node_id, action) for node_id, action, _ in sim.dispatcher.work)
        assert handed == [
            (node(cluster, 0).pk, "prune:node-2"),
            (node(cluster, 1).pk, "prune:node-2"),
        ]
        sim.dispatcher.run()
    plan = node_plan_for(node(cluster, 0))
    assert sorted(plan["hosts"]) == ["node-0", "node-1"]
    assert "node-2" not in plan["hostfile"]["content"]
    message = Event.objects.get(cluster=cluster, reason="machine_lost").message
    assert "the other machines keep running and billed" in message


def test_when_every_machine_is_lost_it_says_none_is_left(project, clock):
    cluster, _, _ = ready(project, clock, nodes=2)
    with Sim():
        for index in (1, 0):
            lifecycle.mark_lost(node_id=node(cluster, index).pk, last_heard=timezone.now(), why="x")
    first, last = Event.objects.filter(cluster=cluster, reason="machine_lost").order_by("pk")
    assert "the other machine keeps running and billed" in first.message
    assert "no machine of it is left, and nothing more is billed" in last.message


def test_terminate_names_the_machine_that_could_not_be_wiped(project, clock, monkeypatch):
    """D2: never 'every machine was stopped and wiped' when one went offline instead."""

    def cannot_wipe(self, n, *, attempt):
        if n.index == 1:
            raise DriverError("the wipe of the host failed")
        return original(self, n, attempt=attempt)

    original = SimulatedDriver.stop
    cluster, machine_type, sim = ready(project, clock)
    monkeypatch.setattr(SimulatedDriver, "stop", cannot_wipe)
    with sim:
        lifecycle.terminate(cluster=cluster)
        sim.run_until(clock, timezone.now() + timedelta(minutes=2), every=11)
    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.TERMINATED
    assert node(cluster, 1).host.state == Host.State.OFFLINE
    assert node(cluster, 0).host.state == Host.State.FREE
    ended = Event.objects.get(cluster=cluster, reason="terminated").message
    assert "stopped and wiped" not in ended
    assert "node-1 could not be wiped: it is out of service until staff check" in ended


def test_a_cluster_degraded_by_a_lost_machine_is_not_installed_again(project, clock):
    """Retry install mends software that did not install, never a lost or unhealthy machine."""
    cluster, _, _ = ready(project, clock, nodes=2)
    with Sim():
        lifecycle.mark_lost(node_id=node(cluster, 1).pk, last_heard=timezone.now(), why="gone")
        cluster.refresh_from_db()
        assert cluster.status == Cluster.Status.DEGRADED and not cluster.can_retry_install
        with pytest.raises(ClusterRefused) as refused:
            lifecycle.retry_install(cluster=cluster)
    assert refused.value.code == "invalid_state"
    assert "node-1 was lost: gone." in refused.value.message
    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.DEGRADED
