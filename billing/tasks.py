"""Billing's periodic tasks (the meter's beat is the clusters' `run_meter`, which stops what
the balance no longer covers)."""

from celery import shared_task
from django.utils import timezone

from billing import invoices


@shared_task(name="billing.tasks.send_invoice_emails", ignore_result=True)
def send_invoice_emails() -> int:
    """Last month's invoice emails; each goes once per project and month (a Notice row)."""
    return invoices.send_invoice_emails(now=timezone.now())
