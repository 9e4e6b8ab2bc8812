"""The Clusters pages: the list, the create form, the cluster page and its actions."""

import re
from datetime import timedelta
from decimal import Decimal

import pytest
import time_machine
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from clusters.models import Cluster, Event, Node
from offers.models import Host, Location, MachineType, QuoteRequest
from runcrate.models import Outage
from tests.clusters.front import credit, machine_type_with_hosts, reported_cluster, ssh_key
from tests.factories import (
    ClusterFactory,
    EventFactory,
    GpuModelFactory,
    LocationFactory,
    MachineTypeFactory,
)

HTMX = {"HX-Request": "true"}
POLL = 'hx-trigger="every 2s"'


def text_of(response) -> str:
    """The page as a person reads it: tags dropped, whitespace collapsed."""
    return " ".join(re.sub(r"<[^>]+>", " ", response.content.decode()).split())


def frees(machine_type: MachineType) -> int:
    return Host.objects.filter(machine_type=machine_type, state=Host.State.FREE).count()


# --- the list ----------------------------------------------------------------------------------


def test_it_lists_the_projects_clusters_with_size_location_and_price(owner, stranger):
    location = LocationFactory(code="us-east-2", name="Columbus, Ohio")
    machine_type = MachineTypeFactory(location=location, price_per_hour=Decimal("23.92"))
    ClusterFactory(project=owner.project, name="train", machine_type=machine_type, size=4)
    ClusterFactory(project=stranger.project, name="someone-elses")

    page = text_of(owner.browser_client().get("/clusters/"))

    assert "train" in page
    assert "someone-elses" not in page
    assert "4 machines 8× H100 SXM 80GB each" in page
    assert "Columbus, Ohio" in page
    assert "$95.68" in page


def test_it_polls_the_list_while_a_cluster_is_live(owner):
    ClusterFactory(project=owner.project, status=Cluster.Status.PROVISIONING)
    client = owner.browser_client()

    page = client.get("/clusters/").content.decode()
    fragment = client.get("/clusters/", headers=HTMX)

    assert POLL in page
    assert fragment.status_code == 200
    assert fragment.content.decode().lstrip().startswith('<tbody id="cluster-rows"')
    assert POLL in fragment.content.decode()


def test_it_stops_polling_the_list_when_no_cluster_is_live(owner):
    ClusterFactory(project=owner.project, status=Cluster.Status.TERMINATED)
    client = owner.browser_client()

    page = client.get("/clusters/").content.decode()
    fragment = client.get("/clusters/", headers=HTMX)

    assert POLL not in page
    assert fragment.status_code == 286
    assert POLL not in fragment.content.decode()


def test_it_lists_the_users_quote_requests_beside_the_clusters(owner, stranger):
    QuoteRequest.objects.create(
        project=owner.project,
        gpu=GpuModelFactory(),
        nodes=128,
        interconnect=MachineType.Interconnect.INFINIBAND,
        start_date=timezone.now().date(),
        duration_weeks=12,
        contact_name="Ada",
        contact_email="ada@example.com",
    )

    mine = text_of(owner.browser_client().get("/clusters/"))
    theirs = text_of(stranger.browser_client().get("/clusters/"))

    assert "Quote requests" in mine and "H100 SXM 80GB 128 InfiniBand New" in mine
    assert "128 InfiniBand" not in theirs
    assert 'href="/offers/quote/"' in owner.browser_client().get("/clusters/").content.decode()


def test_it_lists_clusters_in_the_same_number_of_queries_whatever_their_number(
    owner, django_assert_num_queries
):
    client = owner.browser_client()
    ClusterFactory(project=owner.project, machines=True)
    with CaptureQueriesContext(connection) as one_cluster:
        assert client.get("/clusters/").status_code == 200
    for _ in range(9):
        ClusterFactory(project=owner.project, machines=True, machine_type=MachineTypeFactory())

    with django_assert_num_queries(len(one_cluster)):
        response = client.get("/clusters/")

    assert response.content.decode().count('href="/clusters/') >= 10


# --- the cluster page ------------------------------------------------------------------------


def test_it_shows_a_cluster_to_its_project_and_404_to_a_stranger(owner, teammate, stranger):
    cluster = ClusterFactory(project=owner.project, name="train", machines=True)

    assert teammate.browser_client().get(f"/clusters/{cluster.pk}/").status_code == 200
    assert stranger.browser_client().get(f"/clusters/{cluster.pk}/").status_code == 404
    fragment = stranger.browser_client().get(f"/clusters/{cluster.pk}/", headers=HTMX)
    assert fragment.status_code == 404


def test_it_shows_each_node_with_its_step_progress_and_time_left(owner):
    with time_machine.travel("2026-12-01 10:00:00Z", tick=False):
        cluster = ClusterFactory(project=owner.project, size=2, machines=True)
        node = cluster.nodes.get(index=1)
        node.running_at = timezone.now()
        node.step = Node.Step.AGENT
        node.step_deadline = timezone.now() + timedelta(minutes=2, seconds=10)
        node.save()

        page = owner.browser_client().get(f"/clusters/{cluster.pk}/machines/").content.decode()

    row = re.search(r'<tr id="node-1".*?</tr>', page, re.S).group(0)
    assert "10.77.0.2" in row
    assert "Agent checking in" in row
    assert 'aria-valuenow="1"' in row and 'aria-valuemax="3"' in row
    assert "2m 10s left" in row


def test_time_left_does_not_count_an_outage_of_ours(owner):
    """A step whose stored deadline passed while our own machinery was down is not out of time
    (docs/lifecycle.md, "Deadlines measure the machine, not us"): the page counts down to the
    deadline the reconciler judges by, the stored one moved back by the outage."""
    with time_machine.travel("2026-12-01 10:00:00Z", tick=False):
        cluster = ClusterFactory(project=owner.project, size=2, machines=True)
        node = cluster.nodes.get(index=1)
        node.step = Node.Step.AGENT
        node.reserved_at = timezone.now() - timedelta(minutes=5)
        node.step_started_at = timezone.now() - timedelta(minutes=4)
        node.step_deadline = timezone.now() - timedelta(minutes=1)
        node.save()
        Outage.objects.create(
            name="machines",
            started_at=timezone.now() - timedelta(minutes=3, seconds=30),
            ended_at=timezone.now() - timedelta(seconds=30),
        )

        page = owner.browser_client().get(f"/clusters/{cluster.pk}/machines/").content.decode()

    row = re.search(r'<tr id="node-1".*?</tr>', page, re.S).group(0)
    assert "2m 00s left" in row  # 3 minutes of outage, 1 minute past the stored deadline


def test_it_polls_the_status_fragment_while_the_cluster_is_live(owner):
    cluster = ClusterFactory(project=owner.project, machines=True)
    client = owner.browser_client()

    page = client.get(f"/clusters/{cluster.pk}/").content.decode()
    fragment = client.get(f"/clusters/{cluster.pk}/", headers=HTMX)

    assert POLL in page and 'hx-swap="outerHTML"' in page
    assert fragment.status_code == 200
    body = fragment.content.decode()
    assert body.lstrip().startswith('<section id="cluster-status"')
    assert POLL in body
    assert "<html" not in body
    assert "HX-Request" in fragment["Vary"]


@pytest.mark.parametrize("status", sorted(Cluster.TERMINAL))
def test_it_drops_the_poll_and_answers_286_once_the_cluster_is_final(owner, status):
    cluster = ClusterFactory(project=owner.project, status=status, machines=True)
    client = owner.browser_client()

    page = client.get(f"/clusters/{cluster.pk}/").content.decode()
    fragment = client.get(f"/clusters/{cluster.pk}/", headers=HTMX)

    assert 'hx-trigger="every' not in page
    assert fragment.status_code == 286
    assert 'hx-trigger="every' not in fragment.content.decode()
    assert f">{status}</span>" in fragment.content.decode()


def test_it_polls_a_settled_cluster_slowly_and_fast_again_while_a_worker_joins(owner):
    cluster = ClusterFactory(
        project=owner.project,
        status=Cluster.Status.READY,
        machines=True,
        machines__status=Node.Status.JOINED,
    )
    client = owner.browser_client()

    assert 'hx-trigger="every 10s"' in client.get(f"/clusters/{cluster.pk}/").content.decode()

    cluster.nodes.filter(index=1).update(status=Node.Status.STARTING, is_worker=True)
    assert POLL in client.get(f"/clusters/{cluster.pk}/", headers=HTMX).content.decode()


def test_it_says_which_node_and_step_failed_and_offers_what_can_start_now(owner):
    gpu = GpuModelFactory()
    failed_type = machine_type_with_hosts(free=0, gpu=gpu, slug="gone-type")
    elsewhere = machine_type_with_hosts(
        free=3,
        gpu=gpu,
        slug="other-place",
        location=LocationFactory(code="eu-west-1", name="Dublin"),
        price_per_hour=Decimal("19.00"),
    )
    too_small = machine_type_with_hosts(free=1, gpu=gpu, slug="too-small")
    other_gpu = machine_type_with_hosts(free=5, gpu=GpuModelFactory(slug="a100", name="A100"))
    cluster = ClusterFactory(
        project=owner.project,
        name="train",
        machine_type=failed_type,
        size=3,
        software=Cluster.Software.SLURM,
        status=Cluster.Status.FAILED,
        failure_reason=Event.Reason.AGENT_TIMEOUT,
        failure_node="node-2",
        failure_step=Node.Step.AGENT,
        failure_message="node-2's agent did not check in within 3 minutes.",
        machines=True,
    )

    response = owner.browser_client().get(f"/clusters/{cluster.pk}/")
    page = text_of(response)
    html = response.content.decode()

    assert "failed to start on node-2, at step Agent check-in" in page
    assert "agent_timeout" in page and "did not check in within 3 minutes" in page
    assert '<li class="failed">Agent check-in</li>' in html
    assert '<li class="ended">Failed</li>' in html  # the stepper says how it ended
    assert "Dublin" in page and "$57.00" in page
    assert (
        f'href="/clusters/new/?offer={elsewhere.slug}&amp;nodes=3&amp;name=train&amp;'
        "software=slurm&amp;environment=default" in html
    )
    assert f"offer={too_small.slug}" not in html
    assert f"offer={other_gpu.slug}" not in html


def test_it_marks_the_install_step_red_on_a_degraded_cluster_and_offers_a_retry(owner):
    cluster = ClusterFactory(
        project=owner.project,
        software=Cluster.Software.RAY,
        status=Cluster.Status.DEGRADED,
        joined_at=timezone.now(),
        failure_reason=Event.Reason.INSTALL_FAILED,
        failure_node="node-1",
        failure_step=Node.Step.INSTALL,
        failure_message="ray status shows 1 of 2 nodes alive.",
        machines=True,
    )

    html = owner.browser_client().get(f"/clusters/{cluster.pk}/").content.decode()

    assert '<li class="done">Private network</li>' in html
    assert '<li class="failed">Software install</li>' in html
    assert f'action="/clusters/{cluster.pk}/retry-install/"' in html
    assert f'href="/clusters/{cluster.pk}/terminate/"' in html
    assert "Add workers" not in html


def test_it_offers_add_workers_and_terminate_on_a_ready_cluster(owner):
    now = timezone.now()
    cluster = ClusterFactory(
        project=owner.project,
        status=Cluster.Status.READY,
        joined_at=now,
        ready_at=now,
        machines=True,
        machines__status=Node.Status.JOINED,
    )

    client = owner.browser_client()
    html = client.get(f"/clusters/{cluster.pk}/").content.decode()
    machines = client.get(f"/clusters/{cluster.pk}/machines/").content.decode()

    assert f'action="/clusters/{cluster.pk}/workers/"' in machines  # on the Machines tab
    assert 'name="count"' in machines and "hx-preserve" in machines
    terminate = f'href="/clusters/{cluster.pk}/terminate/"'
    assert terminate in html and terminate in machines  # the header's, on every tab
    assert "Retry install" not in html
    assert '<li class="done">Ready</li>' in html


def test_it_shows_the_event_log_with_failures_and_their_raw_output(owner):
    cluster = ClusterFactory(project=owner.project, status=Cluster.Status.FAILED, machines=True)
    node = cluster.nodes.get(index=0)
    EventFactory(cluster=cluster, message="Reserved 2 machines.")
    EventFactory(
        cluster=cluster,
        node=node,
        step=Node.Step.NETWORK,
        reason=Event.Reason.NETWORK_UNREACHABLE,
        message="node-0 cannot reach node-1.",
        output="ping: 10.77.0.2: 100% packet loss",
    )

    html = owner.browser_client().get(f"/clusters/{cluster.pk}/events/").content.decode()

    failure_row = re.search(r'<tr class="row-bad">.*?</tr>', html, re.S).group(0)
    assert "node-0 cannot reach node-1." in failure_row
    assert "<details" in failure_row and "100% packet loss" in failure_row
    assert "Reserved 2 machines." in html


@pytest.mark.parametrize("status", [Cluster.Status.PROVISIONING, Cluster.Status.FAILED])
def test_it_runs_the_status_fragment_in_the_same_queries_for_2_and_64_nodes(
    owner, django_assert_num_queries, status
):
    client = owner.browser_client()
    clusters = {}
    for size in (2, 64):
        cluster = ClusterFactory(project=owner.project, size=size, status=status, machines=True)
        for node in cluster.nodes.all():
            EventFactory(cluster=cluster, node=node, reason=Event.Reason.MACHINE_RUNNING)
        clusters[size] = cluster
    client.get(f"/clusters/{clusters[2].pk}/machines/", headers=HTMX)  # warm the session

    with CaptureQueriesContext(connection) as small:
        client.get(f"/clusters/{clusters[2].pk}/machines/", headers=HTMX)
    with django_assert_num_queries(len(small)):
        response = client.get(f"/clusters/{clusters[64].pk}/machines/", headers=HTMX)

    assert response.content.decode().count('<tr id="node-') == 64


@pytest.mark.parametrize("tab", ["", "machines/", "events/"])
def test_the_page_of_a_reported_cluster_runs_the_same_queries_for_8_and_64_nodes(
    owner, django_assert_num_queries, tab
):
    small = reported_cluster(owner.project, size=8)
    large = reported_cluster(owner.project, size=64)
    client = owner.browser_client()
    client.get(f"/clusters/{small.pk}/{tab}")  # warm the session

    with CaptureQueriesContext(connection) as queries:
        client.get(f"/clusters/{small.pk}/{tab}")
    with django_assert_num_queries(len(queries)):
        page = client.get(f"/clusters/{large.pk}/{tab}").content.decode()

    rows = {"": 0, "machines/": 64, "events/": 0}[tab]
    assert page.count('<tr id="node-') == rows
    assert page.count("node-63: ok.") == (3 if tab == "events/" else 0)


# --- the create form ---------------------------------------------------------------------------


def test_it_shows_the_offer_and_prefills_the_form(owner):
    machine_type = machine_type_with_hosts(
        free=6,
        slug="use2-h100x8-bm",
        machine_kind=MachineType.Kind.BARE_METAL,
        price_per_hour=Decimal("23.92"),
        location=LocationFactory(code="us-east-2", name="Columbus, Ohio"),
    )
    ssh_key(owner.project, "laptop")
    ssh_key(owner.project, "desktop")

    response = owner.browser_client().get(f"/clusters/new/?offer={machine_type.slug}&nodes=4")
    html = response.content.decode()
    page = text_of(response)

    assert response.status_code == 200
    assert "Columbus, Ohio" in page and "Bare metal" in page and "Ethernet" in page
    assert "$95.68 per hour" in page and "$23.92 per machine-hour" in page
    assert "1-2 Gbit/s" in page
    assert re.search(r'name="nodes"[^>]*value="4"[^>]*max="6"', html)
    assert html.count('type="checkbox" name="ssh_keys"') == 2
    assert html.count("checked") >= 3  # both keys and the "None" software
    assert re.search(r'<option value="default" selected>', html)
    assert "Community" not in page


def test_the_new_cluster_form_highlights_create_cluster_in_the_navigation(owner):
    machine_type = machine_type_with_hosts(free=2)

    html = owner.browser_client().get(f"/clusters/new/?offer={machine_type.slug}").content.decode()

    assert 'aria-current="page">Create cluster</a>' in html
    assert 'aria-current="page">Clusters</a>' not in html


def test_the_new_cluster_form_calls_what_the_user_rents_machines(owner):
    machine_type = machine_type_with_hosts(free=2)

    html = owner.browser_client().get(f"/clusters/new/?offer={machine_type.slug}").content.decode()

    assert '<label for="id_nodes">Machines</label>' in html
    assert "Machines are called <code>node-0</code>" in html
    assert ">Nodes<" not in html and "on every node" not in html


def test_it_disables_kubernetes_on_a_container_offer_and_says_why(owner):
    machine_type = machine_type_with_hosts(free=2, machine_kind=MachineType.Kind.CONTAINER)

    html = owner.browser_client().get(f"/clusters/new/?offer={machine_type.slug}").content.decode()

    kubernetes = re.search(r'<input type="radio" name="software" value="kubernetes"[^>]*>', html)
    assert "disabled" in kubernetes.group(0)
    assert "Kubernetes needs a virtual machine or bare metal" in html


def test_it_warns_about_community_hosts(owner):
    machine_type = machine_type_with_hosts(free=2, community=True)

    page = text_of(owner.browser_client().get(f"/clusters/new/?offer={machine_type.slug}"))

    assert "Community" in page
    assert "run by independent operators: keep secrets" in page


def test_it_says_when_the_project_has_no_ssh_keys_and_links_to_add_one(owner):
    machine_type = machine_type_with_hosts(free=2)

    response = owner.browser_client().get(f"/clusters/new/?offer={machine_type.slug}")

    assert "has no SSH keys yet" in text_of(response)
    assert 'href="/accounts/ssh-keys/"' in response.content.decode()


def test_it_answers_404_with_a_message_for_an_unknown_offer(owner):
    response = owner.browser_client().get("/clusters/new/?offer=no-such-thing&nodes=2")

    assert response.status_code == 404
    assert "There is no offer “no-such-thing”" in text_of(response)


def test_it_updates_the_price_summary_when_the_nodes_change(owner):
    machine_type = machine_type_with_hosts(free=8, price_per_hour=Decimal("2.50"))

    response = owner.browser_client().get(
        f"/clusters/new/?offer={machine_type.slug}&nodes=8", headers=HTMX
    )

    assert response.content.decode().lstrip().startswith('<div class="card price-card"')
    assert "$20.00" in text_of(response)


def test_it_warns_before_submitting_when_the_balance_is_short(owner):
    machine_type = machine_type_with_hosts(free=4, price_per_hour=Decimal("20.00"))
    credit(owner.project, "30.00")

    page = text_of(owner.browser_client().get(f"/clusters/new/?offer={machine_type.slug}&nodes=4"))

    assert "Your balance is $30.00: creating this cluster needs at least $80.00" in page


def test_it_keeps_a_location_that_only_says_yes_or_no_to_eight_nodes(owner):
    location = LocationFactory(capacity_reporting=Location.CapacityReporting.BOOLEAN)
    machine_type = machine_type_with_hosts(free=1, location=location)

    html = owner.browser_client().get(f"/clusters/new/?offer={machine_type.slug}").content.decode()

    assert re.search(r'name="nodes"[^>]*max="8"', html)


# --- creating, and the actions -------------------------------------------------------------


@pytest.fixture
def offer(owner) -> MachineType:
    """4 free machines at 10 USD an hour, two keys and 500 USD on the owner's project."""
    ssh_key(owner.project, "laptop")
    ssh_key(owner.project, "desktop")
    credit(owner.project, "500.00")
    return machine_type_with_hosts(free=4, slug="use2-h100x8-vm", price_per_hour=Decimal("10.00"))


@pytest.fixture(autouse=True)
def _work_in_memory():
    from clusters import lifecycle

    with lifecycle.dispatching_to(lifecycle.CollectingDispatcher()) as dispatcher:
        yield dispatcher


def submit(person, offer: MachineType, **fields):
    keys = list(person.project.ssh_keys.values_list("pk", flat=True))
    data = {
        "offer": offer.slug,
        "name": "train",
        "nodes": "2",
        "environment": "default",
        "software": "none",
        "ssh_keys": keys,
        **fields,
    }
    return person.browser_client().post("/clusters/new/", data)


def error_beside(response, field: str) -> str:
    """The errors rendered inside the form field's own block (its div or fieldset)."""
    html = response.content.decode()
    blocks = re.split(r'(?=<(?:div|fieldset) class="field)', html)
    block = next(
        b for b in blocks if f'name="{field}"' in b and b.startswith(("<div", "<fieldset"))
    )
    assert "has-error" in block.split(">", 1)[0], f"{field} is not marked as wrong"
    errors = re.search(r'<ul class="errorlist[^"]*"[^>]*>(.*?)</ul>', block, re.S)
    assert errors, f"no error list beside {field}"
    return " ".join(re.sub(r"<[^>]+>", " ", errors.group(1)).split())


def test_it_creates_a_cluster_and_opens_its_page(owner, offer):
    response = submit(owner, offer, nodes="3", software="slurm")

    cluster = Cluster.objects.get()
    assert response.status_code == 302
    assert response["Location"] == f"/clusters/{cluster.pk}/"
    assert (cluster.name, cluster.size, cluster.software) == ("train", 3, "slurm")
    assert cluster.ssh_keys.count() == 2
    assert frees(offer) == 1


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        ({"name": "Not_A_Label"}, "name", "A cluster name is a DNS label"),
        ({"nodes": "1"}, "nodes", "A cluster has at least 2 machines; for one machine"),
        ({"nodes": "5"}, "nodes", "only 4 are free"),
        ({"nodes": "many"}, "nodes", "whole number"),
        ({"ssh_keys": []}, "ssh_keys", "Add an SSH public key first"),
        ({"software": "nomad"}, "software", "Select a valid choice"),
    ],
)
def test_it_shows_a_refusal_beside_its_field_keeps_the_input_and_reserves_nothing(
    owner, offer, fields, field, message
):
    response = submit(owner, offer, **fields)

    assert response.status_code == 400
    assert message in error_beside(response, field)
    assert Cluster.objects.count() == 0 and frees(offer) == 4
    html = response.content.decode()
    typed = fields.get("name", "train")
    assert f'value="{typed}"' in html


def test_it_shows_a_refusal_without_a_field_on_top(owner, offer):
    credit(owner.project, "-495.00")

    response = submit(owner, offer)

    assert response.status_code == 400
    top = re.search(
        r'<div class="flash flash-error" role="alert">(.*?)</div>', response.content.decode(), re.S
    )
    assert "Your balance is $5.00" in top.group(1) and "$20.00" in top.group(1)
    assert Cluster.objects.count() == 0 and frees(offer) == 4


def test_it_refuses_kubernetes_on_containers_beside_the_software(owner, offer):
    MachineType.objects.filter(pk=offer.pk).update(machine_kind=MachineType.Kind.CONTAINER)

    response = submit(owner, offer, software="kubernetes")

    assert "Kubernetes needs virtual machines or bare metal" in error_beside(response, "software")
    assert Cluster.objects.count() == 0 and frees(offer) == 4


def test_it_refuses_a_name_taken_by_a_live_cluster_beside_the_name(owner, offer):
    submit(owner, offer)

    response = submit(owner, offer)

    assert "already exists" in error_beside(response, "name")
    assert Cluster.objects.count() == 1


def test_it_asks_to_confirm_before_terminating_and_terminates_on_post(owner, offer):
    submit(owner, offer)
    cluster = Cluster.objects.get()
    client = owner.browser_client()

    confirm = client.get(f"/clusters/{cluster.pk}/terminate/")
    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.PROVISIONING
    assert "Everything on them is deleted" in text_of(confirm)
    assert (
        f'<form method="post" action="/clusters/{cluster.pk}/terminate/"'
        in confirm.content.decode()
    )

    done = client.post(f"/clusters/{cluster.pk}/terminate/")

    cluster.refresh_from_db()
    assert done.status_code == 302 and done["Location"] == f"/clusters/{cluster.pk}/"
    assert cluster.status == Cluster.Status.TERMINATING
    again = client.post(f"/clusters/{cluster.pk}/terminate/", follow=True)
    assert "can be terminated" in text_of(again)


def test_it_keeps_strangers_away_from_the_actions(owner, stranger, offer):
    submit(owner, offer)
    cluster = Cluster.objects.get()
    client = stranger.browser_client()

    responses = [
        client.get(f"/clusters/{cluster.pk}/terminate/"),
        client.post(f"/clusters/{cluster.pk}/terminate/"),
        client.post(f"/clusters/{cluster.pk}/retry-install/"),
        client.post(f"/clusters/{cluster.pk}/workers/", {"count": "1"}),
    ]

    assert [r.status_code for r in responses] == [404] * 4
    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.PROVISIONING


def test_it_says_why_an_action_does_not_fit_the_status(owner, offer):
    submit(owner, offer)
    cluster = Cluster.objects.get()
    client = owner.browser_client()

    retry = client.post(f"/clusters/{cluster.pk}/retry-install/", follow=True)
    workers = client.post(f"/clusters/{cluster.pk}/workers/", {"count": "1"}, follow=True)
    nonsense = client.post(f"/clusters/{cluster.pk}/workers/", {"count": "x"}, follow=True)

    assert "Retry install is for a degraded cluster" in text_of(retry)
    assert "Workers can be added to a ready cluster" in text_of(workers)
    assert "as a whole number" in text_of(nonsense)


def test_it_shows_how_to_reach_node_0_on_a_running_cluster(owner):
    gateway = LocationFactory(ssh_gateway="gw.us-east-2.runcrate.net:22")
    now = timezone.now()
    cluster = ClusterFactory(
        project=owner.project,
        machine_type=MachineTypeFactory(location=gateway),
        status=Cluster.Status.READY,
        joined_at=now,
        ready_at=now,
        machines=True,
        machines__status=Node.Status.JOINED,
    )

    html = owner.browser_client().get(f"/clusters/{cluster.pk}/").content.decode()

    assert f"ssh -J c{cluster.pk}@gw.us-east-2.runcrate.net:22 root@node-0" in html


def test_the_cluster_page_shows_the_acceptance_report_and_a_lost_machine(owner):
    now = timezone.now()
    report = {
        "measured_at": now.isoformat(),
        "expected": {"gpu": "H100 SXM 80GB", "gpus_per_machine": 2, "memory_gib": 80},
        "nodes": [
            {
                "name": "node-0",
                "gpus": [{"name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559}] * 2,
                "reachability": {"node-1": True},
                "latency_ms": None,
                "bandwidth_mbit": None,
                "method": None,
            },
            {
                "name": "node-1",
                "gpus": [{"name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559}] * 2,
                "reachability": {"node-0": True},
                "latency_ms": 0.314,
                "bandwidth_mbit": 1712.4,
                "method": "tcp-stream",
                "shared": "sshfs",
            },
        ],
    }
    cluster = ClusterFactory(
        project=owner.project,
        status=Cluster.Status.DEGRADED,
        joined_at=now,
        ready_at=now,
        acceptance=report,
        failure_reason="machine_lost",
        failure_node="node-1",
        failure_message="node-1 was lost: its agent has been silent for 181 seconds.",
        machines=True,
        machines__status=Node.Status.JOINED,
    )
    cluster.nodes.filter(index=1).update(status=Node.Status.LOST, heartbeat_at=now)

    client = owner.browser_client()
    overview = client.get(f"/clusters/{cluster.pk}/").content.decode()
    page = client.get(f"/clusters/{cluster.pk}/machines/").content.decode()
    assert "Acceptance report" in page
    assert "1,712 Mbit/s" in page and "0.31 ms" in page and "tcp-stream" in page
    assert re.search(r"mounted\s*<span[^>]*>sshfs</span>", page)  # how node-1 mounts /shared
    assert "2 × NVIDIA H100 80GB HBM3" in page
    assert "A machine was lost: node-1." in overview
    assert f"Lost: silent since {now:%H:%M:%S} UTC" in page
    assert "did not install" not in page + overview


# --- a user in no project -----------------------------------------------------------------------


@pytest.mark.parametrize("method", ["get", "post"])
def test_it_answers_404_on_the_create_form_to_a_user_in_no_project(owner, offer, method):
    # Removed from their last project: the form would read a balance and keys that are nobody's.
    owner.user.memberships.all().delete()

    client = owner.browser_client()
    data = {"offer": offer.slug, "nodes": "2", "name": "train", "environment": "default"}
    response = getattr(client, method)("/clusters/new/", data)

    assert response.status_code == 404
    assert "Nothing is here" in text_of(response)
    assert not Cluster.objects.exists()
