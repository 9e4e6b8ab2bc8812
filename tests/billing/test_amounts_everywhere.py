"""One amount reads the same wherever it is printed (runcrate/money.py, docs/billing.md "How
amounts are written"): 1234.5 is $1,234.50 in an email, on a page and in admin, and 1234.50
in the CSV and the API, which carry data."""

import csv
import io
from datetime import UTC, datetime
from decimal import Decimal

import time_machine
from django.core import mail
from django.test import Client

from accounts.models import User
from billing.limits import BalanceStanding, warn_low_balances
from tests.billing.conftest import add_credit

NOW = datetime(2026, 3, 20, 12, 0, tzinfo=UTC)


def test_it_prints_1234_50_the_same_in_an_email_a_page_admin_and_data(owner):
    add_credit(owner.project, "1234.50", at=NOW, note="Wire transfer")
    project = owner.project
    standing = BalanceStanding(
        balance={project.pk: Decimal("1234.50")}, burn={project.pk: Decimal("2000")}, over=set()
    )
    staff = Client()
    staff.force_login(User.objects.create_superuser("staff@example.com", password=None))

    with time_machine.travel(NOW, tick=False):
        assert warn_low_balances(standing, now=NOW) == 1
        page = owner.browser_client().get("/billing/").content.decode()
        exported = owner.browser_client().get("/billing/export.csv?month=2026-03")
        api = owner.api().get("/api/v1/billing/balance").json()
    projects_admin = staff.get("/admin/accounts/project/").content.decode()
    ledger_admin = staff.get("/admin/billing/ledgerentry/").content.decode()

    email = mail.outbox[0]
    assert "Your balance is $1,234.50 and" in email.body
    assert "$2,000.00 per hour" in email.body
    assert "<strong>$1,234.50</strong>" in email.alternatives[0][0]
    assert "$1,234.50" in page and "+$1,234.50" in page
    assert "$1234.50" not in page + email.body
    assert "$1,234.50" in projects_admin
    assert "+$1,234.50" in ledger_admin
    topup = next(row for row in csv.DictReader(io.StringIO(exported.content.decode())))
    assert topup["amount_usd"] == "1234.50"
    assert api["data"]["balance"] == "1234.50"
