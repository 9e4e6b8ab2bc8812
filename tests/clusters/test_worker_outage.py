"""Our own outages never fail a customer's cluster (issue 19): on PostgreSQL and Redis, with a
real beat, a default worker and a `machines` worker, (1) the `machines` worker stopped for
longer than a step's deadline and then started again, and (2) the beat stopped for longer than
a step's deadline and then started again, leave every cluster that could start `ready`; and
`/readyz` is 503, naming the `machines` worker, while it is gone.

The deadlines are shortened by settings, not waited out: boots of 2 s, every step at least
RUNCRATE_MIN_STEP_SECONDS = 5 s, a tick (and the machines heartbeat) every 0.5 s; each outage
lasts 10 s, twice the step's deadline (the audit's were 130 s and 80 s against 30-s steps).
Bounded polls throughout; skipped, with the reason, without PostgreSQL and Redis."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection
from django.utils import timezone

from clusters.models import Cluster, Node
from config.celery import app
from offers.models import MachineType
from runcrate.models import Beat, Outage
from tests.clusters.lifecycle_kit import create, inventory, new_project

ROOT = Path(__file__).resolve().parents[2]
BOOT_SECONDS = 2
MIN_STEP_SECONDS = 5
TICK_SECONDS = 0.5
OUTAGE_SECONDS = 2 * MIN_STEP_SECONDS

pytestmark = [
    pytest.mark.procs,
    pytest.mark.skipif(
        not (settings.REDIS_URL and settings.IS_POSTGRES),
        reason="needs PostgreSQL and the Redis broker: set DATABASE_URL and REDIS_URL",
    ),
    pytest.mark.django_db(transaction=True),
]


class Deployment:
    """The production set minus web: one beat, a default worker, a `machines` and a `releases`
    worker, each a process of its own on this test's databases."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.processes: dict[str, subprocess.Popen] = {}
        database = connection.settings_dict
        self.env = {
            **os.environ,
            "DATABASE_URL": f"postgres://{database['USER']}@{database['HOST'] or '127.0.0.1'}:"
            f"{database['PORT'] or 5432}/{database['NAME']}",
            "REDIS_URL": settings.REDIS_URL,
            "RUNCRATE_TICK_SECONDS": str(TICK_SECONDS),
            "RUNCRATE_MIN_STEP_SECONDS": str(MIN_STEP_SECONDS),
            "RUNCRATE_VAR_DIR": str(tmp_path / "var"),
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "SECRET_KEY": settings.SECRET_KEY,  # agent tokens are derived from it
        }

    def start(self, name: str) -> None:
        celery = [sys.executable, "-m", "celery", "--app=config"]
        quiet = ["--loglevel=WARNING"]
        worker = ["worker", "--pool=threads", "--without-mingle", "--without-gossip"]
        command = {
            "beat": [*celery, "beat", *quiet, f"--schedule={self.tmp_path / 'schedule'}"],
            "default": [*celery, *worker, "-Q", "celery", "--concurrency=4", "-n", "d@%h", *quiet],
            "machines": [*celery, *worker, "-Q", "machines", "--concurrency=4", "-n", "m@%h"]
            + quiet,
            "releases": [*celery, *worker, "-Q", "releases", "--concurrency=2", "-n", "r@%h"]
            + quiet,
        }[name]
        log = open(self.tmp_path / f"{name}.log", "ab")  # noqa: SIM115 (kept open for it)
        self.processes[name] = subprocess.Popen(
            command,
            cwd=ROOT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def stop(self, name: str) -> None:
        process = self.processes.pop(name)
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)

    def stop_all(self) -> None:
        for name in list(self.processes):
            self.stop(name)

    def logs(self) -> str:
        return "\n".join(
            f"--- {path.name}\n{path.read_text()[-2000:]}" for path in self.tmp_path.glob("*.log")
        )


@pytest.fixture
def deployment(tmp_path, settings):
    # This process creates the clusters and answers /readyz: the same settings as the others.
    settings.RUNCRATE_TICK_SECONDS = TICK_SECONDS
    settings.RUNCRATE_MIN_STEP_SECONDS = MIN_STEP_SECONDS
    settings.RUNCRATE_BEAT_OVERDUE_MIN_SECONDS = 3  # overdue after 10 ticks: 5 s
    app.control.purge()
    running = Deployment(tmp_path)
    for name in ("default", "machines", "releases", "beat"):
        running.start(name)
    try:
        yield running
    finally:
        running.stop_all()


def wait_for(done, *, seconds: float, what: str, deployment: Deployment) -> None:
    give_up = time.monotonic() + seconds
    while not done():
        assert time.monotonic() < give_up, f"{what}, not within {seconds} s\n{deployment.logs()}"
        time.sleep(0.25)


def machines_check(client) -> tuple[int, str]:
    answer = client.get("/readyz")
    return answer.status_code, answer.json()["checks"]["machines"]


def clusters(project) -> list[int]:
    kinds = [MachineType.Kind.CONTAINER, MachineType.Kind.VM, MachineType.Kind.BARE_METAL]
    return [
        create(project, inventory(hosts=2, boot_seconds=BOOT_SECONDS, kind=kind), nodes=2).pk
        for kind in kinds
    ]


def settled(ids: list[int]) -> bool:
    moving = [Cluster.Status.PROVISIONING, Cluster.Status.INSTALLING]
    return not Cluster.objects.filter(pk__in=ids, status__in=moving).exists()


def assert_all_ready(ids: list[int]) -> None:
    for cluster in Cluster.objects.filter(pk__in=ids):
        why = f"{cluster.machine_type.machine_kind}: {cluster.failure_reason} "
        assert cluster.status == Cluster.Status.READY, why + cluster.failure_message
        assert cluster.nodes.filter(status=Node.Status.JOINED).count() == 2


def past_every_deadline(ids: list[int]) -> bool:
    """Whether the outage has outlasted every stored step deadline of the clusters' nodes."""
    deadlines = Node.objects.filter(cluster_id__in=ids).values_list("step_deadline", flat=True)
    return all(d is not None and timezone.now() > d for d in deadlines)


def test_the_machines_worker_down_past_a_deadline_then_back_leaves_every_cluster_ready(
    deployment, client
):
    Beat.record("meter")  # the meter runs each minute: not what this test is about
    wait_for(
        lambda: machines_check(client) == (200, "ok"),
        seconds=90,
        what="the deployment never became ready",
        deployment=deployment,
    )
    deployment.stop("machines")
    _, project = new_project()
    ids = clusters(project)
    started = time.monotonic()

    # While it is gone: /readyz names it, and nothing fails though every deadline passes.
    wait_for(
        lambda: machines_check(client)[0] == 503,
        seconds=30,
        what="/readyz stayed 200 with the machines worker gone",
        deployment=deployment,
    )
    status, said = machines_check(client)
    assert said.startswith("overdue: ") and "celery worker -Q machines" in said, said
    time.sleep(max(0.0, OUTAGE_SECONDS - (time.monotonic() - started)))  # the outage itself
    assert past_every_deadline(ids)
    assert not Cluster.objects.filter(pk__in=ids, status=Cluster.Status.FAILED).exists()

    deployment.start("machines")
    wait_for(lambda: settled(ids), seconds=120, what="not settled", deployment=deployment)
    assert_all_ready(ids)
    assert Outage.objects.filter(name="machines").exists()
    wait_for(
        lambda: machines_check(client) == (200, "ok"),
        seconds=30,
        what="/readyz did not see the machines worker back",
        deployment=deployment,
    )


def test_the_beat_stopped_past_a_deadline_then_back_leaves_every_cluster_ready(deployment, client):
    wait_for(
        lambda: Beat.objects.filter(name__in=["tick", "machines"]).count() == 2,
        seconds=90,
        what="the beat's tick and the machines heartbeat never ran",
        deployment=deployment,
    )
    _, project = new_project()
    deployment.stop("beat")  # the creates' own advances hand out the starts; no tick follows
    ids = clusters(project)
    started = time.monotonic()
    time.sleep(OUTAGE_SECONDS)  # the outage itself
    assert time.monotonic() - started >= OUTAGE_SECONDS
    assert past_every_deadline(ids)
    assert not Cluster.objects.filter(pk__in=ids, status=Cluster.Status.FAILED).exists()

    deployment.start("beat")
    wait_for(lambda: settled(ids), seconds=120, what="not settled", deployment=deployment)
    assert_all_ready(ids)
    assert Outage.objects.filter(name="tick").exists()
