"""In Chromium: create a 2-node cluster, watch its page reach ready, terminate it.

The live server has no Celery worker, so the test thread plays the worker: it runs `advance`
and the work the lifecycle hands off, while the page polls on its own. The simulated machines
boot in a fraction of a second (RUNCRATE_SIM_SPEED); the browser waits for the page to show
what the database already says.
"""

from decimal import Decimal

import pytest
from playwright.sync_api import expect

from clusters import lifecycle
from clusters.models import Cluster
from tests.clusters.front import credit, machine_type_with_hosts, ssh_key
from tests.conftest import log_in
from tests.factories import LocationFactory

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

ROUNDS = 200


@pytest.fixture
def worker(settings):
    """The test thread's stand-in for Celery: `worker(cluster_id)` runs one tick."""
    settings.RUNCRATE_SIM_SPEED = 600  # a 60-second boot takes a tenth of a second
    with lifecycle.dispatching_to(lifecycle.CollectingDispatcher()) as dispatcher:

        def tick(cluster_id: int) -> str:
            dispatcher.run()
            lifecycle.advance(cluster_id=cluster_id)
            dispatcher.run()
            return Cluster.objects.get(pk=cluster_id).status

        yield tick


def run_until(page, worker, cluster_id: int, status: str) -> None:
    for _ in range(ROUNDS):
        if worker(cluster_id) == status:
            return
        page.wait_for_timeout(100)
    pytest.fail(f"cluster {cluster_id} never reached {status}")


def test_it_creates_a_cluster_watches_it_get_ready_and_terminates_it(page, owner, worker):
    machine_type = machine_type_with_hosts(
        free=3,
        slug="demo-h100x8-vm",
        boot_seconds=60,
        price_per_hour=Decimal("2.50"),
        location=LocationFactory(code="us-east-2", name="Columbus, Ohio"),
    )
    ssh_key(owner.project, "laptop")
    credit(owner.project, "100.00")
    log_in(page, owner)

    page.goto(f"/clusters/new/?offer={machine_type.slug}&nodes=2")
    expect(page.locator("#price-summary")).to_contain_text("$5.00")
    page.fill("input[name=name]", "demo")
    page.get_by_role("button", name="Create cluster").click()
    page.wait_for_url("**/clusters/*/")
    cluster = Cluster.objects.get(project=owner.project, name="demo")
    badge = page.locator("#cluster-status-badge")
    expect(badge).to_have_text("provisioning")
    expect(page.locator("#cluster-status")).to_have_attribute("hx-trigger", "every 2s")

    run_until(page, worker, cluster.pk, Cluster.Status.READY)

    expect(badge).to_have_text("ready", timeout=10_000)
    expect(page.locator(".stepper li.done")).to_have_count(5)
    expect(page.locator("#node-1")).to_contain_text("joined")

    page.get_by_role("link", name="Terminate…").click()
    expect(page.get_by_role("heading")).to_contain_text("Terminate demo?")
    page.get_by_role("button", name="Terminate demo").click()
    page.wait_for_url(f"**/clusters/{cluster.pk}/")
    expect(badge).to_have_text("terminating")

    run_until(page, worker, cluster.pk, Cluster.Status.TERMINATED)

    expect(badge).to_have_text("terminated", timeout=10_000)
    expect(page.locator("#cluster-status")).not_to_have_attribute("hx-trigger", "every 2s")
