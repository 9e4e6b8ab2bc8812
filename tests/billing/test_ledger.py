"""The ledger: the balance is the sum of its lines; staff add credit with `manage.py credit`
or the admin, and a bad amount or an unknown person changes nothing."""

from decimal import Decimal
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.test import Client

from accounts.models import Project, User
from accounts.projects import create_project
from billing import ledger
from billing.models import LedgerEntry


@pytest.fixture
def project(db) -> Project:
    user = User.objects.create(email="ada@example.com")
    return create_project(owner=user, name="Ada's project")


def credit(*args: str) -> str:
    out = StringIO()
    call_command("credit", *args, stdout=out)
    return out.getvalue()


def test_it_sums_the_ledger_into_the_balance(project):
    assert ledger.balance(project=project) == Decimal("0.00")
    ledger.credit(project=project, amount="500")
    ledger.credit(project=project, amount=Decimal("-12.50"), note="refund reversed")
    LedgerEntry.objects.create(project=project, kind="usage", amount=Decimal("-0.01"))

    assert ledger.balance(project=project) == Decimal("487.49")
    line = LedgerEntry.objects.get(amount=Decimal("-12.50"))
    assert (line.kind, line.note) == ("adjustment", "refund reversed")


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        ("abc", "is not an amount in USD"),
        ("", "is not an amount in USD"),
        ("NaN", "is not an amount in USD"),
        ("Infinity", "is not an amount in USD"),
        ("12.345", "more than 2 decimals"),
        ("0", "zero"),
        ("-0.00", "zero"),
        ("1e15", "too large"),
    ],
)
def test_it_refuses_an_amount_it_cannot_put_on_the_ledger(project, raw, why):
    with pytest.raises(ledger.InvalidAmount) as refused:
        ledger.credit(project=project, amount=raw)
    assert why in str(refused.value)
    assert not LedgerEntry.objects.exists()


def test_it_credits_a_project_from_the_command_line(project):
    output = credit("ADA@example.com", "250", "--note", "Welcome credit")

    entry = LedgerEntry.objects.get()
    assert (entry.project, entry.kind, entry.amount, entry.note) == (
        project,
        "adjustment",
        Decimal("250.00"),
        "Welcome credit",
    )
    assert output.strip() == (
        "Credited $250.00 to Ada's project (ada@example.com). Balance: $250.00."
    )


def test_it_debits_with_a_negative_amount(project):
    credit("ada@example.com", "100")
    output = credit("ada@example.com", "-30.25")
    assert ledger.balance(project=project) == Decimal("69.75")
    assert "Debited $30.25 from Ada's project" in output
    assert LedgerEntry.objects.get(amount=Decimal("-30.25")).note == "Debit by staff"


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (("ada@example.com", "ten"), "'ten' is not an amount in USD"),
        (("ada@example.com", "1.001"), "more than 2 decimals"),
        (("ada@example.com", "0"), "zero"),
        (("nobody@example.com", "10"), "No user has the email 'nobody@example.com'"),
    ],
)
def test_it_refuses_bad_input_and_writes_nothing(project, args, why):
    with pytest.raises(CommandError) as refused:
        credit(*args)
    assert why in str(refused.value)
    assert not LedgerEntry.objects.exists()


def test_it_refuses_a_user_without_a_project(db):
    User.objects.create(email="loner@example.com")
    with pytest.raises(CommandError, match="belongs to no project"):
        credit("loner@example.com", "10")
    assert not LedgerEntry.objects.exists()


# --- the admin ------------------------------------------------------------------------------


@pytest.fixture
def staff(db) -> Client:
    client = Client()
    client.force_login(
        User.objects.create(email="staff@example.com", is_staff=True, is_superuser=True)
    )
    return client


def test_it_lets_staff_add_credit_in_the_admin(project, staff):
    response = staff.post(
        "/admin/billing/ledgerentry/add/",
        {"project": project.pk, "amount": "75.50", "note": "Goodwill"},
    )

    assert response.status_code == 302
    entry = LedgerEntry.objects.get()
    assert (entry.amount, entry.note, entry.created_by.email) == (
        Decimal("75.50"),
        "Goodwill",
        "staff@example.com",
    )
    page = staff.get(response["Location"]).content.decode()
    assert "balance is now $75.50" in page


def test_it_shows_the_admin_what_is_wrong_with_an_amount(project, staff):
    response = staff.post(
        "/admin/billing/ledgerentry/add/", {"project": project.pk, "amount": "12.345"}
    )
    assert response.status_code == 200
    assert "more than 2 decimals" in response.content.decode()
    assert not LedgerEntry.objects.exists()


def test_it_keeps_ledger_lines_read_only_in_the_admin(project, staff):
    entry = ledger.credit(project=project, amount="10")
    assert staff.get(f"/admin/billing/ledgerentry/{entry.pk}/delete/").status_code == 403
    staff.post(f"/admin/billing/ledgerentry/{entry.pk}/change/", {"amount": "1000"})
    entry.refresh_from_db()
    assert entry.amount == Decimal("10.00")
    assert "10.00" in staff.get("/admin/billing/ledgerentry/").content.decode()


def test_it_opens_the_credit_form_from_the_project_admin(project, staff):
    response = staff.post(
        "/admin/accounts/project/",
        {"action": "add_credit", "_selected_action": [project.pk]},
    )
    assert response.status_code == 302
    assert response["Location"] == f"/admin/billing/ledgerentry/add/?project={project.pk}"
    form = staff.get(response["Location"]).content.decode()
    assert f'<option value="{project.pk}" selected>' in form
