"""A budget at or below the month's spend stops the environment's running clusters: it is set
only once confirmed, after the page (or the API's 409) has said which clusters it stops."""

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
import time_machine

from accounts.models import Environment
from billing.meter import charge_accrued
from clusters.lifecycle.stops import enforce_limits
from clusters.models import Cluster
from tests.billing.conftest import add_credit, bill_cluster, end_cluster

NOW = datetime(2026, 3, 20, 12, tzinfo=UTC)


@pytest.fixture
def staging(owner) -> Environment:
    """An environment that spent $40.00 this month and runs two clusters (one of them idle:
    it has not been billed yet), beside one that ended."""
    add_credit(owner.project, "1000.00", at=NOW - timedelta(days=1))
    staging = Environment.objects.create(project=owner.project, name="staging")
    bill_cluster(
        owner.project,
        size=2,
        price="10.00",
        at=NOW - timedelta(hours=2),
        environment=staging,
        name="trainer",
    )
    bill_cluster(owner.project, size=2, price="10.00", at=NOW, environment=staging, name="idle")
    ended = bill_cluster(
        owner.project, size=2, price="1.00", at=NOW, environment=staging, name="gone"
    )
    end_cluster(ended, at=NOW)
    charge_accrued(now=NOW)
    return staging


@pytest.fixture(autouse=True)
def _at_now():
    with time_machine.travel(NOW, tick=False):
        yield


def _post(owner, staging: Environment, amount: str, **extra: str):
    return owner.browser_client().post(
        f"/billing/environments/{staging.name}/budget/",
        {f"env-{staging.pk}-monthly_budget": amount, **extra},
    )


def _put(owner, amount: str | None, **extra: object):
    return owner.api().put(
        "/api/v1/environments/staging/budget",
        data={"amount": amount, **extra},
        content_type="application/json",
    )


def _running(staging: Environment) -> list[str]:
    return sorted(
        Cluster.objects.filter(environment=staging, status__in=Cluster.TERMINABLE).values_list(
            "name", flat=True
        )
    )


def test_it_asks_on_the_page_before_a_budget_below_the_spend_stops_clusters(owner, staging):
    response = _post(owner, staging, "30")

    page = response.content.decode()
    assert response.status_code == 200
    assert response.templates[0].name == "billing/confirm_budget.html"
    assert "A budget of $30.00 stops 2 clusters" in page
    assert "has spent <strong>$40.00</strong> this month" in page
    assert [c.name for c in response.context["stops"].clusters] == ["idle", "trainer"]
    assert "gone" not in page
    # The confirmation resends the same amount, with confirm.
    assert f'name="env-{staging.pk}-monthly_budget" value="30.00"' in page
    assert 'name="confirm" value="yes"' in page
    staging.refresh_from_db()
    assert staging.monthly_budget is None
    assert enforce_limits(now=NOW).stopped_for_budget == []
    assert _running(staging) == ["idle", "trainer"]


def test_it_sets_the_budget_once_confirmed_on_the_page_and_the_meter_stops_them(owner, staging):
    response = _post(owner, staging, "40.00", confirm="yes")

    assert response.status_code == 302
    staging.refresh_from_db()
    assert staging.monthly_budget == Decimal("40.00")
    flash = [str(m) for m in response.wsgi_request._messages]
    assert flash == [
        "staging: monthly budget set to $40.00. It is reached: 2 clusters (idle, trainer) "
        "stop within a minute."
    ]
    assert len(enforce_limits(now=NOW).stopped_for_budget) == 2
    assert _running(staging) == []


def test_it_sets_a_budget_above_the_spend_without_asking(owner, staging):
    response = _post(owner, staging, "40.01")

    assert response.status_code == 302
    staging.refresh_from_db()
    assert staging.monthly_budget == Decimal("40.01")
    assert enforce_limits(now=NOW).stopped_for_budget == []


def test_it_sets_a_reached_budget_without_asking_where_nothing_runs(owner, staging):
    Cluster.objects.filter(environment=staging).update(status=Cluster.Status.STOPPED)

    response = _post(owner, staging, "0")

    assert response.status_code == 302
    staging.refresh_from_db()
    assert staging.monthly_budget == Decimal("0.00")


def test_it_answers_409_in_the_api_naming_what_it_would_stop(owner, staging):
    response = _put(owner, "40.00")

    assert response.status_code == 409
    error = response.json()["error"]
    assert error["code"] == "budget_below_spend"
    assert "spent this month ($40.00)" in error["message"]
    assert "its 2 running clusters (idle, trainer)" in error["message"]
    assert '"confirm": true' in error["message"]
    staging.refresh_from_db()
    assert staging.monthly_budget is None


def test_it_sets_the_budget_in_the_api_with_confirm_and_names_what_stops(owner, staging):
    refused = _put(owner, "10.00", confirm=False)
    response = _put(owner, "10.00", confirm=True)

    assert refused.status_code == 409
    assert response.status_code == 200
    assert response.json()["data"] == {
        "name": "staging",
        "monthly_budget": "10.00",
        "month_to_date_spend": "40.00",
        "budget_reached": True,
        "stopping": ["idle", "trainer"],
    }
    assert len(enforce_limits(now=NOW).stopped_for_budget) == 2


def test_it_clears_or_raises_a_budget_in_the_api_without_confirm(owner, staging):
    assert _put(owner, "50.00").json()["data"]["stopping"] == []
    assert _put(owner, None).status_code == 200
    staging.refresh_from_db()
    assert staging.monthly_budget is None
