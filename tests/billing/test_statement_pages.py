"""The Billing page's statement stays flat: a page of lines read from an index, a query count
that does not grow with the clusters of the month, first/previous/next pages, totals and the
CSV over every line; machine time that adds up; the empty chart said in a sentence."""

import csv
import io
import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
import time_machine
from django.db import connection
from django.test.utils import CaptureQueriesContext

from bench.billing import build_billed_clusters
from billing import usage
from billing.meter import charge_accrued
from tests.billing.conftest import add_credit, bill_cluster, end_cluster

NOW = datetime(2026, 3, 20, 12, 30, tzinfo=UTC)
MARCH = usage.Month(2026, 3)


def _bill(project, clusters: int, *, prefix: str) -> None:
    started = NOW - timedelta(hours=2)
    build_billed_clusters(
        project=project,
        clusters=clusters,
        machines_per_cluster=2,
        started_at=started,
        name_prefix=prefix,
    )
    charge_accrued(now=NOW)


def _queries(client, path: str) -> list[str]:
    with CaptureQueriesContext(connection) as captured:
        assert client.get(path).status_code == 200
    return [query["sql"] for query in captured.captured_queries]


@pytest.mark.parametrize("path", ["/billing/", "/billing/?page=2"])
def test_it_runs_the_same_queries_for_3_clusters_and_for_30(owner, path):
    add_credit(owner.project, "10000.00", at=NOW - timedelta(hours=3))
    _bill(owner.project, 3, prefix="few")
    client = owner.browser_client()

    with time_machine.travel(NOW, tick=False):
        client.get(path)  # the session and the template cache warmed
        few = _queries(client, path)
        _bill(owner.project, 27, prefix="many")
        many = _queries(client, path)

    assert len(many) == len(few)


def test_it_pages_the_month_newest_first_with_first_previous_and_next(owner):
    add_credit(owner.project, "10000.00", at=datetime(2026, 3, 1, 8, tzinfo=UTC), note="Top-up")
    _bill(owner.project, 30, prefix="c")
    client = owner.browser_client()

    with time_machine.travel(NOW, tick=False):
        first = client.get("/billing/?month=2026-03")
        second = client.get("/billing/?month=2026-03&page=2")
        beyond = client.get("/billing/?month=2026-03&page=3")

    one, two = first.context["page"], second.context["page"]
    assert (len(one.lines), one.has_previous, one.has_next) == (25, False, True)
    assert (len(two.lines), two.has_previous, two.has_next) == (6, True, False)
    lines = one.lines + two.lines
    assert lines[-1].title == "Top-up"  # the oldest: March 1
    usage_lines = [line for line in lines if line.is_usage]
    assert len({line.cluster_id for line in usage_lines}) == 30
    # Newest first: the clusters of one day by their first row, the latest created first.
    assert [line.entry_id for line in usage_lines] == sorted(
        (line.entry_id for line in usage_lines), reverse=True
    )
    # The month's total is over every line, not the page's.
    totals = first.context["totals"]
    assert -sum(line.amount for line in usage_lines) == totals.usage == Decimal("300.00")
    page = first.content.decode()
    assert 'href="?month=2026-03&amp;page=2"' in page and "Older" in page
    later = second.content.decode()
    assert 'href="?month=2026-03"' in later and "Newest" in later and "Older" not in later
    assert beyond.status_code == 200
    assert "There is no page 3 of March 2026" in beyond.content.decode()


@pytest.mark.parametrize("raw", ["0", "-1", "abc", "99999999999999999999999"])
def test_a_page_number_that_is_not_one_shows_a_page_never_a_500(owner, raw):
    _bill(owner.project, 2, prefix="p")

    with time_machine.travel(NOW, tick=False):
        response = owner.browser_client().get(f"/billing/?page={raw}")

    assert response.status_code == 200


def test_a_line_covers_every_day_of_its_cluster_in_the_month(owner):
    cluster = bill_cluster(
        owner.project, size=2, price="1.00", at=datetime(2026, 3, 4, 22, tzinfo=UTC), name="long"
    )
    charge_accrued(now=datetime(2026, 3, 6, 1, tzinfo=UTC))
    end_cluster(cluster, at=datetime(2026, 3, 6, 1, tzinfo=UTC))
    bill_cluster(owner.project, size=1, price="1.00", at=datetime(2026, 3, 5, 9, tzinfo=UTC))
    charge_accrued(now=datetime(2026, 3, 5, 10, tzinfo=UTC))

    page = usage.statement_page(project_id=owner.project.pk, month=MARCH, now=NOW)

    long = next(line for line in page.lines if line.title == "long")
    # Its first day is March 4; it holds March 4, 5 and 6: 27 h × 2 machines × 1 USD.
    assert long.at == datetime(2026, 3, 4).date()
    assert (long.amount, long.machine_seconds) == (Decimal("-54.00"), 27 * 2 * 3600)
    assert [line.title for line in page.lines][-1] == "long"  # the oldest first day
    assert not long.billed and not long.accumulating


def test_the_csv_and_the_lines_add_up_to_the_month_totals(owner):
    add_credit(owner.project, "100.00", at=datetime(2026, 3, 1, 8, tzinfo=UTC), note="Top-up")
    _bill(owner.project, 30, prefix="csv")

    with time_machine.travel(NOW, tick=False):
        client = owner.browser_client()
        rows = list(
            csv.DictReader(io.StringIO(client.get("/billing/export.csv?month=2026-03").text))
        )
        lines = [
            *client.get("/billing/?month=2026-03").context["lines"],
            *client.get("/billing/?month=2026-03&page=2").context["lines"],
        ]
    totals = usage.month_totals(project_id=owner.project.pk, month=MARCH)

    exported = sum(Decimal(row["amount_usd"]) for row in rows if row["type"] == "usage")
    listed = sum(line.amount for line in lines if line.is_usage)
    assert exported == listed == -totals.usage == Decimal("-300.00")
    assert len([row for row in rows if row["type"] == "usage"]) == 60  # one row per machine
    assert sum(line.amount for line in lines) == totals.credits - totals.usage


def test_machine_time_adds_up_to_its_line(owner):
    start = datetime(2026, 3, 3, 9, 0, 0, tzinfo=UTC)
    cluster = bill_cluster(owner.project, size=4, price="1.00", at=start, name="short")
    end_cluster(cluster, at=start + timedelta(seconds=55))
    charge_accrued(now=start + timedelta(minutes=5))
    client = owner.browser_client()

    with time_machine.travel(NOW, tick=False):
        statement = client.get("/billing/?month=2026-03")
        machines = client.get(f"/billing/clusters/{cluster.pk}/?month=2026-03")

    (line,) = statement.context["lines"]
    rows = machines.context["rows"]
    assert [row.seconds for row in rows] == [55] * 4
    assert line.machine_seconds == sum(row.seconds for row in rows) == 220
    # Rounded to hundredths one by one, four 0.02 h would not add up to 0.06 h; to the second
    # they do: 4 × 0:00:55 = 0:03:40.
    assert re.search(r'<td class="num">0:03:40</td>', statement.content.decode())
    table = machines.content.decode()
    assert table.count('<td class="num">0:00:55</td>') == 4
    assert '<td class="num">0:03:40</td>' in table  # the footer


def test_an_empty_month_says_so_instead_of_drawing_an_empty_chart(owner):
    bill_cluster(owner.project, size=1, at=datetime(2026, 3, 4, 9, tzinfo=UTC))
    charge_accrued(now=datetime(2026, 3, 4, 10, tzinfo=UTC))

    with time_machine.travel(NOW, tick=False):
        client = owner.browser_client()
        empty = client.get("/billing/?month=2026-02").content.decode()
        spent = client.get("/billing/?month=2026-03").content.decode()

    assert "No spend in February 2026." in empty and "<svg" not in empty.split("Spend per day")[1]
    assert '<svg class="spend-chart"' in spent and "No spend in" not in spent


def test_billing_says_machines_never_nodes(owner):
    cluster = bill_cluster(owner.project, size=2, at=NOW - timedelta(hours=1), name="words")
    charge_accrued(now=NOW)
    client = owner.browser_client()

    with time_machine.travel(NOW, tick=False):
        pages = [
            client.get("/billing/").content.decode(),
            client.get(f"/billing/clusters/{cluster.pk}/").content.decode(),
            client.get(
                f"/billing/clusters/{cluster.pk}/", headers={"HX-Request": "true"}
            ).content.decode(),
        ]

    assert '<th scope="col">Machine</th>' in pages[1]
    for page in pages:
        main = page.split("<main", 1)[-1]
        words = re.sub(r"node-\d+", "", main)  # a machine's own name stays node-N
        assert not re.search(r"\bnodes?\b", words, re.IGNORECASE)
