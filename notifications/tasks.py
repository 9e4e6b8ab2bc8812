"""The beat's one task: new events become deliveries, due deliveries are sent, and endpoints
failing for days are switched off. Safe to run twice and at once (notifications/outbox.py,
notifications/delivery.py say how)."""

from celery import shared_task
from django.utils import timezone

from notifications import delivery, outbox


def run_notifications() -> dict:
    """One pass, as the beat runs it; returns what it did."""
    now = timezone.now()
    planned = outbox.plan_deliveries(now=now)
    delivered = delivery.send_due(now=now)
    switched = delivery.switch_off_failing(now=now)
    return {"planned": planned.deliveries, "delivered": delivered, "switched_off": len(switched)}


@shared_task(name="notifications.tasks.send_notifications", ignore_result=True)
def send_notifications() -> dict:
    return run_notifications()
