"""The Billing page: balance, burn rate and hours left; a month of lines; per-machine rows."""

import csv
import io
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
import time_machine
from django.db import connection
from django.test.utils import CaptureQueriesContext

from bench.billing import build_billed_clusters
from billing.meter import charge_accrued
from billing.models import LedgerEntry
from tests.billing.conftest import add_credit, bill_cluster, end_cluster
from tests.factories import ClusterFactory

NOW = datetime(2026, 3, 20, 12, 30, tzinfo=UTC)


def test_it_shows_balance_burn_rate_and_hours_remaining(owner):
    add_credit(owner.project, "100.00", at=NOW - timedelta(days=1))
    bill_cluster(owner.project, size=2, price="10.00", at=NOW - timedelta(minutes=30))
    charge_accrued(now=NOW)  # 2 × 10 USD/h × 30 min = 10 USD

    with time_machine.travel(NOW, tick=False):
        response = owner.browser_client().get("/billing/")

    assert response.status_code == 200
    summary = response.context["summary"]
    assert (summary.balance, summary.burn_rate, summary.hours_remaining) == (
        Decimal("90.00"),
        Decimal("20.00"),
        Decimal("4.50"),
    )
    page = response.content.decode()
    assert "$90.00" in page and "$20.00" in page and "4.50" in page


def test_it_shows_a_dash_for_hours_remaining_when_nothing_runs(owner):
    add_credit(owner.project, "25.00")

    response = owner.browser_client().get("/billing/")

    assert response.context["summary"].hours_remaining is None
    assert "Nothing is running or stored." in response.content.decode()


def test_it_lists_top_ups_adjustments_and_one_line_per_cluster(owner):
    add_credit(owner.project, "500.00", at=NOW - timedelta(days=3), note="Card top-up")
    add_credit(
        owner.project, "-5.00", at=NOW - timedelta(days=2), kind="adjustment", note="Correction"
    )
    bill_cluster(owner.project, size=3, price="2.00", at=NOW - timedelta(hours=2), name="train")
    charge_accrued(now=NOW - timedelta(hours=1, minutes=30))
    charge_accrued(now=NOW)

    with time_machine.travel(NOW, tick=False):
        response = owner.browser_client().get("/billing/?month=2026-03")

    lines = response.context["lines"]
    assert [(line.label, line.amount) for line in lines] == [
        ("Cluster usage — train", Decimal("-12.00")),  # 3 machines × 2 h × 2 USD
        ("Correction", Decimal("-5.00")),
        ("Card top-up", Decimal("500.00")),
    ]
    assert lines[0].hours == Decimal("6.00")
    assert lines[0].accumulating  # its 12:00 hour is still open
    page = response.content.decode()
    assert "Cluster usage — train" in page and "accumulating" in page


def test_it_stops_calling_a_line_accumulating_once_the_cluster_ended(owner):
    cluster = bill_cluster(owner.project, size=2, at=NOW - timedelta(minutes=20))
    end_cluster(cluster, at=NOW - timedelta(minutes=5))
    charge_accrued(now=NOW)

    with time_machine.travel(NOW, tick=False):
        response = owner.browser_client().get("/billing/")

    assert [line.accumulating for line in response.context["lines"]] == [False]


def test_it_shows_only_the_chosen_month(owner):
    bill_cluster(owner.project, size=2, at=datetime(2026, 2, 27, 10, tzinfo=UTC), name="feb")
    charge_accrued(now=datetime(2026, 2, 27, 11, tzinfo=UTC))
    add_credit(owner.project, "50.00", at=datetime(2026, 3, 2, tzinfo=UTC))

    with time_machine.travel(NOW, tick=False):
        client = owner.browser_client()
        february = client.get("/billing/?month=2026-02").context["lines"]
        march = client.get("/billing/?month=2026-03").context["lines"]

    assert [line.title for line in february] == ["feb"]
    assert [line.kind for line in march] == ["topup"]


@pytest.mark.parametrize("month", ["2026-13", "march", "2026-3", "<b>x</b>", "1999-12"])
def test_it_shows_the_current_month_with_a_message_for_a_month_that_is_not_one(owner, month):
    with time_machine.travel(NOW, tick=False):
        response = owner.browser_client().get("/billing/", {"month": month})

    assert response.status_code == 400
    assert response.context["month"].param == "2026-03"
    html = response.content.decode()
    assert "a month is written YYYY-MM, like 2026-03. Showing March 2026." in html
    assert "<b>x</b>" not in html
    assert 'id="billing-month"' in html and "Add credit" in html  # the whole page


def test_a_cluster_usage_page_with_a_bad_month_shows_it_with_a_message(owner):
    cluster = ClusterFactory(project=owner.project)
    with time_machine.travel(NOW, tick=False):
        response = owner.browser_client().get(f"/billing/clusters/{cluster.pk}/?month=13")
    assert response.status_code == 400
    assert "There is no month &#x27;13&#x27;" in response.content.decode()


def test_the_csv_of_a_bad_month_sends_back_to_the_page_with_why(owner):
    client = owner.browser_client()
    response = client.get("/billing/export.csv?month=2026-13", follow=True)
    assert response.redirect_chain == [("/billing/", 302)]
    assert "There is no month &#x27;2026-13&#x27;" in response.content.decode()


def test_it_swaps_only_the_month_for_htmx(owner):
    response = owner.browser_client().get(
        "/billing/?month=2026-03", headers={"HX-Request": "true", "HX-Target": "billing-month"}
    )

    body = response.content.decode()
    assert body.lstrip().startswith('<section id="billing-month"')
    assert "Current balance" not in body


def test_it_draws_spend_per_day_as_an_svg_chart(owner):
    bill_cluster(owner.project, size=2, price="1.00", at=datetime(2026, 3, 4, 22, tzinfo=UTC))
    charge_accrued(now=datetime(2026, 3, 5, 2, tzinfo=UTC))

    with time_machine.travel(NOW, tick=False):
        response = owner.browser_client().get("/billing/?month=2026-03")

    chart = response.context["chart"]
    spent = {bar.day.day: bar.amount for bar in chart.bars if bar.amount}
    assert spent == {4: Decimal("4.00"), 5: Decimal("4.00")}
    assert len(chart.bars) == 31
    body = response.content.decode()
    assert '<svg class="spend-chart"' in body
    assert "<title>Mar 4: $4.00</title>" in body


def test_it_opens_a_cluster_line_to_its_machines_with_htmx_and_without(owner):
    cluster = bill_cluster(owner.project, size=2, price="3.00", at=NOW - timedelta(hours=1))
    charge_accrued(now=NOW)
    url = f"/billing/clusters/{cluster.pk}/?month=2026-03"
    client = owner.browser_client()

    with time_machine.travel(NOW, tick=False):
        fragment = client.get(url, headers={"HX-Request": "true"}).content.decode()
        page = client.get(url)

    assert fragment.lstrip().startswith(f'<tr id="machines-{cluster.pk}"')
    assert fragment.count('class="machine-row"') == 2
    assert "node-0" in fragment and "node-1" in fragment and "$3.00" in fragment
    assert page.status_code == 200
    assert [(row.node, row.cost) for row in page.context["rows"]] == [
        ("node-0", Decimal("3.00")),
        ("node-1", Decimal("3.00")),
    ]
    assert page.context["total"] == Decimal("6.00")


def test_it_answers_404_for_another_projects_cluster_line(owner, stranger):
    cluster = bill_cluster(stranger.project, size=2, at=NOW - timedelta(hours=1))

    response = owner.browser_client().get(f"/billing/clusters/{cluster.pk}/")

    assert response.status_code == 404


def test_it_keeps_billing_from_developers(teammate):
    client = teammate.browser_client()

    assert client.get("/billing/").status_code == 403
    assert client.get("/billing/export.csv").status_code == 403
    assert client.get("/billing/environments/").status_code == 403


def test_it_exports_the_month_as_csv_that_adds_up_to_the_page(owner):
    add_credit(owner.project, "100.00", at=datetime(2026, 3, 1, 8, tzinfo=UTC), note="Card top-up")
    cluster = bill_cluster(
        owner.project, size=2, price="1.11", at=datetime(2026, 3, 3, 9, 10, 7, tzinfo=UTC)
    )
    charge_accrued(now=datetime(2026, 3, 3, 10, 0, tzinfo=UTC))
    end_cluster(cluster, at=datetime(2026, 3, 3, 11, 45, 33, tzinfo=UTC))
    charge_accrued(now=datetime(2026, 3, 4, tzinfo=UTC))

    with time_machine.travel(NOW, tick=False):
        response = owner.browser_client().get("/billing/export.csv?month=2026-03")

    assert response["Content-Type"].startswith("text/csv")
    assert "runcrate-billing-2026-03.csv" in response["Content-Disposition"]
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert [row["type"] for row in rows] == ["topup", "usage", "usage"]
    assert [row["node"] for row in rows[1:]] == ["node-0", "node-1"]
    usage = sum(Decimal(row["amount_usd"]) for row in rows if row["type"] == "usage")
    ledger = sum(
        LedgerEntry.objects.filter(kind="usage").values_list("amount", flat=True), Decimal(0)
    )
    # Each machine ran 9,326 s: 9,326 × 1.11 / 3600 = 2.8757… → 2.88.
    assert usage == ledger == Decimal("-5.76")
    assert rows[1]["end"] == "2026-03-03T11:45:33Z"


def test_it_runs_the_same_queries_for_2_clusters_and_for_1000(owner, django_assert_num_queries):
    started = NOW - timedelta(hours=2)
    build_billed_clusters(
        project=owner.project, clusters=2, machines_per_cluster=2, started_at=started
    )
    add_credit(owner.project, "10000.00", at=started)
    charge_accrued(now=NOW)
    client = owner.browser_client()
    client.get("/billing/")  # warm the session and the template cache

    with time_machine.travel(NOW, tick=False):
        with CaptureQueriesContext(connection) as small:
            client.get("/billing/")
        build_billed_clusters(
            project=owner.project,
            clusters=998,
            machines_per_cluster=2,
            started_at=started,
            name_prefix="more",
        )
        charge_accrued(now=NOW)
        with django_assert_num_queries(len(small)):
            response = client.get("/billing/")

    # 1,000 clusters and the credit: a page of 25 lines, more after it (the page counts none).
    assert response.context["page"].has_next
    assert len(response.context["lines"]) == 25
