"""The Clusters list's filter and search (docs/clusters.md, "The list"): live or ended by the
model's own groups, a part of the name, counts per choice, and an empty result that says so."""

import re

from django.db import connection
from django.test.utils import CaptureQueriesContext

from clusters.models import Cluster
from tests.factories import ClusterFactory, MachineTypeFactory


def names_in(html: str) -> list[str]:
    """The clusters' names in the list, in their order."""
    return re.findall(r'<a class="strong" href="/clusters/\d+/">([^<]+)</a>', html)


def counts_in(html: str) -> dict[str, int]:
    found = re.findall(
        r'<a href="[^"]*"(?: aria-current="page")?>(\w+) <span class="count">(\d+)', html
    )
    return {label: int(count) for label, count in found}


def some_clusters(project) -> None:
    ClusterFactory(project=project, name="train-old", status=Cluster.Status.TERMINATED)
    ClusterFactory(project=project, name="train-ready", status=Cluster.Status.READY)
    ClusterFactory(project=project, name="eval-failed", status=Cluster.Status.FAILED)
    ClusterFactory(project=project, name="eval-starting", status=Cluster.Status.PROVISIONING)


def test_it_shows_every_cluster_with_the_live_ones_first_by_default(owner):
    some_clusters(owner.project)

    html = owner.browser_client().get("/clusters/").content.decode()

    assert names_in(html) == ["eval-starting", "train-ready", "eval-failed", "train-old"]
    assert counts_in(html) == {"All": 4, "Live": 2, "Ended": 2}
    assert '<a href="?" aria-current="page">All' in html


def test_it_shows_only_live_or_only_ended_clusters(owner):
    some_clusters(owner.project)
    client = owner.browser_client()

    live = client.get("/clusters/?show=live").content.decode()
    ended = client.get("/clusters/?show=ended").content.decode()

    assert names_in(live) == ["eval-starting", "train-ready"]
    assert names_in(ended) == ["eval-failed", "train-old"]
    assert '<a href="?show=ended" aria-current="page">Ended' in ended


def test_it_searches_names_case_insensitively_within_the_filter(owner):
    some_clusters(owner.project)
    client = owner.browser_client()

    found = client.get("/clusters/?q=EVAL").content.decode()
    live_found = client.get("/clusters/?q=eval&show=live").content.decode()

    assert names_in(found) == ["eval-starting", "eval-failed"]
    assert counts_in(found) == {"All": 2, "Live": 1, "Ended": 1}
    assert names_in(live_found) == ["eval-starting"]
    assert 'value="eval"' in live_found and 'name="show" value="live"' in live_found
    # The choices keep the search.
    assert 'href="?q=eval&amp;show=ended"' in live_found


def test_it_says_when_nothing_matches_and_offers_to_clear_the_filter(owner):
    some_clusters(owner.project)

    html = owner.browser_client().get("/clusters/?q=nothing-like-it&show=live").content.decode()

    assert names_in(html) == []
    assert "No live clusters named like “nothing-like-it”." in html
    assert '<a href="/clusters/">Clear the filter</a> to see all 4 clusters.' in html
    assert "Get started" not in html  # the project has clusters: no getting-started steps


def test_it_never_lists_a_strangers_clusters_nor_counts_them(owner, stranger):
    some_clusters(stranger.project)
    ClusterFactory(project=owner.project, name="mine", status=Cluster.Status.READY)
    client = owner.browser_client()

    for query in ("", "?show=ended", "?q=train", "?q=eval&show=live"):
        html = client.get(f"/clusters/{query}").content.decode()
        assert not {"train-old", "train-ready", "eval-failed", "eval-starting"} & set(
            names_in(html)
        )
    assert counts_in(client.get("/clusters/").content.decode()) == {"All": 1, "Live": 1, "Ended": 0}


def test_it_ignores_an_unknown_choice_and_a_long_search(owner):
    some_clusters(owner.project)
    client = owner.browser_client()

    unknown = client.get("/clusters/?show=everything&page=x")
    long = client.get("/clusters/?q=" + "a" * 5000)

    assert unknown.status_code == 200 and len(names_in(unknown.content.decode())) == 4
    assert long.status_code == 200 and names_in(long.content.decode()) == []


def test_it_keeps_the_filter_in_the_lists_poll(owner):
    some_clusters(owner.project)
    client = owner.browser_client()

    html = client.get("/clusters/?show=live&q=train").content.decode()
    fragment = client.get("/clusters/?show=live&q=train", headers={"HX-Request": "true"})

    assert 'hx-get="/clusters/?show=live&amp;q=train"' in html
    assert names_in(fragment.content.decode()) == ["train-ready"]


def test_it_filters_and_searches_in_the_same_number_of_queries_whatever_the_clusters(owner):
    client = owner.browser_client()
    ClusterFactory(project=owner.project, name="train-0", machines=True)
    with CaptureQueriesContext(connection) as one_cluster:
        assert client.get("/clusters/?show=live&q=train").status_code == 200
    for index in range(1, 10):
        status = Cluster.Status.READY if index % 2 else Cluster.Status.TERMINATED
        ClusterFactory(
            project=owner.project,
            name=f"train-{index}",
            status=status,
            machines=True,
            machine_type=MachineTypeFactory(),
        )

    with CaptureQueriesContext(connection) as ten_clusters:
        html = client.get("/clusters/?show=live&q=train").content.decode()

    assert len(ten_clusters) == len(one_cluster)
    assert len(names_in(html)) == 6


def test_it_offers_create_cluster_and_request_a_quote_once_each_on_an_empty_page(stranger):
    html = stranger.browser_client().get("/clusters/").content.decode()
    main = html.split("<main", 1)[1]

    assert main.count('href="/offers/"') == 1  # the getting-started step
    assert main.count('href="/offers/quote/"') == 1
    assert main.count("Request a quote") == 1
    assert "Search by name" not in main  # nothing to filter yet


def test_it_keeps_the_filter_and_the_search_across_pages(owner, monkeypatch):
    monkeypatch.setattr("clusters.views.CLUSTERS_PER_PAGE", 2)
    for index in range(3):
        ClusterFactory(project=owner.project, name=f"train-{index}", status=Cluster.Status.READY)
    ClusterFactory(project=owner.project, name="eval", status=Cluster.Status.READY)
    client = owner.browser_client()

    first = client.get("/clusters/?show=live&q=train").content.decode()
    second = client.get("/clusters/?show=live&q=train&page=2").content.decode()

    assert names_in(first) == ["train-2", "train-1"]
    assert 'href="?show=live&amp;q=train&amp;page=2">Older' in first
    assert names_in(second) == ["train-0"]
    assert 'href="?show=live&amp;q=train&amp;page=1">Newer' in second


def test_it_polls_the_filtered_rows_without_counting_them_again(owner):
    some_clusters(owner.project)
    client = owner.browser_client()
    poll = {"HX-Request": "true"}

    with CaptureQueriesContext(connection) as plain:
        client.get("/clusters/", headers=poll)
    with CaptureQueriesContext(connection) as filtered:
        fragment = client.get("/clusters/?show=live&q=eval", headers=poll)

    assert len(filtered) == len(plain)
    assert names_in(fragment.content.decode()) == ["eval-starting"]
