"""Invoices (issue 24, item 7): a month's invoice lists every charge line of the month as the
ledger has it and totals exactly the ledger's charges of the month, not a line of the month
before or after; the billing details form; who may see them; the monthly email, once."""

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
import time_machine
from django.core import mail
from django.db import connection
from django.db.models import Sum
from django.test import Client
from django.test.utils import CaptureQueriesContext

from accounts.models import User
from billing import invoices, meter, tasks
from billing.meter import charge_accrued
from billing.models import BillingDetails, LedgerEntry, Notice
from billing.usage import Month
from clusters import volumes
from runcrate.money import usd
from tests.billing.conftest import add_credit, bill_cluster, end_cluster
from tests.factories import LocationFactory, MachineTypeFactory

MARCH = Month(2026, 3)
FEB_END = datetime(2026, 2, 28, 22, 0, tzinfo=UTC)
IN_APRIL = datetime(2026, 4, 5, 12, 0, tzinfo=UTC)
DETAILS = {
    "company_name": "Analytical Engines Ltd",
    "address": "12 St James's Square\nLondon SW1Y 4JH",
    "tax_id": "gb 123 4567 89",
    "invoice_email": "accounts@engines.example",
}


def march_charges(project) -> Decimal:
    """The ledger's charges of March, summed straight from its lines (positive)."""
    total = LedgerEntry.objects.filter(
        project=project,
        kind__in=[LedgerEntry.Kind.USAGE, LedgerEntry.Kind.STORAGE],
        period_start__gte=MARCH.start,
        period_start__lt=MARCH.end,
    ).aggregate(total=Sum("amount"))["total"]
    return -(total or Decimal("0"))


def bill_march(project, *, clusters: int = 2) -> None:
    """A cluster from Feb 28 22:00 into March (two hours of it in February), `clusters` more
    within March, one ended; a volume stored across the month boundary; top-ups in February
    and in March; and a line in April, which no March invoice may hold."""
    add_credit(project, "500.00", at=FEB_END - timedelta(days=2), note="February top-up")
    location = LocationFactory(code="us-east-2", volume_price_per_gb_month=Decimal("0.10"))
    MachineTypeFactory(location=location)
    with time_machine.travel(FEB_END, tick=False):
        volumes.create_volume(project=project, name="datasets", location="us-east-2", size_gb=800)
    bill_cluster(project, at=FEB_END, name="across-the-boundary", price="23.92")
    charge_accrued(now=datetime(2026, 3, 1, 3, 10, tzinfo=UTC))
    for index in range(clusters):
        started = datetime(2026, 3, 10 + index, 9, 0, tzinfo=UTC)
        cluster = bill_cluster(project, at=started, name=f"train-{index}", price="7.33")
        charge_accrued(now=started + timedelta(hours=2, minutes=17))
        if index == 0:
            end_cluster(cluster, at=started + timedelta(hours=2, minutes=17))
    add_credit(project, "250.00", at=datetime(2026, 3, 15, 8, tzinfo=UTC), note="March top-up")
    meter.charge_storage(now=datetime(2026, 4, 1, 2, 0, tzinfo=UTC))
    charge_accrued(now=datetime(2026, 4, 1, 2, 0, tzinfo=UTC))


@pytest.fixture
def march(owner):
    bill_march(owner.project)
    return owner


def test_it_totals_exactly_the_ledgers_charges_of_the_month(march):
    invoice = invoices.invoice_for(project=march.project, month=MARCH, now=IN_APRIL)

    expected = march_charges(march.project)
    assert expected > 0 and invoice.total == expected
    # The boundary is really there: February and April have charges of their own.
    february = LedgerEntry.objects.filter(
        project=march.project, kind="usage", period_start__lt=MARCH.start
    )
    april = LedgerEntry.objects.filter(project=march.project, period_start__gte=MARCH.end)
    assert february.count() == 2 and april.exists()
    # One line per cluster and per volume, as the ledger has them.
    assert sorted(line.title for line in invoice.charges) == [
        "across-the-boundary",
        "datasets",
        "train-0",
        "train-1",
    ]
    boundary = next(line for line in invoice.charges if line.title == "across-the-boundary")
    charged_in_march = LedgerEntry.objects.filter(
        cluster_id=boundary.cluster_id, period_start__gte=MARCH.start, period_start__lt=MARCH.end
    ).aggregate(total=Sum("amount"))["total"]
    assert boundary.amount == charged_in_march
    assert [line.title for line in invoice.receipts] == ["March top-up"]
    assert invoice.received == Decimal("250.00")
    assert invoice.final and invoice.number == f"RC-202603-{march.project.pk:06d}"


def test_it_shows_the_invoice_with_its_lines_total_and_receipts(march):
    client = march.browser_client()
    client.post("/billing/invoices/details/", DETAILS)

    with time_machine.travel(IN_APRIL, tick=False):
        response = client.get("/billing/invoices/2026-03/")

    assert response.status_code == 200
    page = response.content.decode()
    assert response.context["invoice"].total == march_charges(march.project)
    assert f'<td class="num invoice-total">{usd(march_charges(march.project))}</td>' in page
    for text in (
        "Cluster usage — across-the-boundary",
        "Volume storage — datasets",
        "March top-up",
        "Analytical Engines Ltd",
        "London SW1Y 4JH",
        "GB 123 4567 89",
        f"RC-202603-{march.project.pk:06d}",
        "Runcrate Clusters",  # the seller's default
    ):
        assert text in page
    assert "February top-up" not in page


def _queries(client: Client, path: str) -> int:
    with CaptureQueriesContext(connection) as captured:
        assert client.get(path).status_code == 200
    return len(captured.captured_queries)


def test_it_runs_the_same_queries_for_2_clusters_and_for_6(owner, stranger):
    bill_march(owner.project, clusters=2)
    bill_march(stranger.project, clusters=6)
    few, many = owner.browser_client(), stranger.browser_client()

    with time_machine.travel(IN_APRIL, tick=False):
        few.get("/billing/invoices/2026-03/")  # the session warmed
        many.get("/billing/invoices/2026-03/")
        assert _queries(few, "/billing/invoices/2026-03/") == _queries(
            many, "/billing/invoices/2026-03/"
        )
        assert len(many.get("/billing/invoices/2026-03/").context["invoice"].charges) == 8


def test_it_lists_the_months_with_lines_newest_first(march):
    with time_machine.travel(IN_APRIL, tick=False):
        response = march.browser_client().get("/billing/invoices/")

    assert response.status_code == 200
    assert response.context["months"] == [Month(2026, 4), MARCH, Month(2026, 2)]
    assert b'href="/billing/invoices/2026-03/"' in response.content


@pytest.mark.parametrize(
    "month",
    ["2026-13", "march", "2026-3", "99999-01", "1999-12", "2026-05", "2027-01", "2025-12"],
)
def test_it_answers_404_for_a_month_without_an_invoice(march, month):
    # Malformed, out of range, in the future (May, from April) or without a line (Dec 2025).
    with time_machine.travel(IN_APRIL, tick=False):
        response = march.browser_client().get(f"/billing/invoices/{month}/")

    assert response.status_code == 404


def test_the_billing_page_links_to_the_invoices(owner):
    response = owner.browser_client().get("/billing/")

    assert b'href="/billing/invoices/">Invoices</a>' in response.content


def test_staff_see_the_billing_details_in_admin(owner):
    owner.browser_client().post("/billing/invoices/details/", DETAILS)
    staff = User.objects.create_user(email="staff@example.com", password="x", is_staff=True)
    staff.is_superuser = True
    staff.save()
    client = Client()
    client.force_login(staff)

    response = client.get("/admin/billing/billingdetails/")

    assert response.status_code == 200
    assert b"Analytical Engines Ltd" in response.content


def test_it_saves_the_billing_details(owner):
    client = owner.browser_client()

    response = client.post("/billing/invoices/details/", DETAILS, follow=True)

    assert response.redirect_chain == [("/billing/invoices/", 302)]
    assert b"Billing details saved" in response.content
    details = BillingDetails.objects.get(project=owner.project)
    assert (details.company_name, details.tax_id) == ("Analytical Engines Ltd", "GB 123 4567 89")
    assert details.address == "12 St James's Square\nLondon SW1Y 4JH"


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("company_name", "   ", "This field is required."),
        ("address", "", "This field is required."),
        ("invoice_email", "not-an-email", "Enter a valid email address."),
        ("tax_id", "<script>", "A VAT or tax ID is letters, digits"),
        ("company_name", "x" * 201, "at most 200 characters"),
    ],
)
def test_it_changes_nothing_on_bad_details(owner, field, value, message):
    client = owner.browser_client()
    client.post("/billing/invoices/details/", DETAILS)

    response = client.post(
        "/billing/invoices/details/",
        {**DETAILS, field: value, "tax_id": (value if field == "tax_id" else "FR 999")},
    )

    assert response.status_code == 422
    assert message in response.content.decode()
    details = BillingDetails.objects.get(project=owner.project)
    assert (details.company_name, details.address, details.tax_id, details.invoice_email) == (
        DETAILS["company_name"],
        DETAILS["address"],
        "GB 123 4567 89",
        DETAILS["invoice_email"],
    )


def test_it_refuses_the_details_form_without_its_csrf_token(owner):
    client = Client(enforce_csrf_checks=True)
    client.force_login(owner.user)

    response = client.post("/billing/invoices/details/", DETAILS)

    assert response.status_code == 403
    assert not BillingDetails.objects.exists()


def test_a_developer_gets_no_invoice_page_and_changes_nothing(march, teammate):
    client = teammate.browser_client()

    with time_machine.travel(IN_APRIL, tick=False):
        answers = [
            client.get("/billing/invoices/").status_code,
            client.get("/billing/invoices/2026-03/").status_code,
            client.post("/billing/invoices/details/", DETAILS).status_code,
        ]

    assert answers == [403, 403, 403]
    assert not BillingDetails.objects.exists()


def test_a_stranger_sees_neither_the_invoice_nor_the_details(march, stranger):
    march.browser_client().post("/billing/invoices/details/", DETAILS)
    client = stranger.browser_client()

    with time_machine.travel(IN_APRIL, tick=False):
        invoice = client.get("/billing/invoices/2026-03/")
        listing = client.get("/billing/invoices/")
        client.post("/billing/invoices/details/", {**DETAILS, "company_name": "Stranger Inc"})

    assert invoice.status_code == 404
    assert listing.context["months"] == []
    assert b"Analytical Engines" not in listing.content
    mine = BillingDetails.objects.get(project=march.project)
    assert mine.company_name == "Analytical Engines Ltd"


def test_it_emails_each_months_invoice_once_to_projects_with_lines(march, stranger):
    first_of_april = datetime(2026, 4, 1, 6, 30, tzinfo=UTC)

    sent = invoices.send_invoice_emails(now=first_of_april)
    again = invoices.send_invoice_emails(now=first_of_april + timedelta(hours=1))

    assert (sent, again) == (1, 0)  # the stranger's project had no line in March
    [message] = mail.outbox
    assert message.to == [march.user.email]
    total = usd(march_charges(march.project))
    assert message.subject == f"Your Runcrate invoice for March 2026: {total}"
    assert "/billing/invoices/2026-03/" in message.body
    assert Notice.objects.filter(kind=Notice.Kind.INVOICE, key="2026-03").count() == 1


def test_it_emails_the_invoice_to_the_address_for_invoices(march):
    march.browser_client().post("/billing/invoices/details/", DETAILS)

    invoices.send_invoice_emails(now=datetime(2026, 4, 1, 6, 30, tzinfo=UTC))

    assert [message.to for message in mail.outbox] == [["accounts@engines.example"]]


def test_the_beat_sends_them_on_the_first_of_the_month(settings, march):
    entry = settings.CELERY_BEAT_SCHEDULE["invoice-emails"]
    assert entry["task"] == tasks.send_invoice_emails.name
    assert entry["schedule"].day_of_month == {1}

    with time_machine.travel(datetime(2026, 4, 1, 6, 30, tzinfo=UTC), tick=False):
        assert tasks.send_invoice_emails() == 1
        assert tasks.send_invoice_emails() == 0
