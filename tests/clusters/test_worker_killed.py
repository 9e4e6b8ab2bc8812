"""A worker killed with SIGKILL while it holds start, agent and network work never fails a
healthy cluster: on PostgreSQL and Redis, a real `celery worker` process is killed mid-way
through container, vm and bare-metal clusters, restarted 20 s later, and every cluster ends
`ready`, no host leaked, nothing billed twice (docs/architecture.md, "Workers and queues").

The test process plays the beat (it sends the tick); the worker is a separate process on the
same databases. Bounded waits throughout; skipped, with the reason, without PostgreSQL and
Redis."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.conf import settings
from django.db import OperationalError, connection

from billing.models import UsageRecord
from clusters import lifecycle, tasks
from clusters.models import Cluster, Node
from config.celery import app
from offers.models import Host, MachineType
from tests.clusters.lifecycle_kit import create, inventory, new_project

ROOT = Path(__file__).resolve().parents[2]
# Boots of BOOT_SECONDS take BOOT_SECONDS / SIM_SPEED = 15 s, while every step keeps its
# BOOT_SECONDS deadline in real time. A cluster still at an earlier step lives through two
# outages back to back (each 20 s down, the restart, one lease), so the deadline is twice that.
BOOT_SECONDS = 120
SIM_SPEED = 8

pytestmark = [
    pytest.mark.procs,
    pytest.mark.skipif(
        not (settings.REDIS_URL and settings.IS_POSTGRES),
        reason="needs PostgreSQL and the Redis broker: set DATABASE_URL and REDIS_URL",
    ),
    pytest.mark.django_db(transaction=True),
]


def start_worker(tmp_path: Path) -> subprocess.Popen:
    database = connection.settings_dict
    env = {
        **os.environ,
        "DATABASE_URL": f"postgres://{database['USER']}@{database['HOST'] or '127.0.0.1'}:"
        f"{database['PORT'] or 5432}/{database['NAME']}",
        "REDIS_URL": settings.REDIS_URL,
        "RUNCRATE_SIM_SPEED": str(SIM_SPEED),
        "RUNCRATE_VAR_DIR": str(tmp_path / "var"),
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "SECRET_KEY": settings.SECRET_KEY,  # agent tokens are derived from it
    }
    log = open(tmp_path / "worker.log", "ab")  # noqa: SIM115 (kept open for the process)
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "--app=config", "worker", "--pool=threads"]
        + ["--concurrency=4", "--loglevel=WARNING", "--without-mingle", "--without-gossip"],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def tick_until(done, *, seconds: float) -> bool:
    """Send the tick (what the beat sends) until `done()`, for at most `seconds`."""
    give_up = time.monotonic() + seconds
    while time.monotonic() < give_up:
        if done():
            return True
        tasks.tick.delay()
        time.sleep(0.5)
    return done()


def leased_work(ids: list[int]) -> set[str]:
    """The kinds of work handed out and not yet written back, by the step each serves."""
    return set(
        Node.objects.filter(cluster_id__in=ids, lease_token__gt="").values_list("step", flat=True)
    )


def work_left(ids: list[int], step: str) -> bool:
    """Whether a tick could still hand out some of `step`'s work ("agent" or "network"): a node
    whose agent has not checked in, or one that has not reported its network test in a cluster
    whose agents all checked in (the network step starts only then)."""
    nodes = Node.objects.filter(cluster_id__in=ids)
    if step == Node.Step.AGENT:
        return nodes.filter(step=step, agent_at=None).exists()
    waiting = set(nodes.filter(agent_at=None).values_list("cluster_id", flat=True))
    testing = nodes.filter(step=step, network_reported_at=None).values_list("cluster_id", flat=True)
    return any(cluster_id not in waiting for cluster_id in testing)


def freeze_with_work_left(worker, ids: list[int], step: str) -> None:
    """Freeze the worker at a moment some of `step`'s work is still to be handed out. Decided
    while it is frozen: a worker left running may finish the last of that work, and a cluster
    waiting on another's agents, in between."""
    give_up = time.monotonic() + 90
    while True:
        os.kill(worker.pid, signal.SIGSTOP)
        if work_left(ids, step):
            return
        os.kill(worker.pid, signal.SIGCONT)
        assert time.monotonic() < give_up, f"{step} work never came due: {leased_work(ids)}"
        tasks.tick.delay()
        time.sleep(0.5)


def kill_while_it_holds(worker, ids: list[int], step: str, tmp_path: Path) -> subprocess.Popen:
    """Freeze the worker, let the reconciler (run here, as on any process) hand out work until
    some of `step`'s is leased to the frozen worker, kill it with SIGKILL, keep it down 20 s,
    start it again."""
    os.kill(worker.pid, signal.SIGSTOP)
    give_up = time.monotonic() + 60
    while step not in leased_work(ids):
        assert time.monotonic() < give_up, f"no {step} work was handed out: {leased_work(ids)}"
        for cluster_id in ids:
            # The frozen worker may hold this cluster's row lock mid-transaction.
            with contextlib.suppress(OperationalError):
                lifecycle.advance(cluster_id=cluster_id)
        time.sleep(0.25)
    os.killpg(worker.pid, signal.SIGKILL)
    worker.wait(timeout=10)
    time.sleep(20)  # down for 20 s, as in the finding; nothing runs the work meanwhile
    return start_worker(tmp_path)


def test_a_worker_killed_mid_work_and_restarted_leaves_every_cluster_ready(tmp_path, settings):
    settings.RUNCRATE_SIM_SPEED = SIM_SPEED  # as the worker
    with connection.cursor() as cursor:
        # A frozen worker may hold a cluster's row lock: the reconciler here gives up on that
        # cluster after a second instead of waiting for the lock.
        cursor.execute("SET lock_timeout = '1s'")
    app.control.purge()
    _, project = new_project()
    kinds = [MachineType.Kind.CONTAINER, MachineType.Kind.VM, MachineType.Kind.BARE_METAL]
    machine_types = [inventory(hosts=3, boot_seconds=BOOT_SECONDS, kind=kind) for kind in kinds]
    worker = start_worker(tmp_path)
    try:
        # Killed holding the machines' starts...
        os.kill(worker.pid, signal.SIGSTOP)
        ids = [create(project, machine_type, nodes=3).pk for machine_type in machine_types]
        worker = kill_while_it_holds(worker, ids, Node.Step.RUNNING, tmp_path)

        # ... then the agents' check-ins, then the network tests.
        for step in (Node.Step.AGENT, Node.Step.NETWORK):
            freeze_with_work_left(worker, ids, step)
            worker = kill_while_it_holds(worker, ids, step, tmp_path)

        def settled() -> bool:
            return not Cluster.objects.filter(
                pk__in=ids, status__in=[Cluster.Status.PROVISIONING, Cluster.Status.INSTALLING]
            ).exists()

        assert tick_until(settled, seconds=120), (tmp_path / "worker.log").read_text()[-3000:]
    finally:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(timeout=10)

    for cluster in Cluster.objects.filter(pk__in=ids):
        kind = cluster.machine_type.machine_kind
        why = f"{kind}: {cluster.failure_reason} {cluster.failure_message}"
        assert cluster.status == Cluster.Status.READY, why
        assert cluster.nodes.filter(status="joined").count() == 3
        # Billed once per machine, no host leaked.
        assert UsageRecord.objects.filter(cluster=cluster).count() == 3
        assert Host.objects.filter(machine_type=cluster.machine_type, state="in_use").count() == 3
