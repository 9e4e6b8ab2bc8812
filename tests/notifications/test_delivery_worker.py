"""A customer's slow receiver holds nothing of anyone else's (issue 33, item 2), shown with real
workers: the `notifications` queue's worker as the Procfile starts it (a process of its own),
and a worker of the default and `machines` queues running the tick. Two receivers on 127.0.0.1
drip a header line every 0.5 s; while the beat's pass waits on them, each to its whole 10 s
deadline, another customer's cluster comes up on the tick; then each attempt ends at its
deadline, saying so, and is retried later like any failure."""

import time
from pathlib import Path

import pytest
from celery.contrib.testing.worker import start_worker
from django.conf import settings

from clusters import tasks
from clusters.models import Cluster
from config.celery import app
from notifications import delivery
from notifications.endpoints import create_endpoint
from notifications.models import Delivery
from notifications.tasks import send_notifications
from tests.clusters.lifecycle_kit import create, inventory, new_project
from tests.notifications.conftest import ready_event, serve, trickle
from tests.worker_kit import procfile_worker

pytestmark = [
    pytest.mark.procs,
    pytest.mark.skipif(
        not settings.REDIS_URL, reason="needs the Redis broker: set REDIS_URL (e.g. redis://...)"
    ),
]


def wait_for(condition, *, seconds: float, what: str) -> None:
    give_up = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < give_up, f"{what} did not happen within {seconds:.0f} s"
        time.sleep(0.2)


@pytest.mark.django_db(transaction=True)
def test_trickling_receivers_hold_their_own_worker_while_the_tick_brings_a_cluster_up(
    owner, local_webhooks, settings, tmp_path: Path
):
    settings.RUNCRATE_SIM_SPEED = 1_000_000  # the other customer's machines boot at once
    app.control.purge()  # messages left in this broker by earlier runs
    accepted: list[float] = []
    receivers = [serve(trickle, accepted) for _ in range(2)]
    for receiver in receivers:
        url = next(receiver)
        create_endpoint(project=owner.project, user=owner.user, url=url, events=["cluster.ready"])
    ready_event(owner.project)
    _, other = new_project()
    machine_type = inventory(hosts=3, boot_seconds=60)
    try:
        with (
            procfile_worker(
                "notify",
                tmp_path / "notify.log",
                DEBUG="true",  # a receiver over http on 127.0.0.1, as the tests' own setting
                RUNCRATE_WEBHOOKS_ALLOW_PRIVATE="true",
                SITE_URL="http://testserver",
            ),
            start_worker(
                app,
                pool="solo",
                queues=["celery", "machines"],
                perform_ping_check=False,
                shutdown_timeout=30,
            ),
        ):
            send_notifications.delay()  # what the beat sends every 5 s, once here
            wait_for(lambda: accepted, seconds=60, what="the first receiver's connection")

            cluster = create(other, machine_type, nodes=3)
            while cluster.status in (Cluster.Status.PROVISIONING, Cluster.Status.INSTALLING):
                tasks.tick.delay()  # what the beat sends every RUNCRATE_TICK_SECONDS
                time.sleep(0.25)
                cluster.refresh_from_db()
                # Both attempts take 20 s: the cluster needs far less, on the tick alone.
                assert Delivery.objects.filter(attempts=0).exists(), "the pass ended first"
            assert cluster.status == Cluster.Status.READY, cluster.failure_message
            # The pass was still held by the receivers when the cluster was ready.
            assert Delivery.objects.filter(attempts=0).exists()

            wait_for(
                lambda: not Delivery.objects.filter(attempts=0).exists(),
                seconds=60,
                what="both attempts' end",
            )
    finally:
        for receiver in receivers:
            receiver.close()

    assert len(accepted) == 2
    # Each attempt ended at its whole deadline (connect to last byte): the trickle never ends,
    # and this error is the deadline's own.
    for sent in Delivery.objects.all():
        assert (sent.state, sent.attempts) == (Delivery.State.PENDING, 1)
        assert sent.last_error == f"no whole answer within {delivery.TIMEOUT:.0f} seconds"
