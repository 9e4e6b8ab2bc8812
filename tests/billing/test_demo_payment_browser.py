"""In Chromium, in the demo that `make run` starts (no Stripe keys): a new user signs up, adds
credit with the demo payment and creates a cluster, without one shell command (issue 21).

The live server has no Celery worker: the test thread plays it, as in
tests/clusters/test_cluster_browser.py."""

import io
import re
from decimal import Decimal

import pytest
from django.core.management import call_command
from playwright.sync_api import expect

from billing.models import LedgerEntry, Payment
from clusters import lifecycle
from clusters.models import Cluster
from config.management.commands.seed_demo import DEMO_SSH_KEY

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

EMAIL = "newcomer@example.com"
PASSWORD = "a-long-new-password"
OFFER = "cac1-h100x2-vm"


@pytest.fixture
def the_demo(transactional_db, settings):
    settings.DEBUG = True  # seed_demo makes its user only with DEBUG on (the test runner's is off)
    call_command("seed_demo", stdout=io.StringIO())
    settings.RUNCRATE_DEMO = True
    settings.STRIPE_SECRET_KEY = ""
    settings.STRIPE_WEBHOOK_SECRET = ""
    settings.RUNCRATE_SIM_SPEED = 600


def test_a_new_user_pays_with_the_demo_payment_and_creates_a_cluster(page, the_demo):
    page.goto("/accounts/signup/")
    page.fill("input[name=email]", EMAIL)
    page.fill("input[name=password1]", PASSWORD)
    page.fill("input[name=password2]", PASSWORD)
    page.get_by_role("button", name="Sign up").click()
    page.wait_for_url("**/clusters/")

    page.click("nav >> text=Billing")
    page.wait_for_url("**/billing/")
    topup = page.locator("section.topup")
    expect(topup).to_contain_text("no card is charged")
    expect(topup).not_to_contain_text("STRIPE_")
    topup.get_by_label("Amount").fill("120")
    topup.get_by_role("button", name="Add credit").click()

    page.wait_for_url(re.compile(r".*/billing/payments/\d+/demo/$"))
    expect(page.get_by_role("heading", level=1)).to_have_text("Demo payment of $120.00")
    expect(page.locator("main")).to_contain_text("No card is charged: this is the demo")
    # The same page in a second tab: its Pay is the confirmation posted twice.
    again = page.context.new_page()
    again.goto(page.url)
    page.get_by_role("button", name="Pay $120.00 (demo)").click()

    page.wait_for_url(re.compile(r".*/billing/payments/\d+/$"))
    expect(page.locator("#payment-status")).to_contain_text("$120.00 was added to your balance")
    expect(page.locator(".topbar-balance")).to_contain_text("$120.00")
    again.get_by_role("button", name="Pay $120.00 (demo)").click()
    again.wait_for_url(page.url)
    expect(again.locator("#payment-status")).to_contain_text("$120.00 was added")
    again.reload()
    expect(again.locator(".topbar-balance")).to_contain_text("$120.00")  # not $240.00
    again.goto(page.url + "demo/")  # a paid payment's demo page sends the user on
    assert again.url == page.url
    again.close()
    [line] = LedgerEntry.objects.filter(kind=LedgerEntry.Kind.TOPUP)
    assert (line.amount, line.note) == (Decimal("120.00"), "Demo top-up (no card charged)")
    assert line.project.memberships.get().user.email == EMAIL
    assert Payment.objects.get().status == Payment.Status.PAID

    page.goto("/accounts/")
    keys = page.locator("#ssh-keys")
    keys.get_by_label("Public key").fill(DEMO_SSH_KEY)
    keys.get_by_role("button", name="Add key").click()
    expect(keys).to_contain_text("demo@runcrate.localhost")

    page.goto(f"/clusters/new/?offer={OFFER}&nodes=2")
    page.fill("input[name=name]", "first-run")
    page.get_by_role("button", name="Create cluster").click()
    page.wait_for_url(re.compile(r".*/clusters/\d+/$"))
    cluster = Cluster.objects.get(name="first-run")
    assert cluster.project == line.project
    expect(page.locator("#cluster-status-badge")).to_have_text("provisioning")

    with lifecycle.dispatching_to(lifecycle.CollectingDispatcher()) as work:
        for _ in range(200):
            work.run()
            lifecycle.advance(cluster_id=cluster.pk)
            work.run()
            cluster.refresh_from_db()
            if cluster.status == Cluster.Status.READY:
                break
            page.wait_for_timeout(100)
    assert cluster.status == Cluster.Status.READY
    expect(page.locator("#cluster-status-badge")).to_have_text("ready", timeout=10_000)
