"""The cluster page in tabs (issue 21, item 5): each tab its own URL, swapped by htmx and
loaded whole without it; the poll on each tab sends what that tab shows; the header's cost,
the stepper's end, the billed machines, and the top bar's balance after a meter run."""

import json
import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from html import unescape
from urllib.parse import parse_qs, urlsplit

import pytest
import time_machine
from django.conf import settings

from billing import meter
from billing.models import UsageRecord
from clusters.models import Cluster, Event, Node
from clusters.web.presenters import TABS
from tests.billing.conftest import add_credit, bill_cluster, end_cluster
from tests.factories import ClusterFactory, EventFactory, NodeFactory

HTMX = {"HX-Request": "true"}
NOW = datetime(2026, 3, 20, 12, 0, tzinfo=UTC)


@pytest.fixture(autouse=True)
def _frozen():
    with time_machine.travel(NOW, tick=False):
        yield


def poll_url(page: str) -> str:
    found = re.search(r'<section id="cluster-status"[^>]* hx-get="([^"]*)"', page)
    assert found, "the page does not poll"
    return unescape(found.group(1))


def test_every_tab_is_its_own_url_with_the_tab_marked_current(owner, stranger):
    cluster = bill_cluster(owner.project, size=2, at=NOW - timedelta(minutes=30))
    client = owner.browser_client()

    for tab in TABS:
        url = tab.url(cluster)
        html = client.get(url).content.decode()
        nav = re.search(r'<nav id="cluster-tabs".*?</nav>', html, re.S).group(0)
        assert re.findall(r'<a href="([^"]*)"[^>]*aria-current="page"', nav) == [url]
        assert len(re.findall(r"<a href=", nav)) == len(TABS)
        assert (
            f'<section id="cluster-tab" class="cluster-tab cluster-page" '
            f'aria-labelledby="{tab.heading}"' in html
        )
        assert f'id="{tab.heading}"' in html  # the panel's heading exists
        assert urlsplit(poll_url(html)).path == url  # the poll asks for this tab
        assert stranger.browser_client().get(url).status_code == 404

    assert [tab.slug for tab in TABS] == [
        "overview",
        "connect",
        "machines",
        "metrics",
        "logs",
        "events",
        "billing",
    ]
    assert TABS[2].url(cluster) == f"/clusters/{cluster.pk}/machines/"
    assert client.get(f"/clusters/{cluster.pk}/nope/").status_code == 404


def test_a_tab_link_swaps_the_panel_and_moves_the_header_and_tab_list(owner):
    cluster = bill_cluster(owner.project, size=2, at=NOW - timedelta(minutes=30))
    client = owner.browser_client()
    page = client.get(f"/clusters/{cluster.pk}/").content.decode()
    link = re.search(
        r'<a href="(/clusters/\d+/events/)" hx-get="([^"]*)" hx-target="#cluster-tab"', page
    )
    assert link and link.group(1) == link.group(2)
    assert 'hx-push-url="true"' in page

    answer = client.get(link.group(1), headers={**HTMX, "HX-Target": "cluster-tab"})

    body = answer.content.decode()
    assert body.lstrip().startswith('<section id="cluster-tab"')
    assert 'aria-labelledby="events-title"' in body and 'id="event-rows"' in body
    assert re.search(r'<section id="cluster-status"[^>]* hx-swap-oob="true"', body)
    assert urlsplit(poll_url(body)).path == link.group(1)
    assert re.search(r'<nav id="cluster-tabs"[^>]* hx-swap-oob="true"', body)
    assert "HX-Target" in answer["Vary"]
    assert "<html" not in body  # a fragment, not the page


def test_the_stepper_ends_with_how_the_cluster_ended(owner):
    cluster = bill_cluster(owner.project, size=2, at=NOW - timedelta(hours=1))
    end_cluster(cluster, at=NOW - timedelta(minutes=10))

    html = owner.browser_client().get(f"/clusters/{cluster.pk}/").content.decode()

    stepper = re.search(r'<ol class="stepper is-ended".*?</ol>', html, re.S).group(0)
    steps = re.findall(r'<li class="(\w+)"[^>]*>([^<]*)</li>', stepper)
    assert steps[-1] == ("ended", "Terminated")
    assert steps[-2] == ("done", "Ready")
    assert 'aria-current="step"' not in stepper


def test_an_ended_cluster_shows_what_it_cost_for_the_machines_it_billed(owner):
    started = NOW - timedelta(hours=2)
    cluster = bill_cluster(owner.project, size=2, price="10.00", at=started)
    worker = NodeFactory(cluster=cluster, index=2, is_worker=True, status=Node.Status.ENDED)
    UsageRecord.objects.create(
        project=owner.project,
        cluster=cluster,
        node=worker,
        price_per_hour=Decimal("10.00"),
        started_at=started,
        ended_at=started + timedelta(hours=1),
        charged_until=started,
    )
    end_cluster(cluster, at=started + timedelta(hours=1))
    client = owner.browser_client()

    html = client.get(f"/clusters/{cluster.pk}/").content.decode()
    billing = client.get(f"/clusters/{cluster.pk}/billing/").content.decode()

    # Three machines for an hour at $10.00; priced for the three, not the first size (2).
    assert '<strong class="cost-figure">$30.00</strong> in all · 3 machines billed' in html
    assert '<div class="price-main">$30.00<span' in html
    assert "data-cost=" not in html  # an ended cluster's cost does not tick
    assert "Cost in all" in billing and "$30.00" in billing
    rows = re.findall(r'<td class="mono" data-label="Machine">(node-\d)</td>', billing)
    assert rows == ["node-0", "node-1", "node-2"]


def test_a_running_cluster_writes_what_its_cost_and_uptime_read_next(owner):
    """The browser shows the server's words for each coming second (static/js/app.js computes
    nothing): the cost grows by the machines' price, rounded as the meter rounds it, and the
    uptime as runcrate.durations words it; a row only where either changes."""
    cluster = bill_cluster(owner.project, size=2, price="1.80", at=NOW - timedelta(minutes=10))

    html = owner.browser_client().get(f"/clusters/{cluster.pk}/").content.decode()

    found = re.search(r'id="cluster-cost" data-cost-ahead="([^"]*)"', html)
    rows = json.loads(unescape(found.group(1)))
    # 600 s × 1.80 / 3600 = 0.30 per machine, so $0.60 now; two machines up at $3.60 per hour
    # add a cent every 10 s (half up: at 5 s), and the uptime reads 11 min from 60 s on.
    assert rows[:3] == [[5, "$0.61", "10 min"], [15, "$0.62", "10 min"], [25, "$0.63", "10 min"]]
    assert [60, "$0.66", "11 min"] in rows
    assert rows[-1][0] <= settings.RUNCRATE_METER_SECONDS + 10  # past the meter's next run
    assert rows[-1][0] > settings.RUNCRATE_METER_SECONDS


def test_the_poll_brings_the_balance_once_the_meter_ran_without_a_query_while_it_did_not(
    owner, django_assert_num_queries
):
    add_credit(owner.project, "100.00", at=NOW - timedelta(days=1))
    cluster = bill_cluster(owner.project, size=2, price="6.00", at=NOW - timedelta(hours=1))
    meter.stamp_run()
    client = owner.browser_client()
    url = poll_url(client.get(f"/clusters/{cluster.pk}/").content.decode())
    assert parse_qs(urlsplit(url).query)["meter"] == [meter.last_run_stamp()]

    with django_assert_num_queries(3):  # the session, the user, the cluster's version
        assert client.get(url, headers=HTMX).status_code == 204

    meter.charge_accrued(now=NOW)  # the meter's run stamps the cache
    response = client.get(url, headers=HTMX)

    assert response.status_code == 200
    body = response.content.decode()
    assert re.search(
        r'<a class="topbar-balance[^"]*" href="/billing/" id="topbar-balance" hx-swap-oob="true"',
        body,
    )
    assert "$88.00" in body  # $100 less two machines for an hour at $6.00
    assert parse_qs(urlsplit(poll_url(body)).query)["meter"] == [meter.last_run_stamp()]
    assert client.get(poll_url(body), headers=HTMX).status_code == 204


def test_events_show_the_date_and_time_for_the_browser_to_write_in_its_zone(owner):
    cluster = ClusterFactory(project=owner.project, machines=True)
    EventFactory(
        cluster=cluster,
        node=cluster.nodes.get(index=0),
        reason=Event.Reason.MACHINE_RUNNING,
        step=Node.Step.RUNNING,
        at=datetime(2026, 3, 19, 8, 5, 9, tzinfo=UTC),
    )

    html = owner.browser_client().get(f"/clusters/{cluster.pk}/events/").content.decode()

    assert (
        '<time datetime="2026-03-19T08:05:09Z" data-when="relative">2026-03-19 08:05:09 UTC</time>'
        in html
    )
    row = re.search(r'<tbody id="event-rows">.*?</tbody>', html, re.S).group(0)
    assert '<td class="small">Boot</td>' in row  # the step's one name, not "running"


def test_a_step_has_one_name_in_the_stepper_the_banner_and_the_machine_rows(owner):
    cluster = ClusterFactory(
        project=owner.project,
        status=Cluster.Status.FAILED,
        failure_reason=Event.Reason.BOOT_TIMEOUT,
        failure_node="node-1",
        failure_step=Node.Step.RUNNING,
        failure_message="node-1 did not boot.",
        machines=True,
    )
    cluster.nodes.filter(index=1).update(status=Node.Status.FAILED, step=Node.Step.RUNNING)
    client = owner.browser_client()

    overview = client.get(f"/clusters/{cluster.pk}/").content.decode()
    machines = client.get(f"/clusters/{cluster.pk}/machines/").content.decode()

    assert '<li class="failed">Boot</li>' in overview
    assert "at step Boot." in overview
    assert "Failed at boot" in re.search(r'<tr id="node-1".*?</tr>', machines, re.S).group(0)
    for page in (overview, machines):
        assert "Machines running" not in page


@pytest.mark.parametrize(
    "size, sentence",
    [
        (1, "The machine stops and billing ends for it at once."),
        (2, "Both machines stop together and billing ends for both at once."),
        (4, "All 4 machines stop together and billing ends for every one of them at once."),
    ],
)
def test_the_terminate_page_counts_the_machines_in_words(owner, size, sentence):
    cluster = bill_cluster(owner.project, size=size, at=NOW - timedelta(minutes=5))

    html = owner.browser_client().get(f"/clusters/{cluster.pk}/terminate/").content.decode()

    assert sentence in html
    assert "All 2 machines" not in html


def test_the_shape_is_written_one_way(owner):
    cluster = bill_cluster(owner.project, size=2, at=NOW - timedelta(minutes=5))
    gpus = cluster.machine_type.gpus_per_machine
    name = cluster.machine_type.gpu.name

    html = owner.browser_client().get(f"/clusters/{cluster.pk}/").content.decode()

    assert f"2 machines · {gpus}× {name} each" in html
    assert f"2 × {gpus}×" not in html
