"""In Chromium: the Machines tab of a 64-machine, 8-GPU cluster after a report (issue 38, item
2): the poll swaps each row's GPUs cell in place, the rows themselves (and what the user opened
in them) and the header stay the same elements, report after report, at 1280 and 390 px,
nothing sideways, axe's sweep with no finding. With RUNCRATE_SCREENSHOTS=DIR it saves each
width's page."""

import pytest
from django.utils import timezone

from clusters.telemetry import metrics
from tests.clusters.test_metrics_browser import GPUS, big, opened, screenshot  # noqa: F401
from tests.clusters.test_metrics_tab import gpu
from tests.runcrate.test_pages_browser import (
    AXE_RUN,
    FAILING_IMPACTS,
    FAILING_RULES,
    OVERFLOW,
    axe_source,  # noqa: F401 (the fixture)
)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def wait_for(page, script: str, what: str) -> None:
    for _ in range(100):  # the page's CSP refuses wait_for_function's eval: asked, in turn
        if page.evaluate(script):
            return
        page.wait_for_timeout(250)
    raise AssertionError(what)


@pytest.mark.parametrize("width", [1280, 390])
def test_a_report_swaps_each_rows_gpus_cell_and_keeps_the_rows(
    browser,
    live_server,
    axe_source,  # noqa: F811
    owner,
    big,  # noqa: F811
    width,
):
    context, page = opened(browser, live_server, axe_source, owner, width)
    page.goto(f"/clusters/{big.pk}/machines/", wait_until="load")
    assert page.locator("#node-rows tr").count() == 64
    # Marks the poll would wipe if it sent the rows again.
    page.evaluate("document.getElementById('node-13').dataset.drawn = 'before'")
    page.evaluate("document.getElementById('node-63').dataset.drawn = 'before'")
    page.evaluate("document.getElementById('cluster-status').dataset.drawn = 'before'")

    node = big.nodes.get(index=13)
    gpus = [gpu(index, 12.0) for index in range(GPUS)]
    metrics.store(node.pk, big.pk, gpus=gpus, host=None, at=timezone.now())
    wait_for(
        page,
        "() => document.getElementById('node-13-gpus').textContent.includes('8 GPUs · 12%')",
        "the poll did not swap node-13's GPUs cell",
    )
    screenshot(page, f"machines-64x8-after-poll-{width}")

    assert page.evaluate("document.getElementById('node-13').dataset.drawn") == "before"
    assert page.evaluate("document.getElementById('node-63').dataset.drawn") == "before"
    assert page.locator("#node-rows tr").count() == 64
    assert "silent since" in page.locator("#node-63-gpus").inner_text()
    # Only the figures moved: the header was left as it was, and the page's poll now includes
    # the new metrics version (#metrics-shown), so the next report is drawn too.
    assert page.evaluate("document.getElementById('cluster-status').dataset.drawn") == "before"
    gpus = [gpu(index, 34.0) for index in range(GPUS)]
    metrics.store(node.pk, big.pk, gpus=gpus, host=None, at=timezone.now())
    wait_for(
        page,
        "() => document.getElementById('node-13-gpus').textContent.includes('8 GPUs · 34%')",
        "the poll did not draw the second report",
    )
    assert page.evaluate("document.getElementById('cluster-status').dataset.drawn") == "before"
    overflow = page.evaluate(OVERFLOW)
    assert overflow["scrollWidth"] <= overflow["clientWidth"], overflow["culprits"]
    assert page.evaluate(AXE_RUN, [list(FAILING_IMPACTS), FAILING_RULES]) == []
    context.close()
