"""The network test a user asks for: which clusters may run one, one at a time, the task that
measures and stores the result (the simulated data center's all_reduce_perf), the API and the
cluster page (docs/lifecycle.md, "The network test")."""

import re
from datetime import timedelta

import pytest
import time_machine
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from clusters import lifecycle
from clusters.errors import ClusterRefused
from clusters.machines.base import DriverError
from clusters.machines.simulated import SimulatedDriver
from clusters.models import Cluster, Event, Node
from tests.factories import ClusterFactory

HTMX = {"HX-Request": "true"}
NOW = "2026-12-01 10:00:00Z"
URL = "/api/v1/clusters"


@pytest.fixture
def clock():
    with time_machine.travel(NOW, tick=False) as traveller:
        yield traveller


@pytest.fixture(autouse=True)
def work():
    """What the lifecycle hands off stays in memory until the test runs it (`work.run()`)."""
    with lifecycle.dispatching_to(lifecycle.CollectingDispatcher()) as dispatcher:
        yield dispatcher


def ready_cluster(project, *, size=2, status=Cluster.Status.READY, **fields) -> Cluster:
    now = timezone.now()
    return ClusterFactory(
        project=project,
        size=size,
        status=status,
        joined_at=now,
        ready_at=now,
        machines=True,
        machines__status=Node.Status.JOINED,
        machines__step=Node.Step.DONE,
        **fields,
    )


def reasons(cluster: Cluster) -> list[str]:
    return list(cluster.events.order_by("at", "pk").values_list("reason", flat=True))


def text_of(response) -> str:
    return " ".join(re.sub(r"<[^>]+>", " ", response.content.decode()).split())


# --- the action and the task --------------------------------------------------------------------


def test_it_runs_on_a_ready_cluster_and_stores_the_result_with_an_event(owner, clock, work):
    cluster = ready_cluster(owner.project)

    lifecycle.run_network_test(cluster=cluster, user=owner.user)

    cluster.refresh_from_db()
    test = cluster.network_test
    assert test["state"] == "running" and test["machines"] == ["node-0", "node-1"]
    assert test["started_at"] == timezone.now().isoformat()
    assert test["requested_by"] == "owner@example.com"
    assert reasons(cluster) == ["network_test_started"]
    assert work.network_tests == [(cluster.pk, test["token"])]

    clock.shift(timedelta(seconds=40))
    work.run()

    cluster.refresh_from_db()
    test = cluster.network_test
    assert test["state"] == "done"
    assert test["finished_at"] == timezone.now().isoformat()
    assert test["method"] == "nccl" and test["simulated"] is True
    assert len(test["results"]["sizes"]) == 25
    assert test["results"]["sizes"][-1]["busbw_gbs"] == 0.20
    assert "-np 2 " in test["results"]["command"] and test["results"]["command"].endswith("-g 8")
    done = cluster.events.get(reason=Event.Reason.NETWORK_TEST_DONE)
    assert "all_reduce_perf, simulated: bus bandwidth 0.20 GB/s at 128 MiB" in done.message
    assert "Ethernet is expected to give about 1-2 Gbit/s" in done.message
    assert done.notification is None  # no email for a test
    assert cluster.status == Cluster.Status.READY


def test_it_refuses_a_second_test_while_one_runs_and_allows_one_once_it_is_done(owner, work):
    cluster = ready_cluster(owner.project)
    lifecycle.run_network_test(cluster=cluster)

    with pytest.raises(ClusterRefused) as refused:
        lifecycle.run_network_test(cluster=cluster)

    assert refused.value.code == "network_test_running" and refused.value.status == 409
    assert "already running" in refused.value.message
    work.run()
    lifecycle.run_network_test(cluster=cluster)
    cluster.refresh_from_db()
    assert cluster.network_test["state"] == "running"


def test_a_test_that_outlives_its_time_reads_as_failed_and_its_late_result_is_dropped(
    owner, clock, work
):
    cluster = ready_cluster(owner.project)
    lifecycle.run_network_test(cluster=cluster)
    (_, stale_token) = work.network_tests.pop()

    clock.shift(timedelta(seconds=lifecycle.NETWORK_TEST_SECONDS))

    cluster.refresh_from_db()
    report = lifecycle.network_test_report(cluster)
    assert report["state"] == "failed" and "did not finish within 15 minutes" in report["error"]
    lifecycle.run_network_test(cluster=cluster)  # no longer refused
    assert lifecycle.do_network_test(cluster_id=cluster.pk, token=stale_token) is False
    work.run()
    cluster.refresh_from_db()
    assert cluster.network_test["state"] == "done"
    assert reasons(cluster).count("network_test_done") == 1


def test_a_second_delivery_of_the_task_writes_nothing(owner, work):
    cluster = ready_cluster(owner.project)
    lifecycle.run_network_test(cluster=cluster)
    (cluster_id, token) = work.network_tests[0]

    assert lifecycle.do_network_test(cluster_id=cluster_id, token=token) is True
    assert lifecycle.do_network_test(cluster_id=cluster_id, token=token) is False

    assert reasons(cluster).count("network_test_done") == 1


def test_it_runs_on_a_degraded_cluster_whose_install_failed(owner, work):
    cluster = ready_cluster(owner.project, status=Cluster.Status.DEGRADED, software="slurm")

    lifecycle.run_network_test(cluster=cluster)
    work.run()

    cluster.refresh_from_db()
    assert cluster.network_test["state"] == "done"
    assert cluster.status == Cluster.Status.DEGRADED


@pytest.mark.parametrize(
    "status",
    [
        Cluster.Status.PROVISIONING,
        Cluster.Status.INSTALLING,
        Cluster.Status.TERMINATING,
        Cluster.Status.TERMINATED,
        Cluster.Status.FAILED,
    ],
)
def test_it_refuses_a_cluster_that_is_not_ready_and_changes_nothing(owner, work, status):
    cluster = ready_cluster(owner.project, status=status)

    with pytest.raises(ClusterRefused) as refused:
        lifecycle.run_network_test(cluster=cluster)

    assert refused.value.code == "invalid_state"
    assert f"This cluster is {status}" in refused.value.message
    cluster.refresh_from_db()
    assert cluster.network_test == {} and reasons(cluster) == [] and work.network_tests == []


@pytest.mark.parametrize(("lost", "left"), [(1, "1 machine up"), (0, "without node-0")])
def test_it_refuses_a_degraded_cluster_without_two_machines_to_measure(owner, lost, left):
    cluster = ready_cluster(owner.project, status=Cluster.Status.DEGRADED, size=3)
    cluster.nodes.filter(index__in={1: [1, 2], 0: [0]}[lost]).update(status=Node.Status.LOST)

    with pytest.raises(ClusterRefused) as refused:
        lifecycle.run_network_test(cluster=cluster)

    assert refused.value.code == "invalid_state"
    assert left in refused.value.message


def test_it_measures_only_the_machines_that_joined(owner, work):
    cluster = ready_cluster(owner.project, size=3)
    cluster.nodes.filter(index=2).update(status=Node.Status.STARTING, is_worker=True)

    lifecycle.run_network_test(cluster=cluster)
    work.run()

    cluster.refresh_from_db()
    assert cluster.network_test["machines"] == ["node-0", "node-1"]
    assert "-np 2 " in cluster.network_test["results"]["command"]


def test_a_driver_that_cannot_measure_fails_the_test_with_its_words_not_the_cluster(
    owner, work, monkeypatch
):
    def unreachable(self, cluster, *, nodes, plan):
        raise DriverError("could not connect to 203.0.113.7:22: timed out", output="ssh: …")

    monkeypatch.setattr(SimulatedDriver, "network_test", unreachable)
    cluster = ready_cluster(owner.project)

    lifecycle.run_network_test(cluster=cluster)
    work.run()

    cluster.refresh_from_db()
    assert cluster.network_test["state"] == "failed"
    assert cluster.network_test["error"] == "could not connect to 203.0.113.7:22: timed out"
    failed = cluster.events.get(reason=Event.Reason.NETWORK_TEST_FAILED)
    assert failed.message == "Network test failed: could not connect to 203.0.113.7:22: timed out"
    assert failed.output == "ssh: …" and not failed.is_failure and failed.notification is None
    assert cluster.status == Cluster.Status.READY


def test_a_test_that_breaks_is_failed_at_once_rather_than_left_running(owner, work, monkeypatch):
    def broken(self, cluster, *, nodes, plan):
        raise KeyError("sizes")

    monkeypatch.setattr(SimulatedDriver, "network_test", broken)
    cluster = ready_cluster(owner.project)

    lifecycle.run_network_test(cluster=cluster)
    work.run()

    cluster.refresh_from_db()
    assert cluster.network_test["state"] == "failed"
    assert cluster.network_test["error"] == "The test broke: KeyError."


# --- the API -------------------------------------------------------------------------------------


def test_the_api_starts_a_test_with_202_and_reads_its_result_in_the_cluster(owner, work):
    cluster = ready_cluster(owner.project)
    api = owner.api()

    started = api.post(f"{URL}/{cluster.pk}/network-test")

    assert started.status_code == 202
    data = started.json()["data"]
    assert data["state"] == "running" and data["machines"] == ["node-0", "node-1"]
    assert data["sizes"] is None and "token" not in data
    assert "1-2 Gbit/s" in data["expected"]
    work.run()
    detail = api.get(f"{URL}/{cluster.pk}").json()["data"]["network_test"]
    assert detail["state"] == "done" and detail["method"] == "nccl" and detail["simulated"]
    assert detail["sizes"][-1]["size"] == "128 MiB"
    assert detail["sizes"][-1]["busbw_gbs"] == 0.20
    assert detail["peak_busbw_gbs"] == 0.20
    assert detail["finished_at"] is not None


def test_the_api_answers_409_for_a_cluster_not_ready_or_a_test_running(owner):
    starting = ClusterFactory(project=owner.project, machines=True)
    ready = ready_cluster(owner.project)
    api = owner.api()

    not_ready = api.post(f"{URL}/{starting.pk}/network-test")
    api.post(f"{URL}/{ready.pk}/network-test")
    running = api.post(f"{URL}/{ready.pk}/network-test")

    assert not_ready.status_code == 409
    assert not_ready.json()["error"]["code"] == "invalid_state"
    assert "ready or degraded" in not_ready.json()["error"]["message"]
    assert running.status_code == 409
    assert running.json()["error"]["code"] == "network_test_running"


def test_the_api_answers_404_for_a_strangers_cluster_and_starts_nothing(owner, stranger):
    cluster = ready_cluster(owner.project)

    response = stranger.api().post(f"{URL}/{cluster.pk}/network-test")

    assert response.status_code == 404 and response.json()["error"]["code"] == "not_found"
    cluster.refresh_from_db()
    assert cluster.network_test == {}


def test_the_api_gives_null_before_any_test(owner):
    cluster = ready_cluster(owner.project)

    assert owner.api().get(f"{URL}/{cluster.pk}").json()["data"]["network_test"] is None


# --- the cluster page ------------------------------------------------------------------------


def agent_result(size: int) -> dict:
    """A done test by the agents' own measurement, for a cluster of `size` machines."""
    return {
        "state": "done",
        "token": "t0ken",
        "started_at": "2026-12-01T09:59:20+00:00",
        "expires_at": "2026-12-01T10:14:20+00:00",
        "finished_at": "2026-12-01T09:59:40+00:00",
        "requested_by": "owner@example.com",
        "machines": [f"node-{i}" for i in range(size)],
        "method": "agent",
        "simulated": False,
        "results": {
            "seconds": 3.0,
            "pairs": [
                {
                    "node": f"node-{i}",
                    "to": "node-0",
                    "gbit_s": 1.712,
                    "latency_ms": 0.314,
                    "tool": "tcp-stream",
                    "error": None,
                }
                for i in range(1, size)
            ],
        },
        "error": None,
    }


def test_the_page_offers_the_button_on_a_ready_cluster_only(owner):
    ready = ready_cluster(owner.project)
    starting = ClusterFactory(project=owner.project, machines=True)
    client = owner.browser_client()

    page = client.get(f"/clusters/{ready.pk}/machines/").content.decode()
    other = client.get(f"/clusters/{starting.pk}/machines/").content.decode()

    form = re.search(
        r'<form method="post" action="/clusters/\d+/network-test/".*?</form>', page, re.S
    )
    assert form is not None
    assert 'hx-post="/clusters/' in form.group(0) and 'hx-target="#cluster-status"' in form.group(0)
    assert 'name="csrfmiddlewaretoken"' in form.group(0)
    assert ">Run network test</button>" in form.group(0)
    assert "On the Ethernet private network expect about 1-2 Gbit/s" in page
    assert "Run network test" not in other


def test_the_button_starts_a_test_and_htmx_gets_the_running_test_and_a_fast_poll(owner, clock):
    cluster = ready_cluster(owner.project)
    client = owner.browser_client()
    assert 'hx-trigger="every 10s"' in client.get(f"/clusters/{cluster.pk}/").content.decode()

    response = client.post(f"/clusters/{cluster.pk}/network-test/", headers=HTMX)

    assert response.status_code == 200
    body = response.content.decode()
    assert body.lstrip().startswith('<section id="cluster-status"')
    assert 'hx-trigger="every 2s"' in body
    assert re.search(r'<section id="cluster-tab"[^>]* data-tab="machines" hx-swap-oob="true"', body)
    assert "Measuring between node-0, node-1 since 2026-" in text_of(response)
    assert " 10:00:00 UTC" in text_of(response)
    assert re.search(r"<button class=\"btn\" type=\"submit\" disabled", body)
    cluster.refresh_from_db()
    assert cluster.network_test["state"] == "running"


def test_the_button_without_javascript_redirects_with_a_message(owner):
    cluster = ready_cluster(owner.project)
    client = owner.browser_client()

    started = client.post(f"/clusters/{cluster.pk}/network-test/", follow=True)
    again = client.post(f"/clusters/{cluster.pk}/network-test/", follow=True)

    assert started.redirect_chain == [(f"/clusters/{cluster.pk}/machines/", 302)]
    assert "Network test started" in text_of(started)
    assert "A network test is already running on this cluster" in text_of(again)


def test_a_refusal_through_htmx_shows_beside_the_test(owner):
    cluster = ready_cluster(owner.project)
    client = owner.browser_client()
    client.post(f"/clusters/{cluster.pk}/network-test/")

    response = client.post(f"/clusters/{cluster.pk}/network-test/", headers=HTMX)

    assert response.status_code == 200
    assert "A network test is already running on this cluster" in text_of(response)


def test_the_button_needs_the_csrf_token_and_keeps_strangers_out(owner, stranger):
    cluster = ready_cluster(owner.project)
    forged = Client(enforce_csrf_checks=True)
    forged.force_login(owner.user)

    assert forged.post(f"/clusters/{cluster.pk}/network-test/").status_code == 403
    assert stranger.browser_client().post(f"/clusters/{cluster.pk}/network-test/").status_code == (
        404
    )
    assert owner.browser_client().get(f"/clusters/{cluster.pk}/network-test/").status_code == 405
    cluster.refresh_from_db()
    assert cluster.network_test == {}


def test_the_page_shows_the_bus_bandwidth_per_size_beside_what_ethernet_gives(owner, work):
    cluster = ready_cluster(owner.project)
    lifecycle.run_network_test(cluster=cluster)
    work.run()

    page = text_of(owner.browser_client().get(f"/clusters/{cluster.pk}/machines/"))

    assert "Bus bandwidth 0.20 GB/s at its best" in page
    assert "simulated" in page
    assert "128 MiB 0.20 GB/s 0.20 GB/s 0.11 GB/s 1.26 s" in page
    assert "8 B 0.00 GB/s 0.00 GB/s 0.00 GB/s 100 µs" in page
    assert "What Ethernet is expected to give" in page
    assert "Ran on node-0: timeout -k 10 300 mpirun --allow-run-as-root -np 2" in page


def test_the_page_shows_gbit_per_pair_and_a_failed_pair(owner):
    result = agent_result(3)
    result["state"] = "failed"
    result["error"] = "node-2 → node-0: bandwidth to 10.77.0.1:7077: timed out"
    result["results"]["pairs"][1].update(gbit_s=None, latency_ms=None, tool=None, error="timed out")
    cluster = ready_cluster(owner.project, size=3, network_test=result)

    response = owner.browser_client().get(f"/clusters/{cluster.pk}/machines/")

    page = text_of(response)
    assert "The network test failed. node-2 → node-0: bandwidth to 10.77.0.1:7077" in page
    assert "node-1 node-0 1.71 Gbit/s 0.31 ms tcp-stream" in page
    assert "node-2 node-0 — — timed out" in page
    assert 'class="row-bad"' in response.content.decode().split('id="network-test"')[1]


def test_the_page_shows_the_test_in_the_same_queries_for_2_and_64_machines(
    owner, django_assert_num_queries
):
    small = ready_cluster(owner.project, size=2, network_test=agent_result(2))
    large = ready_cluster(owner.project, size=64, network_test=agent_result(64))
    client = owner.browser_client()
    client.get(f"/clusters/{small.pk}/machines/")

    with CaptureQueriesContext(connection) as queries:
        page = client.get(f"/clusters/{small.pk}/machines/", headers=HTMX)
    with django_assert_num_queries(len(queries)):
        large_page = client.get(f"/clusters/{large.pk}/machines/", headers=HTMX)

    assert "node-1 node-0 1.71 Gbit/s" in text_of(page)
    assert text_of(large_page).count("1.71 Gbit/s") == 63
