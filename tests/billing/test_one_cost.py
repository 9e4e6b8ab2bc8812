"""One cost (docs/billing.md, "One cost"; issue 37): `billing.usage.cluster_costs` gives a
cluster's cost so far, its machines' costs and a row per machine and month, at one instant, and
the rows add up to the cost to the cent, whether the meter ran or not, across a month's end,
with a worker added and a machine replaced. The cluster page's header and Billing tab, the
Clusters list, the Billing page and the API read it; the list and the API in a fixed number
of queries."""

import html
import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from urllib.parse import parse_qs, urlsplit

import pytest
import time_machine
from django.db import connection
from django.test.utils import CaptureQueriesContext

from billing.meter import charge_accrued
from billing.models import LedgerEntry, UsageRecord
from billing.usage import Month, cluster_costs, in_month, machine_rows
from clusters.models import Cluster, Node
from tests.billing.conftest import add_credit, bill_cluster, end_cluster
from tests.factories import MachineTypeFactory, NodeFactory

NOW = datetime(2026, 3, 20, 12, 0, tzinfo=UTC)


@pytest.fixture(autouse=True)
def _frozen():
    with time_machine.travel(NOW, tick=False):
        yield


def ledger_cost(cluster: Cluster) -> Decimal:
    lines = LedgerEntry.objects.filter(cluster=cluster, kind=LedgerEntry.Kind.USAGE)
    return -sum((line.amount for line in lines), Decimal("0.00"))


def add_machine(
    cluster: Cluster,
    *,
    index: int,
    at: datetime,
    ended_at: datetime | None = None,
    status: str = Node.Status.JOINED,
    replaces: Node | None = None,
) -> Node:
    """A machine that joined `cluster` at `at` (a worker, or a replacement), billed from it."""
    node = NodeFactory(
        cluster=cluster, index=index, status=status, replaces=replaces, reserved_at=at
    )
    UsageRecord.objects.create(
        project=cluster.project,
        cluster=cluster,
        node=node,
        price_per_hour=cluster.price_per_machine_hour,
        started_at=at,
        ended_at=ended_at,
        charged_until=at,
    )
    return node


def cents(text: str) -> Decimal:
    return Decimal(re.sub(r"[^\d.]", "", text))


def test_it_adds_the_rows_up_to_the_cost_to_the_cent_whether_the_meter_ran_or_not(owner):
    add_credit(owner.project, "1000.00", at=NOW - timedelta(days=1))
    started = NOW - timedelta(seconds=7777)
    # $1.13 an hour: each machine's cost rounds on its own, the cluster's is their sum.
    cluster = bill_cluster(owner.project, size=3, price="1.13", at=started)
    add_machine(cluster, index=3, at=started + timedelta(seconds=1234))

    before = cluster_costs([cluster.pk], now=NOW, rows=True)[cluster.pk]
    charge_accrued(now=NOW - timedelta(seconds=41))  # the meter ran 41 s ago
    between = cluster_costs([cluster.pk], now=NOW, rows=True)[cluster.pk]
    charge_accrued(now=NOW)
    after = cluster_costs([cluster.pk], now=NOW, rows=True)[cluster.pk]

    # 7,777 s × 1.13 / 3600 = 2.441… → 2.44 a machine, the worker's 6,543 s → 2.05.
    assert before.cost == between.cost == after.cost == Decimal("9.37") == ledger_cost(cluster)
    assert sum(row.cost for row in before.rows) == before.cost
    assert [row.cost for row in before.rows] == [Decimal("2.44")] * 3 + [Decimal("2.05")]
    assert sum(before.node_costs.values()) == before.cost
    assert before.rows == between.rows == after.rows
    assert all(row.ended_at is None for row in before.rows)  # running
    assert (before.machines, before.machines_now) == (4, 4)


def test_it_splits_a_machine_at_a_months_end_and_still_adds_up(owner):
    started = datetime(2026, 2, 28, 23, 20, 7, tzinfo=UTC)
    now = datetime(2026, 3, 1, 0, 45, 0, tzinfo=UTC)
    cluster = bill_cluster(owner.project, size=2, price="0.07", at=started)
    with time_machine.travel(now, tick=False):
        charge_accrued(now=now)
        cost = cluster_costs([cluster.pk], now=now, rows=True)[cluster.pk]
        february = machine_rows(cluster=cluster, month=Month(2026, 2))
        march = machine_rows(cluster=cluster, month=Month(2026, 3))

    # 5,093 s at $0.07 = 0.0990… → 0.10 a machine; February's 2,393 s → 0.05, March the rest.
    assert cost.cost == Decimal("0.20") == ledger_cost(cluster)
    assert [(r.started_at.month, r.cost) for r in cost.rows] == [
        (2, Decimal("0.05")),
        (3, Decimal("0.05")),
        (2, Decimal("0.05")),
        (3, Decimal("0.05")),
    ]
    assert february == in_month(cost.rows, Month(2026, 2))
    assert march == in_month(cost.rows, Month(2026, 3))
    assert february[0].ended_at == datetime(2026, 3, 1, tzinfo=UTC)  # its part of February
    assert march[0].ended_at is None  # running
    assert sum(r.seconds for r in cost.rows) == 2 * 5093


def test_a_replaced_machine_keeps_its_row_and_the_count_is_the_machines_to_the_end(owner):
    started = NOW - timedelta(hours=2)
    cluster = bill_cluster(owner.project, size=2, price="3.60", at=started)
    lost = cluster.nodes.get(index=1)
    lost_at = started + timedelta(minutes=30)
    UsageRecord.objects.filter(node=lost).update(ended_at=lost_at)
    Node.objects.filter(pk=lost.pk).update(status=Node.Status.LOST)
    add_machine(cluster, index=1, at=lost_at + timedelta(minutes=5), replaces=lost)

    cost = cluster_costs([cluster.pk], now=NOW, rows=True)[cluster.pk]
    end_cluster(cluster, at=NOW)
    ended = cluster_costs([cluster.pk], now=NOW + timedelta(hours=1), rows=True)[cluster.pk]

    # $3.60 an hour is a cent a 10 s: 2 h → 7.20, 30 min → 1.80, 85 min → 5.10.
    assert [(r.node.split(" (")[0], r.cost) for r in cost.rows] == [
        ("node-0", Decimal("7.20")),
        ("node-1", Decimal("1.80")),
        ("node-1", Decimal("5.10")),
    ]
    assert cost.rows[1].node.startswith("node-1 (replaced ")
    assert cost.cost == Decimal("14.10") == sum(r.cost for r in cost.rows)
    assert (cost.machines, cost.machines_now) == (3, 2)
    assert ended.cost == cost.cost and (ended.machines_now, ended.billed_until) == (2, NOW)
    assert cluster.machines_priced(0, billed=ended.machines_now) == 2


def test_the_page_header_tab_and_rows_are_one_figure(owner):
    started = NOW - timedelta(hours=1, minutes=7, seconds=3)
    cluster = bill_cluster(owner.project, size=4, price="5.58", at=started)
    add_machine(cluster, index=4, at=started + timedelta(minutes=20))
    charge_accrued(now=NOW - timedelta(seconds=50))  # the ledger is 50 s behind

    html = owner.browser_client().get(f"/clusters/{cluster.pk}/billing/").content.decode()
    cost = cluster_costs([cluster.pk], now=NOW)[cluster.pk]

    header = re.search(r'<strong class="cost-figure">([^<]+)</strong>', html)
    tab = re.search(r'<strong id="billing-cost">([^<]+)</strong>', html)
    rows = re.findall(r'<td class="num machine-cost" data-label="Cost">([^<]+)</td>', html)
    assert header and tab and len(rows) == 5
    # 4,023 s × 5.58 / 3600 = 6.2356… → 6.24 a machine; the worker's 2,823 s → 4.38.
    assert cents(header[1]) == cents(tab[1]) == sum(map(cents, rows)) == cost.cost
    assert cost.cost == Decimal("29.34") != ledger_cost(cluster)
    assert "5 machines" in html  # the worker counts
    # On the Billing tab the header does not tick apart from the tab: the poll redraws both.
    assert "data-cost-ahead" not in html
    assert re.search(r"until=\d+", html)


def test_the_list_counts_an_added_worker_at_once_and_terminating_keeps_it(owner):
    started = NOW - timedelta(hours=1)
    cluster = bill_cluster(owner.project, size=4, price="22.32", at=started)
    # A worker just added: reserved, starting, not billed yet.
    NodeFactory(cluster=cluster, index=4, status=Node.Status.STARTING)
    client = owner.browser_client()

    listed = client.get("/clusters/").content.decode()
    page = client.get(f"/clusters/{cluster.pk}/").content.decode()
    api = owner.api().get(f"/api/v1/clusters/{cluster.pk}").json()["data"]

    assert re.search(r'data-label="Size">5 machines<', listed)
    assert "5 machines ·" in page
    assert api["nodes"] == 5

    # Terminating: every machine ended and billing with them (what terminate does).
    Node.objects.filter(cluster=cluster).update(status=Node.Status.ENDED)
    UsageRecord.objects.filter(cluster=cluster).update(ended_at=NOW)
    Cluster.objects.filter(pk=cluster.pk).update(status=Cluster.Status.TERMINATING)
    terminating = client.get(f"/clusters/{cluster.pk}/").content.decode()
    listed = client.get("/clusters/").content.decode()

    assert "4 machines ·" in terminating  # the four billed to the end; the worker never joined
    assert "$89.28" in terminating  # 4 × $22.32 for an hour
    assert re.search(r'data-label="Size">4 machines<', listed)


def test_the_billing_page_brings_a_running_clusters_line_to_now(owner):
    add_credit(owner.project, "1000.00", at=NOW - timedelta(days=1))
    started = NOW - timedelta(minutes=33, seconds=20)
    cluster = bill_cluster(owner.project, size=2, price="7.20", at=started, name="live")
    ended = bill_cluster(owner.project, size=1, price="3.60", at=started, name="done")
    end_cluster(ended, at=started + timedelta(minutes=10))
    charge_accrued(now=NOW - timedelta(seconds=40))  # the ledger is 40 s behind the live one

    html = owner.browser_client().get("/billing/").content.decode()
    rows = owner.browser_client().get(f"/billing/clusters/{cluster.pk}/?month=2026-03")

    cost = cluster_costs([cluster.pk], now=NOW)[cluster.pk]
    # $7.20 an hour is 2 cents a 10 s: 2,000 s → 4.00 a machine.
    assert cost.cost == Decimal("8.00") and ledger_cost(cluster) < cost.cost
    lines = dict(re.findall(r"Cluster usage — (\w+)</a>.*?amount-debit\">([^<]+)<", html, re.S))
    assert lines == {"live": "−$8.00", "done": "−$0.60"}  # now, and the ended one's ledger line
    # The month's usage total is what the meter charged (the ledger), 40 s behind.
    assert "$8.60" not in html
    machine_costs = re.findall(r"\$4\.00", rows.content.decode())
    assert len(machine_costs) >= 2


def test_the_api_lists_costs_in_the_same_queries_for_2_and_20_clusters(
    owner, django_assert_num_queries
):
    machine_type = MachineTypeFactory(price_per_hour=Decimal("3.00"))
    api = owner.api()

    def billed(count: int) -> None:
        for n in range(count):
            at = NOW - timedelta(hours=n + 1)
            bill_cluster(owner.project, size=2, machine_type=machine_type, at=at)

    billed(2)
    api.get("/api/v1/clusters")
    with CaptureQueriesContext(connection) as two:
        api.get("/api/v1/clusters")
    billed(18)
    with django_assert_num_queries(len(two)):
        data = api.get("/api/v1/clusters").json()["data"]

    assert len(data) == 20
    hour = next(c for c in data if c["billed_seconds"] == 3600)  # two machines at $3.00
    assert (hour["cost_so_far"], hour["final_cost"], hour["billed_for"]) == ("6.00", None, "1 h")
    assert [m["cost"] for m in hour["machines"]] == ["3.00", "3.00"]
    assert sorted(Decimal(c["cost_so_far"]) for c in data)[-1] == Decimal("108.00")  # 18 h


def test_the_api_gives_the_final_cost_once_ended_and_each_machines_cost(owner, stranger):
    started = NOW - timedelta(hours=3)
    cluster = bill_cluster(owner.project, size=2, price="10.00", at=started)
    worker = add_machine(cluster, index=2, at=started + timedelta(hours=1))
    running = owner.api().get(f"/api/v1/clusters/{cluster.pk}").json()["data"]
    end_cluster(cluster, at=started + timedelta(hours=2, minutes=13))
    ended = owner.api().get(f"/api/v1/clusters/{cluster.pk}").json()["data"]

    assert (running["cost_so_far"], running["final_cost"]) == ("80.00", None)
    # 2 × 2 h 13 min at $10 (22.17 each) and the worker's 1 h 13 min (12.17).
    assert (ended["cost_so_far"], ended["final_cost"]) == ("56.51", "56.51")
    assert (ended["billed_seconds"], ended["billed_for"], ended["nodes"]) == (7980, "2 h 13 min", 3)
    costs = {m["id"]: m["cost"] for m in ended["machines"]}
    assert costs[worker.pk] == "12.17"
    assert sum(Decimal(c) for c in costs.values()) == Decimal("56.51")
    assert stranger.api().get(f"/api/v1/clusters/{cluster.pk}").status_code == 404


def test_the_billing_tabs_poll_redraws_the_header_and_the_tab_together_at_the_next_cent(owner):
    started = NOW - timedelta(minutes=10)
    cluster = bill_cluster(owner.project, size=2, price="36.00", at=started)  # 2 cents a second
    client = owner.browser_client()
    page = client.get(f"/clusters/{cluster.pk}/billing/").content.decode()
    url = html.unescape(re.search(r'<section id="cluster-status"[^>]* hx-get="([^"]+)"', page)[1])
    until = int(parse_qs(urlsplit(url).query)["until"][0])

    assert until == int(NOW.timestamp()) + 1  # the next cent, a second on
    assert client.get(url, headers={"HX-Request": "true"}).status_code == 204  # not yet
    with time_machine.travel(NOW + timedelta(seconds=1), tick=False):
        answer = client.get(url, headers={"HX-Request": "true"}).content.decode()

    # 10 min 1 s of two machines at $36.00 an hour: $12.02, in the header and the tab alike.
    assert '<strong class="cost-figure">$12.02</strong>' in answer
    assert '<strong id="billing-cost">$12.02</strong>' in answer
