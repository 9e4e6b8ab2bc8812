"""Volumes (SPEC §6, docs/volumes.md): the Storage page, the API, and attaching one to a cluster
at create time. Every refusal leaves nothing created, attached, deleted or reserved."""

import re
from datetime import timedelta
from decimal import Decimal
from html import unescape

import pytest
import time_machine
from django.utils import timezone

from billing.models import LedgerEntry
from clusters import lifecycle, volumes
from clusters.models import Cluster, Node, Volume
from offers.models import Host, MachineType
from tests.clusters.front import credit, machine_type_with_hosts, ssh_key
from tests.clusters.lifecycle_kit import T0, Sim, node
from tests.factories import ClusterFactory, LocationFactory, MachineTypeFactory

API = "/api/v1/volumes"


def text_of(response) -> str:
    return " ".join(unescape(re.sub(r"<[^>]+>", " ", response.content.decode())).split())


@pytest.fixture(autouse=True)
def _work_in_memory():
    with lifecycle.dispatching_to(lifecycle.CollectingDispatcher()) as dispatcher:
        yield dispatcher


@pytest.fixture(autouse=True)
def _balances_that_cover_storage(request):
    """Every project here can pay for a day of its volumes, which creating one needs; the rule
    itself is tested with an empty balance (test_it_refuses_a_volume_the_balance_cannot_pay)."""
    for person in ("owner", "stranger"):
        if person in request.fixturenames:
            credit(request.getfixturevalue(person).project, "100.00")


def sold_in(location):
    """A location where an offer can attach a volume (a datacenter machine type is sold there),
    which creating a volume needs."""
    MachineTypeFactory(location=location, community=False)
    return location


@pytest.fixture
def ohio(db):
    return sold_in(
        LocationFactory(
            code="us-east-2", name="Columbus, Ohio", volume_price_per_gb_month=Decimal("0.08")
        )
    )


@pytest.fixture
def tokyo(db):
    return sold_in(
        LocationFactory(
            code="ap-northeast-1", name="Tokyo, Japan", volume_price_per_gb_month=Decimal("0.12")
        )
    )


@pytest.fixture
def offer(owner, ohio) -> MachineType:
    """Four free VMs in Ohio at 10 USD an hour; the owner has a key and 500 USD."""
    ssh_key(owner.project)
    credit(owner.project, "500.00")
    return machine_type_with_hosts(
        free=4, slug="use2-h100x8-vm", price_per_hour=Decimal("10.00"), location=ohio
    )


def volume(person, location, name="datasets", size_gb=500) -> Volume:
    return volumes.create_volume(
        project=person.project, name=name, location=location.code, size_gb=size_gb
    )


def snapshot():
    """What a refusal must leave as it was."""
    return (
        list(Volume.objects.order_by("pk").values_list("pk", "cluster_id", "deleted_at")),
        Cluster.objects.count(),
        Host.objects.filter(state=Host.State.FREE).count(),
        LedgerEntry.objects.count(),
    )


def create_cluster_api(person, **fields):
    body = {"name": "train", "offer_id": "use2-h100x8-vm", "nodes": 2, **fields}
    return person.api().post("/api/v1/clusters", body, content_type="application/json")


def error_of(response) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["code"]


# --- the Storage page -------------------------------------------------------------------------


def test_it_lists_the_projects_volumes_with_location_size_price_and_cluster(
    owner, stranger, ohio, tokyo
):
    attached = volume(owner, ohio, "datasets", 500)
    volume(owner, tokyo, "checkpoints", 2000)
    volume(stranger, ohio, "someone-elses")
    cluster = ClusterFactory(project=owner.project, name="train", status=Cluster.Status.READY)
    Volume.objects.filter(pk=attached.pk).update(cluster=cluster)

    response = owner.browser_client().get("/storage/")
    page = text_of(response)

    assert response.status_code == 200
    assert 'aria-current="page">Storage</a>' in response.content.decode()
    assert "Columbus, Ohio us-east-2 500 GB $40.00 $0.08 per GB-month train attached" in page
    assert "Tokyo, Japan ap-northeast-1 2,000 GB $240.00 $0.12 per GB-month —" in page
    assert "$280.00" in page  # every volume, per month
    assert "someone-elses" not in page
    assert "in use by train" in page


def test_it_creates_a_volume_from_the_storage_page(owner, ohio):
    response = owner.browser_client().post(
        "/storage/", {"name": "datasets", "location": "us-east-2", "size_gb": "250"}, follow=True
    )

    created = Volume.objects.get(project=owner.project)
    assert (created.name, created.location, created.size_gb) == ("datasets", ohio, 250)
    assert created.price_per_gb_month == Decimal("0.08")
    storage = created.storage  # billed from its creation, at its size and price
    assert (storage.started_at, storage.charged_until) == (created.created_at, created.created_at)
    assert (storage.size_gb, storage.price_per_gb_month) == (250, Decimal("0.08"))
    assert "Volume datasets created: 250 GB in us-east-2, $20.00 per month." in text_of(response)


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        ({"name": "Data_Sets"}, "name", "A volume name is a DNS label"),
        ({"name": "-data"}, "name", "A volume name is a DNS label"),
        ({"name": "taken"}, "name", "already has a volume named 'taken'"),
        ({"size_gb": "0"}, "size_gb", "A volume holds 1 to 100,000 GB"),
        ({"size_gb": "100001"}, "size_gb", "A volume holds 1 to 100,000 GB"),
        ({"size_gb": "lots"}, "size_gb", "The size is a whole number of GB"),
        ({"location": "mars-1"}, "location", "Select a valid choice"),
    ],
)
def test_it_refuses_a_bad_volume_on_the_page_beside_its_field(owner, ohio, fields, field, message):
    volume(owner, ohio, "taken")
    before = snapshot()

    response = owner.browser_client().post(
        "/storage/", {"name": "datasets", "location": "us-east-2", "size_gb": "10", **fields}
    )

    assert response.status_code == 400
    html = response.content.decode()
    assert message in text_of(response)
    assert re.search(
        rf'<div class="field field-{field} has-error">\s*<label for="id_{field}">', html
    )
    assert snapshot() == before


def test_it_deletes_a_volume_after_asking(owner, ohio):
    doomed = volume(owner, ohio)
    client = owner.browser_client()

    confirm = client.get(f"/storage/{doomed.pk}/delete/")
    assert "Every file on it is deleted" in text_of(confirm)
    response = client.post(f"/storage/{doomed.pk}/delete/", follow=True)

    doomed.refresh_from_db()
    assert doomed.deleted_at is not None
    assert "Volume datasets deleted" in text_of(response)
    assert "No volumes yet" in text_of(client.get("/storage/"))
    # Its name is free again.
    assert volume(owner, ohio).pk != doomed.pk


def test_it_refuses_to_delete_an_attached_volume_from_the_page(owner, ohio):
    held = volume(owner, ohio)
    cluster = ClusterFactory(project=owner.project, name="train", status=Cluster.Status.READY)
    Volume.objects.filter(pk=held.pk).update(cluster=cluster)
    client = owner.browser_client()

    listing = client.get("/storage/").content.decode()
    assert f'href="/storage/{held.pk}/delete/"' not in listing  # disabled, with its reason
    assert "it can be deleted once that cluster ends" in listing
    response = client.post(f"/storage/{held.pk}/delete/", follow=True)

    assert "Volume datasets is attached to cluster train: it cannot be deleted" in text_of(response)
    held.refresh_from_db()
    assert held.deleted_at is None and held.cluster == cluster


def test_it_answers_404_to_a_stranger_deleting_a_volume(owner, stranger, ohio):
    theirs = volume(owner, ohio)
    client = stranger.browser_client()

    assert client.get(f"/storage/{theirs.pk}/delete/").status_code == 404
    assert client.post(f"/storage/{theirs.pk}/delete/").status_code == 404
    theirs.refresh_from_db()
    assert theirs.deleted_at is None


# --- the API ------------------------------------------------------------------------------


def test_it_creates_lists_and_deletes_volumes_through_the_api(owner, stranger, ohio):
    api = owner.api()
    volume(stranger, ohio, "someone-elses")

    created = api.post(
        API,
        {"name": "datasets", "location": "us-east-2", "size_gb": 1000},
        content_type="application/json",
    )

    assert created.status_code == 201
    data = created.json()["data"]
    assert data == {
        "id": data["id"],
        "name": "datasets",
        "location": "us-east-2",
        "size_gb": 1000,
        "price_per_gb_month": "0.08",
        "price_per_month": "80.00",
        "created_at": data["created_at"],
        "attached_to": None,
    }
    listed = api.get(API).json()
    assert [v["name"] for v in listed["data"]] == ["datasets"]
    assert listed["meta"] == {"total": 1, "limit": 50, "offset": 0}

    deleted = api.delete(f"{API}/{data['id']}")
    assert deleted.status_code == 204
    assert api.get(API).json()["data"] == []
    assert Volume.objects.get(pk=data["id"]).deleted_at is not None


@pytest.mark.parametrize(
    ("fields", "status", "code"),
    [
        ({"name": "Data Sets"}, 422, "invalid_name"),
        ({"name": "taken"}, 409, "name_taken"),
        ({"location": "mars-1"}, 422, "unknown_location"),
        ({"size_gb": 0}, 422, "invalid_size"),
        ({"size_gb": 100_001}, 422, "invalid_size"),
        ({"size_gb": "lots"}, 422, "invalid_request"),
    ],
)
def test_it_refuses_a_bad_volume_in_the_api_with_its_code(owner, ohio, fields, status, code):
    volume(owner, ohio, "taken")
    before = snapshot()
    body = {"name": "datasets", "location": "us-east-2", "size_gb": 10, **fields}

    response = owner.api().post(API, body, content_type="application/json")

    assert error_of(response) == (status, code)
    assert response.json()["error"]["message"]
    assert snapshot() == before


def test_it_refuses_a_volume_the_balance_cannot_pay_for_a_week_on_the_page(owner, ohio):
    credit(owner.project, "-100.00")  # the owner's balance is $0.00
    before = snapshot()

    response = owner.browser_client().post(
        "/storage/", {"name": "datasets", "location": "us-east-2", "size_gb": "100000"}
    )

    assert response.status_code == 400
    assert (
        "Your balance is $0.00; a 100,000 GB volume in us-east-2 ($8,000.00 a month) needs at "
        "least $1,866.67: 7 days of your volumes' storage, this one included."
    ) in text_of(response)
    assert snapshot() == before


def test_it_refuses_a_volume_the_balance_cannot_pay_for_a_week_in_the_api(owner, ohio):
    # $100 covers 7 days of 5,357 GB at $0.08 a GB-month ($99.9973…, rounded up to $100.00),
    # not of 5,358 GB ($100.016…).
    api = owner.api()
    body = {"name": "datasets", "location": "us-east-2", "size_gb": 5_357}
    assert api.post(API, body, content_type="application/json").status_code == 201
    before = snapshot()

    # The volumes already kept count: a second one of 1 GB is a week beyond the balance.
    response = api.post(
        API, {**body, "name": "more", "size_gb": 1}, content_type="application/json"
    )

    assert error_of(response) == (402, "insufficient_balance")
    assert (
        "needs at least $100.02: 7 days of your volumes' storage"
        in (response.json()["error"]["message"])
    )
    assert snapshot() == before


def test_a_balance_of_six_days_of_storage_is_not_enough_and_the_days_are_a_setting(
    owner, ohio, settings
):
    # 1,000 GB at $0.08 is $80.00 a month, $2.67 a day: the owner's $100 less $84 leaves
    # $16.00, six days ($16.00) but not seven ($18.67).
    credit(owner.project, "-84.00")
    api = owner.api()
    body = {"name": "datasets", "location": "us-east-2", "size_gb": 1000}

    response = api.post(API, body, content_type="application/json")
    assert error_of(response) == (402, "insufficient_balance")
    assert "needs at least $18.67: 7 days" in response.json()["error"]["message"]

    settings.RUNCRATE_VOLUME_PREPAID_DAYS = 6
    assert api.post(API, body, content_type="application/json").status_code == 201


def test_it_counts_stored_volumes_in_the_burn_rate_on_the_page_and_in_the_api(
    owner, ohio, settings
):
    settings.RUNCRATE_VOLUME_PREPAID_DAYS = 1  # the owner's $100 covers a day of it, not a week
    volume(owner, ohio, size_gb=9000)  # $720.00 a month: $1.00 an hour

    with time_machine.travel(timezone.now(), tick=False):
        summary = owner.browser_client().get("/billing/").context["summary"]
        balance = owner.api().get("/api/v1/billing/balance").json()["data"]

    assert (summary.burn_rate, summary.hours_remaining) == (Decimal("1"), Decimal("100.00"))
    assert (balance["burn_rate"], balance["hours_remaining"]) == ("1.00", "100.00")


def test_it_refuses_to_delete_an_attached_volume_in_the_api(owner, ohio):
    held = volume(owner, ohio)
    cluster = ClusterFactory(project=owner.project, name="train", status=Cluster.Status.READY)
    Volume.objects.filter(pk=held.pk).update(cluster=cluster)

    response = owner.api().delete(f"{API}/{held.pk}")

    assert error_of(response) == (409, "volume_in_use")
    assert "attached to cluster train" in response.json()["error"]["message"]
    listed = owner.api().get(API).json()["data"]
    assert listed[0]["attached_to"] == {"id": cluster.pk, "name": "train"}
    held.refresh_from_db()
    assert held.deleted_at is None


def test_it_answers_404_to_a_stranger_in_the_volumes_api(owner, stranger, ohio):
    theirs = volume(owner, ohio)

    assert error_of(stranger.api().delete(f"{API}/{theirs.pk}")) == (404, "not_found")
    assert error_of(owner.api().delete(f"{API}/987654")) == (404, "not_found")
    assert stranger.api().get(API).json()["data"] == []
    theirs.refresh_from_db()
    assert theirs.deleted_at is None


# --- attaching at create time ----------------------------------------------------------------


def test_it_attaches_a_volume_of_the_same_location_to_a_new_cluster(owner, offer, ohio):
    datasets = volume(owner, ohio)

    response = create_cluster_api(owner, volume_id=datasets.pk)

    assert response.status_code == 201
    assert response.json()["data"]["volume"] == {"id": datasets.pk, "name": "datasets"}
    cluster = Cluster.objects.get(pk=response.json()["data"]["id"])
    datasets.refresh_from_db()
    assert datasets.cluster == cluster and datasets.attached_at == cluster.created_at
    created = cluster.events.get(reason="created")
    assert "Volume datasets attached at /shared/volume on node-0." in created.message
    # The node plans the drivers apply: on the head only.
    head, worker = (node(cluster, i) for i in (0, 1))
    assert {"path": "/shared/volume", "volume": "datasets"} in (
        lifecycle.node_plan_for(head)["mounts"]
    )
    assert all(m["path"] != "/shared/volume" for m in lifecycle.node_plan_for(worker)["mounts"])
    page = text_of(owner.browser_client().get(f"/clusters/{cluster.pk}/"))
    assert "Volume datasets 500 GB at /shared/volume on node-0" in page
    listed = owner.api().get(API).json()["data"][0]
    assert listed["attached_to"] == {"id": cluster.pk, "name": "train"}


def test_it_refuses_a_volume_of_another_location(owner, offer, tokyo):
    elsewhere = volume(owner, tokyo)
    before = snapshot()

    response = create_cluster_api(owner, volume_id=elsewhere.pk)

    assert error_of(response) == (422, "volume_not_allowed")
    message = response.json()["error"]["message"]
    assert "Volume datasets is in Tokyo, Japan (ap-northeast-1)" in message
    assert "this offer is in Columbus, Ohio (us-east-2)" in message
    assert snapshot() == before


def test_it_refuses_a_volume_on_a_community_offer(owner, offer, ohio):
    MachineType.objects.filter(pk=offer.pk).update(community=True)
    datasets = volume(owner, ohio)
    before = snapshot()

    response = create_cluster_api(owner, volume_id=datasets.pk)

    assert error_of(response) == (422, "volume_not_allowed")
    assert "cannot be attached on community hosts" in response.json()["error"]["message"]
    assert snapshot() == before


def test_it_refuses_a_volume_attached_to_another_cluster(owner, offer, ohio):
    datasets = volume(owner, ohio)
    assert create_cluster_api(owner, volume_id=datasets.pk).status_code == 201
    before = snapshot()

    response = create_cluster_api(owner, name="second", volume_id=datasets.pk)

    assert error_of(response) == (409, "volume_in_use")
    assert "attached to cluster train" in response.json()["error"]["message"]
    assert snapshot() == before


@pytest.mark.parametrize("whose", ["stranger", "deleted", "missing"])
def test_it_refuses_a_volume_that_is_not_the_projects(owner, stranger, offer, ohio, whose):
    if whose == "stranger":
        volume_id = volume(stranger, ohio).pk
    elif whose == "deleted":
        gone = volume(owner, ohio)
        volumes.delete_volume(volume=gone)
        volume_id = gone.pk
    else:
        volume_id = 987654
    before = snapshot()

    response = create_cluster_api(owner, volume_id=volume_id)

    assert error_of(response) == (422, "volume_not_allowed")
    assert (
        f"There is no volume {volume_id} in your project." == (response.json()["error"]["message"])
    )
    assert snapshot() == before


def test_it_rolls_the_creation_back_when_the_volume_was_taken_meanwhile(
    owner, offer, ohio, monkeypatch
):
    datasets = volume(owner, ohio)
    other = ClusterFactory(project=owner.project, name="other", status=Cluster.Status.READY)
    checked = volumes.volume_to_attach

    def check_then_lose_the_race(**kwargs):
        found = checked(**kwargs)
        Volume.objects.filter(pk=found.pk).update(cluster=other)  # another request won
        return found

    monkeypatch.setattr(volumes, "volume_to_attach", check_then_lose_the_race)
    before = Cluster.objects.count(), Host.objects.filter(state=Host.State.FREE).count()

    response = create_cluster_api(owner, volume_id=datasets.pk)

    assert error_of(response) == (409, "volume_in_use")
    assert "attached to cluster other" in response.json()["error"]["message"]
    assert (Cluster.objects.count(), Host.objects.filter(state=Host.State.FREE).count()) == before
    datasets.refresh_from_db()
    assert datasets.cluster == other


def test_it_refuses_to_delete_a_volume_attached_meanwhile(owner, ohio):
    datasets = volume(owner, ohio)
    stale = Volume.objects.get(pk=datasets.pk)  # read before the cluster took it
    cluster = ClusterFactory(project=owner.project, name="train", status=Cluster.Status.READY)
    Volume.objects.filter(pk=datasets.pk).update(cluster=cluster)

    with pytest.raises(volumes.VolumeRefused) as refused:
        volumes.delete_volume(volume=stale)

    assert refused.value.code == "volume_in_use"
    assert Volume.objects.get(pk=datasets.pk).deleted_at is None


def test_it_deletes_a_volume_whose_cluster_let_it_go_while_it_was_refused(owner, ohio, monkeypatch):
    # The delete's update finds the volume attached; before it reads why, the cluster ends and
    # detaches it: the volume is deletable then, and is deleted (never a crash, never "in use").
    datasets = volume(owner, ohio)
    cluster = ClusterFactory(project=owner.project, name="train", status=Cluster.Status.READY)
    Volume.objects.filter(pk=datasets.pk).update(cluster=cluster)
    attached = Volume.objects.get(pk=datasets.pk)
    reread = Volume.refresh_from_db

    def detached_meanwhile(self, *args, **kwargs):
        Volume.objects.filter(pk=self.pk).update(cluster=None)
        reread(self, *args, **kwargs)

    monkeypatch.setattr(Volume, "refresh_from_db", detached_meanwhile)
    deleted = volumes.delete_volume(volume=attached)

    assert deleted.deleted_at is not None
    assert Volume.objects.get(pk=datasets.pk).deleted_at == deleted.deleted_at


# --- the create form ---------------------------------------------------------------------------


def test_it_offers_the_projects_volumes_on_the_create_form_with_reasons(owner, offer, ohio, tokyo):
    free = volume(owner, ohio, "datasets")
    far = volume(owner, tokyo, "far-away")
    held = volume(owner, ohio, "held")
    Volume.objects.filter(pk=held.pk).update(
        cluster=ClusterFactory(project=owner.project, name="busy", status=Cluster.Status.READY)
    )

    html = owner.browser_client().get(f"/clusters/new/?offer={offer.slug}").content.decode()

    assert f'<option value="{free.pk}">datasets · 500 GB · us-east-2</option>' in html
    assert (
        f'<option value="{far.pk}" disabled>far-away · 500 GB · ap-northeast-1 — far-away is in '
        "ap-northeast-1; this offer is in us-east-2.</option>"
    ) in html
    assert (
        f'<option value="{held.pk}" disabled>held · 500 GB · us-east-2 — held is attached to '
        "busy.</option>"
    ) in html


def test_it_disables_the_volume_choice_on_community_offers_and_says_why(owner, offer, ohio):
    MachineType.objects.filter(pk=offer.pk).update(community=True)
    volume(owner, ohio)

    html = owner.browser_client().get(f"/clusters/new/?offer={offer.slug}").content.decode()

    assert '<select name="volume" id="id_volume" disabled aria-describedby="volume-why">' in html
    assert "Volumes cannot be attached on community hosts" in html


def test_it_attaches_the_chosen_volume_from_the_create_form(owner, offer, ohio):
    datasets = volume(owner, ohio)
    form = {
        "offer": offer.slug,
        "nodes": "2",
        "name": "train",
        "environment": "default",
        "software": "none",
        "ssh_keys": [owner.project.ssh_keys.get().pk],
        "volume": str(datasets.pk),
    }

    response = owner.browser_client().post("/clusters/new/", form)

    assert response.status_code == 302
    datasets.refresh_from_db()
    assert datasets.cluster.name == "train"


def test_it_refuses_a_volume_in_use_on_the_create_form_beside_the_field(owner, offer, ohio):
    datasets = volume(owner, ohio)
    Volume.objects.filter(pk=datasets.pk).update(
        cluster=ClusterFactory(project=owner.project, name="busy", status=Cluster.Status.READY)
    )
    before = snapshot()
    form = {
        "offer": offer.slug,
        "nodes": "2",
        "name": "train",
        "environment": "default",
        "software": "none",
        "ssh_keys": [owner.project.ssh_keys.get().pk],
        "volume": str(datasets.pk),
    }

    response = owner.browser_client().post("/clusters/new/", form)

    assert response.status_code == 400
    html = response.content.decode()
    assert re.search(r'<div class="field volume-field has-error">', html)
    assert "Volume datasets is attached to cluster busy" in text_of(response)
    assert snapshot() == before


# --- detaching when the cluster ends ------------------------------------------------------------


@pytest.mark.parametrize("end", ["terminated", "failed", "stopped"])
def test_it_detaches_the_volume_when_the_cluster_ends(owner, ohio, end):
    ssh_key(owner.project)
    credit(owner.project, "500.00")
    fault = {"failed": "agent"}.get(end, "")
    machine_type = machine_type_with_hosts(
        free=0, slug="use2-vm", price_per_hour=Decimal("10.00"), location=ohio, boot_seconds=60
    )
    for index in range(2):
        Host.objects.create(name=f"h-{index}", machine_type=machine_type, fault=fault)
    datasets = volume(owner, ohio)

    with time_machine.travel(T0, tick=False) as clock, Sim() as sim:
        cluster = lifecycle.create_cluster(
            project=owner.project,
            user=owner.user,
            environment=owner.project.environments.get(),
            offer_slug=machine_type.slug,
            nodes=2,
            name="train",
            software="none",
            volume_id=datasets.pk,
        )
        sim.run_until(clock, T0 + timedelta(seconds=150), every=10)
        cluster.refresh_from_db()
        if end == "failed":
            assert cluster.status == Cluster.Status.FAILED
        else:
            assert cluster.status == Cluster.Status.READY
            datasets.refresh_from_db()
            assert datasets.cluster == cluster
            if end == "stopped":
                lifecycle.stop(cluster=cluster, reason="balance")
            else:
                lifecycle.terminate(cluster=cluster, user=owner.user)
            sim.run_until(clock, timezone.now() + timedelta(seconds=60), every=10)
            cluster.refresh_from_db()
            assert cluster.status == end

    datasets.refresh_from_db()
    assert datasets.cluster is None and datasets.attached_at is None
    assert owner.api().get(f"/api/v1/clusters/{cluster.pk}").json()["data"]["volume"] is None
    assert Node.objects.filter(cluster=cluster, holds_host=True).count() == 0
    assert owner.api().delete(f"{API}/{datasets.pk}").status_code == 204


# --- where a volume can be created: only where an offer can attach it -------------------------


@pytest.fixture
def community_only(db):
    location = LocationFactory(code="eu-community-1", name="Community, EU")
    MachineTypeFactory(location=location, community=True)
    return location


@pytest.fixture
def unsold(db):
    location = LocationFactory(code="ap-south-9", name="Nowhere yet")
    MachineTypeFactory(location=location, interconnect=MachineType.Interconnect.INFINIBAND)
    return location


def test_it_shows_locations_no_offer_can_attach_as_disabled_with_why(
    owner, ohio, community_only, unsold, django_assert_num_queries
):
    with django_assert_num_queries(1):
        reasons = dict((loc.code, why) for loc, why in volumes.volume_locations())
    assert reasons == {
        "ap-south-9": "No machines are offered in ap-south-9, so a volume there could not be "
        "attached.",
        "eu-community-1": "No offer in eu-community-1 can attach a volume: its machines are "
        "community hosts, which never get one.",
        "us-east-2": "",
    }
    html = owner.browser_client().get("/storage/").content.decode()
    options = dict(re.findall(r'<option value="([^"]+)"([^>]*)>', html))
    assert "disabled" in options["eu-community-1"] and "disabled" in options["ap-south-9"]
    assert "disabled" not in options["us-east-2"] and "selected" in options["us-east-2"]
    assert "its machines are community hosts, which never get one" in text_of(
        owner.browser_client().get("/storage/")
    )


@pytest.mark.parametrize("where", ["community_only", "unsold"])
def test_it_refuses_a_volume_where_no_offer_can_attach_it(owner, request, where):
    location = request.getfixturevalue(where)
    before = snapshot()

    page = owner.browser_client().post(
        "/storage/", {"name": "datasets", "location": location.code, "size_gb": "100"}
    )
    api = owner.api().post(
        API,
        {"name": "datasets", "location": location.code, "size_gb": 100},
        content_type="application/json",
    )

    assert page.status_code == 400
    assert "Pick a location where you can create a cluster to attach it to." in text_of(page)
    assert error_of(api) == (422, "location_cannot_attach")
    assert location.code in api.json()["error"]["message"]
    assert snapshot() == before


def test_the_storage_form_defaults_to_the_cheapest_usable_location(owner, ohio, tokyo):
    # ap-northeast-1 comes first by code, but Ohio's 0.08 USD per GB-month is the cheaper.
    html = owner.browser_client().get("/storage/").content.decode()
    options = dict(re.findall(r'<option value="([^"]+)"([^>]*)>', html))
    assert "selected" in options["us-east-2"]
    assert "selected" not in options["ap-northeast-1"]
