"""The beat's tick: which clusters it advances, and the sweep that reports hosts held by
nothing. Both are plain functions a test calls without a worker."""

import json
import logging

import pytest
import time_machine
from django.conf import settings as django_settings
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from clusters import lifecycle, tasks
from clusters.models import Cluster, DueCluster, Node
from offers.models import Host
from tests.clusters.lifecycle_kit import (
    T0,
    Sim,
    create,
    environment_of,
    inventory,
)
from tests.factories import HostFactory


def test_it_ticks_only_the_clusters_with_something_to_do(project):
    # Every state is reached through the lifecycle: the tick reads what its writes keep
    # (`Cluster.needs_work`), not the nodes.
    machine_type = inventory(hosts=7, boot_seconds=5)
    crashing = inventory(hosts=2, boot_seconds=5, faults={0: "crash"})
    with time_machine.travel(T0, tick=False) as clock, Sim() as sim:
        failed = create(project, crashing)  # its node-0 crashes: failed, every host wiped
        ready = create(project, machine_type)
        releasing = create(project, machine_type)
        sim.run_until(clock, T0.replace(minute=1), every=5)
        lifecycle.terminate(cluster=releasing)
        sim.dispatcher.advances.clear()
        moving = create(project, machine_type)
        sim.dispatcher.advances.clear()
        statuses = dict(Cluster.objects.values_list("pk", "status"))
        assert [statuses[c.pk] for c in (failed, ready, releasing, moving)] == [
            "failed",
            "ready",
            "terminating",
            "provisioning",
        ]
        assert not failed.nodes.filter(holds_host=True).exists()

        assert lifecycle.clusters_needing_work() == [releasing.pk, moving.pk]

        lifecycle.add_workers(cluster=ready, count=1)  # a ready cluster with a worker starting
        assert lifecycle.clusters_needing_work() == [ready.pk, releasing.pk, moving.pk]

        sim.run_until(clock, T0.replace(minute=2), every=5)
        statuses = dict(Cluster.objects.values_list("pk", "status"))
        assert [statuses[c.pk] for c in (ready, releasing, moving)] == [
            "ready",
            "terminated",
            "ready",
        ]
        assert ready.nodes.filter(status="joined").count() == 3
        assert lifecycle.clusters_needing_work() == []


def test_it_enqueues_one_advance_per_cluster_from_the_beat_task(
    project, monkeypatch, django_capture_on_commit_callbacks
):
    machine_type = inventory(hosts=4)
    with Sim():
        first = create(project, machine_type)
        second = create(project, machine_type)
    sent = []
    monkeypatch.setattr(tasks.advance, "delay", sent.append)

    with django_capture_on_commit_callbacks(execute=True):
        assert tasks.tick.apply().get() == 2
    assert sent == [first.pk, second.pk]

    # Until a worker picks them up, more ticks queue nothing more.
    with django_capture_on_commit_callbacks(execute=True):
        tasks.tick.apply()
    assert sent == [first.pk, second.pk]
    monkeypatch.setattr(lifecycle, "advance", lambda cluster_id: [])
    tasks.advance(first.pk)  # the worker runs one: it may be asked for again
    with django_capture_on_commit_callbacks(execute=True):
        tasks.tick.apply()
    assert sent == [first.pk, second.pk, first.pk]


def test_it_reports_hosts_held_by_no_node(project, caplog):
    machine_type = inventory(hosts=2)
    with Sim():
        create(project, machine_type)
    stray = HostFactory(machine_type=machine_type, state=Host.State.IN_USE, name="stray-01")
    HostFactory(machine_type=machine_type, state=Host.State.OFFLINE)

    with caplog.at_level(logging.ERROR, logger="clusters.lifecycle"):
        assert lifecycle.sweep_orphan_hosts() == [stray]
    assert "stray-01 is in_use but no node holds it" in caplog.text
    stray.refresh_from_db()
    assert stray.state == Host.State.IN_USE  # reported for staff, never freed blindly


def test_it_sweeps_hosts_on_the_beat_schedule_of_its_own(project, settings):
    machine_type = inventory(hosts=1)
    HostFactory(machine_type=machine_type, state=Host.State.RESERVED, name="stray-02")

    assert tasks.sweep_hosts.apply().get() == 1
    assert settings.CELERY_BEAT_SCHEDULE["hosts-sweep"]["task"] == "clusters.tasks.sweep_hosts"


# --- cost -----------------------------------------------------------------------------------

postgres_explain = pytest.mark.skipif(
    not django_settings.IS_POSTGRES,
    reason="needs PostgreSQL's EXPLAIN (the plan is PostgreSQL's); set DATABASE_URL",
)


def fleet(project, machine_type, *, ready: int, moving: int = 3) -> None:
    """`ready` ready clusters of 8 joined nodes each, and `moving` provisioning ones, written
    as the lifecycle leaves them (the property test checks it keeps `needs_work` and the
    DueCluster rows so)."""
    environment = environment_of(project)
    now = timezone.now()
    first = Cluster.objects.count()
    clusters = Cluster.objects.bulk_create(
        Cluster(
            project=project,
            environment=environment,
            machine_type=machine_type,
            name=f"fleet-{first + i}",
            size=8,
            authorized_keys="ssh-ed25519 AAAA fleet",
            give_up_at=now,
            status=Cluster.Status.READY if i < ready else Cluster.Status.PROVISIONING,
            needs_work=i >= ready,
        )
        for i in range(ready + moving)
    )
    Node.objects.bulk_create(
        Node(
            cluster=cluster,
            index=index,
            status="joined" if cluster.status == "ready" else "starting",
            step="done" if cluster.status == "ready" else "running",
        )
        for cluster in clusters
        for index in range(8)
    )
    DueCluster.objects.bulk_create(DueCluster(cluster=c) for c in clusters if c.needs_work)


def plan_shape(plan: dict) -> dict:
    """What a plan does, without its estimates: node types, relations, indexes, children."""
    kept = {k: plan[k] for k in ("Node Type", "Relation Name", "Index Name") if k in plan}
    kept["Plans"] = [plan_shape(child) for child in plan.get("Plans", [])]
    return kept


def tick_query() -> tuple[int, list[int], dict | None]:
    """(queries, clusters picked, plan shape on PostgreSQL) of the tick, with the statistics
    PostgreSQL keeps on the tables as they are."""
    plan = None
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            for table in ("clusters_cluster", "clusters_node", "clusters_duecluster"):
                cursor.execute(f"ANALYZE {table}")
        query = DueCluster.objects.order_by("cluster_id").values_list("cluster_id")
        plan = plan_shape(json.loads(query.explain(format="json"))[0]["Plan"])
    with CaptureQueriesContext(connection) as queries:
        picked = lifecycle.clusters_needing_work()
    return len(queries.captured_queries), picked, plan


def test_it_picks_clusters_in_one_query_whatever_the_number_of_ready_ones(project):
    machine_type = inventory(hosts=0)
    fleet(project, machine_type, ready=10)
    few = tick_query()
    fleet(project, machine_type, ready=990)
    many = tick_query()

    assert Cluster.objects.filter(status="ready").count() == 1000
    assert few[0] == many[0] == 1
    assert len(few[1]) == 3 and len(many[1]) == 6  # only the provisioning clusters
    assert Cluster.objects.filter(pk__in=many[1], status="provisioning").count() == 6


@postgres_explain
def test_its_query_plan_is_the_same_at_10_and_1000_ready_clusters(project):
    machine_type = inventory(hosts=0)
    fleet(project, machine_type, ready=10)
    few = tick_query()
    fleet(project, machine_type, ready=990)
    many = tick_query()

    assert few[2] == many[2]
    # Read from the table that holds only the clusters with work to do.
    assert json.dumps(many[2]).count('"Relation Name"') == 1
    assert "clusters_duecluster" in json.dumps(many[2])
