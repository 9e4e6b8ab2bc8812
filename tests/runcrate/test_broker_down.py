"""With the broker (and the cache, on the same Redis) away: a create answers 201 once and a
terminate 202, nothing is duplicated, `/readyz` says which part is down, and every cluster
settles once the broker is back (docs/architecture.md, "When the broker is away").

"Away" is real: the Celery app and the cache point at 127.0.0.1:9, where nothing listens, so
every publish and every cache call meets a refused connection."""

from datetime import timedelta
from decimal import Decimal

import pytest
import time_machine
from django.core.cache import cache
from django.utils import timezone

from clusters.models import Cluster
from config.celery import app
from offers.models import Host
from runcrate.models import Beat
from tests.clusters.front import credit, machine_type_with_hosts, ssh_key
from tests.clusters.lifecycle_kit import Sim
from tests.factories import LocationFactory

pytestmark = pytest.mark.django_db(transaction=True)  # on_commit hooks run, as in production

NOWHERE = "redis://127.0.0.1:9/0"


@pytest.fixture
def broker_away(settings):
    """The Celery app's broker and the cache both unreachable, then given back."""
    old_url = app.conf.broker_url
    settings.CACHES = {
        "default": {
            "BACKEND": "runcrate.cache.ForgivingRedisCache",
            "LOCATION": NOWHERE,
            "OPTIONS": {"socket_connect_timeout": 1, "socket_timeout": 1},
        }
    }

    def point_at(url: str) -> None:
        # The app's pools are made from the URL on first use: dropped, they are made anew.
        app.conf.broker_url = url
        app._pool = None
        app.amqp._producer_pool = None

    point_at(NOWHERE)
    yield
    point_at(old_url)


@pytest.fixture
def offer(owner):
    ssh_key(owner.project)
    credit(owner.project, "500.00")
    return machine_type_with_hosts(
        free=4,
        slug="use2-h100x8-vm",
        price_per_hour=Decimal("10.00"),
        boot_seconds=60,
        location=LocationFactory(code="us-east-2", name="Columbus, Ohio"),
    )


def test_create_and_terminate_answer_what_happened_and_the_tick_settles_it_later(
    owner, offer, broker_away, settings
):
    body = {"name": "train", "offer_id": "use2-h100x8-vm", "nodes": 2, "software": "none"}
    created = owner.api().post("/api/v1/clusters", body, content_type="application/json")
    assert created.status_code == 201, created.content
    cluster = Cluster.objects.get(pk=created.json()["data"]["id"])
    assert Cluster.objects.count() == 1
    assert Host.objects.filter(machine_type=offer).exclude(state=Host.State.FREE).count() == 2
    # The cache is away too: the page that shows it still answers.
    assert cache.get("anything", "missing") == "missing"
    assert owner.browser_client().get(f"/clusters/{cluster.pk}/").status_code == 200

    ended = owner.api().post(f"/api/v1/clusters/{cluster.pk}/terminate")
    assert ended.status_code == 202, ended.content
    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.TERMINATING
    assert Cluster.objects.count() == 1

    # The broker comes back: the tick finds the work nobody could queue.
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    with Sim() as sim:
        for _ in range(20):
            sim.tick()
            cluster.refresh_from_db()
            if cluster.status == Cluster.Status.TERMINATED:
                break
    assert cluster.status == Cluster.Status.TERMINATED
    assert not Host.objects.filter(machine_type=offer).exclude(state=Host.State.FREE).exists()


def test_readyz_says_which_part_is_down(client, broker_away):
    Beat.record("tick")
    Beat.record("meter")
    answer = client.get("/readyz")
    assert answer.status_code == 503
    checks = answer.json()["checks"]
    assert checks["database"] == "ok"
    assert checks["broker"].startswith("down: ")
    assert (checks["tick"], checks["meter"]) == ("ok", "ok")
    # Liveness is another question: the process answers.
    assert client.get("/healthz").status_code == 200


def test_readyz_is_ready_with_the_broker_and_fresh_beats_and_not_when_a_beat_is_overdue(
    client, settings
):
    settings.RUNCRATE_TICK_SECONDS = 2
    settings.RUNCRATE_METER_SECONDS = 60
    never = client.get("/readyz")
    assert never.status_code == 503
    assert never.json()["checks"]["tick"].startswith("never ran")

    now = timezone.now()
    Beat.record("tick", at=now)
    Beat.record("meter", at=now)
    Beat.record("machines", at=now)
    Beat.record("releases", at=now)
    ready = client.get("/readyz")
    assert ready.status_code == 200, ready.json()
    assert ready.json() == {
        "status": "ok",
        "checks": {
            "database": "ok",
            "broker": "ok",
            "tick": "ok",
            "machines": "ok",
            "releases": "ok",
            "meter": "ok",
        },
    }
    with time_machine.travel(now + timedelta(seconds=61), tick=False):
        Beat.record("meter")  # the meter and the machines queue run; the tick has not for 61 s
        Beat.record("machines")
        Beat.record("releases")
        late = client.get("/readyz")
    assert late.status_code == 503
    assert late.json()["checks"]["tick"] == "overdue: last ran 61 s ago"
    assert late.json()["checks"]["meter"] == "ok"
    assert late.json()["checks"]["machines"] == "ok"


def test_recording_a_beat_costs_one_query_once_it_has_run(django_assert_num_queries):
    Beat.record("tick")
    later = timezone.now() + timedelta(seconds=2)
    with django_assert_num_queries(1):
        Beat.record("tick", at=later)
    assert Beat.objects.get(name="tick").last_ran_at == later
