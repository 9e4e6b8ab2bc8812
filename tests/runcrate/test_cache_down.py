"""A hung Redis fails fast (issue 19, item 12): the cache and the broker have connect and read
timeouts of about a second, a cache call after a failure does not wait again, and requests are
answered while a throwaway redis-server is paused (SIGSTOP). Bounded by the timeouts in the
settings, not by measuring the clock: without them, these tests would hang."""

import threading
from decimal import Decimal

import pytest
from django.core.cache import cache, caches
from django.core.cache.backends.redis import RedisCache
from django.db import connections
from redis.exceptions import TimeoutError as RedisTimeoutError

from clusters.models import Cluster
from config.celery import app
from runcrate import cache as forgiving
from tests.clusters.front import credit, machine_type_with_hosts, ssh_key
from tests.factories import LocationFactory
from tests.runcrate import throwaway_redis as kit

# Bounds for a call that must end by its own timeout; far above the timeouts, far below "hung".
BOUND_SECONDS = 30


@pytest.fixture
def redis_server(tmp_path):
    server = kit.start(tmp_path)
    yield server
    kit.stop(server)


@pytest.fixture
def cache_on_server(settings, redis_server):
    """Django's cache on the throwaway server, as the settings make it (skipping included)."""
    settings.CACHES = {"default": redis_server.cache_settings()}
    return redis_server


def within_bound(call):
    """Run `call` in a thread and give back what it returned or raised, failing the test if it
    has not ended within BOUND_SECONDS (it hangs: no timeout applied)."""
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["value"] = call()
        except Exception as error:  # what the call raised is the answer
            outcome["error"] = error
        finally:
            connections.close_all()  # this thread's own database connection

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(BOUND_SECONDS)
    assert not thread.is_alive(), f"still waiting after {BOUND_SECONDS} s: no timeout applied"
    return outcome


# --- the settings ------------------------------------------------------------------------------


def test_the_cache_and_the_broker_time_out_within_a_second_or_two(load_settings):
    loaded = load_settings(REDIS_URL="redis://cache.internal:6379/2")

    for alias in ("default", "limits"):
        options = loaded.CACHES[alias]["OPTIONS"]
        assert options == kit.CACHE_OPTIONS, alias  # connect and read: 1 s each
    broker = loaded.CELERY_BROKER_TRANSPORT_OPTIONS
    assert broker["socket_connect_timeout"] == 1
    # Above kombu's 1 s BRPOP, which a consumer's read waits through by design.
    assert 1 < broker["socket_timeout"] <= 2
    assert broker["retry_on_timeout"] is False
    assert loaded.CELERY_BROKER_CONNECTION_TIMEOUT <= 1
    assert loaded.CELERY_TASK_PUBLISH_RETRY_POLICY["max_retries"] <= 1


def test_the_limits_count_in_a_cache_that_raises_on_the_redis_of_the_default(load_settings):
    loaded = load_settings(REDIS_URL="redis://cache.internal:6379/2")
    limits = loaded.CACHES[loaded.RATELIMIT_USE_CACHE]

    assert limits["BACKEND"] == "django.core.cache.backends.redis.RedisCache"
    assert limits["LOCATION"] == loaded.CACHES["default"]["LOCATION"]
    assert limits["KEY_PREFIX"] == loaded.CACHES["default"]["KEY_PREFIX"]
    assert loaded.RATELIMIT_FAIL_OPEN is False


def test_a_laptop_counts_its_limits_in_its_file_cache(load_settings):
    loaded = load_settings()
    assert loaded.RATELIMIT_USE_CACHE == "default"
    assert loaded.CACHES["default"]["BACKEND"].endswith("FileBasedCache")


# --- a paused cache ----------------------------------------------------------------------------


@pytest.mark.procs  # redis-server
def test_a_paused_cache_fails_a_call_by_its_read_timeout(redis_server):
    strict = RedisCache(redis_server.url, {"OPTIONS": dict(kit.CACHE_OPTIONS)})
    strict.set("k", "v")

    with redis_server.paused():
        outcome = within_bound(lambda: strict.get("k"))

    assert isinstance(outcome.get("error"), RedisTimeoutError), outcome


@pytest.mark.procs  # redis-server
def test_a_failed_cache_call_skips_the_cache_a_moment_rather_than_wait_again(
    cache_on_server, monkeypatch
):
    asked: list[str] = []

    def spy(name):
        real = getattr(RedisCache, name)

        def asking(self, *args, **kwargs):
            asked.append(name)
            return real(self, *args, **kwargs)

        return asking

    monkeypatch.setattr(RedisCache, "get", spy("get"))
    monkeypatch.setattr(RedisCache, "add", spy("add"))

    def three_calls():
        first = cache.get("k", "missing")  # a miss, after one read timeout
        skipped = caches["default"]._skip_until > 0
        return first, skipped, cache.get("k", "missing"), cache.add("m", 1)

    with cache_on_server.paused():
        outcome = within_bound(three_calls)

    # The second and third calls answered without asking Redis (one cache per thread).
    assert outcome == {"value": ("missing", True, "missing", True)}
    assert asked == ["get"]
    assert 0 < forgiving.SKIP_SECONDS <= 5


@pytest.mark.procs  # redis-server
@pytest.mark.django_db(transaction=True)  # the call runs in a thread: it sees committed rows
def test_an_api_read_is_answered_while_the_cache_is_paused(owner, cache_on_server):
    api = owner.api()
    assert api.get("/api/v1/me").status_code == 200  # the key cached

    with cache_on_server.paused():
        outcome = within_bound(lambda: api.get("/api/v1/clusters"))

    assert outcome["value"].status_code == 200


# --- a paused broker ---------------------------------------------------------------------------


@pytest.fixture
def broker_paused_server(redis_server):
    """The Celery app's broker on the throwaway server (the cache stays on the shared Redis)."""
    old_url, old_options = app.conf.broker_url, app.conf.broker_transport_options

    def point_at(url: str, options: dict) -> None:
        app.conf.broker_url = url
        app.conf.broker_transport_options = options
        app._pool = None
        app.amqp._producer_pool = None

    options = {**old_options, "socket_connect_timeout": 1, "socket_timeout": 2}
    point_at(redis_server.url, options)
    yield redis_server
    point_at(old_url, old_options)


@pytest.mark.procs  # redis-server
@pytest.mark.django_db(transaction=True)  # on_commit hooks run: the publish is tried
def test_a_create_answers_201_while_the_broker_is_paused(owner, broker_paused_server):
    ssh_key(owner.project)
    credit(owner.project, "500.00")
    machine_type_with_hosts(
        free=2,
        slug="use2-h100x8-vm",
        price_per_hour=Decimal("1.00"),
        boot_seconds=60,
        location=LocationFactory(code="us-east-2", name="Columbus, Ohio"),
    )
    body = {"name": "train", "offer_id": "use2-h100x8-vm", "nodes": 2, "software": "none"}
    api = owner.api()

    with broker_paused_server.paused():
        outcome = within_bound(
            lambda: api.post("/api/v1/clusters", body, content_type="application/json")
        )

    response = outcome["value"]
    assert response.status_code == 201, response.content
    assert Cluster.objects.filter(name="train").count() == 1
