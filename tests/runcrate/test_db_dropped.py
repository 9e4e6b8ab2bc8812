"""Our own outages are 503s, never 500s (runcrate/outages.py, issue 19 item 3): the database's
connections killed under a load of real requests, a database or broker error met by a view,
an API endpoint or a middleware, and a create whose connection drops after its commit.

The kills are real: `pg_terminate_backend` on every other backend of this test database (and
only this one), from a connection of the test's own, while the requests run."""

import threading
import uuid
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from decimal import Decimal

import psycopg
import pytest
from django.conf import settings
from django.db import OperationalError, close_old_connections, connection
from django.test import Client
from django.utils import timezone
from kombu.exceptions import OperationalError as BrokerError

from accounts.models import ApiKey, Environment, Invitation, Membership, SshKey
from audit.models import Entry
from clusters import lifecycle
from clusters.models import Cluster, Event, Node
from runcrate import outages
from tests.accounts.sshkeys import ed25519_line
from tests.clusters.front import credit, machine_type_with_hosts, ssh_key
from tests.conftest import Person, postgres_only
from tests.factories import ClusterFactory, LocationFactory, issue_key

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

    monkeypatch.setattr("clusters.web.views.quotes_for", dropped)

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
@pytest.mark.procs  # kills PostgreSQL backends
@pytest.mark.django_db(transaction=True)
def test_a_create_whose_connection_drops_after_its_commit_answers_201(owner, offer, monkeypatch):
    """The connection is killed between the create's commit and its reading back: the cluster
    exists, so the answer is its 201, read on a fresh connection."""
    from clusters.web import api as clusters_api

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
    cluster = Cluster.objects.get(name="after-commit")
    assert recorded(cluster, "created cluster `after-commit`") == 1


def recorded(cluster: Cluster, words: str) -> int:
    """How many entries say the action happened to `cluster` (written in its transaction)."""
    return Entry.objects.filter(
        object_type="cluster",
        object_id=str(cluster.pk),
        summary__startswith=words,
        outcome=Entry.Outcome.DONE,
    ).count()


# --- an action whose commit succeeded (terminate, add workers, retry install) ----------------
# The change commits, then the connection is killed: after the COMMIT (an on_commit hook of the
# test's) or at it (the COMMIT went through, its answer was lost). Either way the answer is the
# action's success, never a 503 whose retry would be refused with 409.


@pytest.fixture
def in_memory():
    with lifecycle.dispatching_to(lifecycle.CollectingDispatcher()) as dispatcher:
        yield dispatcher


def ready_cluster(owner) -> Cluster:
    now = timezone.now()
    credit(owner.project)  # adding workers needs an hour of the grown cluster
    return ClusterFactory(
        project=owner.project,
        machine_type=machine_type_with_hosts(free=3),
        status=Cluster.Status.READY,
        joined_at=now,
        ready_at=now,
        machines=True,
        machines__status=Node.Status.JOINED,
    )


def degraded_cluster(owner) -> Cluster:
    return ClusterFactory(
        project=owner.project,
        software=Cluster.Software.SLURM,
        status=Cluster.Status.DEGRADED,
        failure_reason="install_failed",
        joined_at=timezone.now(),
        machines=True,
        machines__status=Node.Status.JOINED,
        machines__step=Node.Step.INSTALL,
    )


# The words of each action's audit entry.
WORDS = {
    "terminate": "terminated cluster",
    "workers": "added 1 worker to cluster",
    "retry-install": "retried the install of cluster",
}
# (what to do, the lifecycle function it calls, the cluster it needs, the body, the status after)
ACTIONS = {
    "terminate": ("terminate", ready_cluster, None, Cluster.Status.TERMINATING),
    "workers": ("add_workers", ready_cluster, {"count": 1}, Cluster.Status.READY),
    "retry-install": ("retry_install", degraded_cluster, None, Cluster.Status.INSTALLING),
}


def act(api: Client, cluster: Cluster, action: str):
    body = ACTIONS[action][2]
    url = f"/api/v1/clusters/{cluster.pk}/{action}"
    if body is None:
        return api.post(url)
    return api.post(url, body, content_type="application/json")


def assert_done(cluster: Cluster, action: str, response) -> None:
    cluster.refresh_from_db()
    assert cluster.status == ACTIONS[action][3]
    assert response.status_code == 202, response.content
    assert response.json()["data"]["status"] == ACTIONS[action][3]
    if action == "workers":
        assert cluster.nodes.count() == 3
        assert len(response.json()["data"]["machines"]) == 3
    assert recorded(cluster, WORDS[action]) == 1  # in the action's transaction: committed too


@pytest.fixture
def drop_at_commit(monkeypatch):
    """The request's first COMMIT, with every other backend of the test database killed
    around it (the request's own among them): `after` it went through (the next query fails),
    `at` it (it went through, then the client is told it failed, as when the server dies
    before its answer arrives), or `before` it (it fails for real: nothing committed)."""
    killer = _killer_connection()
    real_commit = connection.commit
    dropped: list[int] = []

    def patch(when: str) -> list[int]:
        def commit():
            if dropped:  # once: the request's first COMMIT
                return real_commit()
            if when == "before":
                dropped.append(kill_backends(killer))
                return real_commit()
            real_commit()
            dropped.append(kill_backends(killer))
            if when == "at":
                raise OperationalError("server closed the connection unexpectedly")

        monkeypatch.setattr(connection, "commit", commit)
        return dropped

    yield patch
    monkeypatch.undo()
    killer.close()
    connection.close()


@postgres_only
@pytest.mark.procs  # kills PostgreSQL backends
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("when", ["after", "at"])
@pytest.mark.parametrize("action", ACTIONS)
def test_a_cluster_action_whose_commit_went_through_answers_202(
    owner, in_memory, drop_at_commit, action, when
):
    """`at`: the COMMIT itself raised, and its outcome is asked of the database."""
    cluster = ACTIONS[action][1](owner)
    dropped = drop_at_commit(when)

    response = act(served(owner, api=True), cluster, action)

    assert dropped and dropped[0] >= 1
    assert_done(cluster, action, response)


@postgres_only
@pytest.mark.procs  # kills PostgreSQL backends
@pytest.mark.django_db(transaction=True)
def test_an_action_whose_commit_did_not_happen_answers_503_and_changed_nothing(
    owner, in_memory, drop_at_commit
):
    cluster = ready_cluster(owner)
    dropped = drop_at_commit("before")

    response = act(served(owner, api=True), cluster, "terminate")

    assert dropped and dropped[0] >= 1
    assert_unavailable_envelope(response)
    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.READY
    assert not cluster.events.filter(reason=Event.Reason.TERMINATE_REQUESTED).exists()
    assert recorded(cluster, "terminated cluster") == 0


@postgres_only
@pytest.mark.procs  # kills PostgreSQL backends
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("when", ["after", "at"])
def test_a_terminate_from_the_page_whose_commit_went_through_says_so(
    owner, in_memory, drop_at_commit, when
):
    cluster = ready_cluster(owner)
    browser = served(owner, api=False)
    drop_at_commit(when)

    response = browser.post(f"/clusters/{cluster.pk}/terminate/")

    assert response.status_code == 302, response.content[:300]
    assert response["Location"] == f"/clusters/{cluster.pk}/"
    page = browser.get(response["Location"]).content.decode()
    assert f"Terminating {cluster.name}: every machine stops and billing ends now." in page
    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.TERMINATING


@postgres_only
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("ends", ["commit", "rollback"])
def test_it_waits_for_a_transaction_still_ending_to_say_whether_it_committed(ends):
    """A backend killed at its COMMIT may still be ending when its outcome is asked: the
    answer waits for it (bounded), then says what it became."""
    other = _killer_connection()
    try:
        other.execute("begin")
        xid = other.execute("select pg_current_xact_id()::text").fetchone()[0]
        timer = threading.Timer(0.2, lambda: other.execute(ends))
        timer.start()
        committed = outages._committed(xid)
        timer.join(timeout=5)
    finally:
        other.close()
        connection.close()

    assert committed is (ends == "commit")


# --- the project's other changes: keys, members, budgets, channels ---------------------------


@dataclass
class Change:
    """One API call that changes something: how to make it, its success, how to see it done."""

    method: str
    url: Callable[[Person], str]
    body: dict | None
    success: int
    done: Callable[[Person], bool]
    words: str = ""  # the start of its audit entry's words


def _teammate(owner: Person) -> Membership:
    return Membership.objects.get(project=owner.project, user__email="teammate@example.com")


def _spare_key(owner: Person) -> ApiKey:
    return ApiKey.objects.get(project=owner.project, name="spare")


CHANGES = {
    "add ssh key": Change(
        "post",
        lambda owner: "/api/v1/ssh-keys",
        {"name": "desk", "public_key": ed25519_line()},
        201,
        lambda owner: SshKey.objects.filter(project=owner.project, name="desk").exists(),
        words="added SSH key `desk`",
    ),
    "remove ssh key": Change(
        "delete",
        lambda owner: f"/api/v1/ssh-keys/{SshKey.objects.get(name='laptop').pk}",
        None,
        204,
        lambda owner: not SshKey.objects.filter(name="laptop").exists(),
        words="removed SSH key `laptop`",
    ),
    "issue api key": Change(
        "post",
        lambda owner: "/api/v1/keys",
        {"name": "agent"},
        201,
        lambda owner: ApiKey.objects.filter(project=owner.project, name="agent").exists(),
        words="created API key `agent`",
    ),
    "revoke api key": Change(
        "delete",
        lambda owner: f"/api/v1/keys/{_spare_key(owner).pk}",
        None,
        204,
        lambda owner: _spare_key(owner).revoked_at is not None,
        words="revoked API key `spare`",
    ),
    "set budget": Change(
        "put",
        lambda owner: "/api/v1/environments/default/budget",
        {"amount": "750.00"},
        200,
        lambda owner: (
            owner.project.environments.get(name="default").monthly_budget == Decimal("750.00")
        ),
        words="set the monthly budget of `default`",
    ),
    "invite member": Change(
        "post",
        lambda owner: "/api/v1/members",
        {"email": "new@example.com", "role": "developer"},
        201,
        lambda owner: Invitation.objects.filter(email="new@example.com").exists(),
        words="invited new@example.com",
    ),
    "change role": Change(
        "patch",
        lambda owner: f"/api/v1/members/{_teammate(owner).pk}",
        {"role": "manager"},
        200,
        lambda owner: _teammate(owner).role == Membership.Role.MANAGER,
        words="changed the role of teammate@example.com",
    ),
    "remove member": Change(
        "delete",
        lambda owner: f"/api/v1/members/{_teammate(owner).pk}",
        None,
        204,
        lambda owner: not Membership.objects.filter(user__email="teammate@example.com").exists(),
        words="removed teammate@example.com",
    ),
}


def make_change(api: Client, owner: Person, change: Change):
    call = getattr(api, change.method)
    if change.body is None:
        return call(change.url(owner))
    return call(change.url(owner), change.body, content_type="application/json")


@pytest.fixture
def project_to_change(owner, teammate):
    ssh_key(owner.project)
    issue_key(user=owner.user, project=owner.project, name="spare")
    return owner


@postgres_only
@pytest.mark.procs  # kills PostgreSQL backends
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("when", ["after", "at"])
@pytest.mark.parametrize("name", CHANGES)
def test_a_change_whose_commit_went_through_answers_its_success(
    project_to_change, drop_at_commit, name, when
):
    owner, change = project_to_change, CHANGES[name]
    api = served(owner, api=True)
    assert not change.done(owner)
    dropped = drop_at_commit(when)

    response = make_change(api, owner, change)

    assert dropped and dropped[0] >= 1
    assert change.done(owner)
    assert response.status_code == change.success, response.content
    done = Entry.objects.filter(summary__startswith=change.words, outcome=Entry.Outcome.DONE)
    assert done.count() == 1


# --- a load of real requests while the database's backends are killed ------------------------


@contextmanager
def killing(pace: float = 0.1):
    """Every other backend of the test database killed every `pace` seconds by a second
    thread, for the block; yields how many each kill ended (read it after the block)."""
    stop = threading.Event()
    killed: list[int] = []
    killer = _killer_connection()

    def keep_killing() -> None:
        while not stop.is_set():
            killed.append(kill_backends(killer))
            stop.wait(pace)  # a pace between kills, not a wait for anything

    thread = threading.Thread(target=keep_killing, daemon=True)
    thread.start()
    try:
        yield killed
    finally:
        stop.set()
        thread.join(timeout=10)
        killer.close()
        connection.close()
    assert not thread.is_alive()


@postgres_only
@pytest.mark.procs  # kills PostgreSQL backends
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
@pytest.mark.procs  # kills PostgreSQL backends
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
    statuses: list[int] = []
    made: dict[str, int] = {}
    with killing() as killed:
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

    assert sum(killed) >= 10, "the load must actually have lost connections"
    assert 500 not in statuses, sorted(set(statuses))
    assert set(statuses) <= {200, 201, 503}, sorted(set(statuses))
    assert statuses.count(200) > 0
    assert set(made.values()) == {201}, made
    for name in made:
        assert Cluster.objects.filter(name=name).count() == 1


ROUNDS = 10


@postgres_only
@pytest.mark.procs  # kills PostgreSQL backends
@pytest.mark.django_db(transaction=True)
def test_every_action_that_committed_under_the_killer_answered_its_success(owner, in_memory):
    """Terminates (API and page), add workers, API keys issued and revoked and budgets set,
    each sent once while every backend is killed over and over: none is a 500, each is its
    success or a 503, and every one that committed answered its success (a 503 only for what
    did not happen, so sending it again is right)."""
    machine_type = machine_type_with_hosts(free=ROUNDS)
    credit(owner.project, "5000.00")
    now = timezone.now()

    def ready() -> Cluster:
        return ClusterFactory(
            project=owner.project,
            machine_type=machine_type,
            status=Cluster.Status.READY,
            joined_at=now,
            ready_at=now,
            machines=True,
            machines__status=Node.Status.JOINED,
        )

    by_api, by_page = [ready() for _ in range(ROUNDS)], [ready() for _ in range(ROUNDS // 2)]
    growing = ready()
    for i in range(ROUNDS):
        issue_key(user=owner.user, project=owner.project, name=f"spare-{i}")
        Environment.objects.create(project=owner.project, name=f"env-{i}")
    spares = ApiKey.objects.filter(name__startswith="spare-")
    spare_ids = list(spares.order_by("pk").values_list("pk", flat=True))
    api, browser = served(owner, api=True), served(owner, api=False)
    answers: dict[str, list[tuple[object, int]]] = {
        "terminate": [],
        "page": [],
        "workers": [],
        "issue": [],
        "revoke": [],
        "budget": [],
    }
    json = "application/json"
    with killing(pace=0.06) as killed:
        for i in range(ROUNDS):
            cluster = by_api[i]
            answers["terminate"].append(
                (cluster.pk, api.post(f"/api/v1/clusters/{cluster.pk}/terminate").status_code)
            )
            if i < len(by_page):
                cluster = by_page[i]
                response = browser.post(f"/clusters/{cluster.pk}/terminate/")
                answers["page"].append((cluster.pk, response.status_code))
            url = f"/api/v1/clusters/{growing.pk}/workers"
            response = api.post(url, {"count": 1}, content_type=json)
            answers["workers"].append((i, response.status_code))
            name = f"agent-{i}"
            response = api.post("/api/v1/keys", {"name": name}, content_type=json)
            answers["issue"].append((name, response.status_code))
            key_id = spare_ids[i]
            answers["revoke"].append((key_id, api.delete(f"/api/v1/keys/{key_id}").status_code))
            env = f"env-{i}"
            url = f"/api/v1/environments/{env}/budget"
            response = api.put(url, {"amount": "100.00"}, content_type=json)
            answers["budget"].append((env, response.status_code))

    assert sum(killed) >= 5, "the load must actually have lost connections"
    statuses = {status for kind in answers.values() for _, status in kind}
    assert 500 not in statuses, answers
    terminating = set(
        Cluster.objects.filter(status=Cluster.Status.TERMINATING).values_list("pk", flat=True)
    )
    issued = set(ApiKey.objects.filter(name__startswith="agent-").values_list("name", flat=True))
    revoked = set(spares.filter(revoked_at__isnull=False).values_list("pk", flat=True))
    budgeted = set(
        Environment.objects.filter(monthly_budget=Decimal("100.00")).values_list("name", flat=True)
    )
    committed = {
        "terminate": terminating,
        "page": terminating,
        "issue": issued,
        "revoke": revoked,
        "budget": budgeted,
    }
    success = {"terminate": 202, "page": 302, "workers": 202, "issue": 201, "revoke": 204}
    success["budget"] = 200
    for kind, done in committed.items():
        for what, status in answers[kind]:
            assert status == (success[kind] if what in done else 503), (kind, what, answers)
    added = growing.nodes.count() - growing.size
    assert added == [status for _, status in answers["workers"]].count(202), answers["workers"]
    assert {status for _, status in answers["workers"]} <= {202, 503}
    assert_every_committed_action_recorded_once(committed, growing, added)


def assert_every_committed_action_recorded_once(
    committed: dict[str, set], growing: Cluster, added: int
) -> None:
    """Each action that committed has its one entry, written in its transaction; one that did
    not has none saying it was done."""
    done = Entry.objects.filter(outcome=Entry.Outcome.DONE)
    terminated = done.filter(summary__startswith="terminated cluster")
    assert sorted(int(e.object_id) for e in terminated) == sorted(committed["terminate"])
    created = done.filter(summary__startswith="created API key `agent-")
    assert sorted(e.object_name for e in created) == sorted(committed["issue"])
    revoked = done.filter(summary__startswith="revoked API key `spare-")
    assert sorted(int(e.object_id) for e in revoked) == sorted(committed["revoke"])
    budgets = done.filter(summary__startswith="set the monthly budget of `env-")
    assert sorted(e.object_name for e in budgets) == sorted(committed["budget"])
    assert recorded(growing, "added 1 worker") == added


@dataclass
class Form:
    """One dashboard form that changes something: where it posts, what, how to see it done."""

    url: Callable[[Person], str]
    data: Callable[[Person], dict]
    done: Callable[[Person], bool]


def _default_environment(owner: Person) -> Environment:
    return owner.project.environments.get(name="default")


FORMS = {
    "revoke api key": Form(
        lambda owner: f"/accounts/api-keys/{_spare_key(owner).pk}/revoke/",
        lambda owner: {},
        lambda owner: _spare_key(owner).revoked_at is not None,
    ),
    "add ssh key": Form(
        lambda owner: "/accounts/ssh-keys/add/",
        lambda owner: {"name": "desk", "public_key": ed25519_line()},
        lambda owner: SshKey.objects.filter(project=owner.project, name="desk").exists(),
    ),
    "set budget": Form(
        lambda owner: "/billing/environments/default/budget/",
        lambda owner: {f"env-{_default_environment(owner).pk}-monthly_budget": "250"},
        lambda owner: _default_environment(owner).monthly_budget == Decimal("250"),
    ),
    "change role": Form(
        lambda owner: f"/accounts/members/{_teammate(owner).pk}/role/",
        lambda owner: {"role": "manager"},
        lambda owner: _teammate(owner).role == Membership.Role.MANAGER,
    ),
}


@postgres_only
@pytest.mark.procs  # kills PostgreSQL backends
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("name", FORMS)
def test_a_form_whose_commit_went_through_as_its_connection_dropped_redirects(
    project_to_change, drop_at_commit, name
):
    owner, form = project_to_change, FORMS[name]
    browser = served(owner, api=False)
    url, data = form.url(owner), form.data(owner)
    dropped = drop_at_commit("at")

    response = browser.post(url, data)

    assert dropped and dropped[0] >= 1
    assert form.done(owner)
    assert response.status_code == 302, response.content[:300]


# --- every action of the API is one `outages.commit` -----------------------------------------

# The operations that change something and are not `outages.committing`, each with why.
NOT_COMMITTING = {
    "create_cluster": "outages.commit for the change, then after_commit for the answer; with an "
    "Idempotency-Key the record's transaction holds the create",
    "plan_cluster": "changes nothing",
    "plan_replace": "changes nothing",
    "plan_add_workers": "changes nothing",
    "delete_machine": "changes nothing: always 405",
    "test_webhook": "waits on the receiver: a transaction around it would wait too",
    "check_in": "the agent's: it sends again by itself",
    "network": "the agent's: it sends again by itself",
    "report_metrics": "the agent's: it sends again by itself",
}


def test_every_operation_that_changes_something_is_one_commit():
    """A new POST, PUT, PATCH or DELETE of the API is `outages.committing`, or named above."""
    import config.urls  # noqa: F401  (mounts every router)
    from runcrate.api import api

    one_commit = outages.committing(lambda request: request).__code__
    left_out = []
    for _, router in api._routers:
        for operations in router.path_operations.values():
            for operation in operations.operations:
                if not set(operation.methods) - outages.SAFE_METHODS:
                    continue
                view = operation.view_func
                if view.__code__ is not one_commit and view.__name__ not in NOT_COMMITTING:
                    left_out.append(f"{view.__module__}.{view.__name__}")

    assert left_out == []
