"""The Metrics tab's poll bench (bench/metrics.py `metrics_tab_polls`, issue 23): it reads the
poll from the tab itself and sends it one metrics version behind as the moved poll."""

import pytest

from bench.metrics import metrics_tab_polls
from clusters.models import Cluster, Node
from clusters.telemetry import metrics
from tests.factories import ClusterFactory

HTMX = {"HX-Request": "true"}


@pytest.mark.django_db
def test_it_reads_the_metrics_tab_s_poll_and_sends_one_metrics_version_less_as_moved(owner):
    cluster = ClusterFactory(
        project=owner.project,
        status=Cluster.Status.READY,
        machines=True,
        machines__status=Node.Status.JOINED,
    )
    node = cluster.nodes.first()
    metrics.store(node.pk, cluster.pk, gpus=[{"index": 0}], host=None, at=cluster.created_at)
    browser = owner.browser_client()
    version = metrics.metrics_version(cluster.pk)

    unchanged, moved = metrics_tab_polls(browser, cluster.pk)

    assert unchanged.startswith(f"/clusters/{cluster.pk}/metrics/?")
    assert f"metrics={version}" in unchanged and f"metrics={version - 1}" in moved
    assert unchanged.replace(f"metrics={version}", f"metrics={version - 1}") == moved
    assert browser.get(unchanged, headers=HTMX).status_code == 204
    assert browser.get(moved, headers=HTMX).status_code == 200


def test_it_refuses_a_tab_whose_poll_says_no_metrics_version():
    class Page:
        status_code = 200
        content = b'<section id="cluster-status" hx-get="/clusters/7/metrics/?version=3">'

    class Browser:
        def get(self, path):
            return Page()

    with pytest.raises(RuntimeError, match="no metrics version"):
        metrics_tab_polls(Browser(), 7)
