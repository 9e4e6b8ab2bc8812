"""The beat's tick: which clusters it advances, and the sweep that reports hosts held by
nothing. Both are plain functions a test calls without a worker."""

import logging

import time_machine

from clusters import lifecycle, tasks
from clusters.models import Cluster
from offers.models import Host
from tests.clusters.lifecycle_kit import T0, Sim, create, inventory
from tests.factories import HostFactory


def test_it_ticks_only_the_clusters_with_something_to_do(project):
    # Every state is reached through the lifecycle: the tick reads what its writes keep
    # (`Cluster.needs_work`), not the nodes.
    machine_type = inventory(hosts=7, boot_seconds=5)
    crashing = inventory(hosts=2, boot_seconds=5, faults={0: "crash"})
    with time_machine.travel(T0, tick=False) as clock, Sim() as sim:
        failed = create(project, crashing)  # its node-0 crashes: failed, every host wiped
        ready = create(project, machine_type)
        releasing = create(project, machine_type)
        sim.run_until(clock, T0.replace(minute=1), every=5)
        lifecycle.terminate(cluster=releasing)
        sim.dispatcher.advances.clear()
        moving = create(project, machine_type)
        sim.dispatcher.advances.clear()
        statuses = dict(Cluster.objects.values_list("pk", "status"))
        assert [statuses[c.pk] for c in (failed, ready, releasing, moving)] == [
            "failed",
            "ready",
            "terminating",
            "provisioning",
        ]
        assert not failed.nodes.filter(holds_host=True).exists()

        assert lifecycle.clusters_needing_work() == [releasing.pk, moving.pk]

        lifecycle.add_workers(cluster=ready, count=1)  # a ready cluster with a worker starting
        assert lifecycle.clusters_needing_work() == [ready.pk, releasing.pk, moving.pk]

        sim.run_until(clock, T0.replace(minute=2), every=5)
        statuses = dict(Cluster.objects.values_list("pk", "status"))
        assert [statuses[c.pk] for c in (ready, releasing, moving)] == [
            "ready",
            "terminated",
            "ready",
        ]
        assert ready.nodes.filter(status="joined").count() == 3
        assert lifecycle.clusters_needing_work() == []


def test_it_enqueues_one_advance_per_cluster_from_the_beat_task(
    project, monkeypatch, django_capture_on_commit_callbacks
):
    machine_type = inventory(hosts=4)
    with Sim():
        first = create(project, machine_type)
        second = create(project, machine_type)
    sent = []
    monkeypatch.setattr(tasks.advance, "delay", sent.append)

    with django_capture_on_commit_callbacks(execute=True):
        assert tasks.tick.apply().get() == 2
    assert sent == [first.pk, second.pk]

    # Until a worker picks them up, more ticks queue nothing more.
    with django_capture_on_commit_callbacks(execute=True):
        tasks.tick.apply()
    assert sent == [first.pk, second.pk]
    monkeypatch.setattr(lifecycle, "advance", lambda cluster_id: [])
    tasks.advance(first.pk)  # the worker runs one: it may be asked for again
    with django_capture_on_commit_callbacks(execute=True):
        tasks.tick.apply()
    assert sent == [first.pk, second.pk, first.pk]


def test_it_reports_hosts_held_by_no_node(project, caplog):
    machine_type = inventory(hosts=2)
    with Sim():
        create(project, machine_type)
    stray = HostFactory(machine_type=machine_type, state=Host.State.IN_USE, name="stray-01")
    HostFactory(machine_type=machine_type, state=Host.State.OFFLINE)

    with caplog.at_level(logging.ERROR, logger="clusters.lifecycle"):
        assert lifecycle.sweep_orphan_hosts() == [stray]
    assert "stray-01 is in_use but no node holds it" in caplog.text
    stray.refresh_from_db()
    assert stray.state == Host.State.IN_USE  # reported for staff, never freed blindly


def test_it_sweeps_hosts_on_the_beat_schedule_of_its_own(project, settings):
    machine_type = inventory(hosts=1)
    HostFactory(machine_type=machine_type, state=Host.State.RESERVED, name="stray-02")

    assert tasks.sweep_hosts.apply().get() == 1
    assert settings.CELERY_BEAT_SCHEDULE["hosts-sweep"]["task"] == "clusters.tasks.sweep_hosts"
