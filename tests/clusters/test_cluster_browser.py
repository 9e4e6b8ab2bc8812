"""In Chromium: create a 2-node cluster, watch its page reach ready, terminate it.

The live server has no Celery worker, so the test thread plays the worker: it runs `advance`
and the work the lifecycle hands off, while the page polls on its own. The simulated machines
boot in a fraction of a second (RUNCRATE_SIM_SPEED); the browser waits for the page to show
what the database already says.
"""

import re
from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from clusters import lifecycle
from clusters.models import Cluster
from tests.billing.conftest import bill_cluster
from tests.clusters.front import credit, machine_type_with_hosts, ssh_key
from tests.conftest import log_in
from tests.factories import ClusterFactory, LocationFactory

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


# Records each status the page's badge shows, in order, for as long as the page is not reloaded.
WATCH_STATUSES = """() => {
    const badge = () => document.querySelector("#cluster-status-badge").textContent;
    window.statuses = [badge()];
    new MutationObserver(() => {
        if (badge() !== window.statuses.at(-1)) window.statuses.push(badge());
    }).observe(document.querySelector("main"), {childList: true, subtree: true});
}"""


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

    page.evaluate(WATCH_STATUSES)

    run_until(page, worker, cluster.pk, Cluster.Status.READY)

    expect(badge).to_have_text("ready", timeout=10_000)
    expect(page.locator(".stepper li.done")).to_have_count(5)
    # Every status by the poll: no reload.
    assert page.evaluate("window.statuses") == ["provisioning", "ready"]
    # The tabs swap in place (htmx) and each says so in the URL.
    tabs = page.get_by_role("navigation", name="demo")
    tabs.get_by_role("link", name="Machines").click()
    page.wait_for_url(f"**/clusters/{cluster.pk}/machines/")
    expect(tabs.get_by_role("link", name="Machines")).to_have_attribute("aria-current", "page")
    expect(page.get_by_role("region", name="Machines").first).to_be_visible()
    expect(page.locator("#node-0")).to_contain_text("joined")
    expect(page.locator("#node-1")).to_contain_text("joined")
    tabs.get_by_role("link", name="Events").click()
    page.wait_for_url(f"**/clusters/{cluster.pk}/events/")
    events = list(cluster.events.order_by("-at", "-pk").values_list("message", flat=True))
    expect(page.locator("#event-rows tr")).to_have_count(len(events))
    expect(page.locator("#event-rows tr").first).to_contain_text(events[0])
    assert page.evaluate("window.statuses") == ["provisioning", "ready"]  # still no reload

    page.get_by_role("link", name="Terminate…").click()
    expect(page.get_by_role("heading")).to_contain_text("Terminate demo?")
    page.get_by_role("button", name="Terminate demo").click()
    page.wait_for_url(f"**/clusters/{cluster.pk}/")
    expect(badge).to_have_text("terminating")
    page.evaluate(WATCH_STATUSES)

    run_until(page, worker, cluster.pk, Cluster.Status.TERMINATED)

    expect(badge).to_have_text("terminated", timeout=10_000)
    expect(page.locator("#cluster-status")).not_to_have_attribute("hx-trigger", "every 2s")
    assert page.evaluate("window.statuses") == ["terminating", "terminated"]
    expect(page.locator(".stepper li").last).to_have_text("Terminated")
    page.get_by_role("navigation", name="demo").get_by_role("link", name="Machines").click()
    expect(page.locator("#node-1")).to_contain_text("ended")


def test_the_cost_so_far_moves_on_an_open_ready_page(page, owner):
    """No poll brings anything (the cluster does not change, the meter does not run): the
    figure moves in the browser, from what the server wrote, within 20 seconds."""
    started = timezone.now() - timedelta(minutes=10)
    cluster = bill_cluster(owner.project, size=2, price="36.00", at=started)  # 2 cents a second
    log_in(page, owner)

    page.goto(f"/clusters/{cluster.pk}/")
    figure = page.locator("#cluster-cost .cost-figure")
    first = figure.inner_text()
    assert first.startswith("$")

    expect(figure).not_to_have_text(first, timeout=20_000)
    later = float(figure.inner_text().lstrip("$").replace(",", ""))
    assert later > float(first.lstrip("$").replace(",", ""))
    expect(page.locator("#cluster-cost .cost-uptime")).to_contain_text("min")


def test_the_deadlines_count_down_in_the_browser_without_a_poll(page, owner):
    cluster = ClusterFactory(project=owner.project, name="slow", size=2, machines=True)
    deadline = cluster.nodes.get(index=1).step_deadline
    log_in(page, owner)

    def refuse(route) -> None:  # whatever the poll would bring, it brings nothing
        route.abort()

    page.route(f"**/clusters/{cluster.pk}/machines/?*", refuse)
    page.clock.install()
    page.goto(f"/clusters/{cluster.pk}/machines/")
    countdown = page.locator("#node-1 [data-deadline]")
    assert countdown.get_attribute("data-deadline") == deadline.isoformat(timespec="milliseconds")
    before = seconds_left(countdown.inner_text())

    # The page goes on polling (each poll refused): waited for as the browser sends it, since
    # the route's handler may run only after the clock has moved on.
    with page.expect_request(f"**/clusters/{cluster.pk}/machines/?*", timeout=10_000):
        page.clock.run_for(5_000)

    after = seconds_left(countdown.inner_text())
    assert 4 <= before - after <= 6, (before, after)


def seconds_left(text: str) -> int:
    minutes, seconds = re.fullmatch(r"(\d+)m (\d\d)s left", text).groups()
    return int(minutes) * 60 + int(seconds)
