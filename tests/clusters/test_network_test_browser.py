"""In Chromium: a ready cluster's *Run network test* button (htmx, with the page's CSRF token),
the running test, and its result arriving by the page's own poll. The test thread plays the
Celery worker. With RUNCRATE_SCREENSHOTS=DIR it saves the page at 1280 and 390 px wide."""

import os
from pathlib import Path

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from clusters import lifecycle
from clusters.models import Cluster, Node
from tests.conftest import log_in
from tests.factories import ClusterFactory, LocationFactory, MachineTypeFactory

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def worker():
    with lifecycle.dispatching_to(lifecycle.CollectingDispatcher()) as dispatcher:
        yield dispatcher


def screenshot(page, name: str) -> None:
    folder = os.environ.get("RUNCRATE_SCREENSHOTS")
    if not folder:
        return
    Path(folder).mkdir(parents=True, exist_ok=True)
    for width in (1280, 390):
        page.set_viewport_size({"width": width, "height": 900})
        page.locator("#network-test").screenshot(path=f"{folder}/{name}-{width}.png")
    page.set_viewport_size({"width": 1280, "height": 900})


def test_the_button_runs_the_test_and_the_result_arrives_by_the_poll(page, owner, worker):
    now = timezone.now()
    cluster = ClusterFactory(
        project=owner.project,
        name="train",
        size=2,
        machine_type=MachineTypeFactory(
            location=LocationFactory(code="us-west-1", name="San Jose, California")
        ),
        status=Cluster.Status.READY,
        joined_at=now,
        ready_at=now,
        machines=True,
        machines__status=Node.Status.JOINED,
        machines__step=Node.Step.DONE,
    )
    log_in(page, owner)
    page.goto(f"/clusters/{cluster.pk}/machines/")
    section = page.locator("#network-test")
    expect(section.get_by_text("What Ethernet is expected to give")).to_be_visible()

    section.get_by_role("button", name="Run network test").click()

    expect(section).to_contain_text("Measuring between node-0, node-1")
    expect(section.get_by_role("button")).to_be_disabled()
    expect(page.locator("#cluster-status")).to_have_attribute("hx-trigger", "every 2s")
    assert worker.network_tests, "the click did not start a test"
    worker.run()

    expect(section).to_contain_text("0.20 GB/s at its best", timeout=10_000)
    expect(section.locator("table.network-sizes tbody tr")).to_have_count(25)
    expect(section.get_by_role("button", name="Run network test")).to_be_enabled()
    cluster.refresh_from_db()
    assert cluster.network_test["state"] == "done"
    screenshot(page, "network-test-nccl")


def test_the_agents_result_reads_well_on_a_phone(page, owner):
    now = timezone.now()
    pairs = [
        {
            "node": f"node-{i}",
            "to": "node-0",
            "gbit_s": gbit,
            "latency_ms": 0.31 if gbit else None,
            "tool": "iperf3" if gbit else None,
            "error": None if gbit else "bandwidth to 10.77.0.1:7077: timed out",
        }
        for i, gbit in ((1, 1.712), (2, 0.941), (3, None))
    ]
    cluster = ClusterFactory(
        project=owner.project,
        name="lab",
        size=4,
        status=Cluster.Status.READY,
        joined_at=now,
        ready_at=now,
        network_test={
            "state": "failed",
            "started_at": now.isoformat(),
            "expires_at": now.isoformat(),
            "finished_at": now.isoformat(),
            "machines": ["node-0", "node-1", "node-2", "node-3"],
            "method": "agent",
            "simulated": False,
            "results": {"pairs": pairs, "seconds": 3.0},
            "error": "node-3 → node-0: bandwidth to 10.77.0.1:7077: timed out",
        },
        machines=True,
        machines__status=Node.Status.JOINED,
        machines__step=Node.Step.DONE,
    )
    log_in(page, owner)
    page.set_viewport_size({"width": 390, "height": 900})
    page.goto(f"/clusters/{cluster.pk}/machines/")

    rows = page.locator("#network-test table.network-pairs tbody tr")
    expect(rows).to_have_count(3)
    expect(rows.nth(0)).to_contain_text("1.71 Gbit/s")
    expect(page.locator("#network-test .note-bad")).to_contain_text("node-3 → node-0")
    # On a phone the Ethernet note stacks under the table instead of squeezing it.
    table = page.locator("#network-test .network-test-result").bounding_box()
    note = page.locator("#network-test .network-expected").bounding_box()
    assert note["y"] >= table["y"] + table["height"] - 1
    assert note["x"] + note["width"] <= 390  # and fits the screen
    screenshot(page, "network-test-agent")
