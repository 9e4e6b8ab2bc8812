"""Step deadlines measure the machine, not us (issue 19): the arithmetic of moving a deadline
back by our own downtime, how a late beat records its outage, and the reconciler with
time_machine moving the clock through a `machines` queue outage and a stopped beat."""

from datetime import timedelta

import pytest

from clusters import tasks
from clusters.lifecycle.rules import deadline_with_downtime, extended
from clusters.models import Cluster, Node
from runcrate.models import Beat, Outage, our_downtime
from tests.clusters.lifecycle_kit import T0, Sim, at, create, inventory, node

BOOT = 180


def t(seconds: float):
    return T0 + timedelta(seconds=seconds)


# --- the arithmetic ------------------------------------------------------------------------


def test_no_downtime_leaves_the_deadline_as_it_is():
    assert extended(t(100), since=t(0), downtime=[]) == t(100)


def test_downtime_inside_the_step_moves_the_deadline_back_by_all_of_it():
    assert extended(t(100), since=t(0), downtime=[(t(10), t(40))]) == t(130)


def test_only_the_part_after_the_step_began_counts():
    assert extended(t(100), since=t(20), downtime=[(t(10), t(40))]) == t(120)
    assert extended(t(100), since=t(50), downtime=[(t(10), t(40))]) == t(100)


def test_downtime_after_the_deadline_changes_nothing():
    assert extended(t(100), since=t(0), downtime=[(t(100), t(200))]) == t(100)


def test_downtime_that_straddles_the_deadline_counts_whole():
    # The step had 10 s left when we went down at 90 s; it gets them after we came back.
    assert extended(t(100), since=t(0), downtime=[(t(90), t(300))]) == t(310)


def test_a_second_outage_inside_the_moved_deadline_moves_it_again():
    downtime = [(t(10), t(40)), (t(120), t(150)), (t(400), t(500))]
    assert extended(t(100), since=t(0), downtime=downtime) == t(160)


def test_a_capped_deadline_moves_with_the_cap_from_the_reservation():
    # Reserved at 0, cap at 1500; the agent step began at 1000 after a 600-s outage at 100:
    # its deadline is the cap, and the cap counts only the machines' time.
    downtime = [(t(100), t(700))]
    capped = deadline_with_downtime(
        t(1500), since=t(1000), cap=t(1500), reserved_at=t(0), downtime=downtime
    )
    assert capped == t(2100)
    # Not capped: only the downtime since the step began, none here.
    free = deadline_with_downtime(
        t(1200), since=t(1000), cap=t(1500), reserved_at=t(0), downtime=downtime
    )
    assert free == t(1200)


# --- the beats record outages ------------------------------------------------------------------


@pytest.mark.django_db
def test_a_beat_on_time_records_no_outage_in_one_query(django_assert_num_queries):
    Beat.record("tick", at=t(0), every=2)
    with django_assert_num_queries(1):
        Beat.record("tick", at=t(2), every=2)
    assert not Outage.objects.exists()
    assert Beat.objects.get(name="tick").last_ran_at == t(2)


@pytest.mark.django_db
def test_a_late_beat_records_the_time_it_did_not_run():
    Beat.record("machines", at=t(0), every=2)
    Beat.record("machines", at=t(5), every=2)  # 5 s: within 3 periods and the 5-s floor
    assert not Outage.objects.exists()
    Beat.record("machines", at=t(135), every=2)
    outage = Outage.objects.get()
    assert (outage.name, outage.started_at, outage.ended_at) == ("machines", t(7), t(135))
    assert Beat.objects.get(name="machines").last_ran_at == t(135)


@pytest.mark.django_db
def test_our_downtime_merges_the_beats_and_runs_a_late_one_to_now(settings):
    settings.RUNCRATE_TICK_SECONDS = 2
    Outage.objects.create(name="tick", started_at=t(10), ended_at=t(50))
    Outage.objects.create(name="machines", started_at=t(40), ended_at=t(60))
    Outage.objects.create(name="meter", started_at=t(70), ended_at=t(90))  # not ours to count
    Outage.objects.create(name="tick", started_at=t(-100), ended_at=t(-50))  # before `since`
    Beat.record("tick", at=t(200))
    Beat.record("machines", at=t(150))  # silent since: late at 200
    assert our_downtime(since=t(0), now=t(200)) == [(t(10), t(60)), (t(152), t(200))]


@pytest.mark.django_db
def test_a_beat_that_never_ran_is_no_outage():
    assert our_downtime(since=t(0), now=t(10_000)) == []


# --- the reconciler --------------------------------------------------------------------------


def test_the_machines_queue_down_past_the_boot_deadline_then_back_ends_ready(
    project, clock, settings
):
    settings.RUNCRATE_TICK_SECONDS = 2
    machine_type = inventory(hosts=2, boot_seconds=BOOT)
    with Sim() as sim:
        Beat.record("tick", at=t(0), every=2)
        Beat.record("machines", at=t(0), every=2)
        cluster = create(project, machine_type, nodes=2)
        assert node(cluster, 0).step_deadline == at(2 * BOOT)
        # The machines queue is down: the starts wait in it. The tick runs, every 2 s.
        for second in range(2, 601, 2):
            Beat.record("tick", at=t(second), every=2)
        clock.move_to(at(600))
        tasks.tick()  # advances queued, and run; the starts they hand out are not
        sim.dispatcher.work.clear()
        sim.dispatcher.advances and sim.dispatcher.run()
        cluster.refresh_from_db()
        assert cluster.status == Cluster.Status.PROVISIONING, cluster.failure_message

        # A worker takes the queue again: the heartbeat records the outage, the start runs.
        Beat.record("machines", at=t(600), every=2)
        sim.tick()
        node0 = node(cluster, 0)
        assert node0.step_started_at == at(600)  # counted from when the driver got it
        assert node0.step_deadline == at(600 + 2 * BOOT)
        sim.run_until(clock, at(600 + BOOT * 1.5), every=5)
    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.READY, cluster.failure_message


def test_the_beat_stopped_past_the_agent_deadline_then_back_ends_ready(project, clock, settings):
    settings.RUNCRATE_TICK_SECONDS = 2
    machine_type = inventory(hosts=2, boot_seconds=BOOT)
    with Sim() as sim:
        cluster = create(project, machine_type, nodes=2)
        for second in range(0, BOOT + 1, 2):
            Beat.record("machines", at=t(second), every=2)
        sim.run_until(clock, at(BOOT), every=5)
        Beat.record("tick", at=t(BOOT), every=2)
        assert node(cluster, 0).step == Node.Step.AGENT
        assert node(cluster, 0).step_deadline == at(2 * BOOT)
        # The beat stops for 320 s: no tick, no machines heartbeat; nothing advances.
        clock.move_to(at(BOOT + 320))
        tasks.tick()  # the beat is back: its first tick records the outage, then advances
        sim.dispatcher.run()
        cluster.refresh_from_db()
        assert cluster.status == Cluster.Status.PROVISIONING, cluster.failure_message
        assert Outage.objects.filter(name="tick", ended_at=at(BOOT + 320)).exists()
        sim.run_until(clock, at(BOOT + 320 + BOOT), every=5)
    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.READY, cluster.failure_message


def test_a_machine_that_never_boots_still_fails_by_the_machines_time(project, clock, settings):
    """The cap (25 minutes: 2 × 1000 s of boot is past it) counts only the machines' time: a
    10-minute outage of the machines queue moves the failure 10 minutes later, and the
    message says so."""
    settings.RUNCRATE_TICK_SECONDS = 2
    machine_type = inventory(hosts=2, boot_seconds=1000, faults={0: "boot"})
    with Sim() as sim:
        cluster = create(project, machine_type, nodes=2)
        assert node(cluster, 0).step_deadline == at(1500)  # the cap
        # An outage on record, the beats otherwise quiet (none recorded: nothing going on).
        Outage.objects.create(name="machines", started_at=at(100), ended_at=at(700))
        sim.run_until(clock, at(2099), every=60)
        cluster.refresh_from_db()
        assert cluster.status == Cluster.Status.PROVISIONING
        clock.move_to(at(2100))
        sim.tick()
    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.FAILED
    assert cluster.failure_reason == "boot_timeout"
    assert "not counting 10 minutes in which our own services did not run" in (
        cluster.failure_message
    ), cluster.failure_message


def test_without_an_outage_a_silent_agent_fails_at_its_deadline(project, clock, settings):
    """The control: ticks on time, the agent never checks in: agent_timeout at running + boot,
    with nothing said about downtime."""
    settings.RUNCRATE_TICK_SECONDS = 2
    machine_type = inventory(hosts=2, boot_seconds=BOOT, faults={0: "agent"})
    with Sim() as sim:
        cluster = create(project, machine_type, nodes=2)
        for second in range(0, 2 * BOOT + 1, 5):
            clock.move_to(at(second))
            Beat.record("tick", every=2)
            Beat.record("machines", every=2)
            sim.tick()
    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.FAILED
    assert cluster.failure_reason == "agent_timeout"
    assert cluster.ended_at == at(2 * BOOT)
    assert "not counting" not in cluster.failure_message
