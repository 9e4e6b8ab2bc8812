"""Demo payments (docs/billing.md, "Adding credit"): in the demo that `make run` starts, without
Stripe keys, a demo payment page credits the balance through the signed-webhook path, once, as
a demo top-up; anywhere else there is no such page."""

import json
from decimal import Decimal

import pytest
from django.test import Client

from billing import payments
from billing.models import LedgerEntry, Payment, balance_of

WEBHOOK = "/billing/stripe/webhook/"


@pytest.fixture
def demo(settings):
    settings.RUNCRATE_DEMO = True
    settings.STRIPE_SECRET_KEY = ""
    settings.STRIPE_WEBHOOK_SECRET = ""


def start(client: Client, amount: str = "50.00", key: str = "demo-key-1") -> Payment:
    response = client.post("/billing/credit/", {"amount": amount, "idempotency_key": key})
    payment = Payment.objects.get(idempotency_key=key)
    assert response.status_code == 302
    assert response["Location"] == f"/billing/payments/{payment.pk}/demo/"
    return payment


def topups(project) -> list[LedgerEntry]:
    return list(LedgerEntry.objects.filter(project=project, kind=LedgerEntry.Kind.TOPUP))


def test_it_sends_the_user_to_a_labelled_demo_payment_page(owner, demo):
    client = owner.browser_client()
    billing = client.get("/billing/").content.decode()

    payment = start(client)
    page = client.get(f"/billing/payments/{payment.pk}/demo/").content.decode()

    assert "no card is charged" in billing
    assert "Card payments are not available" not in billing
    assert "Stripe" not in billing  # the demo pays on no Stripe page
    assert (payment.status, payment.amount) == (Payment.Status.OPEN, Decimal("50.00"))
    assert payment.stripe_session_id.startswith("cs_demo_")
    assert "Demo payment of $50.00" in page
    assert "No card is charged: this is the demo" in page
    assert f'action="/billing/payments/{payment.pk}/demo/pay/"' in page
    assert balance_of(owner.project.pk) == Decimal("0.00")  # nothing before the confirmation
    waiting = client.get(f"/billing/payments/{payment.pk}/").content.decode()
    assert "not paid" in waiting and 'hx-trigger="every 2s"' not in waiting  # no Stripe to wait for
    assert f'href="/billing/payments/{payment.pk}/demo/"' in waiting


def test_it_credits_a_demo_top_up_once_however_often_it_is_confirmed(owner, demo):
    client = owner.browser_client()
    payment = start(client, "75.00")
    pay = f"/billing/payments/{payment.pk}/demo/pay/"

    first = client.post(pay)
    second = client.post(pay)

    assert first.status_code == second.status_code == 302
    assert first["Location"] == f"/billing/payments/{payment.pk}/"
    [line] = topups(owner.project)
    assert (line.amount, line.note, line.payment_id) == (
        Decimal("75.00"),
        "Demo top-up (no card charged)",
        payment.pk,
    )
    assert balance_of(owner.project.pk) == Decimal("75.00")
    payment.refresh_from_db()
    assert payment.status == Payment.Status.PAID and payment.amount_paid == Decimal("75.00")
    page = client.get(f"/billing/payments/{payment.pk}/").content.decode()
    assert "$75.00 was added to your balance" in page and "no card was charged" in page
    # A paid demo payment's page sends the user to the payment, not to a Pay button again.
    assert client.get(f"/billing/payments/{payment.pk}/demo/")["Location"] == (
        f"/billing/payments/{payment.pk}/"
    )


def test_it_confirms_through_the_webhooks_own_path(owner, demo, monkeypatch):
    client = owner.browser_client()
    payment = start(client)
    seen: list[str] = []
    handle = payments.handle_webhook

    def spy(*, payload: bytes, signature: str | None) -> payments.WebhookResult:
        seen.append(json.loads(payload)["type"])
        return handle(payload=payload, signature=signature)

    monkeypatch.setattr(payments, "handle_webhook", spy)
    client.post(f"/billing/payments/{payment.pk}/demo/pay/")

    assert seen == ["checkout.session.completed"]
    assert len(topups(owner.project)) == 1


def test_it_refuses_a_tampered_or_unsigned_demo_confirmation(owner, demo):
    payment = start(owner.browser_client())
    payload = payments.demo_event(payment)
    signature = payments.sign(payload, secret=payments.demo_webhook_secret())
    tampered = payload.replace(b'"amount_total": 5000', b'"amount_total": 500000')
    assert tampered != payload
    forged = payments.sign(payload, secret="whsec_guessed")

    answers = [
        Client().post(WEBHOOK, data=tampered, content_type="application/json", headers=headers)
        for headers in ({"Stripe-Signature": signature}, {})
    ]
    answers.append(
        Client().post(
            WEBHOOK,
            data=payload,
            content_type="application/json",
            headers={"Stripe-Signature": forged},
        )
    )

    assert [answer.status_code for answer in answers] == [400, 400, 400]
    assert topups(owner.project) == []
    assert balance_of(owner.project.pk) == Decimal("0.00")
    payment.refresh_from_db()
    assert payment.status == Payment.Status.OPEN


def test_the_demo_secret_signs_nothing_once_stripe_keys_are_set(owner, demo, settings):
    payment = start(owner.browser_client())
    payload = payments.demo_event(payment)
    signature = payments.sign(payload, secret=payments.demo_webhook_secret())
    settings.STRIPE_SECRET_KEY = "sk_test_local"
    settings.STRIPE_WEBHOOK_SECRET = "whsec_test_local_secret"

    response = Client().post(
        WEBHOOK,
        data=payload,
        content_type="application/json",
        headers={"Stripe-Signature": signature},
    )

    assert response.status_code == 400
    assert topups(owner.project) == []


@pytest.mark.parametrize(
    "changes",
    [
        {"STRIPE_SECRET_KEY": "sk_test_local", "STRIPE_WEBHOOK_SECRET": "whsec_x"},
        {"STRIPE_WEBHOOK_SECRET": "whsec_x"},
        {"STRIPE_SECRET_KEY": "sk_test_local"},
        {"RUNCRATE_DEMO": False},
    ],
    ids=["stripe-keys", "webhook-secret-only", "secret-key-only", "not-the-demo"],
)
def test_the_demo_payment_pages_are_404_outside_the_demo_or_with_stripe_keys(
    owner, demo, settings, changes
):
    client = owner.browser_client()
    payment = start(client)
    for name, value in changes.items():
        setattr(settings, name, value)

    page = client.get(f"/billing/payments/{payment.pk}/demo/")
    pay = client.post(f"/billing/payments/{payment.pk}/demo/pay/")

    assert page.status_code == pay.status_code == 404
    assert topups(owner.project) == []


def test_a_stranger_cannot_open_or_confirm_anothers_demo_payment(owner, stranger, demo):
    payment = start(owner.browser_client())
    client = stranger.browser_client()

    assert client.get(f"/billing/payments/{payment.pk}/demo/").status_code == 404
    assert client.post(f"/billing/payments/{payment.pk}/demo/pay/").status_code == 404
    assert topups(owner.project) == []


def test_a_card_payment_has_no_demo_page(owner, demo):
    card = Payment.objects.create(
        project=owner.project,
        created_by=owner.user,
        amount=Decimal("50.00"),
        idempotency_key="card-1",
        stripe_session_id="cs_test_0001",
        status=Payment.Status.OPEN,
    )
    client = owner.browser_client()

    assert client.get(f"/billing/payments/{card.pk}/demo/").status_code == 404
    assert client.post(f"/billing/payments/{card.pk}/demo/pay/").status_code == 404


def test_the_get_of_the_confirmation_is_not_allowed(owner, demo):
    payment = start(owner.browser_client())

    response = owner.browser_client().get(f"/billing/payments/{payment.pk}/demo/pay/")

    assert response.status_code == 405
    assert topups(owner.project) == []
