"""The cluster page's poll (docs/clusters.md, "The poll"): an unchanged cluster is answered from
its version alone, in three queries with authentication, and `204`; a changed one gets the new
version and only what changed; and every writer of what the page shows moves the version."""

import html
import re
from datetime import timedelta
from urllib.parse import parse_qs, urlsplit

import pytest
import time_machine
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from accounts.models import User
from clusters import lifecycle
from clusters.lifecycle.network_test import do_network_test
from clusters.models import Cluster, Event, Node
from clusters.telemetry import metrics
from tests.clusters.lifecycle_kit import create, inventory
from tests.factories import ClusterFactory, EventFactory, NodeFactory

HTMX = {"HX-Request": "true"}
NOW = "2026-12-01 10:00:00Z"
UNSHOWN_COLUMNS = ('"driver_state"', '"reachability"', '"gpus"')


def poll_url(page: str) -> str:
    """The URL the page polls (its `hx-get`), as the browser sends it."""
    found = re.search(r'<section id="cluster-status"[^>]* hx-get="([^"]*)"', page)
    assert found, "the page does not poll"
    return html.unescape(found.group(1))


def query_of(url: str) -> dict[str, str]:
    return {key: values[0] for key, values in parse_qs(urlsplit(url).query).items()}


def live_cluster(project, *, size: int = 2, **fields) -> Cluster:
    cluster = ClusterFactory(project=project, size=size, machines=True, **fields)
    for node in cluster.nodes.all():
        EventFactory(cluster=cluster, node=node, reason=Event.Reason.MACHINE_RUNNING)
    return cluster


def change(cluster: Cluster, *, node: Node | None = None, message: str = "") -> int:
    """What a writer does, by hand: bump the version, stamp the rows and the event it writes."""
    cluster.refresh_from_db()
    version = cluster.bump_version()
    cluster.save(update_fields=["version"])
    if node is not None:
        Node.objects.filter(pk=node.pk).update(step=Node.Step.AGENT, version=version)
    if message:
        EventFactory(cluster=cluster, message=message, version=version)
    return version


# --- the unchanged poll ---------------------------------------------------------------------


@pytest.mark.parametrize("size", [2, 64])
def test_it_answers_an_unchanged_poll_with_204_in_three_queries(
    owner, django_assert_num_queries, size
):
    cluster = live_cluster(owner.project, size=size)
    client = owner.browser_client()
    url = poll_url(client.get(f"/clusters/{cluster.pk}/").content.decode())
    assert query_of(url)["version"] == "0"

    # Everything the request costs: the session, the user, and the cluster's version.
    with django_assert_num_queries(3) as queries:
        response = client.get(url, headers=HTMX)

    assert response.status_code == 204
    assert response.content == b""
    assert "HX-Request" in response["Vary"]
    sql = " ".join(query["sql"] for query in queries.captured_queries)
    assert "clusters_node" not in sql and "clusters_event" not in sql
    assert "accounts_membership" in sql  # the project, inside the cluster's query


@pytest.mark.parametrize("size", [2, 64])
def test_the_metrics_tab_s_unchanged_poll_is_three_queries_and_a_report_redraws_it(
    owner, django_assert_num_queries, size
):
    """Issue 23: the Metrics tab's poll says the metrics version it shows; a report moves
    that version (a cache read), never the cluster's, and redraws the tab's panel."""
    cluster = live_cluster(owner.project, size=size, status=Cluster.Status.READY)
    node = cluster.nodes.get(index=0)
    client = owner.browser_client()
    url = poll_url(client.get(f"/clusters/{cluster.pk}/metrics/").content.decode())
    assert query_of(url)["metrics"] == str(metrics.metrics_version(cluster.pk))

    with django_assert_num_queries(3):  # the session, the user, the cluster's version
        assert client.get(url, headers=HTMX).status_code == 204
    Node.objects.filter(pk=node.pk).update(status=Node.Status.JOINED)
    metrics.store(node.pk, cluster.pk, gpus=[{"index": 0}], host=None, at=timezone.now())
    response = client.get(url, headers=HTMX)

    body = response.content.decode()
    assert response.status_code == 200
    assert re.search(r'<section id="cluster-tab"[^>]* hx-swap-oob="true">', body)
    assert query_of(poll_url(body))["version"] == query_of(url)["version"]
    assert query_of(poll_url(body))["metrics"] != query_of(url)["metrics"]


def test_it_stops_the_polling_of_an_unchanged_final_cluster_and_swaps_nothing(owner):
    cluster = live_cluster(owner.project, status=Cluster.Status.TERMINATED, version=7)
    url = f"/clusters/{cluster.pk}/?version=7&nodes=2&connect="

    response = owner.browser_client().get(url, headers=HTMX)

    assert response.status_code == 286
    assert response["HX-Reswap"] == "none"
    assert response.content == b""


def test_it_answers_404_to_a_stranger_and_to_a_user_in_no_project(owner, teammate, stranger):
    cluster = live_cluster(owner.project)
    url = f"/clusters/{cluster.pk}/?version=0&nodes=2&connect="
    nobody = Client()
    nobody.force_login(User.objects.create(email="alone@example.com"))

    assert teammate.browser_client().get(url, headers=HTMX).status_code == 204
    assert stranger.browser_client().get(url, headers=HTMX).status_code == 404
    assert nobody.get(url, headers=HTMX).status_code == 404
    assert stranger.browser_client().get(url.replace("0", "1", 1), headers=HTMX).status_code == 404


@pytest.mark.parametrize(
    "query",
    [
        "version=abc",
        "version=-1",
        "version=%C2%B2",  # a superscript two: a digit to str.isdigit, not to int()
        "version=" + "9" * 40,
        "version=0&nodes=x&until=soon",
        "version=0&until=99999999999999999999999",
        "version=0&nodes=-3",
        "version=",
    ],
)
def test_it_answers_odd_poll_parameters_without_an_error(owner, query):
    cluster = live_cluster(owner.project)

    response = owner.browser_client().get(f"/clusters/{cluster.pk}/?{query}", headers=HTMX)

    assert response.status_code in (200, 204)


# --- the changed poll -----------------------------------------------------------------------


def test_it_sends_the_new_version_the_changed_rows_and_the_new_events_only(owner):
    """Each tab's poll sends what that tab shows of the change: the Machines tab its changed
    rows and reports, the Events tab its new events."""
    cluster = live_cluster(owner.project, size=4)
    EventFactory(cluster=cluster, message="Reserved 4 machines.")
    client = owner.browser_client()
    machines = poll_url(client.get(f"/clusters/{cluster.pk}/machines/").content.decode())
    events = poll_url(client.get(f"/clusters/{cluster.pk}/events/").content.decode())
    assert urlsplit(machines).path == f"/clusters/{cluster.pk}/machines/"

    version = change(cluster, node=cluster.nodes.get(index=2), message="node-2 is running.")
    response = client.get(machines, headers=HTMX)

    assert response.status_code == 200
    body = response.content.decode()
    assert body.lstrip().startswith('<section id="cluster-status"')
    assert query_of(poll_url(body))["version"] == str(version)
    rows = re.findall(r'<tr id="(node-\d+)" hx-swap-oob="true">', body)
    assert rows == ["node-2"]
    assert "Agent checking in" in body
    assert '<div id="cluster-reports" hx-swap-oob="true">' in body
    assert "event-rows" not in body and "node-2 is running." not in body  # not on this tab
    assert 'id="cluster-tab"' not in body  # the tables are not sent again whole

    body = client.get(events, headers=HTMX).content.decode()
    assert '<tbody hx-swap-oob="afterbegin:#event-rows">' in body
    assert "node-2 is running." in body and "Reserved 4 machines." not in body
    assert "node-rows" not in body and 'id="cluster-tab"' not in body

    # The next poll shows the new version: nothing changed since.
    assert client.get(poll_url(body), headers=HTMX).status_code == 204


def test_it_appends_the_rows_the_page_lacks(owner):
    cluster = live_cluster(owner.project, size=2, status=Cluster.Status.READY)
    client = owner.browser_client()
    url = poll_url(client.get(f"/clusters/{cluster.pk}/machines/").content.decode())
    assert query_of(url)["nodes"] == "2"

    version = change(cluster, message="Adding 1 worker: node-2.")
    NodeFactory(cluster=cluster, index=2, is_worker=True, version=version)
    body = client.get(url, headers=HTMX).content.decode()

    added = body.split('<tbody hx-swap-oob="beforeend:#node-rows">')[1].split("</tbody>")[0]
    assert re.findall(r'<tr id="(node-\d+)"', added) == ["node-2"]
    assert 'hx-swap-oob="true">' not in added
    assert query_of(poll_url(body))["nodes"] == "3"
    assert '<div id="machines-actions" hx-swap-oob="true"' in body.replace(
        ' class="machines-actions"', ""
    )


def test_it_sends_the_whole_page_once_the_cluster_is_final_and_stops_the_polling(owner):
    cluster = live_cluster(owner.project)
    client = owner.browser_client()
    url = poll_url(client.get(f"/clusters/{cluster.pk}/").content.decode())

    Cluster.objects.filter(pk=cluster.pk).update(status=Cluster.Status.TERMINATED, version=1)
    response = client.get(url, headers=HTMX)

    assert response.status_code == 286
    body = response.content.decode()
    assert re.search(r'<section id="cluster-tab"[^>]* hx-swap-oob="true">', body)
    assert 'hx-trigger="every' not in body


def test_it_sends_the_whole_page_to_a_page_ahead_of_the_cluster(owner):
    cluster = live_cluster(owner.project, version=3)

    response = owner.browser_client().get(
        f"/clusters/{cluster.pk}/?version=9&nodes=2&connect=", headers=HTMX
    )

    assert response.status_code == 200
    body = response.content.decode()
    assert re.search(r'<section id="cluster-tab"[^>]* hx-swap-oob="true">', body)
    assert query_of(poll_url(body))["version"] == "3"


def test_it_answers_the_whole_poll_once_a_running_network_test_is_past_its_time(owner):
    with time_machine.travel(NOW, tick=False) as clock:
        now = timezone.now()
        cluster = live_cluster(
            owner.project,
            status=Cluster.Status.READY,
            machines__status=Node.Status.JOINED,
            network_test={
                "state": "running",
                "started_at": now.isoformat(),
                "expires_at": (now + timedelta(minutes=15)).isoformat(),
                "machines": ["node-0", "node-1"],
            },
        )
        client = owner.browser_client()
        url = poll_url(client.get(f"/clusters/{cluster.pk}/machines/").content.decode())
        assert query_of(url)["until"] == str(int((now + timedelta(minutes=15)).timestamp()))

        clock.shift(timedelta(minutes=14))
        assert client.get(url, headers=HTMX).status_code == 204
        clock.shift(timedelta(minutes=1, seconds=1))
        late = client.get(url, headers=HTMX)

    assert late.status_code == 200
    assert "did not finish within 15 minutes" in late.content.decode()
    assert "until" not in query_of(poll_url(late.content.decode()))


def test_it_reads_the_node_rows_without_their_large_json(owner):
    cluster = live_cluster(owner.project, size=3)
    client = owner.browser_client()

    with CaptureQueriesContext(connection) as page_queries:
        url = poll_url(client.get(f"/clusters/{cluster.pk}/machines/").content.decode())
    change(cluster, node=cluster.nodes.get(index=1), message="node-1 moved.")
    with CaptureQueriesContext(connection) as poll_queries:
        assert client.get(url, headers=HTMX).status_code == 200

    for queries in (page_queries, poll_queries):
        node_reads = [q["sql"] for q in queries.captured_queries if "clusters_node" in q["sql"]]
        assert node_reads
        for sql in node_reads:
            assert not any(column in sql for column in UNSHOWN_COLUMNS), sql


def test_it_answers_a_changed_poll_in_the_same_queries_for_2_and_64_nodes(
    owner, django_assert_num_queries
):
    client = owner.browser_client()
    urls = {}
    for size in (2, 64):
        cluster = live_cluster(owner.project, size=size)
        urls[size] = poll_url(client.get(f"/clusters/{cluster.pk}/machines/").content.decode())
        for node in cluster.nodes.all():
            change(cluster, node=node, message=f"{node.name} moved.")

    with CaptureQueriesContext(connection) as small:
        client.get(urls[2], headers=HTMX)
    with django_assert_num_queries(len(small)):
        response = client.get(urls[64], headers=HTMX)

    assert (
        len(re.findall(r'<tr id="node-\d+" hx-swap-oob="true">', response.content.decode())) == 64
    )


# --- every writer of what the page shows moves the version -----------------------------------


def client_of(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def poll_from(client: Client, cluster: Cluster, version: int, nodes: int, tab: str) -> str:
    """What a page on `tab` (machines, events; "" for the overview) showing `version` and
    `nodes` rows gets from its poll."""
    path = f"/clusters/{cluster.pk}/{tab}/" if tab else f"/clusters/{cluster.pk}/"
    url = f"{path}?version={version}&nodes={nodes}&connect="
    response = client.get(url, headers=HTMX)
    assert response.status_code in (200, 286), response.status_code
    return response.content.decode()


def test_the_reconciler_moves_the_version_with_the_rows_and_events_it_writes(person, sim):
    user, project = person
    with time_machine.travel(NOW, tick=False) as clock:
        cluster = create(project, inventory(hosts=2, boot_seconds=60))
        client = client_of(user)
        clock.shift(timedelta(seconds=45))
        sim.tick()
        cluster.refresh_from_db()
        assert cluster.version > 0
        seen, nodes = cluster.version, cluster.nodes.count()

        while cluster.version == seen and cluster.status != Cluster.Status.READY:
            clock.shift(timedelta(seconds=15))
            sim.tick()
            cluster.refresh_from_db()
        body = poll_from(client, cluster, seen, nodes, "machines")
        events = poll_from(client, cluster, seen, nodes, "events")

    assert cluster.version > seen
    stamped = set(cluster.nodes.filter(version__gt=seen).values_list("index", flat=True))
    assert stamped
    sent = re.findall(r'<tr id="node-(\d+)" hx-swap-oob="true">', body)
    assert {int(index) for index in sent} == stamped
    for event in cluster.events.filter(version__gt=seen):
        assert html.escape(event.message) in events
    for event in cluster.events.filter(version__lte=seen):
        assert html.escape(event.message) not in events


def ready(project, sim, clock, *, hosts: int = 3) -> Cluster:
    cluster = create(project, inventory(hosts=hosts, boot_seconds=60))
    for _ in range(10):
        clock.shift(timedelta(seconds=45))
        sim.tick()
    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.READY
    return cluster


@pytest.mark.parametrize(
    "act, reason",
    [
        (
            lambda cluster, user: lifecycle.terminate(cluster=cluster, user=user),
            "terminate_requested",
        ),
        (
            lambda cluster, user: lifecycle.stop(cluster=cluster, reason="balance"),
            "stopped_balance",
        ),
        (lambda cluster, user: lifecycle.add_workers(cluster=cluster, count=1), "workers_added"),
        (
            lambda cluster, user: lifecycle.run_network_test(cluster=cluster, user=user),
            "network_test_started",
        ),
    ],
    ids=["terminate", "stop", "add_workers", "network_test"],
)
def test_every_user_action_moves_the_version_and_its_poll_sends_the_event(person, sim, act, reason):
    user, project = person
    with time_machine.travel(NOW, tick=False) as clock:
        cluster = ready(project, sim, clock)
        client = client_of(user)
        seen = cluster.version
        assert (
            client.get(f"/clusters/{cluster.pk}/?version={seen}", headers=HTMX).status_code == 204
        )

        act(cluster, user)
        cluster.refresh_from_db()
        body = poll_from(client, cluster, seen, 2, "events")

    assert cluster.version == seen + 1
    event = cluster.events.get(version=seen + 1)
    assert event.reason == reason
    assert html.escape(event.message) in body


def test_the_network_test_result_moves_the_version(person, sim):
    user, project = person
    with time_machine.travel(NOW, tick=False) as clock:
        cluster = ready(project, sim, clock)
        lifecycle.run_network_test(cluster=cluster, user=user)
        cluster.refresh_from_db()
        seen = cluster.version

        assert do_network_test(cluster_id=cluster.pk, token=cluster.network_test["token"])
        cluster.refresh_from_db()
        client = client_of(user)
        events = poll_from(client, cluster, seen, 2, "events")
        machines = poll_from(client, cluster, seen, 2, "machines")

    assert cluster.version == seen + 1
    assert "Network test done" in events
    assert 'data-state="done"' in machines


def test_losing_a_machine_moves_the_version_and_sends_its_row(person, sim):
    user, project = person
    with time_machine.travel(NOW, tick=False) as clock:
        cluster = ready(project, sim, clock)
        client = client_of(user)
        seen = cluster.version
        lost = cluster.nodes.get(index=1)

        assert lifecycle.mark_lost(node_id=lost.pk, last_heard=timezone.now(), why="silent")
        cluster.refresh_from_db()
        body = poll_from(client, cluster, seen, 2, "machines")
        overview = poll_from(client, cluster, seen, 2, "")

    assert cluster.version == seen + 1
    assert cluster.status == Cluster.Status.DEGRADED
    # node-1's row, and node-0's: it is handed its plan again, without node-1 (D9).
    assert re.findall(r'<tr id="(node-\d+)" hx-swap-oob="true">', body) == ["node-0", "node-1"]
    assert "was lost: silent" in overview  # the banner, on the overview tab
