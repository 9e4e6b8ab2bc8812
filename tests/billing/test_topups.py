"""Add credit: a Stripe Checkout Session (against a local fake Stripe), the Idempotency-Key
stored before the call and reused on retry, and the page that waits for the webhook."""

from decimal import Decimal

import pytest

from billing import payments
from billing.models import Payment, balance_of
from tests.billing.stripe_fakes import WEBHOOK_SECRET, FakeStripe, session_event, sign


@pytest.fixture
def stripe_server(settings, monkeypatch):
    monkeypatch.setattr(payments, "NETWORK_RETRIES", 0)  # retries are ours, and counted
    with FakeStripe() as fake:
        settings.STRIPE_API_BASE = fake.url
        settings.STRIPE_SECRET_KEY = "sk_test_local"
        settings.STRIPE_WEBHOOK_SECRET = WEBHOOK_SECRET
        settings.SITE_URL = "https://clusters.runcrate.test"
        yield fake


def add_credit(client, amount="50.00", key="form-key-1"):
    return client.post("/billing/credit/", {"amount": amount, "idempotency_key": key})


def test_it_sends_the_user_to_a_checkout_session_for_the_amount(owner, stripe_server):
    response = add_credit(owner.browser_client(), "50.00")

    payment = Payment.objects.get()
    assert response.status_code == 302
    assert response["Location"] == "https://checkout.stripe.test/c/pay/cs_test_0001"
    assert (payment.status, payment.stripe_session_id) == ("open", "cs_test_0001")
    [request] = stripe_server.requests
    assert request["path"] == "/v1/checkout/sessions"
    assert request["key"] == "form-key-1" == payment.idempotency_key
    form = request["form"]
    assert form["mode"] == "payment"
    assert form["line_items[0][price_data][unit_amount]"] == "5000"
    assert form["line_items[0][price_data][currency]"] == "usd"
    assert form["client_reference_id"] == str(payment.pk)
    assert form["success_url"] == (
        f"https://clusters.runcrate.test/billing/payments/{payment.pk}/"
        "?session_id={CHECKOUT_SESSION_ID}"
    )
    assert balance_of(owner.project.pk) == Decimal("0.00")  # only the webhook credits


def test_it_reuses_the_stored_idempotency_key_when_it_retries(owner, stripe_server):
    stripe_server.fail_next = 1
    client = owner.browser_client()

    failed = add_credit(client, "75.00", key="form-key-2")
    payment = Payment.objects.get()
    assert failed.status_code == 302
    assert failed["Location"] == f"/billing/payments/{payment.pk}/"
    assert (payment.status, payment.idempotency_key) == ("created", "form-key-2")
    assert payment.last_error
    page = client.get(f"/billing/payments/{payment.pk}/").content.decode()
    assert "Stripe did not create the payment page" in page and "Try again" in page

    retried = client.post(f"/billing/payments/{payment.pk}/retry/")
    resent = add_credit(client, "75.00", key="form-key-2")  # the form sent once more

    assert (
        retried["Location"]
        == resent["Location"]
        == stripe_server.sessions_by_key["form-key-2"]["url"]
    )
    assert [request["key"] for request in stripe_server.requests] == ["form-key-2"] * 2
    assert Payment.objects.count() == 1
    payment.refresh_from_db()
    assert (payment.status, payment.last_error) == ("open", "")


def test_it_sends_the_same_key_again_when_the_form_is_sent_twice_before_stripe_answered(
    owner, stripe_server
):
    # The first attempt stored the payment and its key, then Stripe failed to answer.
    stripe_server.fail_next = 1
    client = owner.browser_client()
    add_credit(client, "30.00", key="form-key-3")

    add_credit(client, "30.00", key="form-key-3")

    assert [request["key"] for request in stripe_server.requests] == ["form-key-3"] * 2
    assert Payment.objects.get().status == "open"


def test_it_refuses_less_than_10_usd_and_asks_stripe_nothing(owner, stripe_server):
    response = add_credit(owner.browser_client(), "9.99")

    assert response.status_code == 422
    assert "The minimum top-up is $10.00." in response.content.decode()
    assert Payment.objects.count() == 0
    assert stripe_server.requests == []


@pytest.mark.parametrize("amount", ["ten", "12.345", "-20", ""])
def test_it_refuses_an_amount_that_is_not_one(owner, stripe_server, amount):
    response = add_credit(owner.browser_client(), amount)

    assert response.status_code == 422
    assert Payment.objects.count() == 0


def test_it_tells_a_customer_whom_to_contact_without_stripe_keys(owner, settings):
    # Not the demo: no demo payments either. A customer reads whom to write to, never the
    # installation's variable names or commands (issue 21).
    settings.RUNCRATE_DEMO = False
    settings.STRIPE_SECRET_KEY = ""
    settings.STRIPE_WEBHOOK_SECRET = ""
    settings.RUNCRATE_SUPPORT_EMAIL = "help@operator.test"
    client = owner.browser_client()

    page = client.get("/billing/").content.decode()
    refused = add_credit(client)

    assert "Card payments are not available here;" in page
    assert 'href="mailto:help@operator.test"' in page
    for internal in ("STRIPE_", "manage.py", 'href="/admin/"'):
        assert internal not in page
    assert 'action="/billing/credit/"' not in page
    assert refused.status_code == 302
    assert Payment.objects.count() == 0
    flash = client.get("/billing/").content.decode()
    assert "contact help@operator.test" in flash


def test_it_shows_staff_how_to_credit_in_admin_without_stripe_keys(owner, settings):
    settings.RUNCRATE_DEMO = False
    settings.STRIPE_SECRET_KEY = ""
    settings.STRIPE_WEBHOOK_SECRET = ""
    owner.user.is_staff = True
    owner.user.save(update_fields=["is_staff"])

    page = owner.browser_client().get("/billing/").content.decode()

    assert "Card payments are not available here;" in page
    assert 'href="/admin/"' in page and "ledger adjustment" in page


def test_it_shows_pending_until_the_webhook_credits_the_payment(owner, stripe_server):
    client = owner.browser_client()
    add_credit(client, "50.00")
    payment = Payment.objects.get()
    url = f"/billing/payments/{payment.pk}/"

    back = client.get(url + "?session_id=cs_test_0001")
    poll = client.get(url, headers={"HX-Request": "true"})
    assert "pending" in back.content.decode()
    assert poll.status_code == 200 and 'hx-trigger="every 2s"' in poll.content.decode()

    payload = session_event(
        "checkout.session.completed",
        session_id="cs_test_0001",
        payment_id=payment.pk,
        project_id=owner.project.pk,
    )
    assert (
        client.post(
            "/billing/stripe/webhook/",
            data=payload,
            content_type="application/json",
            headers={"Stripe-Signature": sign(payload)},
        ).status_code
        == 200
    )

    done = client.get(url, headers={"HX-Request": "true"})
    assert done.status_code == 286  # htmx stops polling
    assert "$50.00 was added to your balance" in done.content.decode()
    assert "hx-trigger" not in done.content.decode()


def test_it_shows_a_payment_only_to_its_project(owner, stranger, stripe_server):
    add_credit(owner.browser_client())
    payment = Payment.objects.get()

    assert stranger.browser_client().get(f"/billing/payments/{payment.pk}/").status_code == 404
    assert (
        stranger.browser_client().post(f"/billing/payments/{payment.pk}/retry/").status_code == 404
    )


def test_it_lists_payments_for_staff_in_admin(owner, stripe_server):
    from django.test import Client

    from accounts.models import User

    add_credit(owner.browser_client(), "50.00")
    staff = User.objects.create_superuser("staff@example.com", "correct-horse-battery")
    client = Client()
    client.force_login(staff)

    listing = client.get("/admin/billing/payment/")
    payment = Payment.objects.get()
    detail = client.get(f"/admin/billing/payment/{payment.pk}/change/")

    assert listing.status_code == detail.status_code == 200
    assert "cs_test_0001" in listing.content.decode()
    assert client.get("/admin/billing/payment/add/").status_code == 403


def test_it_starts_a_new_payment_when_an_old_form_comes_back_after_its_payment(
    owner, stripe_server
):
    client = owner.browser_client()
    add_credit(client, "50.00", key="form-key-old")
    Payment.objects.update(status=Payment.Status.PAID)

    response = add_credit(client, "50.00", key="form-key-old")  # the browser's back button

    assert Payment.objects.count() == 2
    fresh = Payment.objects.exclude(idempotency_key="form-key-old").get()
    assert response["Location"] == fresh.checkout_url != ""
    assert stripe_server.requests[-1]["key"] == fresh.idempotency_key
