"""In Chromium: the acceptance report says in which round each machine was measured and against
which peer (issue 38), fits a phone and passes axe. With RUNCRATE_SCREENSHOTS=DIR it saves the
report at 1280 and 390 px wide."""

import os
from pathlib import Path

import pytest
from django.utils import timezone

from clusters.lifecycle.rounds import placements
from tests.clusters.front import ready_cluster
from tests.runcrate.test_pages_browser import (
    AXE_RUN,
    FAILING_IMPACTS,
    FAILING_RULES,
    OVERFLOW,
    axe_source,  # noqa: F401 (the fixture)
    session_cookie,
)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

NODES = 5
WIDTHS = {1280: 900, 390: 844}


def report(now) -> dict:
    placed = placements(list(range(NODES)))
    return {
        "measured_at": now.isoformat(),
        "expected": {"gpu": "H100", "gpus_per_machine": 8, "memory_gib": 80, "link_mbit": 1000},
        "nodes": [
            {
                "name": f"node-{i}",
                "gpus": [{"name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559}] * 8,
                "vcpus": 208,
                "memory_mib": 1843200,
                "reachability": {f"node-{p}": True for p in range(NODES) if p != i},
                "latency_ms": 0.31,
                "bandwidth_mbit": 1650.0 + i,
                "method": "iperf3",
                "shared": "nfs" if i else None,
                "round": placed[i].round,
                "peer": f"node-{placed[i].peer}",
            }
            for i in range(NODES)
        ],
    }


@pytest.mark.parametrize("width", [1280, 390])
def test_the_report_names_each_machines_round_and_peer(
    browser,
    live_server,
    axe_source,  # noqa: F811
    owner,
    width,
):
    cluster = ready_cluster(owner.project, size=NODES, acceptance=report(timezone.now()))
    context = browser.new_context(
        base_url=live_server.url, viewport={"width": width, "height": WIDTHS[width]}
    )
    context.add_init_script(script=axe_source)
    context.add_cookies([session_cookie(owner, live_server.url)])
    page = context.new_page()
    page.goto(f"/clusters/{cluster.pk}/machines/", wait_until="load")

    rows = page.locator("table.acceptance-table tbody tr")
    assert rows.count() == NODES
    assert "to node-1, round 1" in rows.nth(0).inner_text()
    assert "to node-4, round 2" in rows.nth(3).inner_text()
    assert "to node-0, round 3" in rows.nth(4).inner_text()
    folder = os.environ.get("RUNCRATE_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        page.locator("#acceptance").scroll_into_view_if_needed()
        page.locator("#cluster-reports").screenshot(path=f"{folder}/acceptance-rounds-{width}.png")
    overflow = page.evaluate(OVERFLOW)
    assert overflow["scrollWidth"] <= overflow["clientWidth"], overflow["culprits"]
    assert page.evaluate(AXE_RUN, [list(FAILING_IMPACTS), FAILING_RULES]) == []
    context.close()
