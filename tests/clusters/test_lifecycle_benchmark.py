"""The provisioning benchmark `manage.py bench` runs (clusters/benchmarks.py), small."""

import pytest

from clusters.benchmarks import provision_clusters
from clusters.models import Cluster
from offers.models import Host


@pytest.mark.django_db
def test_it_provisions_every_cluster_to_ready_and_reports_the_cost():
    result = provision_clusters(clusters=3, nodes=2)

    assert result["clusters_ready"] == 3
    assert result["ticks"] >= 1
    assert result["worker_seconds"] > 0
    assert result["queries"] > 0
    assert result["tasks"] >= 3 * 2 * 3  # start, agent and network per node at least
    assert Cluster.objects.filter(status="ready").count() == 3
    assert Host.objects.filter(state="in_use").count() == 6


@pytest.mark.django_db(transaction=True)
def test_it_counts_the_commits_that_wrote():
    # Committed for real (no test transaction around it): every write commits somewhere.
    result = provision_clusters(clusters=1, nodes=2)

    assert result["clusters_ready"] == 1
    assert 0 < result["commits"] < result["queries"]
