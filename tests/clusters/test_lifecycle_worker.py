"""The real path once: Celery tasks through the Redis broker, run by a real worker, take a
cluster from create to ready with nothing but the tasks the lifecycle enqueues (plus the tick
a beat would send)."""

import time

import pytest
from celery.contrib.testing.worker import start_worker
from django.conf import settings

from clusters import tasks
from clusters.models import Cluster
from config.celery import app
from tests.clusters.lifecycle_kit import create, inventory, new_project

pytestmark = pytest.mark.procs  # a real Celery worker

needs_redis = pytest.mark.skipif(
    not settings.REDIS_URL, reason="needs the Redis broker: set REDIS_URL (e.g. redis://...)"
)


@needs_redis
@pytest.mark.django_db(transaction=True)
def test_it_reaches_ready_through_enqueued_tasks_on_a_real_worker(settings):
    settings.RUNCRATE_SIM_SPEED = 1_000_000  # machines boot in microseconds
    app.control.purge()  # messages left in this broker by earlier runs
    _, project = new_project()
    machine_type = inventory(hosts=3, boot_seconds=60)

    with start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=30):
        cluster = create(project, machine_type, nodes=3, software="ray")
        # This waits on a real worker, not on simulated time: nothing here moves a clock.
        give_up = time.monotonic() + 60
        while time.monotonic() < give_up:
            cluster.refresh_from_db()
            if cluster.status not in (Cluster.Status.PROVISIONING, Cluster.Status.INSTALLING):
                break
            tasks.tick.delay()  # what the beat sends every RUNCRATE_TICK_SECONDS
            time.sleep(0.25)

    assert cluster.status == Cluster.Status.READY, list(
        cluster.events.values_list("reason", "message")
    )
    assert cluster.nodes.filter(status="joined", step="done").count() == 3
    assert cluster.usage.count() == 3
