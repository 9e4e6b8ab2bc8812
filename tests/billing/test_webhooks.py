"""The Stripe webhook: only a genuine, recent, signed event credits, and each payment once."""

import threading
import time
from decimal import Decimal

import pytest
from django.test import Client

from billing import payments
from billing.models import LedgerEntry, Payment, balance_of
from tests.billing.stripe_fakes import WEBHOOK_SECRET, session_event, sign
from tests.conftest import postgres_only

URL = "/billing/stripe/webhook/"


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
        idempotency_key="key-1",
        stripe_session_id="cs_test_0001",
        checkout_url="https://checkout.stripe.test/c/pay/cs_test_0001",
        status=Payment.Status.OPEN,
    )


def deliver(payload: str, signature: str | None = None, client: Client | None = None):
    headers = {} if signature is None else {"Stripe-Signature": signature}
    return (client or Client()).post(
        URL, data=payload, content_type="application/json", headers=headers
    )


def completed(payment: Payment, **kwargs) -> str:
    return session_event(
        "checkout.session.completed",
        session_id=payment.stripe_session_id,
        payment_id=payment.pk,
        project_id=payment.project_id,
        **kwargs,
    )


def test_it_answers_400_for_a_form_body_and_changes_nothing(payment):
    response = Client().post(URL, data={"type": "checkout.session.completed"})  # multipart

    assert response.status_code == 400
    assert b"a JSON body, not a form" in response.content
    payment.refresh_from_db()
    assert payment.status == Payment.Status.OPEN
    assert not LedgerEntry.objects.filter(project=payment.project).exists()


def test_it_credits_the_balance_for_a_signed_paid_checkout(payment):
    payload = completed(payment)

    response = deliver(payload, sign(payload))

    assert response.status_code == 200
    payment.refresh_from_db()
    assert payment.status == Payment.Status.PAID
    assert payment.amount_paid == Decimal("50.00")
    assert payment.ledger_entry.kind == LedgerEntry.Kind.TOPUP
    assert balance_of(payment.project_id) == Decimal("50.00")


@pytest.mark.parametrize(
    "tamper",
    ["wrong secret", "altered body", "stale timestamp", "no signature", "garbage signature"],
)
def test_it_answers_400_and_changes_nothing_for_an_event_it_cannot_trust(payment, tamper):
    payload = completed(payment)
    signature = {
        "wrong secret": sign(payload, secret="whsec_someone_else"),
        "altered body": sign(payload),
        "stale timestamp": sign(payload, timestamp=int(time.time()) - 3600),
        "no signature": None,
        "garbage signature": "t=abc,v1=",
    }[tamper]
    if tamper == "altered body":
        payload = payload.replace('"amount_total": 5000', '"amount_total": 500000')

    response = deliver(payload, signature)

    assert response.status_code == 400
    payment.refresh_from_db()
    assert payment.status == Payment.Status.OPEN
    assert payment.credited_at is None
    assert balance_of(payment.project_id) == Decimal("0.00")


@pytest.mark.parametrize("ahead", [payments.FUTURE_TOLERANCE_SECONDS + 5, 3600, 86400 * 365])
def test_it_refuses_an_event_signed_with_a_timestamp_in_the_future(payment, ahead):
    # Stripe signs when it sends: a signature dated ahead of our clock (beyond the skew we
    # allow) is refused like a stale one, before anything is read or credited.
    payload = completed(payment)

    response = deliver(payload, sign(payload, timestamp=int(time.time()) + ahead))

    assert response.status_code == 400
    assert b"in the future" in response.content
    payment.refresh_from_db()
    assert (payment.status, payment.credited_at) == (Payment.Status.OPEN, None)
    assert balance_of(payment.project_id) == Decimal("0.00")


def test_it_accepts_a_timestamp_a_little_ahead_within_the_clock_skew_allowed(payment):
    payload = completed(payment)
    ahead = payments.FUTURE_TOLERANCE_SECONDS - 10

    response = deliver(payload, sign(payload, timestamp=int(time.time()) + ahead))

    assert (response.status_code, response.content) == (200, b"credited\n")


def test_it_refuses_every_event_when_no_signing_secret_is_configured(payment, settings):
    settings.STRIPE_WEBHOOK_SECRET = ""
    payload = completed(payment)

    assert deliver(payload, sign(payload)).status_code == 400
    assert balance_of(payment.project_id) == Decimal("0.00")


def test_it_credits_once_when_the_same_event_comes_three_times(payment):
    payload = completed(payment)

    answers = [deliver(payload, sign(payload)).content for _ in range(3)]

    assert answers == [b"credited\n", b"duplicate\n", b"duplicate\n"]
    assert balance_of(payment.project_id) == Decimal("50.00")
    assert LedgerEntry.objects.filter(kind="topup").count() == 1


def test_it_credits_an_async_payment_once_it_succeeds_whatever_the_order(payment):
    pending = completed(payment, payment_status="unpaid")
    succeeded = session_event(
        "checkout.session.async_payment_succeeded",
        session_id=payment.stripe_session_id,
        payment_id=payment.pk,
        project_id=payment.project_id,
    )

    deliver(pending, sign(pending))
    payment.refresh_from_db()
    assert (payment.status, balance_of(payment.project_id)) == ("processing", Decimal("0.00"))

    deliver(succeeded, sign(succeeded))
    deliver(pending, sign(pending))  # a late repeat of the first event

    payment.refresh_from_db()
    assert payment.status == Payment.Status.PAID
    assert balance_of(payment.project_id) == Decimal("50.00")


def test_it_keeps_a_payment_paid_when_older_events_arrive_after_the_credit(payment):
    succeeded = session_event(
        "checkout.session.async_payment_succeeded",
        session_id=payment.stripe_session_id,
        payment_id=payment.pk,
        project_id=payment.project_id,
    )
    expired = session_event(
        "checkout.session.expired", session_id=payment.stripe_session_id, payment_id=payment.pk
    )
    failed = session_event(
        "checkout.session.async_payment_failed",
        session_id=payment.stripe_session_id,
        payment_id=payment.pk,
    )
    pending = completed(payment, payment_status="unpaid")

    for payload in (succeeded, pending, expired, failed, succeeded):
        assert deliver(payload, sign(payload)).status_code == 200

    payment.refresh_from_db()
    assert payment.status == Payment.Status.PAID
    assert balance_of(payment.project_id) == Decimal("50.00")


def test_it_marks_a_failed_async_payment_without_crediting(payment):
    pending = completed(payment, payment_status="unpaid")
    failed = session_event(
        "checkout.session.async_payment_failed",
        session_id=payment.stripe_session_id,
        payment_id=payment.pk,
    )

    deliver(pending, sign(pending))
    deliver(failed, sign(failed))

    payment.refresh_from_db()
    assert payment.status == Payment.Status.FAILED
    assert balance_of(payment.project_id) == Decimal("0.00")


def test_it_credits_a_session_it_never_heard_back_about_by_its_own_reference(owner):
    # Stripe made the session but its answer was lost: the payment has no session id yet.
    payment = Payment.objects.create(
        project=owner.project, amount=Decimal("20.00"), idempotency_key="key-lost"
    )
    payload = session_event(
        "checkout.session.completed",
        session_id="cs_test_lost",
        payment_id=payment.pk,
        project_id=owner.project.pk,
        amount_total=2000,
    )

    deliver(payload, sign(payload))

    payment.refresh_from_db()
    assert (payment.status, payment.stripe_session_id) == ("paid", "cs_test_lost")
    assert balance_of(owner.project.pk) == Decimal("20.00")


def test_it_ignores_a_session_of_another_project_or_none_of_ours(payment, stranger):
    foreign = session_event(
        "checkout.session.completed",
        session_id="cs_unknown",
        payment_id=payment.pk,
        project_id=stranger.project.pk,  # the reference does not match the metadata
    )
    other_type = '{"id": "evt_2", "type": "invoice.paid", "data": {"object": {}}}'

    assert deliver(foreign, sign(foreign)).content == b"unknown_payment\n"
    assert deliver(other_type, sign(other_type)).content == b"ignored\n"
    assert balance_of(payment.project_id) == Decimal("0.00")
    assert balance_of(stranger.project.pk) == Decimal("0.00")


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_it_credits_once_when_two_deliveries_arrive_at_once(owner, monkeypatch):
    payment = Payment.objects.create(
        project=owner.project,
        amount=Decimal("50.00"),
        idempotency_key="key-race",
        stripe_session_id="cs_test_race",
        status=Payment.Status.OPEN,
    )
    payload = completed(payment)
    both_decided = threading.Barrier(2, timeout=10)
    credit = payments._credit

    def credit_when_both_decided_to(found, session):
        # Both deliveries found the payment uncredited before either writes.
        both_decided.wait()
        return credit(found, session)

    monkeypatch.setattr(payments, "_credit", credit_when_both_decided_to)
    answers = []

    def deliver_once():
        from django.db import connection

        try:
            answers.append(deliver(payload, sign(payload)).content)
        finally:
            connection.close()

    threads = [threading.Thread(target=deliver_once) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    assert sorted(answers) == [b"credited\n", b"duplicate\n"]
    assert balance_of(owner.project.pk) == Decimal("50.00")
    assert LedgerEntry.objects.filter(kind="topup").count() == 1
