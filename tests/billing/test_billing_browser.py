"""The Billing page in a real browser: the demo user opens a cluster line to its machines."""

import io
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

from accounts.models import User
from billing.meter import charge_accrued
from config.management.commands.seed_demo import DEMO_EMAIL, DEMO_PASSWORD
from offers.models import MachineType
from tests.billing.conftest import bill_cluster

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def demo(transactional_db, settings):
    settings.DEBUG = True  # seed_demo makes its user only with DEBUG on (the test runner's is off)
    call_command("seed_demo", stdout=io.StringIO())
    user = User.objects.get(email=DEMO_EMAIL)
    project = user.memberships.get().project
    machine_type = MachineType.objects.order_by("price_per_hour").first()
    now = timezone.now()
    cluster = bill_cluster(
        project, size=3, at=now - timedelta(hours=2), name="llama-ft", machine_type=machine_type
    )
    charge_accrued(now=now)
    return cluster


def test_it_opens_a_cluster_line_to_its_machines(page, demo):
    page.goto("/accounts/login/")
    page.fill("input[name=username]", DEMO_EMAIL)
    page.fill("input[name=password]", DEMO_PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url("**/clusters/")

    page.click("nav >> text=Billing")
    page.wait_for_url("**/billing/")
    line = page.locator("a.line-toggle", has_text="Cluster usage — llama-ft")
    line.click()

    rows = page.locator(f"#machines-{demo.pk} tr.machine-row")
    rows.first.wait_for()
    assert rows.count() == 3
    assert [rows.nth(i).locator("td").first.inner_text() for i in range(3)] == [
        "node-0",
        "node-1",
        "node-2",
    ]
    assert page.url.endswith("/billing/")  # opened in place, not by following the link
    assert demo.machine_type.location.code in rows.first.inner_text()

    page.locator(f"#machines-{demo.pk} >> text=Hide").click()
    page.locator(f"#machines-{demo.pk} tr.machine-row").first.wait_for(state="detached")
