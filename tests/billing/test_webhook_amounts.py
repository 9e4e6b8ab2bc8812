"""Which signed Stripe events credit: only a positive amount of USD, and each payment once,
by the database's own constraint."""

from decimal import Decimal

import pytest
from django.db import IntegrityError, transaction

from billing.models import LedgerEntry, Payment, balance_of
from tests.billing.stripe_fakes import WEBHOOK_SECRET, session_event, sign
from tests.billing.test_webhooks import completed, deliver


@pytest.fixture(autouse=True)
def _stripe_keys(settings):
    settings.STRIPE_SECRET_KEY = "sk_test_local"
    settings.STRIPE_WEBHOOK_SECRET = WEBHOOK_SECRET


@pytest.fixture
def payment(owner) -> Payment:
    return Payment.objects.create(
        project=owner.project,
        created_by=owner.user,
        amount=Decimal("50.00"),
        idempotency_key="key-amounts",
        stripe_session_id="cs_test_amounts",
        status=Payment.Status.OPEN,
    )


@pytest.mark.parametrize(
    ("amount_total", "currency"),
    [
        (-5000, "usd"),
        (0, "usd"),
        (None, "usd"),
        ("5000", "usd"),
        (50.0, "usd"),
        (True, "usd"),
        (5000, "eur"),
        (5000, "USD"),
        (5000, None),
    ],
)
def test_it_credits_nothing_for_a_signed_event_without_a_positive_usd_amount(
    payment, amount_total, currency
):
    payload = completed(payment, amount_total=amount_total, currency=currency)

    response = deliver(payload, sign(payload))

    assert (response.status_code, response.content) == (200, b"invalid_amount\n")
    assert balance_of(payment.project_id) == Decimal("0.00")
    assert not LedgerEntry.objects.exists()
    payment.refresh_from_db()
    assert (payment.status, payment.credited_at) == (Payment.Status.OPEN, None)


def test_it_credits_what_stripe_collected_when_it_is_the_amount_asked(payment):
    payload = completed(payment, amount_total=5000)

    assert deliver(payload, sign(payload)).content == b"credited\n"
    assert balance_of(payment.project_id) == Decimal("50.00")
    payment.refresh_from_db()
    assert payment.amount_paid == Decimal("50.00")


@pytest.mark.parametrize("amount_total", [4999, 5001, 500000, 1])
def test_it_credits_nothing_when_the_amount_paid_is_not_the_amount_asked(payment, amount_total):
    # A genuine, signed event for another total than the session was made for (`unit_amount`
    # of the payment's amount) is not the top-up asked for: staff settle it by hand.
    payload = completed(payment, amount_total=amount_total)

    response = deliver(payload, sign(payload))

    assert (response.status_code, response.content) == (200, b"amount_mismatch\n")
    assert balance_of(payment.project_id) == Decimal("0.00")
    assert not LedgerEntry.objects.exists()
    payment.refresh_from_db()
    assert (payment.status, payment.credited_at, payment.amount_paid) == (
        Payment.Status.OPEN,
        None,
        None,
    )
    assert "not the $50.00 asked; nothing was credited" in payment.last_error
    # The same session's event with the amount asked still credits it, once.
    right = completed(payment, amount_total=5000)
    assert deliver(right, sign(right)).content == b"credited\n"
    assert balance_of(payment.project_id) == Decimal("50.00")


def test_it_credits_a_payment_once_even_if_its_credited_mark_is_lost(payment):
    # Exactly once is the schema's: with `credited_at` cleared by hand, a repeated event still
    # finds the payment's top-up line and credits nothing.
    payload = completed(payment)
    assert deliver(payload, sign(payload)).content == b"credited\n"
    Payment.objects.filter(pk=payment.pk).update(credited_at=None, status=Payment.Status.OPEN)

    again = session_event(
        "checkout.session.async_payment_succeeded",
        session_id=payment.stripe_session_id,
        payment_id=payment.pk,
        project_id=payment.project_id,
        event_id="evt_test_2",
    )

    assert deliver(again, sign(again)).content == b"duplicate\n"
    assert balance_of(payment.project_id) == Decimal("50.00")
    assert LedgerEntry.objects.get().payment == payment


def test_the_database_refuses_a_second_top_up_line_for_a_payment(payment):
    LedgerEntry.objects.create(
        project=payment.project, kind="topup", amount=Decimal("50.00"), payment=payment
    )

    with pytest.raises(IntegrityError), transaction.atomic():
        LedgerEntry.objects.create(
            project=payment.project, kind="topup", amount=Decimal("50.00"), payment=payment
        )
    with pytest.raises(IntegrityError), transaction.atomic():
        LedgerEntry.objects.create(
            project=payment.project, kind="adjustment", amount=Decimal("1.00"), payment=payment
        )
    assert LedgerEntry.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_the_migration_moves_each_payments_link_onto_its_line():
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    before = [("billing", "0006_volume_storage")]
    after = [("billing", "0007_topup_line_per_payment")]
    executor = MigrationExecutor(connection)
    executor.migrate(before)
    old = executor.loader.project_state(before).apps
    project = old.get_model("accounts", "Project").objects.create(name="p")
    entry = old.get_model("billing", "LedgerEntry").objects.create(
        project_id=project.pk, kind="topup", amount=Decimal("20.00")
    )
    old.get_model("billing", "LedgerEntry").objects.create(
        project_id=project.pk, kind="adjustment", amount=Decimal("5.00")
    )
    paid = old.get_model("billing", "Payment").objects.create(
        project_id=project.pk, amount=Decimal("20.00"), idempotency_key="k1", ledger_entry=entry
    )
    old.get_model("billing", "Payment").objects.create(
        project_id=project.pk, amount=Decimal("30.00"), idempotency_key="k2"
    )

    try:
        executor = MigrationExecutor(connection)
        executor.migrate(after)
        new = executor.loader.project_state(after).apps
        lines = new.get_model("billing", "LedgerEntry").objects.order_by("pk")
        assert list(lines.values_list("kind", "payment_id")) == [
            ("topup", paid.pk),
            ("adjustment", None),
        ]
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())
