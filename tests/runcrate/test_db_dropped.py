"""Our own outages are 503s, never 500s (runcrate/outages.py, issue 19 item 3): the database's
connections killed under a load of real requests, a database or broker error met by a view,
an API endpoint or a middleware, and a create whose connection drops after its commit.

The kills are real: `pg_terminate_backend` on every other backend of this test database (and
only this one), from a connection of the test's own, while the requests run."""

import threading
import uuid
from decimal import Decimal

import psycopg
import pytest
from django.conf import settings
from django.db import OperationalError, close_old_connections, connection
from django.test import Client
from kombu.exceptions import OperationalError as BrokerError

from clusters.models import Cluster
from runcrate import outages
from tests.clusters.front import credit, machine_type_with_hosts, ssh_key
from tests.conftest import postgres_only
from tests.factories import LocationFactory

ME = "/api/v1/me"
KILL = (
    "select count(*) filter (where pg_terminate_backend(pid)) from pg_stat_activity "
    "where datname = current_database() and pid <> pg_backend_pid()"
)


@pytest.fixture(autouse=True)
def _production(settings):
    settings.DEBUG = False


class ServedClient(Client):
    """The test client as a real server runs a request: Django's WSGI handler closes a
    connection that failed or grew old, and re-arms its health check, before and after each
    request (`close_old_connections` on request_started and request_finished, which the test
    client leaves out). Exceptions are answered, as in production, not raised."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, raise_request_exception=False, **kwargs)

    def request(self, **request):
        close_old_connections()
        try:
            return super().request(**request)
        finally:
            close_old_connections()


def served(person, *, api: bool) -> ServedClient:
    if api:
        return ServedClient(headers={"authorization": f"Bearer {person.key}"})
    client = ServedClient()
    client.force_login(person.user)
    return client


def _killer_connection() -> psycopg.Connection:
    db = settings.DATABASES["default"]
    return psycopg.connect(
        dbname=db["NAME"],
        user=db.get("USER") or None,
        password=db.get("PASSWORD") or None,
        host=db.get("HOST") or None,
        port=db.get("PORT") or None,
        autocommit=True,
    )


def kill_backends(killer: psycopg.Connection) -> int:
    """Terminate every other connection to this test database; how many there were."""
    return killer.execute(KILL).fetchone()[0]


def assert_unavailable_envelope(response) -> None:
    assert response.status_code == 503, response.content
    assert response["Retry-After"] == str(outages.RETRY_AFTER_SECONDS)
    assert response["Content-Type"].startswith("application/json")
    assert response.json()["error"]["code"] == "service_unavailable"


def assert_unavailable_page(response) -> None:
    assert response.status_code == 503, response.content[:300]
    assert response["Retry-After"] == str(outages.RETRY_AFTER_SECONDS)
    html = response.content.decode()
    assert "We could not reach our database or task queue just now" in html
    assert 'href="/static/css/app.css"' in html
    assert "Traceback" not in html


# --- what each kind of outage answers ------------------------------------------------------


def test_it_answers_a_dropped_connection_in_an_endpoint_with_503_and_the_envelope(
    owner, monkeypatch
):
    def dropped(*args, **kwargs):
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr("accounts.api._key_terms", dropped)

    assert_unavailable_envelope(owner.api().get(ME))


def test_it_answers_a_broker_that_is_away_with_503_too(owner, monkeypatch):
    def away(*args, **kwargs):
        raise BrokerError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")

    monkeypatch.setattr("accounts.api._key_terms", away)

    assert_unavailable_envelope(owner.api().get(ME))


def test_it_still_answers_a_bug_with_500(owner, monkeypatch):
    def bug(*args, **kwargs):
        raise KeyError("a bug")

    monkeypatch.setattr("accounts.api._key_terms", bug)

    response = owner.api().get(ME)
    assert response.status_code == 500
    assert response.json()["error"]["code"] == "internal_error"
    assert not response.has_header("Retry-After")


def test_it_answers_a_page_whose_view_lost_the_database_with_the_503_page(owner, monkeypatch):
    def dropped(project):
        raise OperationalError("terminating connection due to administrator command")

    monkeypatch.setattr("clusters.views.quotes_for", dropped)

    assert_unavailable_page(owner.browser_client().get("/clusters/"))


def test_it_answers_a_middleware_that_lost_the_database_with_503(owner, monkeypatch):
    """The session is read by a middleware, before any view: Django's handler500 tells the
    outage apart (runcrate.middleware.server_error)."""

    def dropped(self, *args, **kwargs):
        raise OperationalError("the connection is closed")

    browser = owner.browser_client()
    browser.raise_request_exception = False
    monkeypatch.setattr("django.contrib.sessions.backends.db.SessionStore.load", dropped)

    assert_unavailable_page(browser.get("/clusters/"))


def test_it_answers_an_api_call_whose_middleware_lost_the_database_with_the_envelope(
    owner, monkeypatch
):
    def dropped(self, *args, **kwargs):
        raise OperationalError("the connection is closed")

    browser = owner.browser_client()  # a session cookie: the session middleware reads it
    browser.raise_request_exception = False
    monkeypatch.setattr("django.contrib.sessions.backends.db.SessionStore.load", dropped)

    assert_unavailable_envelope(browser.get("/api/v1/gpus"))


# --- a create whose commit succeeded ---------------------------------------------------------


@pytest.fixture
def offer(owner):
    ssh_key(owner.project)
    credit(owner.project, "500.00")
    return machine_type_with_hosts(
        free=12,
        slug="use2-h100x8-vm",
        price_per_hour=Decimal("1.00"),
        boot_seconds=60,
        location=LocationFactory(code="us-east-2", name="Columbus, Ohio"),
    )


def create(api: Client, name: str, key: str | None = None):
    headers = {"Idempotency-Key": key} if key else {}
    body = {"name": name, "offer_id": "use2-h100x8-vm", "nodes": 2, "software": "none"}
    return api.post("/api/v1/clusters", body, content_type="application/json", headers=headers)


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_a_create_whose_connection_drops_after_its_commit_answers_201(owner, offer, monkeypatch):
    """The connection is killed between the create's commit and its reading back: the cluster
    exists, so the answer is its 201, read on a fresh connection."""
    from clusters import api as clusters_api

    killer = _killer_connection()
    real_detail = clusters_api._detail
    kills = []

    def killed_first(cluster):
        if not kills:
            kills.append(kill_backends(killer))
        return real_detail(cluster)

    monkeypatch.setattr(clusters_api, "_detail", killed_first)
    try:
        response = create(owner.api(), "after-commit")
    finally:
        killer.close()
        connection.close()

    assert response.status_code == 201, response.content
    assert kills and kills[0] >= 1
    assert response.json()["data"]["name"] == "after-commit"
    assert Cluster.objects.filter(name="after-commit").count() == 1


# --- a load of real requests while the database's backends are killed ------------------------


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_it_replaces_a_connection_the_server_dropped_between_requests(owner):
    """CONN_HEALTH_CHECKS: the kept connection is checked before reuse, so the request after a
    kill is served, not failed."""
    assert settings.DATABASES["default"]["CONN_HEALTH_CHECKS"] is True
    assert settings.DATABASES["default"]["CONN_MAX_AGE"] > 0  # kept between requests
    api = served(owner, api=True)
    assert api.get(ME).status_code == 200
    killer = _killer_connection()
    try:
        assert kill_backends(killer) >= 1  # the connection this thread keeps between requests
        response = api.get(ME)
    finally:
        killer.close()
        connection.close()

    assert response.status_code == 200, response.content


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_killing_the_databases_backends_under_load_gives_no_500(owner, offer):
    """Pages, API reads and idempotent creates while a second thread kills every backend over
    and over: every answer is a success or a 503, and a create retried with its Idempotency-Key
    after a 503 made exactly one cluster."""
    api = served(owner, api=True)
    browser = served(owner, api=False)
    calls = [
        lambda: api.get(ME),
        lambda: api.get("/api/v1/clusters"),
        lambda: api.get("/api/v1/gpus"),
        lambda: browser.get("/clusters/"),
        lambda: browser.get("/accounts/"),
    ]
    stop = threading.Event()
    killed: list[int] = []
    killer = _killer_connection()

    def keep_killing() -> None:
        while not stop.is_set():
            killed.append(kill_backends(killer))
            stop.wait(0.1)  # a pace between kills, not a wait for anything

    thread = threading.Thread(target=keep_killing, daemon=True)
    thread.start()
    statuses: list[int] = []
    made: dict[str, int] = {}
    try:
        for round_ in range(30):
            for call in calls:
                statuses.append(call().status_code)
            if round_ % 6 == 0:  # five creates, each retried with its key until it lands
                key, name = str(uuid.uuid4()), f"load-{round_}"
                # Until it lands: a create whose every try is cut by a kill (one every 0.1 s,
                # on a loaded machine) is retried, as a client with its key would. Bounded: in
                # the full suite on 2 CPUs, 60 tries of one create were once all cut.
                for _ in range(300):
                    status = create(api, name, key).status_code
                    statuses.append(status)
                    if status != 503:
                        break
                made[name] = status
    finally:
        stop.set()
        thread.join(timeout=10)
        killer.close()
        connection.close()

    assert not thread.is_alive()
    assert sum(killed) >= 10, "the load must actually have lost connections"
    assert 500 not in statuses, sorted(set(statuses))
    assert set(statuses) <= {200, 201, 503}, sorted(set(statuses))
    assert statuses.count(200) > 0
    assert set(made.values()) == {201}, made
    for name in made:
        assert Cluster.objects.filter(name=name).count() == 1
