"""In Chromium: a lost worker replaced from the Machines tab (its Replace button, the confirm
page, the POST with the page's CSRF token, the rows after), the degraded banner's link, and the
repair policy's forms. With RUNCRATE_SCREENSHOTS=DIR it saves each page at 1280 and 390 px
wide."""

import os
from datetime import timedelta
from pathlib import Path

import pytest
import time_machine
from django.utils import timezone
from playwright.sync_api import expect

from clusters import lifecycle
from clusters.models import Cluster, Node
from tests.clusters.front import credit, ssh_key
from tests.clusters.lifecycle_kit import Sim, create, inventory
from tests.conftest import log_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

BOOT = 180


def screenshot(page, name: str) -> None:
    folder = os.environ.get("RUNCRATE_SCREENSHOTS")
    if not folder:
        return
    Path(folder).mkdir(parents=True, exist_ok=True)
    for width in (1280, 390):
        page.set_viewport_size({"width": width, "height": 900})
        page.screenshot(path=f"{folder}/{name}-{width}.png", full_page=True)
    page.set_viewport_size({"width": 1280, "height": 900})


@pytest.fixture
def degraded(owner) -> Cluster:
    """owner's Slurm-less 3-node cluster, ready, then node-1 lost and node-2 drained."""
    credit(owner.project, "1000.00")
    ssh_key(owner.project, "laptop")
    machine_type = inventory(hosts=4, boot_seconds=BOOT)
    # Back far enough that the machines joined and node-1 was lost before now.
    start = timezone.now() - timedelta(seconds=BOOT * 3)
    with time_machine.travel(start, tick=False) as clock, Sim() as sim:
        cluster = create(owner.project, machine_type, nodes=3, user=owner.user, name="train")
        sim.run_until(clock, start + timedelta(seconds=BOOT * 2))
        lost = cluster.nodes.get(index=1)
        assert lifecycle.mark_lost(node_id=lost.pk, last_heard=timezone.now(), why="silent")
    Node.objects.filter(cluster=cluster, index=2).update(
        drained="GPU 3: 2 uncorrectable ECC errors", drained_at=timezone.now()
    )
    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.DEGRADED
    return cluster


def test_a_lost_worker_is_replaced_from_the_machines_tab(page, owner, degraded):
    log_in(page, owner)
    page.goto(f"/clusters/{degraded.pk}/")
    expect(page.get_by_role("link", name="Replace node-1…")).to_be_visible()
    screenshot(page, "repair-overview")

    page.goto(f"/clusters/{degraded.pk}/machines/")
    row = page.locator("tr#node-1")
    expect(page.locator("tr#node-2")).to_contain_text("Drained: GPU 3")
    screenshot(page, "repair-machines")
    with Sim():
        row.get_by_role("link", name="Replace node-1").click()
        expect(page.get_by_role("heading", name="Replace node-1?")).to_be_visible()
        expect(page.locator(".replace-card")).to_contain_text("$20.00 per hour")
        screenshot(page, "repair-confirm")
        page.get_by_role("button", name="Replace node-1").click()
        expect(page.get_by_text("Replacing node-1: a new machine")).to_be_visible()
    expect(page.locator("tr#node-1")).to_contain_text("replaces the machine lost at")
    screenshot(page, "repair-replaced")

    page.goto(f"/clusters/{degraded.pk}/nodes/node-0/replace/")
    expect(page.get_by_text("cannot be replaced in place")).to_be_visible()
    screenshot(page, "repair-head-refused")


def test_the_repair_policy_is_chosen_at_create_and_changed_later(page, owner, degraded):
    log_in(page, owner)
    page.goto(f"/clusters/{degraded.pk}/machines/")
    page.get_by_label("Repair policy").select_option("auto")
    page.get_by_role("button", name="Save").click()
    expect(page.get_by_text("Repair policy: replace automatically.")).to_be_visible()
    degraded.refresh_from_db()
    assert degraded.repair_policy == Cluster.RepairPolicy.AUTO

    page.goto(f"/clusters/new/?offer={degraded.machine_type.slug}&nodes=2")
    expect(page.get_by_label("Repair policy")).to_have_value("ask")
    screenshot(page, "repair-create-form")


def test_a_lost_head_says_where_its_button_would_be_that_it_cannot_be_replaced(
    page, owner, degraded
):
    head = degraded.nodes.get(index=0)
    with Sim():
        assert lifecycle.mark_lost(node_id=head.pk, last_heard=timezone.now(), why="silent")
    log_in(page, owner)
    page.goto(f"/clusters/{degraded.pk}/machines/")

    expect(page.locator("tr#node-0")).to_contain_text("it cannot be replaced in place")
    screenshot(page, "repair-head-lost")
