"""Quoted clusters (SPEC §7): staff create one in admin from a won quote request, on any machine
type and past the self-serve size limit, at an agreed price; the user sees it beside their own
clusters with a badge and its terms, and it is billed at the agreed price."""

import datetime
import re
from datetime import timedelta
from decimal import Decimal

import pytest
from django.test import Client
from django.urls import reverse

from accounts.models import User
from billing import meter
from billing.models import LedgerEntry, UsageRecord
from clusters import lifecycle
from clusters.errors import ClusterRefused
from clusters.models import QUOTED_MAX_NODES, Cluster, Event, Node
from offers.models import MAX_NODES, Host, MachineType, QuoteRequest
from tests.clusters.lifecycle_kit import at, create, environment_of, inventory, new_project
from tests.factories import issue_key

BOOT = 180
JOINED = BOOT * 1.5  # a simulated cluster joins 1.5 boot times after creation
AGREED = Decimal("12.50")
LIST_PRICE = Decimal("20.00")
SIZE = MAX_NODES + 6  # past the self-serve limit


@pytest.fixture
def requester(db):
    return new_project(balance="50000.00")


@pytest.fixture
def infiniband(db) -> MachineType:
    machine_type = inventory(hosts=SIZE, boot_seconds=BOOT, price=str(LIST_PRICE))
    machine_type.interconnect = MachineType.Interconnect.INFINIBAND
    machine_type.save(update_fields=["interconnect"])
    return machine_type


def won_quote(project, machine_type, *, status=QuoteRequest.Status.WON, user=None):
    return QuoteRequest.objects.create(
        project=project,
        requested_by=user,
        gpu=machine_type.gpu,
        location=machine_type.location,
        nodes=SIZE,
        interconnect=MachineType.Interconnect.INFINIBAND,
        start_date=datetime.date(2026, 4, 6),
        duration_weeks=8,
        contact_name="Ada",
        contact_email="ada@example.com",
        status=status,
    )


@pytest.fixture
def staff(db) -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("staff@example.com", password=None))
    return client


def client_of(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def form_data(quote, on_type, **changes) -> dict:
    return {
        "quote": quote.pk,
        "machine_type": on_type.pk,
        "nodes": SIZE,
        "agreed_price_per_machine_hour": str(AGREED),
        "name": "big-train",
        "software": "none",
        "environment": "default",
        **changes,
    }


def quoted_cluster(project, machine_type, quote, *, nodes=SIZE, name="big-train") -> Cluster:
    return lifecycle.create_cluster(
        project=project,
        user=quote.requested_by,
        environment=environment_of(project),
        offer_slug=machine_type.slug,
        nodes=nodes,
        name=name,
        software="none",
        quoted=lifecycle.Quoted(quote=quote, price_per_machine_hour=AGREED),
    )


# --- staff create it in admin ------------------------------------------------------------------


def test_it_creates_a_quoted_cluster_from_a_won_quote_through_the_admin(
    staff, requester, infiniband, sim
):
    user, project = requester
    quote = won_quote(project, infiniband, user=user)

    # The QuoteRequest admin's action opens the form, prefilled from the quote.
    response = staff.post(
        reverse("admin:offers_quoterequest_changelist"),
        {"action": "create_quoted_cluster", "_selected_action": [quote.pk]},
    )
    add_url = f"{reverse('admin:clusters_cluster_add')}?quote={quote.pk}"
    assert response.status_code == 302 and response["Location"] == add_url
    form = staff.get(add_url).context["form"]
    assert form.initial == {
        "quote": quote.pk,
        "nodes": SIZE,
        "name": f"quote-{quote.pk}",
        "machine_type": infiniband.pk,
    }

    response = staff.post(reverse("admin:clusters_cluster_add"), form_data(quote, infiniband))

    cluster = Cluster.objects.get(project=project)
    assert response.status_code == 302
    assert response["Location"] == reverse("admin:clusters_cluster_change", args=[cluster.pk])
    assert (cluster.quote, cluster.agreed_price_per_machine_hour) == (quote, AGREED)
    assert (cluster.machine_type, cluster.size, cluster.status) == (
        infiniband,
        SIZE,
        "provisioning",
    )
    assert cluster.created_by == user  # the requester gets its emails, not staff
    assert cluster.nodes.filter(holds_host=True).count() == SIZE
    assert Host.objects.filter(machine_type=infiniband, state=Host.State.RESERVED).count() == SIZE
    created = cluster.events.get(reason=Event.Reason.CREATED)
    assert "agreed $12.50 per machine-hour" in created.message
    assert sim.dispatcher.advances == [cluster.pk]  # the reconciler takes it from here


@pytest.mark.parametrize(
    ("changes", "field", "message"),
    [
        ({"nodes": "255"}, "nodes", "less than or equal to 254"),
        ({"agreed_price_per_machine_hour": "0"}, "agreed_price_per_machine_hour", "0.01"),
        ({"agreed_price_per_machine_hour": "1e30"}, "agreed_price_per_machine_hour", "digits"),
        ({"name": "Not A Label"}, "name", "DNS label"),
        ({"environment": "nope"}, "environment", "no environment 'nope'"),
        ({"software": "kubernetes", "machine_type": "container"}, "software", "Kubernetes"),
    ],
)
def test_it_shows_a_bad_field_beside_it_and_creates_nothing(
    staff, requester, infiniband, sim, changes, field, message
):
    _, project = requester
    quote = won_quote(project, infiniband)
    if changes.get("machine_type") == "container":
        changes["machine_type"] = inventory(hosts=0, kind=MachineType.Kind.CONTAINER).pk

    response = staff.post(
        reverse("admin:clusters_cluster_add"), form_data(quote, infiniband, **changes)
    )

    assert response.status_code == 200
    assert message in " ".join(response.context["form"].errors[field])
    assert not Cluster.objects.exists()
    assert not Host.objects.filter(state=Host.State.RESERVED).exists()


def test_it_offers_only_won_quotes(staff, requester, infiniband, sim):
    _, project = requester
    contacted = won_quote(project, infiniband, status=QuoteRequest.Status.CONTACTED)

    response = staff.post(reverse("admin:clusters_cluster_add"), form_data(contacted, infiniband))
    assert "quote" in response.context["form"].errors
    response = staff.post(
        reverse("admin:offers_quoterequest_changelist"),
        {"action": "create_quoted_cluster", "_selected_action": [contacted.pk]},
        follow=True,
    )
    assert "mark it won first" in response.content.decode()
    assert not Cluster.objects.exists()


def test_it_keeps_the_balance_rule_at_the_agreed_price(staff, infiniband, sim):
    # One hour of 70 machines at the agreed $12.50 is $875; the list price would need $1,400.
    _, poor = new_project(balance="874.99")
    _, enough = new_project(balance="875.00")

    refused = staff.post(
        reverse("admin:clusters_cluster_add"), form_data(won_quote(poor, infiniband), infiniband)
    )
    accepted = staff.post(
        reverse("admin:clusters_cluster_add"),
        form_data(won_quote(enough, infiniband), infiniband),
    )

    assert "needs at least $875.00" in " ".join(refused.context["form"].non_field_errors())
    assert accepted.status_code == 302
    assert list(Cluster.objects.values_list("project", flat=True)) == [enough.pk]


def test_it_says_when_too_few_hosts_are_free_and_reserves_none(staff, requester, infiniband, sim):
    _, project = requester
    quote = won_quote(project, infiniband)

    response = staff.post(
        reverse("admin:clusters_cluster_add"), form_data(quote, infiniband, nodes=SIZE + 1)
    )

    assert "Only 70 machines of this type are free" in " ".join(
        response.context["form"].errors["nodes"]
    )
    assert not Host.objects.filter(state=Host.State.RESERVED).exists()


# --- the lifecycle's rules ---------------------------------------------------------------------


def test_self_serve_never_creates_on_an_infiniband_type_nor_past_the_limit(requester, infiniband):
    _, project = requester
    ethernet = inventory(hosts=2)

    with pytest.raises(ClusterRefused) as unlisted:
        create(project, infiniband, nodes=2)
    with pytest.raises(ClusterRefused) as too_big:
        create(project, ethernet, nodes=MAX_NODES + 1)

    assert unlisted.value.code == "unknown_offer"
    assert too_big.value.code == "invalid_nodes"


def test_it_refuses_terms_from_a_quote_not_won_or_of_another_project(requester, infiniband, sim):
    _, project = requester
    _, other = new_project()

    with pytest.raises(ClusterRefused) as lost:
        quoted_cluster(
            project, infiniband, won_quote(project, infiniband, status=QuoteRequest.Status.LOST)
        )
    with pytest.raises(ClusterRefused) as elsewhere:
        quoted_cluster(project, infiniband, won_quote(other, infiniband))

    assert (lost.value.code, elsewhere.value.code) == ("quote_not_won", "unknown_quote")
    assert not Cluster.objects.exists()


def test_it_bills_a_quoted_cluster_at_the_agreed_price(requester, infiniband, sim, clock):
    _, project = requester
    cluster = quoted_cluster(project, infiniband, won_quote(project, infiniband), nodes=4)
    sim.run_until(clock, at(JOINED))
    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.READY

    records = UsageRecord.objects.filter(cluster=cluster)
    assert sorted(records.values_list("price_per_hour", flat=True)) == [AGREED] * 4
    started = cluster.joined_at
    meter.charge_accrued(now=started + timedelta(hours=1))

    charged = LedgerEntry.objects.filter(cluster=cluster, kind=LedgerEntry.Kind.USAGE)
    assert sum(line.amount for line in charged) == -(AGREED * 4)  # 4 machine-hours
    assert sum(line.machine_seconds for line in charged) == 4 * 3600


def test_it_refuses_to_add_workers_to_a_quoted_cluster(requester, infiniband, sim, clock):
    _, project = requester
    cluster = quoted_cluster(project, infiniband, won_quote(project, infiniband), nodes=2)
    sim.run_until(clock, at(JOINED))

    with pytest.raises(ClusterRefused) as refused:
        lifecycle.add_workers(cluster=cluster, count=1)

    assert refused.value.code == "invalid_state"
    assert "request a quote" in refused.value.message
    assert cluster.nodes.count() == 2


# --- what the user sees ------------------------------------------------------------------------


def test_the_user_sees_it_beside_self_serve_clusters_with_its_badge_and_terms(
    requester, infiniband, sim, clock
):
    user, project = requester
    quoted = quoted_cluster(project, infiniband, won_quote(project, infiniband, user=user))
    create(project, inventory(hosts=2, price="3.00"), nodes=2, name="self-serve")
    client = client_of(user)

    page = client.get(reverse("clusters:list")).content.decode()

    rows = re.findall(r"<tr>(.*?)</tr>", page, re.S)
    quoted_row = next(row for row in rows if "big-train" in row)
    own_row = next(row for row in rows if "self-serve" in row)
    assert ">quoted</span>" in quoted_row and ">quoted</span>" not in own_row
    assert "agreed $12.50 per machine-hour" in quoted_row
    assert "$875.00" in quoted_row  # 70 machines at the agreed price, not the list price
    assert "$6.00" in own_row

    detail = client.get(reverse("clusters:detail", args=[quoted.pk])).content.decode()
    assert '<span class="badge badge-lg badge-accent">quoted</span>' in detail
    assert "$875.00" in detail and "$12.50 per machine, as agreed" in detail
    assert "Created by our team from your quote request" in detail
    assert "$12.50 per machine-hour" in detail
    assert "8 weeks from Apr 6, 2026" in detail
    assert 'id="add-workers"' not in detail


def test_a_ready_infiniband_cluster_describes_its_own_network_not_ethernet(
    requester, infiniband, sim, clock
):
    user, project = requester
    cluster = quoted_cluster(project, infiniband, won_quote(project, infiniband), nodes=2)
    sim.run_until(clock, at(JOINED))
    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.READY
    client = client_of(user)

    # The overview's facts, the Connect tab's panel and the Machines tab's network test.
    detail = "".join(
        client.get(url).content.decode()
        for url in (
            reverse("clusters:detail", args=[cluster.pk]),
            reverse("clusters:tab", args=[cluster.pk, "connect"]),
            reverse("clusters:tab", args=[cluster.pk, "machines"]),
        )
    )
    api = Client(headers={"authorization": f"Bearer {issue_key(user=user, project=project)}"})
    connect = api.get(f"/api/v1/clusters/{cluster.pk}/connect")

    assert "for SSH and the software; GPUs talk over InfiniBand" in detail
    assert "The machines are joined over InfiniBand, as agreed in the quote" in detail
    assert "What InfiniBand is expected to give" in detail
    assert "Ethernet" not in detail and "Request a quote</a> for InfiniBand" not in detail
    assert connect.status_code == 200, connect.content
    assert "joined over InfiniBand" in connect.json()["data"]["bandwidth"]


def test_the_api_gives_the_agreed_price_and_says_quoted(requester, infiniband, sim):
    user, project = requester
    quoted = quoted_cluster(project, infiniband, won_quote(project, infiniband))
    api = Client(headers={"authorization": f"Bearer {issue_key(user=user, project=project)}"})

    data = api.get(f"/api/v1/clusters/{quoted.pk}").json()["data"]

    assert data["quoted"] is True
    assert data["machine_price_per_hour"] == "12.50"
    assert data["price_per_hour"] == "875.00"


# --- who can reach it --------------------------------------------------------------------------


def test_a_user_without_staff_reaches_none_of_the_admin(requester, infiniband, sim):
    user, project = requester
    quote = won_quote(project, infiniband, user=user)
    cluster = quoted_cluster(project, infiniband, quote)
    client = client_of(user)
    urls = [
        reverse("admin:clusters_cluster_changelist"),
        reverse("admin:clusters_cluster_add"),
        reverse("admin:clusters_cluster_change", args=[cluster.pk]),
        reverse("admin:clusters_node_changelist"),
        reverse("admin:clusters_volume_changelist"),
        reverse("admin:offers_quoterequest_changelist"),
    ]

    for url in urls:
        response = client.get(url)
        assert response.status_code == 302 and response["Location"].startswith("/admin/login/")
    response = client.post(reverse("admin:clusters_cluster_add"), form_data(quote, infiniband))
    assert response.status_code == 302
    response = client.post(
        reverse("admin:clusters_cluster_changelist"),
        {"action": "terminate", "_selected_action": [cluster.pk]},
    )
    assert response.status_code == 302
    assert list(Cluster.objects.values_list("status", flat=True)) == ["provisioning"]


def test_a_staff_user_without_the_permissions_cannot_create_or_terminate(
    requester, infiniband, sim
):
    _, project = requester
    quote = won_quote(project, infiniband)
    cluster = quoted_cluster(project, infiniband, quote)
    clerk = User.objects.create(email="clerk@example.com", is_staff=True)
    client = client_of(clerk)

    assert client.get(reverse("admin:clusters_cluster_add")).status_code == 403
    assert (
        client.post(reverse("admin:clusters_cluster_add"), form_data(quote, infiniband)).status_code
        == 403
    )
    assert client.get(reverse("admin:clusters_cluster_changelist")).status_code == 403
    assert Cluster.objects.count() == 1
    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.PROVISIONING


def test_another_project_sees_none_of_it(requester, infiniband, sim):
    _, project = requester
    cluster = quoted_cluster(project, infiniband, won_quote(project, infiniband))
    stranger, _ = new_project()
    client = client_of(stranger)

    assert client.get(reverse("clusters:detail", args=[cluster.pk])).status_code == 404
    assert "big-train" not in client.get(reverse("clusters:list")).content.decode()
    assert client.get(reverse("clusters:terminate", args=[cluster.pk])).status_code == 404
    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.PROVISIONING
    assert Node.objects.filter(cluster=cluster, holds_host=True).count() == SIZE


def test_a_quoted_cluster_stops_at_the_private_networks_254_addresses(requester, infiniband):
    _, project = requester
    quote = won_quote(project, infiniband)

    with pytest.raises(ClusterRefused) as refused:
        quoted_cluster(project, infiniband, quote, nodes=QUOTED_MAX_NODES + 1)

    assert (refused.value.code, refused.value.field) == ("invalid_nodes", "nodes")
    assert "2 to 254 machines" in refused.value.message
    assert not Host.objects.filter(state=Host.State.RESERVED).exists()
