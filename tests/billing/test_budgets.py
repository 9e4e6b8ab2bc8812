"""The environments page: monthly budgets set and cleared, environments created."""

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import time_machine

from accounts.models import Environment
from billing import budgets
from billing.meter import charge_accrued
from tests.billing.conftest import bill_cluster

NOW = datetime(2026, 3, 20, 12, tzinfo=UTC)


def default_environment(person) -> Environment:
    return Environment.objects.get(project=person.project, name="default")


def test_it_sets_a_monthly_budget(owner):
    environment = default_environment(owner)

    response = owner.browser_client().post(
        "/billing/environments/default/budget/", {f"env-{environment.pk}-monthly_budget": "250"}
    )

    assert response.status_code == 302
    environment.refresh_from_db()
    assert environment.monthly_budget == Decimal("250.00")


def test_it_clears_a_monthly_budget(owner):
    environment = default_environment(owner)
    budgets.set_budget(environment=environment, amount=Decimal("100"))

    owner.browser_client().post(
        "/billing/environments/default/budget/", {f"env-{environment.pk}-monthly_budget": ""}
    )

    environment.refresh_from_db()
    assert environment.monthly_budget is None


def test_it_refuses_a_budget_that_is_not_an_amount_and_changes_nothing(owner):
    environment = default_environment(owner)
    budgets.set_budget(environment=environment, amount=Decimal("100"))

    response = owner.browser_client().post(
        "/billing/environments/default/budget/", {f"env-{environment.pk}-monthly_budget": "-3"}
    )

    assert response.status_code == 422
    assert "The budget must be zero or more USD." in response.content.decode()
    environment.refresh_from_db()
    assert environment.monthly_budget == Decimal("100.00")


def test_it_creates_an_environment_with_a_budget(owner):
    response = owner.browser_client().post(
        "/billing/environments/", {"name": "staging", "monthly_budget": "75.50"}
    )

    assert response.status_code == 302
    staging = Environment.objects.get(project=owner.project, name="staging")
    assert staging.monthly_budget == Decimal("75.50")


def test_it_refuses_a_taken_or_invalid_environment_name(owner):
    client = owner.browser_client()

    taken = client.post("/billing/environments/", {"name": "default", "monthly_budget": ""})
    invalid = client.post("/billing/environments/", {"name": "Big Team!", "monthly_budget": ""})

    assert taken.status_code == invalid.status_code == 422
    assert "already has an environment “default”" in taken.content.decode()
    assert "is not a valid name" in invalid.content.decode()
    assert Environment.objects.filter(project=owner.project).count() == 1


def test_it_shows_each_environments_spend_against_its_budget(owner):
    staging = Environment.objects.create(
        project=owner.project, name="staging", monthly_budget=Decimal("50.00")
    )
    bill_cluster(
        owner.project, size=2, price="10.00", at=NOW - timedelta(hours=2), environment=staging
    )
    charge_accrued(now=NOW)

    with time_machine.travel(NOW, tick=False):
        response = owner.browser_client().get("/billing/environments/")

    rows = {row.environment.name: row for row, _ in response.context["rows"]}
    assert (rows["staging"].spent, rows["staging"].share, rows["staging"].warning) == (
        Decimal("40.00"),
        80,
        True,
    )
    assert rows["default"].budget is None
    assert "over 80%" in response.content.decode()


def test_it_answers_404_for_another_projects_environment(owner, stranger):
    research = Environment.objects.create(project=owner.project, name="research")

    response = stranger.browser_client().post(
        "/billing/environments/research/budget/", {f"env-{research.pk}-monthly_budget": "1"}
    )

    assert response.status_code == 404
    research.refresh_from_db()
    assert research.monthly_budget is None
