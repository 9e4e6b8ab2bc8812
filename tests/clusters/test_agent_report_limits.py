"""What a node's agent may report (issue 33, items 4 and 11): its metrics reports at most as
often as it is told to send them (clusters/telemetry/metrics.py `take_report`: a burst of
METRICS_BURST,
then one every RUNCRATE_METRICS_SECONDS; the rest answered 429 with Retry-After, nothing
stored), and only of the GPUs its machine has (`check_gpu_indexes`: 422 before any health
judgement). The tenant is root on the node and holds its token: nothing it sends may grow the
tables faster than the pace, or judge GPUs that do not exist."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import time_machine

from clusters.models import Cluster, Event, GpuSample, Node, NodeSample
from clusters.telemetry import metrics
from tests.clusters.test_metrics_store import HOST, gpu, nodes, post, ready_cluster, report

NOW = datetime(2026, 12, 7, 10, 0, tzinfo=UTC)


@pytest.fixture
def clock():
    with time_machine.travel(NOW, tick=False) as traveller:
        yield traveller


def stored(node: Node) -> tuple[int, int]:
    return (
        GpuSample.objects.filter(node=node).count(),
        NodeSample.objects.filter(node=node).count(),
    )


# --- the pace (item 4) ----------------------------------------------------------------------


def test_a_burst_of_100_reports_in_one_second_stores_only_what_the_pace_allows(
    owner, client, clock, settings
):
    settings.RUNCRATE_METRICS_SECONDS = 15
    first, second = nodes(ready_cluster(owner.project))

    answers = [post(client, first, report(2)) for _ in range(100)]

    assert [a.status_code for a in answers] == [200] * metrics.METRICS_BURST + [429] * (
        100 - metrics.METRICS_BURST
    )
    assert stored(first) == (2 * metrics.METRICS_BURST, metrics.METRICS_BURST)
    refused = answers[-1]
    assert refused.json()["error"]["code"] == "too_many_reports"
    assert "every 15 s" in refused.json()["error"]["message"]
    # Three taken at once put the pace three intervals ahead: the next place is one away.
    assert refused["Retry-After"] == "15"

    # Another node keeps its own pace.
    assert post(client, second, report(2)).status_code == 200
    assert stored(second) == (2, 1)

    # Once the interval has passed, one more is taken, and only one.
    clock.shift(timedelta(seconds=15))
    assert post(client, first, report(2)).status_code == 200
    again = post(client, first, report(2))
    assert again.status_code == 429
    assert again["Retry-After"] == "15"
    assert stored(first) == (2 * (metrics.METRICS_BURST + 1), metrics.METRICS_BURST + 1)


def test_an_agent_keeping_its_interval_is_never_refused(owner, client, clock, settings):
    settings.RUNCRATE_METRICS_SECONDS = 15
    node = nodes(ready_cluster(owner.project))[0]

    for _ in range(20):
        assert post(client, node, report(1)).status_code == 200
        clock.shift(timedelta(seconds=15))

    assert stored(node) == (20, 20)


def test_the_retry_after_counts_the_seconds_to_the_next_place(owner, client, clock, settings):
    settings.RUNCRATE_METRICS_SECONDS = 15
    node = nodes(ready_cluster(owner.project))[0]
    for _ in range(metrics.METRICS_BURST):
        assert post(client, node, report(1)).status_code == 200

    clock.shift(timedelta(seconds=4.5))

    refused = post(client, node, report(1))
    assert refused.status_code == 429
    assert refused["Retry-After"] == "11"  # 10.5 s, rounded up


def test_a_wrong_token_or_a_refused_report_spends_none_of_the_nodes_pace(owner, client, clock):
    node = nodes(ready_cluster(owner.project))[0]

    for _ in range(10):
        assert post(client, node, report(1), token="rcnode_wrong").status_code == 403
        assert post(client, node, {"gpus": "nonsense"}).status_code == 422

    node.refresh_from_db()
    assert node.metrics_paced_until is None
    assert post(client, node, report(1)).status_code == 200


def test_a_report_that_is_not_kept_spends_none_of_the_pace(owner, client, clock):
    node = nodes(ready_cluster(owner.project, status=Cluster.Status.INSTALLING))[0]

    for _ in range(10):
        response = post(client, node, report(1))
        assert response.status_code == 200
        assert response.json() == {"data": {"metrics_seconds": None}}

    node.refresh_from_db()
    assert node.metrics_paced_until is None
    assert stored(node) == (0, 0)


@pytest.mark.django_db(transaction=True)
def test_reports_arriving_together_take_no_more_places_than_the_burst(owner, clock):
    """The place is taken by one conditional UPDATE: concurrent reports, each in its own
    connection, cannot both pass on the same read."""
    import threading

    from django.db import connection

    node = nodes(ready_cluster(owner.project))[0]
    taken, refused = [], []
    barrier = threading.Barrier(8)

    def take() -> None:
        try:
            barrier.wait()
            metrics.take_report(node.pk, now=NOW)
            taken.append(1)
        except metrics.TooManyReports:
            refused.append(1)
        finally:
            connection.close()

    threads = [threading.Thread(target=take) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    assert (len(taken), len(refused)) == (metrics.METRICS_BURST, 8 - metrics.METRICS_BURST)


# --- only the machine's own GPUs (item 11, L5) ----------------------------------------------


def test_a_report_of_more_gpus_than_the_machine_has_is_refused_and_judges_nothing(
    owner, client, clock
):
    cluster = ready_cluster(owner.project)  # the factory's machine type has 8 GPUs
    node = nodes(cluster)[0]
    body = {"gpus": [gpu(i, ecc_uncorrected=5) for i in range(64)], "node": HOST}

    response = post(client, node, body)

    assert response.status_code == 422
    assert response.json()["error"] == {
        "code": "invalid_report",
        "message": "gpus lists 64 GPUs; this machine has 8.",
    }
    node.refresh_from_db()
    cluster.refresh_from_db()
    assert stored(node) == (0, 0)
    assert node.gpu_health == {}
    assert cluster.status == Cluster.Status.READY
    assert node.metrics_paced_until is None


def test_a_report_naming_another_index_than_the_machines_own_is_refused(owner, client, clock):
    cluster = ready_cluster(owner.project)
    node = nodes(cluster)[0]
    body = {"gpus": [gpu(0), gpu(63, ecc_uncorrected=7)], "node": HOST}

    response = post(client, node, body)

    assert response.status_code == 422
    assert response.json()["error"]["message"] == (
        "gpus names GPU 63; this machine's GPUs are numbered 0 to 7."
    )
    node.refresh_from_db()
    cluster.refresh_from_db()
    assert stored(node) == (0, 0)
    assert node.gpu_health == {}
    assert cluster.status == Cluster.Status.READY
    assert not Event.objects.filter(cluster=cluster, reason=Event.Reason.NODE_UNHEALTHY).exists()


def test_the_machines_own_gpus_are_taken(owner, client, clock):
    node = nodes(ready_cluster(owner.project))[0]

    response = post(client, node, {"gpus": [gpu(7), gpu(0)], "node": HOST})

    assert response.status_code == 200, response.content
    assert stored(node) == (2, 1)
