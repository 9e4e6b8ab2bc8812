"""A worker that dies mid-way loses nothing (DESIGN.md): `advance` is one transaction, so a
crash between its steps leaves the previous state, and the next tick carries the cluster on;
per-node work runs under a lease, so lost work is retried once the lease expires and a task
that outlived its lease changes nothing."""

from datetime import timedelta

import pytest

from billing.models import UsageRecord
from clusters import lifecycle
from clusters.lifecycle.steps import join
from clusters.machines.simulated import SimulatedDriver
from clusters.models import Cluster, Event, Node
from tests.clusters.lifecycle_kit import Sim, at, create, inventory, node

BOOT = 180


class WorkerKilled(Exception):
    pass


def test_it_carries_on_after_advance_dies_between_two_steps(project, clock, monkeypatch):
    machine_type = inventory(hosts=3, boot_seconds=BOOT)
    real_start_billing = join.start_billing

    def killed(work, nodes):
        real_start_billing(work, nodes)  # the usage rows are built, the nodes marked joined…
        raise WorkerKilled  # …and the worker dies before anything is flushed

    with Sim() as sim:
        cluster = create(project, machine_type, nodes=3)
        sim.run_until(clock, at(BOOT * 1.5 - 1))
        clock.move_to(at(BOOT * 1.5))
        monkeypatch.setattr(join, "start_billing", killed)
        with pytest.raises(WorkerKilled):
            sim.tick()

        cluster.refresh_from_db()
        assert cluster.status == Cluster.Status.PROVISIONING
        assert cluster.joined_at is None
        assert not UsageRecord.objects.filter(cluster=cluster).exists()
        assert not cluster.nodes.filter(status=Node.Status.JOINED).exists()
        assert not cluster.events.filter(reason="joined").exists()

        monkeypatch.setattr(join, "start_billing", real_start_billing)
        sim.dispatcher.advances.clear()
        sim.dispatcher.work.clear()
        clock.shift(timedelta(seconds=2))  # the next tick
        sim.tick()

    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.READY
    assert UsageRecord.objects.filter(cluster=cluster).count() == 3
    assert set(UsageRecord.objects.values_list("started_at", flat=True)) == {cluster.joined_at}
    assert cluster.events.filter(reason="ready").count() == 1


def test_it_carries_on_after_advance_dies_while_flushing(project, clock, monkeypatch):
    machine_type = inventory(hosts=2, boot_seconds=BOOT, faults={1: "boot"})
    with Sim() as sim:
        cluster = create(project, machine_type)
        sim.run_until(clock, at(2 * BOOT - 1))
        clock.move_to(at(2 * BOOT))

        # The nodes and hosts are written, then the worker dies before the events are.
        def killed(*args, **kwargs):
            raise WorkerKilled

        monkeypatch.setattr(Event.objects, "bulk_create", killed)
        with pytest.raises(WorkerKilled):
            sim.tick()
        cluster.refresh_from_db()
        assert cluster.status == Cluster.Status.PROVISIONING
        assert cluster.nodes.filter(holds_host=True).count() == 2
        assert not machine_type.hosts.filter(state="cleaning").exists()

        monkeypatch.undo()
        sim.dispatcher.advances.clear()
        sim.dispatcher.work.clear()
        clock.shift(timedelta(seconds=2))
        sim.tick()

    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.FAILED
    assert cluster.failure_reason == "boot_timeout"
    assert machine_type.hosts.filter(state="free").count() == 2
    assert cluster.events.filter(reason="boot_timeout").count() == 1


def test_it_retries_per_node_work_lost_with_its_worker_once_the_lease_expires(project, clock):
    machine_type = inventory(hosts=2, boot_seconds=BOOT)
    with Sim() as sim:
        cluster = create(project, machine_type)
        lifecycle.advance(cluster_id=cluster.pk)
        assert [action for _, action, _ in sim.dispatcher.work] == ["start", "start"]
        sim.dispatcher.work.clear()  # the worker that took them died
        sim.dispatcher.advances.clear()
        lease = node(cluster, 0).lease_expires_at
        assert lease == at(lifecycle.LEASE_SECONDS["start"])

        clock.move_to(lease - timedelta(seconds=1))
        sim.tick()
        assert not node(cluster, 0).driver_state  # not retried while the lease holds

        clock.move_to(lease)
        sim.tick()
        assert node(cluster, 0).driver_state["start"]["ok"]
        started = lease
        sim.run_until(clock, started + timedelta(seconds=BOOT * 1.5))

    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.READY


def test_it_drops_the_result_of_work_that_outlived_its_lease(project, clock):
    machine_type = inventory(hosts=2, boot_seconds=BOOT)
    with Sim() as sim:
        cluster = create(project, machine_type)
        lifecycle.advance(cluster_id=cluster.pk)
        stale = sim.dispatcher.work[0]
        sim.dispatcher.work.clear()
        sim.dispatcher.advances.clear()

        clock.shift(timedelta(seconds=lifecycle.LEASE_SECONDS["start"]))
        lifecycle.advance(cluster_id=cluster.pk)  # hands the start off again, new lease
        fresh = next(w for w in sim.dispatcher.work if w[0] == stale[0])
        assert fresh[2] != stale[2]

        node_id, action, token = stale
        assert lifecycle.do_node_work(node_id=node_id, action=action, token=token) is False
        assert Node.objects.get(pk=node_id).driver_state == {}
        assert lifecycle.do_node_work(node_id=node_id, action=action, token=fresh[2]) is True
        assert Node.objects.get(pk=node_id).driver_state["start"]["attempts"] == 1


def test_it_does_nothing_new_when_advanced_twice(project, clock):
    machine_type = inventory(hosts=2, boot_seconds=BOOT)
    with Sim() as sim:
        cluster = create(project, machine_type)
        sim.run_until(clock, at(BOOT * 1.5))
        events = cluster.events.count()
        nodes = list(cluster.nodes.values())

        assert lifecycle.advance(cluster_id=cluster.pk) == []
        assert lifecycle.advance(cluster_id=cluster.pk) == []

    assert cluster.events.count() == events
    assert list(cluster.nodes.values()) == nodes


def test_it_ignores_a_cluster_that_is_gone(db):
    assert lifecycle.advance(cluster_id=999_999) == []
    assert lifecycle.do_node_work(node_id=999_999, action="start", token="x") is False


def test_it_degrades_a_cluster_whose_installer_raises(project, clock, monkeypatch):
    def broken(self, node, *, plan):
        raise ConnectionResetError("ssh session closed")

    monkeypatch.setattr(SimulatedDriver, "install", broken)
    machine_type = inventory(hosts=2, boot_seconds=BOOT)
    with Sim() as sim:
        cluster = create(project, machine_type, software="slurm")
        sim.run_until(clock, at(BOOT * 1.5))
    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.DEGRADED
    event = cluster.events.get(reason="install_failed")
    assert "ConnectionResetError: ssh session closed" in event.output


def test_it_takes_a_host_that_cannot_be_wiped_offline_for_staff(project, clock, monkeypatch):
    tries: dict[int, list[int]] = {}

    def stuck(self, node, *, attempt):
        tries.setdefault(node.index, []).append(attempt)
        raise TimeoutError("wipe timed out")

    machine_type = inventory(hosts=2, boot_seconds=BOOT)
    with Sim() as sim:
        cluster = create(project, machine_type)
        sim.run_until(clock, at(BOOT * 1.5))
        monkeypatch.setattr(SimulatedDriver, "stop", stuck)
        lifecycle.terminate(cluster=cluster)
        sim.run_until(clock, at(BOOT * 1.5 + 9), every=3)
        assert node(cluster, 0).driver_state["stop"]["attempts"] == 1  # retried after 10 s
        sim.run_until(clock, at(BOOT * 1.5 + 30), every=3)

    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.TERMINATED
    assert set(machine_type.hosts.values_list("state", flat=True)) == {"offline"}
    event = cluster.events.filter(reason="release_failed").first()
    assert "could not be wiped after 3 attempts (TimeoutError: wipe timed out)" in event.message
    assert event.notification is None
    # The driver is told which try each stop is (it retries a volume's sync on fewer).
    assert tries == {0: [1, 2, 3], 1: [1, 2, 3]}
