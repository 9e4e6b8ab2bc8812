"""In Chromium: the Metrics tab of a 64-machine, 8-GPU cluster (issue 37, item 7) at 1280 and
390 px: the cluster view on the first screen at 1280, nothing sideways at either width, axe's
sweep with no finding, a node's detail picked from the picker, and the poll's redraw keeping
that node and the open table. With RUNCRATE_SCREENSHOTS=DIR it saves each width's page."""

import os
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from clusters.models import Cluster, Node
from clusters.telemetry import metrics
from tests.clusters.test_metrics_tab import gpu
from tests.factories import ClusterFactory
from tests.runcrate.test_pages_browser import (
    AXE_RUN,
    FAILING_IMPACTS,
    FAILING_RULES,
    OVERFLOW,
    axe_source,  # noqa: F401 (the fixture)
    session_cookie,
)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

MACHINES = 64
GPUS = 8
WIDTHS = {1280: 900, 390: 844}
# Whether an element is in the window and what is at its left middle is itself (not a bar).
HEADING_SEEN = """(selector) => {
    const element = document.querySelector(selector);
    const box = element.getBoundingClientRect();
    const hit = document.elementFromPoint(box.left + 10, box.top + box.height / 2);
    return box.top >= 0 && box.bottom <= window.innerHeight && element.contains(hit);
}"""


def figures(node: int, index: int) -> dict:
    """A training run's figures with a few machines that stand out: 48 to 55 idle, 56 to 62
    half busy, GPU 6 of node-13 hot, and the rest busy."""
    if 48 <= node <= 55:
        return gpu(index, 1.0, temperature_c=33.0, memory_used_mib=1024)
    if node >= 56:
        return gpu(index, 20.0 + (node * 5 + index * 3) % 30, temperature_c=48.0)
    return gpu(
        index,
        float(55 + (node * 7 + index * 11) % 45),
        temperature_c=91.0 if (node, index) == (13, 6) else float(50 + (node * 3 + index * 5) % 30),
        memory_used_mib=(30 + (node + index * 3) % 48) * 1024,
    )


@pytest.fixture
def big(owner) -> Cluster:
    """owner's 64 × 8-GPU cluster, ready 3 minutes ago, every machine reporting every 15 s
    but node-63, silent for two minutes."""
    now = timezone.now()
    cluster = ClusterFactory(
        project=owner.project,
        name="big",
        size=MACHINES,
        status=Cluster.Status.READY,
        joined_at=now - timedelta(minutes=3),
        ready_at=now - timedelta(minutes=3),
        machines=True,
        machines__status=Node.Status.JOINED,
        machines__step=Node.Step.DONE,
    )
    for node in cluster.nodes.order_by("index"):
        times = [now - timedelta(minutes=2)] if node.index == MACHINES - 1 else []
        times = times or [now - timedelta(seconds=15 * n) for n in range(11, -1, -1)]
        for at in times:
            gpus = [figures(node.index, index) for index in range(GPUS)]
            metrics.store(node.pk, cluster.pk, gpus=gpus, host=None, at=at)
    return cluster


def screenshot(page, name: str) -> None:
    folder = os.environ.get("RUNCRATE_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=f"{folder}/{name}.png")
        page.screenshot(path=f"{folder}/{name}-full.png", full_page=True)


def opened(browser, live_server, axe_source, owner, width: int, scheme: str = "light"):  # noqa: F811
    context = browser.new_context(
        base_url=live_server.url,
        viewport={"width": width, "height": WIDTHS[width]},
        color_scheme=scheme,
    )
    context.add_init_script(script=axe_source)
    context.add_cookies([session_cookie(owner, live_server.url)])
    return context, context.new_page()


@pytest.mark.parametrize("width, scheme", [(1280, "light"), (390, "light"), (1280, "dark")])
def test_the_64_machine_metrics_tab_fits_and_passes_axe(
    browser,
    live_server,
    axe_source,  # noqa: F811
    owner,
    big,
    width,
    scheme,
):
    context, page = opened(browser, live_server, axe_source, owner, width, scheme)
    page.goto(f"/clusters/{big.pk}/metrics/", wait_until="load")
    screenshot(page, f"metrics-64x8-{width}-{scheme}")

    assert page.locator(".heatmap-grid").count() == 3
    assert page.locator(".heatmap-grid rect").count() == 3 * MACHINES * GPUS
    named = page.locator(".metrics-named").inner_text()
    assert "Hottest: node-13 91°C on GPU 6" in named
    assert "Idle (every GPU under 5%): node-48, node-49" in named
    assert "Not reporting: node-63" in named
    overflow = page.evaluate(OVERFLOW)
    assert overflow["scrollWidth"] <= overflow["clientWidth"], overflow["culprits"]
    if width == 1280:
        # The cluster view, words and three heatmaps, on the first screen.
        bottom = page.evaluate("document.querySelector('.heatmaps').getBoundingClientRect().bottom")
        assert bottom <= WIDTHS[width]
    else:
        # Each heatmap is drawn whole across the phone's width, its cells still cells.
        box = page.locator(".heatmap-grid").first.bounding_box()
        assert box is not None and box["width"] <= width and box["width"] / 64 >= 4
    assert page.evaluate(AXE_RUN, [list(FAILING_IMPACTS), FAILING_RULES]) == []
    page.locator("#metrics-every-gpu > summary").click()
    assert page.evaluate(AXE_RUN, [list(FAILING_IMPACTS), FAILING_RULES]) == []
    context.close()


def test_a_node_picked_stays_with_the_open_table_across_the_poll(
    browser,
    live_server,
    axe_source,  # noqa: F811
    owner,
    big,
):
    context, page = opened(browser, live_server, axe_source, owner, 1280)
    page.goto(f"/clusters/{big.pk}/metrics/", wait_until="load")
    page.locator("#metrics-every-gpu > summary").click()
    page.select_option("#metrics-node", "node-13")
    page.get_by_role("button", name="Show").click()
    page.wait_for_selector("#metrics-node-13 .gpu-table")
    assert "node=node-13" in page.url
    # Scrolled to it (below the open table's 64 rows), its heading not under the sticky bars.
    assert page.evaluate(HEADING_SEEN, "#metrics-node-13 h3")
    assert page.locator("#metrics-node-13 .metric-chart").count() == 4
    screenshot(page, "metrics-64x8-node-13-1280")
    assert page.evaluate(AXE_RUN, [list(FAILING_IMPACTS), FAILING_RULES]) == []
    page.evaluate("document.getElementById('cluster-tab').dataset.drawn = 'before'")
    page.evaluate("document.getElementById('metrics-every-gpu').open = true")

    node = big.nodes.get(index=13)
    metrics.store(node.pk, big.pk, gpus=[gpu(0, 12.0)], host=None, at=timezone.now())
    metrics.bump_metrics_version(big.pk)
    # The page's poll (every 10 s) redraws the panel: a new element, the same node and table.
    # A poll already under way when the report was stored may redraw first with what it read,
    # so the wait is for the redraw that shows the new report (bounded: 25 s).
    redrawn = "() => document.getElementById('cluster-tab').dataset.drawn !== 'before'"
    shown = page.locator("#metrics-node-13")
    for _ in range(100):  # the page's CSP refuses wait_for_function's eval: asked, in turn
        if page.evaluate(redrawn) and "1 GPU · 12%" in shown.inner_text():
            break
        page.wait_for_timeout(250)
    assert page.evaluate(redrawn), "the poll did not redraw the panel"
    assert shown.inner_text().count("1 GPU · 12%") == 1
    assert page.evaluate("document.getElementById('metrics-every-gpu').open")
    context.close()


CELL = """([figure, n]) => {
    const cell = document.querySelectorAll(`.heatmap-${figure} rect`)[n];
    return [cell.getAttribute("class"), cell.querySelector("title").textContent];
}"""


def test_a_report_redraws_the_cells_in_place_keeping_the_node_and_the_open_table(
    browser,
    live_server,
    axe_source,  # noqa: F811
    owner,
    big,
):
    """A report that moves only the figures (issue 38): the poll sends them (#metrics-now) and
    the page's script draws them into the cells and the table it has; the panel, the picked
    node and the open table stay the same elements."""
    context, page = opened(browser, live_server, axe_source, owner, 1280)
    page.goto(f"/clusters/{big.pk}/metrics/?node=node-13", wait_until="load")
    page.locator("#metrics-every-gpu > summary").click()
    page.evaluate("document.getElementById('cluster-tab').dataset.drawn = 'before'")
    cell = 13 * GPUS + 3  # node-13's GPU 3: a column of 8 per node
    assert page.evaluate(CELL, ["utilization", cell])[1] != "node-13 GPU 3: 99%"

    node = big.nodes.get(index=13)
    hot = [gpu(i, 99.0, temperature_c=95.0) if i == 3 else figures(13, i) for i in range(GPUS)]
    metrics.store(node.pk, big.pk, gpus=hot, host=None, at=timezone.now())
    # The page's poll (every 10 s) brings the figures: asked in turn (the page's CSP refuses
    # wait_for_function's eval), at most 25 s.
    for _ in range(100):
        if page.evaluate(CELL, ["utilization", cell])[1] == "node-13 GPU 3: 99%":
            break
        page.wait_for_timeout(250)
    assert page.evaluate(CELL, ["utilization", cell]) == ["heat-l4", "node-13 GPU 3: 99%"]
    assert page.evaluate(CELL, ["temperature", cell]) == ["heat-l4", "node-13 GPU 3: 95°C"]
    row = page.locator("#metrics-every-gpu tbody tr").nth(13).locator("td").nth(3)
    assert row.inner_text().split("\n")[0] == "99%"
    # Nothing of the panel was redrawn: the same element, the same picked node, open table.
    assert page.evaluate("document.getElementById('cluster-tab').dataset.drawn") == "before"
    assert page.evaluate("document.getElementById('metrics-every-gpu').open")
    # The picked node's GPUs now, out of band: GPU 3's row says the report.
    picked = page.locator("#metrics-node-now .gpu-table tbody tr").nth(3).inner_text()
    assert picked.split("\t")[:2] == ["3", "99%"] and "95°C" in picked
    assert "node-13 95°C on GPU 3" in page.locator(".metrics-named").inner_text()
    assert page.evaluate(AXE_RUN, [list(FAILING_IMPACTS), FAILING_RULES]) == []
    context.close()
