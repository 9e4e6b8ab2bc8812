"""A new account's three steps on the Clusters page (issue 13, item 8): add an SSH key, add
credit, create a cluster; each ticked once done, shown until the project has a cluster, and
cheap: at most three queries for an empty project, none for one with clusters."""

import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from accounts.models import Membership
from billing.models import LedgerEntry
from clusters.models import Cluster
from tests.clusters.front import credit, ssh_key
from tests.factories import ClusterFactory


def steps_of(html: str) -> dict[str, bool]:
    """Each step shown, and whether it is ticked."""
    found = re.findall(r'<li class="start-step( is-done)?" data-step="([a-z_]+)">', html)
    return {key: bool(done) for done, key in found}


def queries_of(client, path: str) -> list[str]:
    with CaptureQueriesContext(connection) as queries:
        assert client.get(path).status_code == 200
    return [q["sql"] for q in queries.captured_queries]


def test_a_new_account_sees_three_steps_none_done(owner):
    owner.project.ssh_keys.all().delete()
    html = owner.browser_client().get("/clusters/").content.decode()
    assert steps_of(html) == {"ssh_key": False, "credit": False, "cluster": False}
    assert 'href="/accounts/ssh-keys/"' in html and 'href="/billing/"' in html
    assert "Get started in three steps" in html


def test_each_step_is_ticked_once_done(owner):
    owner.project.ssh_keys.all().delete()
    client = owner.browser_client()
    ssh_key(owner.project)
    assert steps_of(client.get("/clusters/").content.decode()) == {
        "ssh_key": True,
        "credit": False,
        "cluster": False,
    }
    credit(owner.project, "25.00")
    assert steps_of(client.get("/clusters/").content.decode()) == {
        "ssh_key": True,
        "credit": True,
        "cluster": False,
    }


def test_a_debit_or_usage_is_no_credit(owner):
    LedgerEntry.objects.create(
        project=owner.project, kind=LedgerEntry.Kind.ADJUSTMENT, amount=-5, note="debit"
    )
    assert steps_of(owner.browser_client().get("/clusters/").content.decode())["credit"] is False


@pytest.mark.parametrize("status", [Cluster.Status.PROVISIONING, Cluster.Status.TERMINATED])
def test_the_steps_go_once_the_project_has_a_cluster(owner, status):
    ClusterFactory(project=owner.project, status=status)
    html = owner.browser_client().get("/clusters/").content.decode()
    assert steps_of(html) == {} and "Get started" not in html


def test_a_developer_is_told_who_adds_credit(owner, teammate):
    assert teammate.user.memberships.get().role == Membership.Role.DEVELOPER
    html = teammate.browser_client().get("/clusters/").content.decode()
    step = html.split('data-step="credit"')[1].split("</li>")[0]
    assert "Ask an owner or manager of the project to add credit." in step
    assert "href=" not in step


def steps_queries(queries: list[str]) -> list[str]:
    return [q for q in queries if q.startswith('SELECT 1 AS "a"')]  # the exists() of the steps


def test_it_costs_two_queries_for_an_empty_project_and_none_once_it_has_clusters(owner):
    client = owner.browser_client()
    empty = queries_of(client, "/clusters/")
    # Keys and credit; who may add credit is the role the request's project read already.
    assert len(steps_queries(empty)) == 2
    credit(owner.project, "25.00")
    assert len(steps_queries(queries_of(client, "/clusters/"))) == 2

    ClusterFactory(project=owner.project)
    busy = queries_of(client, "/clusters/")
    assert steps_queries(busy) == []
    # Instead: the rows' own query, their costs, and their GPU utilisation traces (one query
    # for the page, tests/clusters/test_cluster_list.py).
    assert len(busy) == len(empty) - 2 + 3


def test_a_stranger_sees_only_their_own_progress(owner, stranger):
    credit(owner.project, "25.00")
    stranger.project.ssh_keys.all().delete()
    html = stranger.browser_client().get("/clusters/").content.decode()
    assert steps_of(html) == {"ssh_key": False, "credit": False, "cluster": False}
