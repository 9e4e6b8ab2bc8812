"""The billing API: balance, usage of a month, the ledger, environment budgets."""

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import time_machine
from django.db import connection
from django.test.utils import CaptureQueriesContext

from accounts.models import Environment
from bench.billing import build_billed_clusters
from billing.meter import charge_accrued
from tests.billing.conftest import add_credit, bill_cluster, end_cluster

NOW = datetime(2026, 3, 20, 12, 30, tzinfo=UTC)


def test_it_answers_the_balance_burn_rate_and_hours_remaining(owner):
    add_credit(owner.project, "100.00", at=NOW - timedelta(days=1))
    bill_cluster(owner.project, size=4, price="2.50", at=NOW - timedelta(hours=1))
    charge_accrued(now=NOW)

    response = owner.api().get("/api/v1/billing/balance")

    assert response.status_code == 200
    assert response.json() == {
        "data": {
            "balance": "90.00",
            "burn_rate": "10.00",
            "hours_remaining": "9.00",
            "runway_seconds": 32400,  # 90 / 10 hours, the top bar's words for it below
            "runway": "9 h",
            "low": False,
            "minimum_balance": "10.00",
            "balance_needed": None,
            "currency": "USD",
        }
    }


def test_it_says_a_low_balance_and_its_runway_in_words(owner):
    add_credit(owner.project, "15.00", at=NOW - timedelta(days=1))
    bill_cluster(owner.project, size=4, price="5.00", at=NOW)  # $20/h: 45 minutes

    with time_machine.travel(NOW, tick=False):
        data = owner.api().get("/api/v1/billing/balance").json()["data"]

    assert (data["runway_seconds"], data["runway"], data["low"]) == (2700, "45 min", True)


def test_it_answers_null_hours_remaining_while_nothing_runs(owner):
    response = owner.api().get("/api/v1/billing/balance")

    assert response.json()["data"] == {
        "balance": "0.00",
        "burn_rate": "0.00",
        "hours_remaining": None,
        "runway_seconds": None,
        "runway": None,
        "low": False,
        "minimum_balance": "10.00",
        "balance_needed": None,
        "currency": "USD",
    }


def test_it_lists_a_months_usage_per_cluster_and_machine(owner):
    cluster = bill_cluster(
        owner.project, size=2, price="1.50", at=datetime(2026, 3, 2, 9, tzinfo=UTC), name="ft"
    )
    charge_accrued(now=datetime(2026, 3, 2, 10, tzinfo=UTC))
    end_cluster(cluster, at=datetime(2026, 3, 2, 11, 30, tzinfo=UTC))
    charge_accrued(now=datetime(2026, 3, 3, tzinfo=UTC))

    with time_machine.travel(NOW, tick=False):
        body = owner.api().get("/api/v1/billing/usage?month=2026-03").json()

    assert body["meta"] == {
        "total": 1,
        "limit": 100,
        "offset": 0,
        "month": "2026-03",
        "total_usage": "7.50",
    }
    [line] = body["data"]
    assert line == {
        "cluster_id": cluster.pk,
        "name": "ft",
        "hours": "5.00",
        "total": "7.50",
        "accumulating": False,
        "machines": [
            {
                "node": f"node-{index}",
                "gpu": f"8× {cluster.machine_type.gpu.name}",
                "location": cluster.machine_type.location.code,
                "started_at": "2026-03-02T09:00:00Z",
                "ended_at": "2026-03-02T11:30:00Z",
                "hours": "2.50",
                "rate": "1.50",
                "cost": "3.75",
            }
            for index in (0, 1)
        ],
    }


def test_it_refuses_a_month_that_is_not_one(owner):
    response = owner.api().get("/api/v1/billing/usage?month=March")

    assert response.status_code == 422
    assert response.json()["error"]["code"] == "invalid_month"
    assert "YYYY-MM" in response.json()["error"]["message"]


def test_it_runs_the_same_queries_for_2_clusters_and_for_1000(owner, django_assert_num_queries):
    started = NOW - timedelta(hours=2)
    build_billed_clusters(
        project=owner.project, clusters=2, machines_per_cluster=2, started_at=started
    )
    charge_accrued(now=NOW)
    client = owner.api()
    url = "/api/v1/billing/usage?month=2026-03&limit=1000"

    with time_machine.travel(NOW, tick=False):
        client.get(url)  # the key's first use is written once
        with CaptureQueriesContext(connection) as small:
            client.get(url)
        build_billed_clusters(
            project=owner.project,
            clusters=998,
            machines_per_cluster=2,
            started_at=started,
            name_prefix="more",
        )
        charge_accrued(now=NOW)
        with django_assert_num_queries(len(small)):
            body = client.get(url).json()

    assert body["meta"]["total"] == 1000
    assert len(body["data"]) == 1000
    assert all(len(line["machines"]) == 2 for line in body["data"])


def test_it_lists_transactions_newest_first_with_a_type_filter(owner):
    add_credit(owner.project, "100.00", at=NOW - timedelta(days=2), note="Card top-up")
    add_credit(owner.project, "-3.00", at=NOW - timedelta(days=1), kind="adjustment", note="Fix")
    cluster = bill_cluster(owner.project, size=2, price="6.00", at=NOW - timedelta(minutes=20))
    charge_accrued(now=NOW)

    with time_machine.travel(NOW, tick=False):
        every = owner.api().get("/api/v1/billing/transactions").json()
        usage = owner.api().get("/api/v1/billing/transactions?type=usage").json()
        paged = owner.api().get("/api/v1/billing/transactions?limit=1&offset=1").json()

    assert [(t["type"], t["amount"]) for t in every["data"]] == [
        ("usage", "-4.00"),
        ("adjustment", "-3.00"),
        ("topup", "100.00"),
    ]
    [line] = usage["data"]
    assert line["cluster_id"] == cluster.pk and line["cluster_name"] == cluster.name
    assert line["period_start"] == "2026-03-20T12:00:00Z"
    assert line["machine_seconds"] == 2 * 20 * 60
    assert line["accumulating"] is True
    assert paged["meta"] == {"total": 3, "limit": 1, "offset": 1}
    assert [t["type"] for t in paged["data"]] == ["adjustment"]


def test_it_refuses_an_unknown_transaction_type(owner):
    response = owner.api().get("/api/v1/billing/transactions?type=refund")

    assert response.status_code == 422
    assert response.json()["error"]["code"] == "invalid_request"


def test_it_sets_and_clears_an_environments_budget(owner):
    client = owner.api()

    set_ = client.put(
        "/api/v1/environments/default/budget",
        data={"amount": "500.00"},
        content_type="application/json",
    )
    cleared = client.put(
        "/api/v1/environments/default/budget",
        data={"amount": None},
        content_type="application/json",
    )

    assert set_.status_code == 200
    assert set_.json()["data"] == {
        "name": "default",
        "monthly_budget": "500.00",
        "month_to_date_spend": "0.00",
        "budget_reached": False,
        "stopping": [],
    }
    assert cleared.json()["data"]["monthly_budget"] is None
    assert Environment.objects.get(project=owner.project).monthly_budget is None


def test_it_refuses_a_bad_budget_and_changes_nothing(owner):
    Environment.objects.filter(project=owner.project).update(monthly_budget=Decimal("50.00"))
    client = owner.api()

    negative = client.put(
        "/api/v1/environments/default/budget",
        data={"amount": "-5"},
        content_type="application/json",
    )
    missing = client.put(
        "/api/v1/environments/default/budget", data={}, content_type="application/json"
    )
    unknown = client.put(
        "/api/v1/environments/nowhere/budget",
        data={"amount": "5.00"},
        content_type="application/json",
    )

    assert (negative.status_code, negative.json()["error"]["code"]) == (422, "invalid_budget")
    assert missing.status_code == 422
    assert (unknown.status_code, unknown.json()["error"]["code"]) == (404, "not_found")
    assert Environment.objects.get(project=owner.project).monthly_budget == Decimal("50.00")


def test_it_keeps_billing_from_developers_and_other_projects(teammate, stranger, owner):
    Environment.objects.create(project=owner.project, name="shared")

    assert teammate.api().get("/api/v1/billing/balance").status_code == 403
    assert teammate.api().get("/api/v1/billing/transactions").status_code == 403
    stranger_put = stranger.api().put(
        "/api/v1/environments/shared/budget",
        data={"amount": "1.00"},
        content_type="application/json",
    )
    assert stranger_put.status_code == 404
    assert Environment.objects.get(name="shared").monthly_budget is None
