"""One reader of amounts (runcrate/money.py) behind budgets, top-ups, staff credits and key
limits: what Decimal reads but money is not (1e30, 1e309, NaN, Infinity) is refused with each
place's own message, never a 500 or a traceback, and nothing is written."""

from decimal import Decimal
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from accounts.models import ApiKey, Environment
from billing.models import LedgerEntry, Payment
from runcrate.money import (
    NOT_A_NUMBER,
    TOO_LARGE,
    TOO_PRECISE,
    TOO_SMALL,
    NotAnAmount,
    read_amount,
)

NOT_AMOUNTS = ["1e30", "1e309", "-1e30", "9e999999999", "NaN", "Infinity", "-Infinity", "sNaN"]


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ("1e30", TOO_LARGE),
        ("-1e30", TOO_SMALL),
        ("1e309", TOO_LARGE),
        ("9e999999999", TOO_LARGE),
        ("NaN", NOT_A_NUMBER),
        ("-Infinity", NOT_A_NUMBER),
        ("ten", NOT_A_NUMBER),
        (True, NOT_A_NUMBER),
        (None, NOT_A_NUMBER),
        (float("inf"), NOT_A_NUMBER),
        (10**400, TOO_LARGE),
        ("12.345", TOO_PRECISE),
        ("1e-999999999", TOO_PRECISE),
    ],
)
def test_it_refuses_what_decimal_reads_but_money_is_not(raw, reason):
    with pytest.raises(NotAnAmount) as refused:
        read_amount(raw, minimum=Decimal("-1000"), maximum=Decimal("1000"))
    assert refused.value.reason == reason


@pytest.mark.parametrize(
    ("raw", "amount"),
    [(" 12.5 ", "12.50"), (7, "7.00"), (Decimal("1E+2"), "100.00"), ("-0.00", "0.00")],
)
def test_it_reads_an_amount_to_its_places(raw, amount):
    assert read_amount(raw, minimum=Decimal("-1000"), maximum=Decimal("1000")) == Decimal(amount)


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ('"1e30"', "invalid_budget"),
        ('"-1e30"', "invalid_budget"),
        ('"9e999999999"', "invalid_budget"),
        ("1e30", "invalid_budget"),
        ('"NaN"', "invalid_request"),
        ('"Infinity"', "invalid_request"),
        ("1e309", "invalid_number"),
        ("-1e400", "invalid_number"),
    ],
)
def test_the_budget_api_refuses_it_and_keeps_the_budget(owner, body, code):
    environment = Environment.objects.get(project=owner.project, name="default")

    response = owner.api().put(
        "/api/v1/environments/default/budget",
        f'{{"amount": {body}}}',
        content_type="application/json",
    )

    assert response.status_code == 422
    assert response.json()["error"]["code"] == code
    environment.refresh_from_db()
    assert environment.monthly_budget is None


@pytest.mark.parametrize("raw", NOT_AMOUNTS)
def test_the_budget_form_refuses_it_and_keeps_the_budget(owner, raw):
    environment = Environment.objects.get(project=owner.project, name="default")

    response = owner.browser_client().post(
        "/billing/environments/default/budget/", {f"env-{environment.pk}-monthly_budget": raw}
    )

    assert response.status_code == 422
    assert "The budget " in response.content.decode()
    environment.refresh_from_db()
    assert environment.monthly_budget is None


@pytest.mark.parametrize("raw", NOT_AMOUNTS)
def test_the_top_up_form_refuses_it_and_asks_stripe_nothing(owner, settings, raw):
    settings.STRIPE_SECRET_KEY = "sk_test_local"
    settings.STRIPE_WEBHOOK_SECRET = "whsec_local"
    settings.STRIPE_API_BASE = "http://127.0.0.1:9"  # nothing listens: a call would fail

    response = owner.browser_client().post(
        "/billing/credit/", {"amount": raw, "idempotency_key": "form-key-1"}
    )

    assert response.status_code == 422
    assert Payment.objects.count() == 0


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ("1e30", "1e30 is too large for one ledger line."),
        ("1e309", "is too large"),
        ("NaN", "'NaN' is not an amount in USD"),
        ("Infinity", "'Infinity' is not an amount in USD"),
    ],
)
def test_the_credit_command_refuses_it_and_credits_nothing(owner, raw, says):
    with pytest.raises(CommandError) as refused:
        call_command("credit", owner.user.email, raw, stdout=StringIO())

    assert says in str(refused.value)
    assert not LedgerEntry.objects.filter(project=owner.project).exists()


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        ("1e30", "invalid_limit"),
        ("1e309", "invalid_limit"),
        ("NaN", "invalid_request"),
        ("Infinity", "invalid_request"),
    ],
)
def test_a_keys_hourly_limit_refuses_it(owner, raw, code):
    response = owner.api().post(
        "/api/v1/keys", {"name": "agent", "max_usd_per_hour": raw}, content_type="application/json"
    )

    assert response.status_code == 422
    assert response.json()["error"]["code"] == code
    assert ApiKey.objects.filter(project=owner.project).count() == 1
