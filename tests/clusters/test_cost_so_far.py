"""A cluster's cost so far and uptime, on its page and in the list (docs/billing.md "Cost so far
and uptime"): the meter's rule over each machine's billed span, so the figure is the ledger's
once the meter has run; the list reads it in one query for any number of clusters."""

import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
import time_machine
from django.db import connection
from django.test.utils import CaptureQueriesContext

from billing.meter import charge_accrued
from billing.models import LedgerEntry, UsageRecord
from billing.usage import NOT_BILLED, cluster_costs
from clusters.models import Cluster, Node
from tests.billing.conftest import add_credit, bill_cluster, end_cluster
from tests.factories import ClusterFactory, MachineTypeFactory, NodeFactory

NOW = datetime(2026, 3, 20, 12, 0, tzinfo=UTC)


@pytest.fixture(autouse=True)
def _frozen():
    with time_machine.travel(NOW, tick=False):
        yield


def ledger_cost(cluster: Cluster) -> Decimal:
    lines = LedgerEntry.objects.filter(cluster=cluster, kind=LedgerEntry.Kind.USAGE)
    return -sum((line.amount for line in lines), Decimal("0.00"))


def test_it_costs_what_the_ledger_charges_once_the_meter_ran(owner):
    add_credit(owner.project, "1000.00", at=NOW - timedelta(days=1))
    started = NOW - timedelta(seconds=9326)
    cluster = bill_cluster(owner.project, size=2, price="1.11", at=started)
    # A worker joined an hour later and left 20 minutes after; its own price and span.
    worker = NodeFactory(cluster=cluster, index=2, status=Node.Status.ENDED)
    UsageRecord.objects.create(
        project=owner.project,
        cluster=cluster,
        node=worker,
        price_per_hour=Decimal("1.11"),
        started_at=started + timedelta(hours=1),
        ended_at=started + timedelta(hours=1, minutes=20),
        charged_until=started + timedelta(hours=1),
    )
    charge_accrued(now=NOW)

    cost = cluster_costs([cluster.pk], now=NOW)[cluster.pk]

    # 9,326 s × 1.11 / 3600 = 2.8757… → 2.88 per machine, and 1,200 s → 0.37 for the worker.
    assert cost.cost == Decimal("6.13") == ledger_cost(cluster)
    assert (cost.billed_from, cost.billed_until, cost.running) == (started, None, True)
    assert cost.uptime_seconds == 9326


def test_it_stops_counting_when_the_cluster_ends(owner):
    started = NOW - timedelta(hours=3)
    cluster = bill_cluster(owner.project, size=2, price="10.00", at=started)
    end_cluster(cluster, at=started + timedelta(hours=1, minutes=30))

    cost = cluster_costs([cluster.pk], now=NOW)[cluster.pk]

    assert cost.cost == Decimal("30.00")
    assert cost.uptime_seconds == 5400 and not cost.running
    assert cost.billed_until == started + timedelta(hours=1, minutes=30)


def test_a_cluster_never_billed_costs_nothing(owner):
    cluster = ClusterFactory(project=owner.project, machines=True)

    assert cluster_costs([cluster.pk], now=NOW) == {cluster.pk: NOT_BILLED}
    html = owner.browser_client().get(f"/clusters/{cluster.pk}/").content.decode()
    assert '<div class="price-sub cost-so-far" id="cluster-cost">Nothing billed yet</div>' in html
    assert "not billed" in owner.browser_client().get("/clusters/").content.decode()


def test_the_cluster_page_shows_the_cost_so_far_and_the_uptime(owner, stranger):
    started = NOW - timedelta(hours=2, minutes=35, seconds=10)
    cluster = bill_cluster(owner.project, size=2, price="1234.50", at=started)

    html = owner.browser_client().get(f"/clusters/{cluster.pk}/").content.decode()
    ended = bill_cluster(owner.project, size=2, price="10.00", at=started)
    end_cluster(ended, at=started + timedelta(minutes=45))
    ended_html = owner.browser_client().get(f"/clusters/{ended.pk}/").content.decode()

    # 9,310 s × 1,234.50 / 3600 = 3,192.55… per machine: $6,385.10 for two.
    # The running figure carries what the browser shows next, in the server's words.
    assert re.search(
        r'<div class="price-sub cost-so-far" id="cluster-cost" data-cost-ahead="[^"]*">'
        r'<strong class="cost-figure">\$6,385\.10</strong> so far · up '
        r'<span class="cost-uptime">2 h 35 min</span></div>',
        html,
    )
    assert (
        '<strong class="cost-figure">$15.00</strong> in all · 2 machines billed for 45 min'
        in ended_html
    )
    assert stranger.browser_client().get(f"/clusters/{cluster.pk}/").status_code == 404


def test_the_list_shows_each_clusters_cost_and_uptime(owner, stranger):
    bill_cluster(owner.project, size=2, price="10.00", at=NOW - timedelta(minutes=30), name="a")
    bill_cluster(stranger.project, size=2, price="99.00", at=NOW - timedelta(hours=1), name="b")

    html = owner.browser_client().get("/clusters/").content.decode()

    cells = re.findall(r'<td class="num cost-so-far"[^>]*>(.*?)</td>', html)
    assert cells == ['$10.00<div class="price-sub">up 30 min</div>']
    assert "$99" not in html


@pytest.mark.parametrize("page", ["/clusters/", "/clusters/?page=1"])
def test_the_list_reads_costs_in_the_same_queries_for_2_and_20_clusters(
    owner, django_assert_num_queries, page
):
    machine_type = MachineTypeFactory(price_per_hour=Decimal("3.00"))
    client = owner.browser_client()

    def billed(count: int) -> None:
        for n in range(count):
            bill_cluster(
                owner.project, size=3, machine_type=machine_type, at=NOW - timedelta(hours=n + 1)
            )

    billed(2)
    client.get(page)
    with CaptureQueriesContext(connection) as two:
        client.get(page)
    billed(18)
    with django_assert_num_queries(len(two)):
        html = client.get(page).content.decode()
    # The polled rows: no top bar, no quotes, no count of the filter's choices.
    with django_assert_num_queries(len(two) - 3):
        rows = client.get(page, headers={"HX-Request": "true"}).content.decode()

    assert html.count('<td class="num cost-so-far" ') == 20
    assert rows.count('<td class="num cost-so-far" ') == 20
    assert "$9.00<div" in html  # three machines for an hour at $3.00
