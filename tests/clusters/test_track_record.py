"""The track record per machine type (issue 13, item 3): computed from the clusters' events of
the last 30 days, written to `offers.TrackRecord`, shown on the offers and in the API."""

from datetime import UTC, datetime, timedelta
from io import StringIO

import pytest
import time_machine
from django.conf import settings
from django.core.management import call_command

from clusters import tasks
from clusters.models import Cluster, Event
from clusters.track_record import percentile_95, refresh_track_records
from offers.models import TrackRecord
from tests.factories import ClusterFactory, EventFactory
from tests.offers.catalog import offer_row, offer_type, text

NOW = datetime(2026, 6, 30, 12, 0, tzinfo=UTC)
R = Event.Reason


def cluster(machine_type, *, days_ago: float = 1, events=(), acceptance=None, **fields):
    """A cluster created `days_ago` before NOW with `events`: (seconds after creation, reason,
    step) each, after its `created` event."""
    created = NOW - timedelta(days=days_ago)
    made = ClusterFactory(
        machine_type=machine_type,
        created_at=created,
        joined_at=created + timedelta(minutes=5) if acceptance else None,
        acceptance=acceptance or {},
        **fields,
    )
    EventFactory(cluster=made, reason=R.CREATED, at=created)
    for seconds, reason, step in events:
        EventFactory(
            cluster=made, reason=reason, step=step, at=created + timedelta(seconds=seconds)
        )
    return made


def report(*bandwidths):
    """An acceptance report: node-0 measures nothing, the others their bandwidth to it."""
    nodes = [{"name": "node-0", "bandwidth_mbit": None}]
    nodes += [{"name": f"node-{i + 1}", "bandwidth_mbit": b} for i, b in enumerate(bandwidths)]
    return {"measured_at": "…", "nodes": nodes}


def ready(seconds):
    return [(seconds, R.READY, "")]


@pytest.fixture
def history(h100):
    """Ten counted clusters of one type (six started, four failed at each step), one withdrawn,
    one still starting, one from before the window; and one cluster of another type."""
    busy = offer_type(gpu=h100, slug="busy", location="us-east-2", price="20.00", free=9)
    quiet = offer_type(gpu=h100, slug="quiet", location="eu-west-1", price="18.00", free=9)
    cluster(busy, events=ready(600), acceptance=report(1500))
    cluster(busy, events=ready(660), acceptance=report(1700, 1200), days_ago=29.9)
    cluster(busy, events=ready(720))
    # its install failed, then a retry made it ready: it started, in 900 s
    cluster(busy, events=[(400, R.INSTALL_FAILED, "install"), (500, R.RETRY_INSTALL, ""),
                          (900, R.READY, "")])  # fmt: skip
    cluster(busy, events=ready(1200))
    # ready, then a machine was lost: it started all the same
    cluster(busy, events=[(480, R.READY, ""), (7200, R.MACHINE_LOST, "done")])
    cluster(busy, events=[(1500, R.BOOT_TIMEOUT, "running")])
    cluster(busy, events=[(300, R.AGENT_TIMEOUT, "agent")])
    cluster(busy, events=[(420, R.NETWORK_UNREACHABLE, "network"), (430, R.HOST_RELEASED, "")])
    # degraded by its install, then terminated without ever being ready: failed at install
    cluster(busy, events=[(700, R.INSTALL_FAILED, "install"), (900, R.TERMINATE_REQUESTED, "")])
    # terminated by its user while provisioning: withdrawn, not counted
    cluster(busy, events=[(60, R.TERMINATE_REQUESTED, ""), (90, R.TERMINATED, "")])
    cluster(busy, days_ago=0.01, status=Cluster.Status.PROVISIONING)  # still starting
    cluster(busy, days_ago=31, events=ready(60), acceptance=report(10))  # before the window
    cluster(quiet, events=ready(300))
    return busy, quiet


def test_it_computes_the_track_record_exactly_from_the_events(history):
    busy, quiet = history

    assert refresh_track_records(now=NOW) == 2

    record = TrackRecord.objects.get(machine_type=busy)
    assert record.clusters == 10
    assert record.started == 6
    assert record.withdrawn == 1
    # 480, 600, 660, 720, 900, 1200: the median between 660 and 720, the p95 the largest
    assert record.ready_median_seconds == 690
    assert record.ready_p95_seconds == 1200
    assert record.failures_by_step == {"agent": 1, "install": 1, "network": 1, "running": 1}
    assert record.bandwidth_median_mbit == 1500.0  # of 1500, 1700, 1200; not the old 10
    assert record.computed_at == NOW
    other = TrackRecord.objects.get(machine_type=quiet)
    assert (other.clusters, other.started, other.ready_median_seconds) == (1, 1, 300)
    assert other.failures_by_step == {}
    assert other.bandwidth_median_mbit is None


def test_it_rounds_the_median_to_whole_seconds_half_up(h100):
    machine_type = offer_type(gpu=h100, slug="odd")
    cluster(machine_type, events=ready(600))
    cluster(machine_type, events=ready(601))

    refresh_track_records(now=NOW)

    assert TrackRecord.objects.get(machine_type=machine_type).ready_median_seconds == 601


@pytest.mark.parametrize(
    ("values", "p95"),
    [([5], 5), ([1, 2], 2), (list(range(1, 21)), 19), (list(range(1, 101)), 95),
     (list(range(1, 22)), 20)],
)  # fmt: skip
def test_the_95th_percentile_is_the_nearest_rank(values, p95):
    assert percentile_95(list(reversed(values))) == p95


def test_it_counts_a_cluster_only_for_30_days_from_its_creation(history):
    busy, quiet = history

    # the one created 29.9 days before NOW (ready in 660 s, 1,700 and 1,200 Mbit/s) is out
    refresh_track_records(now=NOW + timedelta(days=0.2))

    record = TrackRecord.objects.get(machine_type=busy)
    assert (record.clusters, record.started) == (9, 5)
    assert record.ready_median_seconds == 720  # 480, 600, 720, 900, 1200
    assert record.bandwidth_median_mbit == 1500.0

    # past every decided cluster's 30 days: only the one still starting is left, uncounted
    refresh_track_records(now=NOW + timedelta(days=29.5))
    assert not TrackRecord.objects.exists()


def test_it_writes_again_in_place_when_run_twice(history):
    busy, _ = history
    refresh_track_records(now=NOW)
    cluster(busy, events=[(100, R.AGENT_TIMEOUT, "agent")])

    refresh_track_records(now=NOW)

    assert TrackRecord.objects.count() == 2
    record = TrackRecord.objects.get(machine_type=busy)
    assert (record.clusters, record.failures_by_step["agent"]) == (11, 2)


# --- shown on the offers and in the API ---------------------------------------------------


def test_it_sends_the_track_record_in_the_offers_api(owner, history):
    refresh_track_records(now=NOW)

    with time_machine.travel(NOW + timedelta(minutes=1), tick=False):
        response = owner.api().get("/api/v1/offers?gpu=h100-sxm&nodes=2")

    offers = {o["id"]: o for o in response.json()["data"]}
    assert offers["busy"]["track_record"] == {
        "clusters": 10,
        "started": 6,
        "started_share": 0.6,
        "ready_median_seconds": 690,
        "ready_p95_seconds": 1200,
        "ready_median_minutes": 12,  # 11.5 minutes, half up: what the offers page shows
        "ready_p95_minutes": 20,
        "failures_by_step": {"agent": 1, "install": 1, "network": 1, "running": 1},
        "bandwidth_median_mbit": 1500.0,
        "computed_at": "2026-06-30T12:00:00Z",
    }
    assert offers["quiet"]["track_record"] is None  # 1 cluster, below the minimum of 5


def test_it_shows_the_track_record_on_each_offer_row(owner, history):
    refresh_track_records(now=NOW)

    html = owner.browser_client().get("/offers/?gpu=h100-sxm&nodes=2").content.decode()

    busy = text(offer_row(html, "busy"))
    # One short badge, the detail one click away (issue 21): a <details> under it.
    assert "60% started · ~ about 12 min: details" in busy  # 690 s
    assert (
        "6 of 10 clusters started in the last 30 days, ready in about 12 min (median), 95% "
        "within 20 min. 1,500 Mbit/s between machines (median). Failed before ready at: agent "
        "1, install 1, network 1, running 1." in busy
    )
    assert "no track record yet" in text(offer_row(html, "quiet"))


def test_it_follows_the_minimum_setting(owner, history, settings):
    refresh_track_records(now=NOW)
    settings.RUNCRATE_TRACK_RECORD_MIN_CLUSTERS = 11

    body = owner.api().get("/api/v1/offers?gpu=h100-sxm&nodes=2").json()
    assert [o["track_record"] for o in body["data"]] == [None, None]

    settings.RUNCRATE_TRACK_RECORD_MIN_CLUSTERS = 1
    quiet = owner.api().get("/api/v1/offers?gpu=h100-sxm&nodes=3").json()["data"][0]
    assert quiet["id"] == "quiet"
    assert quiet["track_record"]["ready_median_seconds"] == 300


def test_it_says_when_nothing_started_and_when_ready_comes_in_under_a_minute(owner, h100):
    never = offer_type(gpu=h100, slug="never", location="aa-1")
    fast = offer_type(gpu=h100, slug="fast", location="bb-2")
    for _ in range(5):
        cluster(never, events=[(200, R.BOOT_TIMEOUT, "running")])
        cluster(fast, events=ready(25))
    refresh_track_records(now=NOW)

    html = owner.browser_client().get("/offers/?gpu=h100-sxm&nodes=2").content.decode()

    assert "none of 5 started" in text(offer_row(html, "never"))
    assert "Failed before ready at: running 5." in text(offer_row(html, "never"))
    assert "100% started · < under 1 min" in text(offer_row(html, "fast"))


def test_the_picker_runs_the_same_queries_with_track_records_for_many_types(
    owner, h100, django_assert_num_queries
):
    for index in range(12):
        machine_type = offer_type(gpu=h100, slug=f"t-{index:02d}", location=f"loc-{index:02d}")
        TrackRecord.objects.create(
            machine_type=machine_type,
            clusters=20,
            started=19,
            ready_median_seconds=600,
            ready_p95_seconds=900,
            failures_by_step={"agent": 1},
            computed_at=NOW,
        )
    client = owner.browser_client()

    # session, user, GPU cards, offers with their track records, the project in the layout,
    # the top bar's balance
    with django_assert_num_queries(6):
        response = client.get("/offers/?gpu=h100-sxm&nodes=2")
    with django_assert_num_queries(4):  # within the tick: from the cache
        again = client.get("/offers/?gpu=h100-sxm&nodes=2&sort=price_per_gpu_hour")

    assert text(response.content.decode()).count("95% started · ~ about 10 min") == 12
    assert text(again.content.decode()).count("95% started · ~ about 10 min") == 12


def test_the_api_runs_the_same_queries_with_track_records(owner, h100, django_assert_num_queries):
    for index in range(12):
        machine_type = offer_type(gpu=h100, slug=f"t-{index:02d}", location=f"loc-{index:02d}")
        TrackRecord.objects.create(
            machine_type=machine_type, clusters=9, started=9, computed_at=NOW
        )
    client = owner.api()

    with django_assert_num_queries(3):  # the key, its last use stamped, the offers
        response = client.get("/api/v1/offers?gpu=h100-sxm&nodes=2")

    assert all(o["track_record"]["clusters"] == 9 for o in response.json()["data"])


# --- run by the beat and by a command -----------------------------------------------------


def test_the_beat_refreshes_the_track_records_every_few_minutes(history):
    entry = settings.CELERY_BEAT_SCHEDULE["track-records"]
    assert entry["task"] == "clusters.tasks.refresh_track_records"
    assert entry["schedule"] <= 600

    with time_machine.travel(NOW, tick=False):
        assert tasks.refresh_track_records() == 2

    assert TrackRecord.objects.get(machine_type__slug="busy").clusters == 10


def test_a_command_refreshes_them_too(history):
    out = StringIO()

    with time_machine.travel(NOW, tick=False):
        call_command("refresh_track_records", stdout=out)

    assert "Track records written for 2 machine type(s)." in out.getvalue()
    assert TrackRecord.objects.count() == 2
