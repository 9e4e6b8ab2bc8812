"""Invoices: per project and month, every charge line of the month as the ledger has it (one
per cluster, one per volume), its total and the month's top-ups and credits as receipts,
made out to the billing details the owner entered (docs/billing.md, "Invoices").

An invoice is not stored: it is read from the ledger each time through the statement's own
reading of the month (billing/usage.py `month_lines`), so it always equals the ledger, and a
month's invoice is final once the month is over. The invoice number is the project and the
month, so the same invoice always has the same number.
"""

from dataclasses import dataclass
from datetime import date, datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.urls import reverse

from accounts.models import Project
from billing.limits import billing_recipients, claim_notice
from billing.models import BillingDetails, Notice
from billing.usage import Line, Month, month_lines, months_with_lines, projects_with_lines
from runcrate.emails import send_templated
from runcrate.errors import Refused

ZERO = Decimal("0.00")


class NoInvoice(Refused, LookupError):
    """A month with no invoice: in the future, or without a line on the project's ledger."""

    def __init__(self, month: Month) -> None:
        super().__init__("no_invoice", f"There is no invoice for {month.label}.", field="month")


@dataclass(frozen=True)
class Invoice:
    project: Project
    month: Month
    details: BillingDetails | None
    charges: list[Line]  # usage per cluster and storage per volume, amounts negative
    receipts: list[Line]  # top-ups and adjustments, amounts signed
    final: bool  # the month is over: nothing more is charged to it

    @property
    def number(self) -> str:
        return invoice_number(project_id=self.project.pk, month=self.month)

    @property
    def issued_on(self) -> date:
        """The first day after the month (the day the invoice email goes out)."""
        return self.month.next.first_day

    @property
    def last_day(self) -> date:
        return self.month.next.first_day - timedelta(days=1)

    @property
    def total(self) -> Decimal:
        """What the month's charges cost: the ledger's charge lines of the month, summed."""
        return -sum((line.amount for line in self.charges), ZERO)

    @property
    def received(self) -> Decimal:
        return sum((line.amount for line in self.receipts), ZERO)

    @property
    def seller(self) -> list[str]:
        return seller_lines()


def seller_lines() -> list[str]:
    """Who sells, as printed at the top of every invoice: settings.RUNCRATE_INVOICE_SELLER."""
    return list(settings.RUNCRATE_INVOICE_SELLER)


def invoice_number(*, project_id: int, month: Month) -> str:
    """`RC-202603-000042`: the month and the project, so it never changes and never repeats."""
    return f"RC-{month.year:04d}{month.month:02d}-{project_id:06d}"


def invoice_months(*, project: Project, now: datetime) -> list[Month]:
    """The months with an invoice, newest first: those with lines, up to the current one."""
    current = Month.of(now)
    return sorted(
        (month for month in months_with_lines(project_id=project.pk) if month <= current),
        reverse=True,
    )


def details_of(project: Project) -> BillingDetails | None:
    return BillingDetails.objects.filter(project=project).first()


def invoice_for(*, project: Project, month: Month, now: datetime) -> Invoice:
    """The project's invoice for `month`; raises NoInvoice for a future month or one without
    lines. Five queries, however many lines."""
    if month > Month.of(now) or month not in months_with_lines(project_id=project.pk):
        raise NoInvoice(month)
    lines = month_lines(project_id=project.pk, month=month, now=now)
    return Invoice(
        project=project,
        month=month,
        details=details_of(project),
        charges=[line for line in lines if line.is_usage or line.is_storage],
        receipts=[line for line in lines if not (line.is_usage or line.is_storage)],
        final=month < Month.of(now),
    )


# ---- the monthly email -------------------------------------------------------------------------


def invoice_recipients(project: Project, details: BillingDetails | None) -> list[str]:
    """The email for invoices the owner entered, else the project's owners and managers."""
    if details is not None and details.invoice_email:
        return [details.invoice_email]
    return billing_recipients({project.pk}).get(project.pk, [])


def send_invoice_emails(*, now: datetime) -> int:
    """Email last month's invoice to each project with lines in it, once per project and
    month (a Notice row claims it); the emails sent. Safe to run twice and concurrently."""
    month = Month.of(now).previous
    sent = 0
    for project in Project.objects.filter(pk__in=projects_with_lines(month=month)).order_by("pk"):
        if not claim_notice(
            project_id=project.pk, kind=Notice.Kind.INVOICE, key=month.param, now=now
        ):
            continue
        invoice = invoice_for(project=project, month=month, now=now)
        sent += send_templated(
            template="billing-invoice-ready",
            to=invoice_recipients(project, invoice.details),
            project_id=project.pk,
            context={
                "invoice": invoice,
                "path": reverse("billing:invoice", args=[month.param]),
            },
        )
    return sent
