"""The Clusters list's filter and search (docs/clusters.md, "The list"): live or ended by the
model's own groups, a part of the name, counts per choice, and an empty result that says so."""

import re
from datetime import timedelta

import time_machine
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from clusters.models import Cluster, Node
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
    monkeypatch.setattr("clusters.web.views.CLUSTERS_PER_PAGE", 2)
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


# --- the utilisation trace (issue 23, item 3) ------------------------------------------------


def traced_cluster(project, name: str, percents: list[float], *, now) -> Cluster:
    """A ready cluster of two nodes whose GPUs reported `percents` (one a minute, to `now`),
    rolled up into minutes as the beat does."""
    from clusters.telemetry import metrics

    cluster = ClusterFactory(
        project=project,
        name=name,
        status=Cluster.Status.READY,
        machines=True,
        machines__status=Node.Status.JOINED,
        machine_type=MachineTypeFactory(),
    )
    start = now - timedelta(minutes=len(percents))
    for node in cluster.nodes.all():
        for minute, percent in enumerate(percents):
            gpus = [{"index": i, "utilization_percent": percent} for i in range(2)]
            metrics.store(
                node.pk, cluster.pk, gpus=gpus, host=None, at=start + timedelta(minutes=minute)
            )
    metrics.roll_up(60, now=now)
    return cluster


def trace_of(html: str, name: str) -> str:
    """The row's trace (beside its status), or "" for none."""
    row = html.split(f">{name}</a>")[1].split("</tr>")[0]
    found = re.search(r'<div class="gpu-trace"[^>]*>(.*?)</div>', row, re.S)
    return found.group(1) if found else ""


def test_it_traces_each_live_cluster_s_utilisation_over_the_hour_in_one_query(owner):
    now = timezone.now().replace(second=30, microsecond=0)
    client = owner.browser_client()
    with time_machine.travel(now, tick=False):
        traced_cluster(owner.project, "train-busy", [20, 60, 100], now=now)
        ClusterFactory(project=owner.project, name="train-old", status=Cluster.Status.TERMINATED)
        html = client.get("/clusters/").content.decode()
        for index in range(5):
            traced_cluster(owner.project, f"train-{index}", [50], now=now)
        with CaptureQueriesContext(connection) as six:
            more = client.get("/clusters/").content.decode()
            rows = client.get("/clusters/", headers={"HX-Request": "true"}).content.decode()

    busy = trace_of(html, "train-busy")
    assert 'role="img"' in busy
    assert (
        'aria-label="Mean GPU utilisation over the last hour: 20% to 100%, 100% in the latest '
        'minute."'
    ) in busy
    assert re.search(r'<path class="line" d="M[\d., L]+"', busy).group(0).count("L") == 2
    assert trace_of(html, "train-old") == ""
    assert trace_of(rows, "train-busy") == busy  # the list's poll redraws it
    traces = [q["sql"] for q in six.captured_queries if "clusters_gpurollup" in q["sql"]]
    assert len(traces) == 2  # one for the page, one for its rows' poll
    assert "GPUs 50%" in trace_of(more, "train-4")


def test_the_list_reads_its_traces_in_the_same_queries_for_1_and_6_live_clusters(owner):
    now = timezone.now().replace(second=30, microsecond=0)
    client = owner.browser_client()
    with time_machine.travel(now, tick=False):
        traced_cluster(owner.project, "train-a", [40], now=now)
        client.get("/clusters/")
        with CaptureQueriesContext(connection) as one:
            client.get("/clusters/")
        for index in range(5):
            traced_cluster(owner.project, f"train-{index}", [40], now=now)
        with CaptureQueriesContext(connection) as six:
            html = client.get("/clusters/").content.decode()

    assert len(six) == len(one)
    assert html.count('class="sparkline"') == 6
    reads = [q["sql"] for q in six.captured_queries if "clusters_gpurollup" in q["sql"]]
    assert len(reads) == 1
