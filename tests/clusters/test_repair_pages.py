"""Repair on the dashboard (issue 36; docs/lifecycle.md, "Repair"): the Machines tab offers to
replace a lost or unhealthy worker (never the head, which says why), a confirm page shows the
plan and its price, the POST replaces, the rows say what replaced what and what is drained, the
degraded banner links to the confirm page, and the repair policy is chosen at create and changed
on the Machines tab. Strangers get 404, members without the permission 403."""

from __future__ import annotations

import html as html_text
import re

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from accounts import permissions
from clusters import lifecycle
from clusters.models import Cluster, Event, Node
from tests.clusters.front import credit, ssh_key
from tests.clusters.lifecycle_kit import Sim, at, create, inventory

BOOT = 180
HTMX = {"HX-Request": "true"}


@pytest.fixture
def cluster(owner, clock) -> Cluster:
    """owner's ready 3-node cluster of the simulated data center ($20.00 per machine-hour),
    with one host to spare for a replacement."""
    credit(owner.project, "1000.00")
    ssh_key(owner.project, "laptop")
    machine_type = inventory(hosts=4, boot_seconds=BOOT)
    with Sim() as sim:
        made = create(owner.project, machine_type, nodes=3, user=owner.user)
        sim.run_until(clock, at(BOOT * 2))
    made.refresh_from_db()
    assert made.status == Cluster.Status.READY
    return made


def lose(cluster: Cluster, index: int) -> Node:
    lost = cluster.nodes.get(index=index)
    with Sim():
        assert lifecycle.mark_lost(node_id=lost.pk, last_heard=timezone.now(), why="test")
    cluster.refresh_from_db()
    lost.refresh_from_db()
    return lost


def text_of(html: str) -> str:
    return " ".join(html_text.unescape(re.sub(r"<[^>]+>", " ", html)).split())


def row_of(html: str, row_id: str) -> str:
    found = re.search(rf'<tr id="{row_id}".*?</tr>', html, re.S)
    assert found, f"no row {row_id}"
    return found.group(0)


def machines_tab(client: Client, cluster: Cluster) -> str:
    response = client.get(f"/clusters/{cluster.pk}/machines/")
    assert response.status_code == 200
    return response.content.decode()


def replace_url(cluster: Cluster, name: str) -> str:
    return f"/clusters/{cluster.pk}/nodes/{name}/replace/"


# --- the Machines tab ---------------------------------------------------------------------------


def test_it_offers_to_replace_the_lost_worker_only(owner, cluster):
    lose(cluster, 1)

    html = machines_tab(owner.browser_client(), cluster)

    assert f'href="{replace_url(cluster, "node-1")}"' in row_of(html, "node-1")
    for name in ("node-0", "node-2"):
        row = row_of(html, name)
        assert "/replace/" not in row and "Replace" not in row
    assert "cannot be replaced in place" not in html  # the head is well


def test_a_healthy_cluster_offers_no_replacement(owner, cluster):
    html = machines_tab(owner.browser_client(), cluster)

    assert "/replace/" not in html


def test_a_lost_head_says_it_cannot_be_replaced_in_place(owner, cluster):
    lose(cluster, 0)

    html = machines_tab(owner.browser_client(), cluster)
    overview = owner.browser_client().get(f"/clusters/{cluster.pk}/").content.decode()

    head = text_of(row_of(html, "node-0"))
    assert "The head holds /shared and the scheduler: it cannot be replaced in place." in head
    assert "/replace/" not in html
    assert lifecycle.HEAD_REFUSAL in text_of(overview) and "/replace/" not in overview


def test_a_drained_worker_says_so_and_why(owner, cluster):
    Node.objects.filter(cluster=cluster, index=2).update(
        drained="GPU 3: 2 uncorrectable ECC errors", drained_at=timezone.now()
    )

    row = row_of(machines_tab(owner.browser_client(), cluster), "node-2")

    assert '<span class="badge badge-warn">drained</span>' in row
    assert "Drained: GPU 3: 2 uncorrectable ECC errors. No new job lands on it." in text_of(row)
    assert "drained" not in row_of(machines_tab(owner.browser_client(), cluster), "node-1")


# --- the confirm page and the replacement ------------------------------------------------------


def test_the_confirm_page_shows_the_machine_why_the_address_and_the_price(owner, cluster):
    lost = lose(cluster, 1)

    response = owner.browser_client().get(replace_url(cluster, "node-1"))

    assert response.status_code == 200
    page = text_of(response.content.decode())
    assert "Replace node-1?" in page
    assert f"{lost.private_ip} , kept" in page
    assert "$20.00 per hour for the new machine" in page
    assert "the cluster then costs $60.00 per hour for 3 machines" in page
    assert "node-1's billing ended at its last heartbeat" in page
    assert 'name="csrfmiddlewaretoken"' in response.content.decode()
    assert not cluster.nodes.filter(status=Node.Status.STARTING).exists()  # nothing reserved


def test_posting_replaces_the_worker_under_its_name(owner, cluster):
    lost = lose(cluster, 1)
    client = owner.browser_client()

    with Sim():
        response = client.post(replace_url(cluster, "node-1"))

    assert response.status_code == 302
    assert response["Location"] == f"/clusters/{cluster.pk}/machines/"
    new = cluster.nodes.get(index=1, status=Node.Status.STARTING)
    assert new.replaces_id == lost.pk and new.private_ip == lost.private_ip
    html = client.get(response["Location"]).content.decode()
    assert (
        f"Replacing node-1: a new machine takes its name and private address {lost.private_ip}"
        in text_of(html)
    )
    old_row = text_of(row_of(html, f"node-1-replaced-{lost.pk}"))
    new_row = text_of(row_of(html, "node-1"))
    assert f"replaced at {new.reserved_at:%H:%M} UTC" in old_row
    assert f"replaces the machine lost at {lost.ended_at:%H:%M} UTC" in new_row
    assert "/replace/" not in html  # node-1 is starting: nothing more to replace


def test_the_head_s_confirm_page_refuses_with_the_reason(owner, cluster):
    lose(cluster, 0)
    client = owner.browser_client()

    page = client.get(replace_url(cluster, "node-0"))
    with Sim():
        posted = client.post(replace_url(cluster, "node-0"), follow=True)

    assert page.status_code == 200
    assert lifecycle.HEAD_REFUSAL in text_of(page.content.decode())
    assert "<form" not in page.content.decode().split('class="card confirm-card')[1]
    assert lifecycle.HEAD_REFUSAL in text_of(posted.content.decode())
    assert not cluster.nodes.filter(status=Node.Status.STARTING).exists()


def test_a_healthy_worker_s_confirm_page_says_it_is_healthy(owner, cluster):
    page = owner.browser_client().get(replace_url(cluster, "node-2"))

    assert page.status_code == 200
    assert "node-2 is healthy: only a lost or unhealthy machine is replaced." in text_of(
        page.content.decode()
    )


def test_strangers_get_404_and_members_without_the_permission_403(
    owner, teammate, stranger, cluster, monkeypatch
):
    lose(cluster, 1)
    urls = (replace_url(cluster, "node-1"), f"/clusters/{cluster.pk}/repair-policy/")

    for url in urls:
        assert stranger.browser_client().get(url).status_code in (404, 405)
        assert stranger.browser_client().post(url, {"repair_policy": "auto"}).status_code == 404
    monkeypatch.setitem(
        permissions.TABLE, "clusters.manage", (permissions.MANAGERS, "manage clusters")
    )
    for url in urls:
        assert teammate.browser_client().post(url, {"repair_policy": "auto"}).status_code == 403
    assert teammate.browser_client().get(urls[0]).status_code == 403
    assert not cluster.nodes.filter(status=Node.Status.STARTING).exists()
    cluster.refresh_from_db()
    assert cluster.repair_policy == Cluster.RepairPolicy.ASK


def test_the_forms_need_the_csrf_token(owner, cluster):
    lose(cluster, 1)
    forged = Client(enforce_csrf_checks=True)
    forged.force_login(owner.user)

    assert forged.post(replace_url(cluster, "node-1")).status_code == 403
    policy = forged.post(f"/clusters/{cluster.pk}/repair-policy/", {"repair_policy": "auto"})
    assert policy.status_code == 403


# --- the degraded banner ------------------------------------------------------------------------


def test_the_degraded_banner_links_to_the_lost_worker_s_confirm_page(owner, cluster):
    lose(cluster, 2)

    overview = owner.browser_client().get(f"/clusters/{cluster.pk}/").content.decode()

    assert "A machine was lost: node-2." in overview
    assert (
        f'<a class="btn btn-small" href="{replace_url(cluster, "node-2")}">Replace node-2…</a>'
        in overview
    )


# --- the poll and the query counts --------------------------------------------------------------


def test_the_poll_redraws_the_tab_once_a_replacement_appears(owner, cluster):
    lost = lose(cluster, 1)
    client = owner.browser_client()
    page = machines_tab(client, cluster)
    poll = re.search(r'<section id="cluster-status"[^>]* hx-get="([^"]*)"', page).group(1)

    with Sim():
        lifecycle.replace_node(cluster=cluster, node_name="node-1", user=owner.user)
    body = client.get(poll.replace("&amp;", "&"), headers=HTMX).content.decode()

    panel = body.split('<section id="cluster-tab"')[1]
    assert 'hx-swap-oob="true"' in panel.split(">")[0]
    ids = re.findall(r'<tr id="([^"]+)"', panel)
    assert ids == ["node-0", f"node-1-replaced-{lost.pk}", "node-1", "node-2"]


def test_the_machines_tab_reads_as_many_queries_with_a_replacement_row(owner, cluster):
    lose(cluster, 1)
    client = owner.browser_client()
    url = f"/clusters/{cluster.pk}/machines/"
    with CaptureQueriesContext(connection) as before:
        client.get(url)

    with Sim():
        lifecycle.replace_node(cluster=cluster, node_name="node-1", user=owner.user)
    with CaptureQueriesContext(connection) as after:
        html = client.get(url).content.decode()

    assert "replaced at" in html
    assert len(after) == len(before), [q["sql"] for q in after]


# --- the repair policy --------------------------------------------------------------------------


def test_the_machines_tab_changes_the_repair_policy(owner, cluster):
    client = owner.browser_client()
    html = machines_tab(client, cluster)
    assert '<option value="ask" selected>Ask me</option>' in html
    assert "an unhealthy one once it stayed unhealthy for 5 min" in text_of(html)

    response = client.post(f"/clusters/{cluster.pk}/repair-policy/", {"repair_policy": "auto"})

    assert response.status_code == 302
    cluster.refresh_from_db()
    assert cluster.repair_policy == Cluster.RepairPolicy.AUTO
    assert cluster.events.filter(reason=Event.Reason.REPAIR_POLICY).count() == 1
    after = client.get(response["Location"]).content.decode()
    assert '<option value="auto" selected>Replace automatically</option>' in after
    assert "Repair policy: replace automatically." in text_of(after)


def test_a_wrong_repair_policy_is_refused_with_a_message(owner, cluster):
    client = owner.browser_client()

    response = client.post(
        f"/clusters/{cluster.pk}/repair-policy/", {"repair_policy": "sometimes"}, follow=True
    )

    assert response.status_code == 200
    assert "The repair policy is ask" in text_of(response.content.decode())
    cluster.refresh_from_db()
    assert cluster.repair_policy == Cluster.RepairPolicy.ASK


def test_the_create_form_stores_the_repair_policy(owner, clock):
    credit(owner.project, "1000.00")
    key = ssh_key(owner.project, "laptop")
    machine_type = inventory(hosts=2, boot_seconds=BOOT)
    client = owner.browser_client()
    form = client.get(f"/clusters/new/?offer={machine_type.slug}&nodes=2").content.decode()
    assert '<option value="ask" selected>Ask me</option>' in form
    assert "Replace automatically : A lost worker is replaced at once" in text_of(form)

    with Sim():
        response = client.post(
            "/clusters/new/",
            {
                "offer": machine_type.slug,
                "name": "healing",
                "nodes": "2",
                "environment": "default",
                "software": "none",
                "ssh_keys": [key.pk],
                "repair_policy": "auto",
            },
        )

    assert response.status_code == 302, response.content.decode()[:2000]
    assert Cluster.objects.get(name="healing").repair_policy == Cluster.RepairPolicy.AUTO
