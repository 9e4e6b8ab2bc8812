"""In Chromium: workers added from the Machines tab (its form, the confirm page with the added
price and the new total, the POST with the page's CSRF and plan tokens, the tab after), and
Cancel adding nothing. With RUNCRATE_SCREENSHOTS=DIR it saves each page at 1280 and 390 px
wide."""

from datetime import timedelta

import pytest
import time_machine
from django.utils import timezone
from playwright.sync_api import expect

from clusters.models import Cluster, Node
from tests.clusters.front import credit, ssh_key
from tests.clusters.lifecycle_kit import Sim, create, inventory
from tests.clusters.test_repair_browser import screenshot
from tests.conftest import log_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

BOOT = 180


@pytest.fixture
def ready(owner) -> Cluster:
    """owner's ready 2-node cluster ($20.00 per machine-hour), with two hosts to spare."""
    credit(owner.project, "1000.00")
    ssh_key(owner.project, "laptop")
    machine_type = inventory(hosts=4, boot_seconds=BOOT)
    start = timezone.now() - timedelta(seconds=BOOT * 3)
    with time_machine.travel(start, tick=False) as clock, Sim() as sim:
        cluster = create(owner.project, machine_type, nodes=2, user=owner.user, name="train")
        sim.run_until(clock, start + timedelta(seconds=BOOT * 2))
    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.READY
    return cluster


def live(cluster: Cluster) -> int:
    return cluster.nodes.filter(status__in=Node.LIVE).count()


def test_workers_are_added_after_the_confirm_page_shows_their_price(page, owner, ready):
    log_in(page, owner)
    page.goto(f"/clusters/{ready.pk}/machines/")
    page.get_by_label("Add workers").fill("2")
    page.get_by_role("button", name="Add…", exact=True).click()

    expect(page.get_by_role("heading", name="Add 2 workers to train?")).to_be_visible()
    card = page.locator(".workers-card")
    expect(card).to_contain_text("+$40.00 per hour for 2 machines of $20.00 per hour")
    expect(card).to_contain_text("2 machines, $40.00 per hour")
    expect(card).to_contain_text("4 machines, $80.00 per hour")
    screenshot(page, "add-workers-confirm")
    assert live(ready) == 2  # the page reserved nothing

    page.get_by_role("link", name="Cancel").click()
    expect(page).to_have_url(f"{page.url.split('/clusters/')[0]}/clusters/{ready.pk}/machines/")
    assert live(ready) == 2

    page.goto(f"/clusters/{ready.pk}/workers/?count=2")
    with Sim():
        page.get_by_role("button", name="Add 2 workers for +$40.00/h").click()
        expect(page.get_by_text("Adding 2 workers: each is billed once it is up.")).to_be_visible()
    assert live(ready) == 4
    screenshot(page, "add-workers-added")
