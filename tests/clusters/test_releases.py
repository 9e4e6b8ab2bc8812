"""Releases side by side, never in anyone's way (issue 38, item 3): a host's release after its
cluster (the stop: wipe, reimage, verify) is a task of its own on the `releases` queue, whose
worker runs RUNCRATE_RELEASE_CONCURRENCY of them at once; live clusters' steps go on the
`machines` queue meanwhile; a release whose worker died is handed out again once its lease runs
out (docs/lifecycle.md, "Ending"; docs/architecture.md, "Workers and queues")."""

from __future__ import annotations

import os
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
from celery.contrib.testing.worker import start_worker
from django.conf import settings

from clusters import lifecycle, tasks
from clusters.lifecycle import dispatch
from clusters.machines import registry
from clusters.machines.base import Released
from clusters.machines.simulated import SimulatedDriver
from clusters.models import Cluster, Node
from config.celery import RELEASES_NICENESS, app
from offers.models import Host
from tests.clusters.lifecycle_kit import T0, Sim, create, inventory, new_project
from tests.worker_kit import procfile_command, procfile_worker

BOOT = 180


class StandIn(SimulatedDriver):
    """A driver whose hosts are handed over one task each (as the ssh driver's are) and whose
    stop waits at a gate: it records how many stops run at once."""

    name = "standin"
    batches_work = False

    def __init__(self) -> None:
        super().__init__()
        self.changed = threading.Condition()
        self.running = 0
        self.most = 0
        self.finished = 0
        self.opened = False

    def stop(self, node: Node, *, attempt: int = 1) -> Released:
        with self.changed:
            self.running += 1
            self.most = max(self.most, self.running)
            self.changed.notify_all()
            # Bounded: a gate never opened lets the stop end after a minute, not hang the run.
            self.changed.wait_for(lambda: self.opened, timeout=60)
            self.running -= 1
            self.finished += 1
            self.changed.notify_all()
        return Released(pristine=True)

    def wait_for(self, condition, *, seconds: float) -> bool:
        with self.changed:
            return self.changed.wait_for(condition, timeout=seconds)

    def open(self) -> None:
        with self.changed:
            self.opened = True
            self.changed.notify_all()


@pytest.fixture
def standin(monkeypatch) -> StandIn:
    driver = StandIn()
    monkeypatch.setitem(registry._DRIVERS, "standin", driver)
    return driver


def on_standin(cluster: Cluster) -> None:
    """The cluster's hosts are released by the stand-in from now on."""
    Host.objects.filter(nodes__cluster=cluster).update(driver="standin")


class Sent:
    """Stands for a Celery task: records what `delay` was asked to send."""

    def __init__(self, into: list, kind: str) -> None:
        self.into, self.kind = into, kind

    def delay(self, *args) -> None:
        self.into.append((self.kind, *args))


def test_each_host_s_release_is_a_task_of_its_own_on_the_releases_queue(
    person, sim, clock, standin, monkeypatch, django_capture_on_commit_callbacks
):
    user, project = person
    cluster = create(project, inventory(hosts=4, boot_seconds=BOOT), nodes=4)
    sim.run_until(clock, T0 + timedelta(seconds=BOOT * 2))
    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.READY
    on_standin(cluster)
    sent: list[tuple] = []
    for kind in ("advance", "node_work", "release"):
        monkeypatch.setitem(dispatch._tasks, kind, Sent(sent, kind))

    with (
        lifecycle.dispatching_to(lifecycle.Dispatcher()),
        django_capture_on_commit_callbacks(execute=True),
    ):
        lifecycle.terminate(cluster=cluster, user=user)
        lifecycle.advance(cluster_id=cluster.pk)

    releases = [s for s in sent if s[0] == "release"]
    nodes = dict(cluster.nodes.values_list("pk", "lease_token"))
    # One task per host, each under its node's lease: the worker's processes take them side by side.
    assert sorted(releases) == sorted(("release", pk, "stop", token) for pk, token in nodes.items())
    assert [s for s in sent if s[0] == "node_work"] == []
    route = app.amqp.router.route
    assert route({}, "clusters.tasks.release_work")["queue"].name == "releases"
    assert route({}, "clusters.tasks.node_work")["queue"].name == "machines"
    assert route({}, "clusters.tasks.advance")["queue"].name == "celery"


def test_a_release_whose_worker_died_is_handed_out_again_once_its_lease_runs_out(
    person, sim, clock
):
    user, project = person
    machine_type = inventory(hosts=2, boot_seconds=BOOT)
    cluster = create(project, machine_type)
    sim.run_until(clock, T0 + timedelta(seconds=BOOT * 2))
    lifecycle.terminate(cluster=cluster, user=user)
    lifecycle.advance(cluster_id=cluster.pk)
    # The release worker took the stops and died: nothing of them ever runs.
    taken = [(node_id, token) for node_id, _, token in sim.dispatcher.work]
    sim.dispatcher.work.clear()
    assert len(taken) == 2

    clock.shift(timedelta(seconds=lifecycle.LEASE_SECONDS[lifecycle.ActionKind.STOP] - 1))
    sim.tick()
    # Still its lease: the hosts stay `cleaning`, held, and are given to no one.
    assert set(Host.objects.filter(machine_type=machine_type).values_list("state", flat=True)) == {
        Host.State.CLEANING
    }
    assert cluster.nodes.filter(holds_host=True).count() == 2

    clock.shift(timedelta(seconds=2))
    sim.tick()

    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.TERMINATED
    assert set(Host.objects.filter(machine_type=machine_type).values_list("state", flat=True)) == {
        Host.State.FREE
    }
    # The dead worker's stops, were they ever to run, would write nothing: their leases are gone.
    with sim:
        assert lifecycle.do_work(action="stop", leases=taken) == 0


needs_services = pytest.mark.skipif(
    not (settings.REDIS_URL and settings.IS_POSTGRES),
    reason="needs PostgreSQL and the Redis broker: set DATABASE_URL and REDIS_URL",
)


@pytest.mark.procs  # a celery worker process
@needs_services
@pytest.mark.django_db(transaction=True)
def test_the_procfile_s_releases_worker_runs_as_many_processes_as_the_setting(tmp_path):
    assert "--concurrency" not in " ".join(procfile_command("releases"))
    log = tmp_path / "releases.log"

    with procfile_worker("releases", log, RUNCRATE_RELEASE_CONCURRENCY="3") as worker:
        banner = log.read_text(errors="replace")
        pool = _children(worker.pid)
        niceness = {pid: os.getpriority(os.PRIO_PROCESS, pid) for pid in [worker.pid, *pool]}

    assert "concurrency: 3 (prefork)" in banner
    assert ".> releases " in banner
    # Its processes ask for less of the CPU than this one: live clusters' steps go first.
    assert len(pool) == 3
    below = min(os.getpriority(os.PRIO_PROCESS, 0) + RELEASES_NICENESS, 19)
    assert niceness == dict.fromkeys([worker.pid, *pool], below)


def _children(pid: int) -> list[int]:
    return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def ready_in_process(cluster: Cluster, *, seconds: float) -> None:
    """Bring `cluster` to ready with its work run in this process (machines boot at once)."""
    with Sim() as sim:
        give_up = time.monotonic() + seconds
        while time.monotonic() < give_up:
            sim.tick()
            cluster.refresh_from_db()
            if cluster.status == Cluster.Status.READY:
                return
            time.sleep(0.1)
    raise AssertionError(f"{cluster.name} is {cluster.status}, not ready")


def tick_until(done, *, seconds: float) -> bool:
    """Send the tick (what the beat sends) until `done()`, for at most `seconds`."""
    give_up = time.monotonic() + seconds
    while time.monotonic() < give_up:
        if done():
            return True
        tasks.tick.delay()
        time.sleep(0.5)
    return done()


@pytest.mark.procs  # celery worker processes
@needs_services
@pytest.mark.django_db(transaction=True)
def test_hosts_are_released_side_by_side_up_to_the_bound_while_a_new_cluster_starts(
    settings, standin, tmp_path
):
    settings.RUNCRATE_SIM_SPEED = 1_000_000  # machines boot in microseconds
    settings.RUNCRATE_RELEASE_CONCURRENCY = bound = 3
    user, project = new_project()
    ended = create(project, inventory(hosts=6, boot_seconds=60), nodes=6)
    ready_in_process(ended, seconds=60)
    on_standin(ended)
    app.control.purge()  # messages left in this broker by earlier runs
    queues = app.amqp.queues
    consuming = queues._consume_from  # start_worker narrows the app's queues to its own
    env = {"RUNCRATE_SIM_SPEED": "1000000", "RUNCRATE_VAR_DIR": str(tmp_path / "var")}
    try:
        # The production lines for the default and machines queues, each a process of its own;
        # the releases worker in this process, on threads (its hosts' stand-in driver lives
        # here, which the Procfile's processes could not reach), as many as the setting gives
        # the Procfile's processes.
        with (
            procfile_worker("worker", tmp_path / "worker.log", **env),
            procfile_worker("machines", tmp_path / "machines.log", **env),
            start_worker(
                app,
                pool="threads",
                concurrency=settings.RUNCRATE_RELEASE_CONCURRENCY,
                queues=["releases"],
                perform_ping_check=False,
                shutdown_timeout=60,
            ),
        ):
            _release_while_another_starts(user, project, ended, standin, bound, tmp_path)
    finally:
        standin.open()
        queues._consume_from = consuming


def _release_while_another_starts(user, project, ended, standin, bound, tmp_path: Path) -> None:
    lifecycle.terminate(cluster=ended, user=user)
    assert tick_until(
        lambda: standin.wait_for(lambda: standin.running == bound, seconds=0.5), seconds=60
    ), (tmp_path / "worker.log").read_text(errors="replace")[-3000:]

    # Every release slot busy, three hosts still waiting for one: a new cluster starts anyway.
    other = create(project, inventory(hosts=2, boot_seconds=60), nodes=2)

    def ready() -> bool:
        other.refresh_from_db()
        return other.status == Cluster.Status.READY

    assert tick_until(ready, seconds=90), list(other.events.values_list("reason", "message"))
    assert (standin.running, standin.finished) == (bound, 0)

    standin.open()

    def released() -> bool:
        ended.refresh_from_db()
        return ended.status == Cluster.Status.TERMINATED

    assert tick_until(released, seconds=90), list(ended.events.values_list("reason", "message"))
    assert standin.finished == 6
    assert standin.most == bound  # side by side, never more than the bound
    assert set(Host.objects.filter(nodes__cluster=ended).values_list("state", flat=True)) == {
        Host.State.FREE
    }
