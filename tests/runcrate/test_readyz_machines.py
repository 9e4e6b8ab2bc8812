"""`/readyz` sees the `machines` worker (issue 19): the beat sends a heartbeat to the `machines`
queue as often as the tick, a worker of that queue records it, and readiness is 503 naming the
worker while the heartbeat is missing or overdue."""

from datetime import timedelta

import pytest
import time_machine
from django.utils import timezone

from clusters import tasks
from config.celery import app
from runcrate.models import Beat

pytestmark = pytest.mark.django_db


def fresh(*names: str) -> None:
    for name in names:
        Beat.record(name)


def test_the_beat_sends_the_heartbeat_to_the_machines_queue_as_often_as_the_tick(settings):
    entry = app.conf.beat_schedule["machines-heartbeat"]
    assert entry["task"] == "clusters.tasks.machines_heartbeat"
    assert entry["options"]["queue"] == "machines"
    assert entry["schedule"] == settings.RUNCRATE_TICK_SECONDS


def test_the_heartbeat_task_records_the_machines_beat():
    tasks.machines_heartbeat()
    assert (timezone.now() - Beat.objects.get(name="machines").last_ran_at) < timedelta(seconds=5)


def test_readyz_is_503_naming_the_machines_worker_when_it_never_ran(client):
    fresh("tick", "meter")
    answer = client.get("/readyz")
    assert answer.status_code == 503
    checks = answer.json()["checks"]
    assert checks["machines"] == (
        "never ran: is a worker for the machines queue (celery worker -Q machines) running?"
    )
    assert (checks["tick"], checks["meter"], checks["database"]) == ("ok", "ok", "ok")


def test_readyz_is_503_while_the_machines_heartbeat_is_overdue_and_200_once_it_runs(
    client, settings
):
    settings.RUNCRATE_TICK_SECONDS = 2
    now = timezone.now()
    Beat.record("machines", at=now)
    with time_machine.travel(now + timedelta(seconds=61), tick=False):
        fresh("tick", "meter", "releases")  # the beat runs; the machines queue has not for 61 s
        late = client.get("/readyz")
        assert late.status_code == 503
        assert late.json()["checks"]["machines"] == (
            "overdue: last ran 61 s ago: is a worker for the machines queue "
            "(celery worker -Q machines) running?"
        )
        tasks.machines_heartbeat()
        back = client.get("/readyz")
    assert back.status_code == 200, back.json()
    assert back.json()["checks"]["machines"] == "ok"


def test_the_overdue_limit_has_a_floor_a_setting_can_lower(client, settings):
    settings.RUNCRATE_TICK_SECONDS = 0.5
    settings.RUNCRATE_BEAT_OVERDUE_MIN_SECONDS = 3
    now = timezone.now()
    Beat.record("machines", at=now)
    with time_machine.travel(now + timedelta(seconds=6), tick=False):
        fresh("tick", "meter")
        assert client.get("/readyz").json()["checks"]["machines"].startswith("overdue")
    settings.RUNCRATE_BEAT_OVERDUE_MIN_SECONDS = 60
    with time_machine.travel(now + timedelta(seconds=6), tick=False):
        assert client.get("/readyz").json()["checks"]["machines"] == "ok"


def test_the_beat_sends_the_releases_heartbeat_to_the_releases_queue(settings):
    entry = app.conf.beat_schedule["releases-heartbeat"]
    assert entry["task"] == "clusters.tasks.releases_heartbeat"
    assert entry["options"]["queue"] == "releases"
    assert entry["schedule"] == settings.RUNCRATE_TICK_SECONDS
    tasks.releases_heartbeat()
    assert (timezone.now() - Beat.objects.get(name="releases").last_ran_at) < timedelta(seconds=5)


def test_readyz_names_the_releases_worker_when_it_never_ran_or_is_overdue(client, settings):
    settings.RUNCRATE_TICK_SECONDS = 2
    fresh("tick", "meter", "machines")
    never = client.get("/readyz")
    assert never.status_code == 503
    assert never.json()["checks"]["releases"] == (
        "never ran: is a worker for the releases queue (celery worker -Q releases) running?"
    )
    now = timezone.now()
    Beat.record("releases", at=now)
    with time_machine.travel(now + timedelta(seconds=61), tick=False):
        fresh("tick", "meter", "machines")
        late = client.get("/readyz")
        assert late.status_code == 503
        assert late.json()["checks"]["releases"] == (
            "overdue: last ran 61 s ago: is a worker for the releases queue "
            "(celery worker -Q releases) running?"
        )
        tasks.releases_heartbeat()
        back = client.get("/readyz")
    assert back.status_code == 200, back.json()
    assert back.json()["checks"]["releases"] == "ok"
