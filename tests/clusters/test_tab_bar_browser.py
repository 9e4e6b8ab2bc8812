"""In Chromium: a cluster's tab bar shows every tab on a 390 px phone (it wraps onto a second
row there, nothing cut off or hidden in a box scrolled sideways) and keeps one row at 1280 px
(docs/accessibility.md, "The cluster's tabs")."""

import os
from pathlib import Path

import pytest
from django.utils import timezone

from clusters.models import Cluster, Node
from clusters.web.presenters import TABS
from tests.conftest import log_in
from tests.factories import ClusterFactory

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# Each tab's box and the window's and the bar's right edges.
TAB_BOXES = """() => {
  const bar = document.querySelector('#cluster-tabs ul');
  const edge = bar.getBoundingClientRect();
  return {
    window: document.documentElement.clientWidth,
    bar: {left: edge.left, right: edge.right, scrollable: bar.scrollWidth > bar.clientWidth},
    tabs: [...bar.querySelectorAll('a')].map(a => {
      const box = a.getBoundingClientRect();
      return {label: a.textContent, left: box.left, right: box.right, top: box.top};
    }),
  };
}"""


@pytest.fixture
def ready(owner) -> Cluster:
    now = timezone.now()
    return ClusterFactory(
        project=owner.project,
        name="train",
        size=2,
        status=Cluster.Status.READY,
        joined_at=now,
        ready_at=now,
        machines=True,
        machines__status=Node.Status.JOINED,
        machines__step=Node.Step.DONE,
    )


def _shot(page, name: str, tmp_path: Path) -> None:
    folder = Path(os.environ.get("RUNCRATE_SHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    page.locator(".cluster-sticky").screenshot(path=str(folder / f"tab-bar-{name}.png"))


@pytest.mark.parametrize("width", [390, 320])
def test_every_tab_is_in_view_on_a_phone(page, owner, ready, tmp_path, width):
    page.set_viewport_size({"width": width, "height": 844})
    log_in(page, owner)
    page.goto(f"/clusters/{ready.pk}/billing/")

    seen = page.evaluate(TAB_BOXES)
    _shot(page, str(width), tmp_path)

    assert [tab["label"] for tab in seen["tabs"]] == [tab.label for tab in TABS]
    assert not seen["bar"]["scrollable"], "a tab is hidden in a box scrolled sideways"
    for tab in seen["tabs"]:
        assert tab["left"] >= 0 and tab["right"] <= seen["window"], f"{tab['label']} is cut off"
    assert len({tab["top"] for tab in seen["tabs"]}) > 1  # wrapped onto a second row
    # The current tab (the last, Billing, on the second row) is marked and in view.
    current = page.locator('#cluster-tabs a[aria-current="page"]')
    assert current.inner_text() == "Billing" and current.is_visible()


def test_the_tabs_keep_one_row_on_a_wide_screen(page, owner, ready, tmp_path):
    log_in(page, owner)
    page.goto(f"/clusters/{ready.pk}/")

    seen = page.evaluate(TAB_BOXES)
    _shot(page, "1280", tmp_path)

    assert len({tab["top"] for tab in seen["tabs"]}) == 1
    assert seen["tabs"][-1]["right"] <= seen["bar"]["right"]
