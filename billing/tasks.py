"""The meter's beat task: charge what ran, then stop what the balance or a budget no longer
covers and send the billing emails. Safe to run twice and on several workers at once."""

from celery import shared_task

from billing import meter, stops
from runcrate.models import Beat


@shared_task(ignore_result=True)
def run_meter() -> dict:
    charged = meter.charge_accrued()
    stored = meter.charge_storage()
    limits = stops.enforce_limits()
    Beat.record("meter")
    return {
        "records_charged": charged.records,
        "amount_charged": f"{charged.amount:.2f}",
        "volumes_charged": stored.records,
        "storage_charged": f"{stored.amount:.2f}",
        "stopped_for_balance": limits.stopped_for_balance,
        "stopped_for_budget": limits.stopped_for_budget,
        "emails": limits.low_balance_emails + limits.budget_emails + limits.stop_emails,
    }
