"""After paying, the payment page leads on (docs/billing.md, "Adding credit"): back to where the
top-up was asked for (the create form whose balance was short), or to Billing and a cluster,
never to a dead end. The way back is kept through a failed try."""

import re
from decimal import Decimal
from html import unescape
from urllib.parse import quote

import pytest
from django.test import Client

from billing.models import Payment
from tests.clusters.front import credit, machine_type_with_hosts


@pytest.fixture
def demo(settings):
    settings.RUNCRATE_DEMO = True
    settings.STRIPE_SECRET_KEY = ""
    settings.STRIPE_WEBHOOK_SECRET = ""


def _pay(client: Client, *, key: str, next_url: str = "") -> Payment:
    data = {"amount": "100.00", "idempotency_key": key}
    if next_url:
        data["next"] = next_url
    client.post("/billing/credit/", data)
    payment = Payment.objects.get(idempotency_key=key)
    client.post(f"/billing/payments/{payment.pk}/demo/pay/")
    return payment


def _hrefs(html: str) -> list[str]:
    return [unescape(href) for href in re.findall(r'<a class="btn[^"]*" href="([^"]*)"', html)]


def test_the_create_form_s_add_credit_leads_through_payment_back_to_the_same_form(owner, demo):
    machine_type = machine_type_with_hosts(free=4, price_per_hour=Decimal("20.00"))
    credit(owner.project, "30.00")
    client = owner.browser_client()
    form_url = f"/clusters/new/?offer={machine_type.slug}&nodes=4"

    form = client.get(form_url).content.decode()
    add_credit = unescape(re.search(r'href="(/billing/\?next=[^"]*)">Add credit</a>', form)[1])
    assert add_credit == f"/billing/?next={quote(form_url, safe='')}#topup-title"
    billing = client.get(add_credit).content.decode()
    assert f'<input type="hidden" name="next" value="{form_url.replace("&", "&amp;")}">' in billing
    assert "the payment page leads back to the create form" in billing

    payment = _pay(client, key="return-1", next_url=form_url)
    page = client.get(f"/billing/payments/{payment.pk}/").content.decode()

    assert "$100.00 was added to your balance" in page
    assert "Next: back to the create form" in page
    assert _hrefs(page) == [form_url, "/billing/"]
    assert "creating this cluster needs at least" not in client.get(form_url).content.decode()


def test_a_top_up_from_billing_itself_leads_to_creating_a_cluster_or_back_to_billing(owner, demo):
    client = owner.browser_client()

    payment = _pay(client, key="return-2")
    page = client.get(f"/billing/payments/{payment.pk}/").content.decode()

    assert "Next: " in page
    assert _hrefs(page) == ["/offers/", "/billing/"]


def test_a_failed_payment_keeps_the_way_back_for_the_next_try(owner, demo):
    client = owner.browser_client()
    client.post(
        "/billing/credit/",
        {"amount": "100.00", "idempotency_key": "return-3", "next": "/clusters/"},
    )
    payment = Payment.objects.get(idempotency_key="return-3")
    Payment.objects.filter(pk=payment.pk).update(status=Payment.Status.FAILED)

    page = client.get(f"/billing/payments/{payment.pk}/").content.decode()

    assert _hrefs(page) == ["/billing/?next=%2Fclusters%2F#topup-title"]
    assert "Try again on Billing" in page


@pytest.mark.parametrize("next_url", ["https://evil.invalid/", "//evil.invalid/x", "javascript:x"])
def test_a_way_back_off_this_site_is_ignored(owner, demo, next_url):
    client = owner.browser_client()

    billing = client.get("/billing/", {"next": next_url}).content.decode()
    payment = _pay(client, key=f"return-{len(next_url)}", next_url=next_url)
    page = client.get(f"/billing/payments/{payment.pk}/").content.decode()

    assert 'name="next"' not in billing
    assert "evil" not in page and "javascript" not in page
    assert "/billing/" in _hrefs(page)
