"""The idle notice (issue 23, item 5; clusters/telemetry/idle.py, docs/metrics.md "The idle
notice"): a
ready cluster whose every GPU stayed below RUNCRATE_IDLE_GPU_PERCENT for
RUNCRATE_IDLE_GPU_MINUTES is told once per idle period (a gpus_idle event, idle_since, an
email), and marked busy again (gpus_busy) when a GPU works; nothing is stopped or billed
differently. Judged from the stored samples, every cluster at once in a fixed number of
queries. The clock is moved, never slept through."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.core import mail
from django.db import connection
from django.test.utils import CaptureQueriesContext

from billing.models import UsageRecord
from clusters.models import Cluster, Event, GpuSample, Node
from clusters.notifications import recipients_for, send_pending_cluster_emails
from clusters.telemetry import idle, metrics
from tests.factories import ClusterFactory

T = datetime(2026, 12, 7, 10, 0, 5, tzinfo=UTC)  # the cluster is ready at T
Reason = Event.Reason
Util = Callable[[int, int, datetime], float]


@pytest.fixture
def clock():
    with time_machine.travel(T, tick=False) as traveller:
        yield traveller


def ready_cluster(project, *, size=2, status=Cluster.Status.READY) -> Cluster:
    return ClusterFactory(
        project=project,
        size=size,
        status=status,
        joined_at=T,
        ready_at=T,
        machines=True,
        machines__status=Node.Status.JOINED,
        machines__step=Node.Step.DONE,
    )


def idle_gpus(node: int, gpu: int, at: datetime) -> float:
    return 1.0


def report(cluster, start: datetime, end: datetime, util: Util = idle_gpus, *, gpus=8):
    """Every node of `cluster` reports every 15 s from `start` up to `end` (excluded), GPU g of
    node-i at `util(i, g, at)` percent, as the endpoint stores a report
    (clusters.telemetry.metrics.store)."""
    rows = []
    at = start
    while at < end:
        for node in cluster.nodes.all():
            rows += [
                GpuSample(node=node, at=at, index=g, utilization_percent=util(node.index, g, at))
                for g in range(gpus)
            ]
        at += timedelta(seconds=15)
    GpuSample.objects.bulk_create(rows)


def minutes(n: float) -> datetime:
    return T + timedelta(minutes=n)


def notice(clock, at: datetime) -> int:
    clock.move_to(at)
    return idle.notice_idle()


def idle_events(cluster):
    return list(
        cluster.events.filter(reason__in=[Reason.GPUS_IDLE, Reason.GPUS_BUSY]).order_by("at", "pk")
    )


def test_thirty_idle_minutes_give_one_event_idle_since_and_one_email(owner, clock):
    cluster = ready_cluster(owner.project)
    version = cluster.version
    billed = set(UsageRecord.objects.filter(cluster=cluster).values_list("pk", "ended_at"))
    report(cluster, T, minutes(30))
    assert notice(clock, minutes(30)) == 1

    cluster.refresh_from_db()
    assert cluster.idle_since == T  # ready at T, idle ever since
    assert cluster.version > version  # the page's poll shows it
    [event] = idle_events(cluster)
    assert event.reason == Reason.GPUS_IDLE and event.version == cluster.version
    # 2 machines × 8 GPUs at $20.00 a machine-hour: the header's price.
    assert event.message == (
        "16 GPUs idle for 30 min, costing $40.00 per hour. Nothing is stopped: its machines "
        "keep running and billed until you terminate the cluster."
    )
    assert idle.notice_text(cluster) == "16 GPUs idle for 30 min, costing $40.00 per hour"
    assert send_pending_cluster_emails() == 1
    [email] = mail.outbox
    assert email.to == recipients_for(cluster) == [owner.user.email]
    assert email.subject == f"Cluster {cluster.name}: its GPUs are idle (nothing is stopped)"
    assert "16 GPUs idle for 30 min, costing $40.00 per hour" in email.body
    assert "below 5% utilisation) for 30 minutes" in email.body
    assert "nothing is stopped" in email.body
    # Nothing was stopped or billed differently.
    assert cluster.status == Cluster.Status.READY
    assert set(cluster.nodes.values_list("status", flat=True)) == {Node.Status.JOINED}
    assert set(UsageRecord.objects.filter(cluster=cluster).values_list("pk", "ended_at")) == billed


def test_twenty_nine_idle_minutes_are_nothing(owner, clock):
    cluster = ready_cluster(owner.project)
    report(cluster, T, minutes(29))
    assert notice(clock, minutes(29)) == 0
    cluster.refresh_from_db()
    assert cluster.idle_since is None and idle_events(cluster) == []
    assert idle.notice_text(cluster) == ""


def test_still_idle_an_hour_later_is_no_second_event_or_email(owner, clock):
    cluster = ready_cluster(owner.project)
    report(cluster, T, minutes(30))
    notice(clock, minutes(30))
    for minute in range(31, 91):
        report(cluster, minutes(minute - 1), minutes(minute))
        clock.move_to(minutes(minute))
        metrics.roll_up_minutes()  # the beat's rollup and pruning run beside it
        idle.notice_idle()
    cluster.refresh_from_db()
    assert cluster.idle_since == T
    assert len(idle_events(cluster)) == 1
    assert send_pending_cluster_emails() == 1
    assert idle.notice_text(cluster) == "16 GPUs idle for 1 h 30 min, costing $40.00 per hour"


def test_busy_again_clears_it_and_idle_again_is_a_new_period_with_a_new_email(owner, clock):
    cluster = ready_cluster(owner.project)
    report(cluster, T, minutes(30))
    notice(clock, minutes(30))
    # One GPU of node-1 works for a moment: the idle period is over (no email).
    busy_at = minutes(31)
    report(
        cluster,
        minutes(30),
        minutes(32),
        lambda n, g, at: 80.0 if (n, g, at) == (1, 5, busy_at) else 0.0,
    )
    assert notice(clock, minutes(32)) == 1
    cluster.refresh_from_db()
    assert cluster.idle_since is None
    idle_event, busy = idle_events(cluster)
    assert busy.reason == Reason.GPUS_BUSY and busy.notification is None
    assert idle.notice_text(cluster) == ""
    assert send_pending_cluster_emails() == 1  # the first period's only

    # Idle again from busy_at on: 30 minutes later, a new period.
    report(cluster, minutes(32), minutes(61))
    assert notice(clock, minutes(60)) == 0  # 29 min since the busy sample
    assert notice(clock, minutes(61)) == 1
    cluster.refresh_from_db()
    assert cluster.idle_since == busy_at
    assert [e.reason for e in idle_events(cluster)] == [
        Reason.GPUS_IDLE,
        Reason.GPUS_BUSY,
        Reason.GPUS_IDLE,
    ]
    assert send_pending_cluster_emails() == 1
    assert len(mail.outbox) == 2


def test_one_gpu_at_work_keeps_the_cluster_from_being_idle(owner, clock):
    cluster = ready_cluster(owner.project)
    report(cluster, T, minutes(45), lambda n, g, at: 40.0 if (n, g) == (0, 7) else 0.0)
    assert notice(clock, minutes(45)) == 0
    assert idle_events(cluster) == []


def test_a_cluster_ready_less_than_the_period_ago_is_not_idle_yet(owner, clock):
    cluster = ready_cluster(owner.project)
    Cluster.objects.filter(pk=cluster.pk).update(ready_at=minutes(10))
    report(cluster, T, minutes(39))
    assert notice(clock, minutes(39)) == 0
    assert notice(clock, minutes(40)) == 1
    cluster.refresh_from_db()
    assert cluster.idle_since == minutes(10)


def test_a_terminated_cluster_is_nothing_and_its_idle_period_ends(owner, clock):
    done = ready_cluster(owner.project, status=Cluster.Status.TERMINATED)
    report(done, T, minutes(40))
    assert notice(clock, minutes(40)) == 0
    assert idle_events(done) == []
    # One that ended while idle no longer says it is.
    cluster = ready_cluster(owner.project)
    report(cluster, T, minutes(40))
    notice(clock, minutes(40))
    Cluster.objects.filter(pk=cluster.pk).update(status=Cluster.Status.TERMINATED)
    notice(clock, minutes(41))
    cluster.refresh_from_db()
    assert cluster.idle_since is None
    assert idle.notice_text(cluster) == ""


def test_a_cluster_without_reports_or_whose_agents_stopped_is_not_idle(owner, clock):
    silent = ready_cluster(owner.project)
    stopped = ready_cluster(owner.project)
    report(stopped, T, minutes(20))  # then nothing for 20 minutes
    half = ready_cluster(owner.project)
    report(half, T, minutes(40), lambda n, g, at: 0.0)
    GpuSample.objects.filter(node__cluster=half, node__index=1, at__gte=minutes(25)).delete()
    assert notice(clock, minutes(40)) == 0
    for cluster in (silent, stopped, half):
        cluster.refresh_from_db()
        assert cluster.idle_since is None and idle_events(cluster) == []


def test_the_settings_are_honoured_and_the_rollups_answer_beyond_the_hour(owner, clock, settings):
    settings.RUNCRATE_IDLE_GPU_PERCENT = 50.0
    settings.RUNCRATE_IDLE_GPU_MINUTES = 90.0
    cluster = ready_cluster(owner.project)
    # 45 % is idle below 50 %; the raw samples older than the hour are rolled up and pruned by
    # the beat as the clock goes.
    for minute in range(1, 91):
        report(cluster, minutes(minute - 1), minutes(minute), lambda n, g, at: 45.0)
        clock.move_to(minutes(minute))
        metrics.roll_up_minutes()
    assert GpuSample.objects.filter(at__lt=minutes(30)).count() == 0  # pruned: rollups answer
    clock.move_to(minutes(89))
    assert idle.notice_idle() == 0  # 89 minutes: not yet
    clock.move_to(minutes(90))
    assert idle.notice_idle() == 1
    cluster.refresh_from_db()
    assert cluster.idle_since is not None and cluster.idle_since <= minutes(0)
    assert idle_events(cluster)[0].message.startswith("16 GPUs idle for 1 h 30 min")
    assert "below 50% utilisation) for 90 minutes" in _email_body()


def test_a_busy_minute_beyond_the_hour_counts(owner, clock, settings):
    settings.RUNCRATE_IDLE_GPU_MINUTES = 90.0
    cluster = ready_cluster(owner.project)
    for minute in range(1, 91):
        util = 70.0 if minute == 10 else 0.0
        report(cluster, minutes(minute - 1), minutes(minute), lambda n, g, at, u=util: u)
        clock.move_to(minutes(minute))
        metrics.roll_up_minutes()
    assert idle.notice_idle() == 0


def _email_body() -> str:
    send_pending_cluster_emails()
    [email] = mail.outbox
    return email.body


def test_every_cluster_is_judged_in_the_same_queries_whatever_their_number(owner, clock):
    def queries_for(count: int) -> int:
        Cluster.objects.all().delete()
        for _ in range(count):
            cluster = ready_cluster(owner.project)
            report(cluster, minutes(10), minutes(20))  # not idle long enough: nothing to write
        clock.move_to(minutes(20))
        with CaptureQueriesContext(connection) as queries:
            assert idle.notice_idle() == 0
        return len(queries)

    # Clearing the ended clusters' idle_since, the clusters, their machines, the raw samples.
    assert queries_for(1) == queries_for(5) == 4


def test_a_cluster_that_changes_costs_a_fixed_number_of_queries_more(owner, clock):
    clusters = [ready_cluster(owner.project) for _ in range(3)]
    for cluster in clusters:
        report(cluster, T, minutes(30))
    clock.move_to(minutes(30))
    with CaptureQueriesContext(connection) as queries:
        assert idle.notice_idle() == 3
    # Each: its lock, its machines, the event, the cluster's row (and the savepoint pair the
    # test's own transaction makes of the atomic block).
    assert len(queries) == 4 + 3 * 6


def test_the_page_says_it_on_every_tab_with_the_header_and_how_to_terminate(owner, stranger, clock):
    cluster = ready_cluster(owner.project)
    report(cluster, T, minutes(45))
    notice(clock, minutes(30))
    clock.move_to(minutes(45))
    client = owner.browser_client()
    for tab in ("", "machines/", "events/"):
        page = client.get(f"/clusters/{cluster.pk}/{tab}").content.decode()
        head = page[page.index('id="cluster-status"') : page.index("</section>")]
        assert '<div class="note note-warn idle-notice" role="status">' in head
        assert "16 GPUs idle for 45 min, costing $40.00 per hour." in head
        assert "Nothing is stopped" in head
        assert f'href="/clusters/{cluster.pk}/terminate/"' in head
    # Busy again: the banner goes with the next render (the poll's header).
    report(cluster, minutes(45), minutes(46), lambda n, g, at: 90.0)
    notice(clock, minutes(46))
    page = client.get(f"/clusters/{cluster.pk}/").content.decode()
    assert "idle-notice" not in page
    # A stranger sees nothing of it.
    assert stranger.browser_client().get(f"/clusters/{cluster.pk}/").status_code == 404
