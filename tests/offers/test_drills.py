"""Failure-drill locations (issue 37, docs/inventory.md "Failure drills"): offered only to staff
and to a project flagged for drills (offers/visibility.py `sees_drills`), never to a new
sign-up, never as a suggestion after a failure, never in the quote form or storage."""

import json
import re
from decimal import Decimal
from pathlib import Path

import pytest
from django.test import Client

from accounts.models import ApiKey, Project, User
from clusters import lifecycle
from clusters.models import Cluster, Event, Node, Volume
from offers.inventory import load_inventory, parse_inventory
from offers.models import Location, QuoteRequest
from tests.clusters.front import credit, machine_type_with_hosts, ssh_key
from tests.factories import ClusterFactory, GpuModelFactory, LocationFactory, issue_key

DRILL = "drill1-l40sx8-ctr"
PLAIN = "apne1-l40sx8-bm"
INVENTORY = Path(__file__).resolve().parents[2] / "demo" / "inventory.json"


@pytest.fixture(autouse=True)
def _work_in_memory():
    with lifecycle.dispatching_to(lifecycle.CollectingDispatcher()) as dispatcher:
        yield dispatcher


@pytest.fixture
def catalog(db):
    """An 8× L40S offer in a drill location, cheaper than the plain one beside it."""
    gpu = GpuModelFactory(slug="l40s", name="L40S 48GB", memory_gib=48)
    drill = LocationFactory(code="drill-1", name="Failure drills (every host fails on purpose)")
    Location.objects.filter(pk=drill.pk).update(drill=True)
    machine_type_with_hosts(
        free=4,
        gpu=gpu,
        slug=DRILL,
        gpus_per_machine=8,
        machine_kind="container",
        price_per_hour=Decimal("6.00"),
        location=drill,
    )
    machine_type_with_hosts(
        free=4,
        gpu=gpu,
        slug=PLAIN,
        gpus_per_machine=8,
        price_per_hour=Decimal("7.68"),
        location=LocationFactory(code="ap-northeast-1", name="Tokyo, Japan"),
    )


def signed_up(client: Client) -> tuple[User, Project, str]:
    """A new sign-up, logged in on `client`, and an API key of theirs."""
    response = client.post(
        "/accounts/signup/",
        {
            "email": "new@example.com",
            "password1": "a-long-new-pw-1",
            "password2": "a-long-new-pw-1",
        },
    )
    assert response.status_code == 302
    user = User.objects.get(email="new@example.com")
    project = Project.objects.get(memberships__user=user)
    return user, project, issue_key(user=user, project=project, name="cli")


def offered(client: Client, api: Client) -> dict[str, bool]:
    """Where DRILL shows up: the offers page, the API's offers and GPUs, the create form."""
    page = client.get("/offers/?gpu=l40s&nodes=2").content.decode()
    listed = api.get("/api/v1/offers?gpu=l40s&nodes=2").json()["data"]
    gpus = {g["slug"]: g for g in api.get("/api/v1/gpus").json()["data"]}
    return {
        "page": DRILL in page or "Failure drills" in page,
        "api": DRILL in [o["id"] for o in listed],
        "gpus": gpus["l40s"]["lowest_machine_price_per_hour"] == "6.00",
        "create_form": client.get(f"/clusters/new/?offer={DRILL}&nodes=2").status_code == 200,
    }


def test_a_new_sign_up_sees_the_drill_location_nowhere(client, catalog):
    _, project, key = signed_up(client)
    api = Client(headers={"authorization": f"Bearer {key}"})
    credit(project)
    ssh_key(project)

    assert offered(client, api) == dict.fromkeys(("page", "api", "gpus", "create_form"), False)
    # The plain offer is there, so the page did list L40S offers.
    assert PLAIN in client.get("/offers/?gpu=l40s&nodes=2").content.decode()
    created = api.post(
        "/api/v1/clusters",
        {"name": "drill", "offer_id": DRILL, "nodes": 2, "software": "none"},
        content_type="application/json",
    )
    assert (created.status_code, created.json()["error"]["code"]) == (404, "unknown_offer")
    assert not Cluster.objects.filter(project=project).exists()
    # Neither the quote form nor storage lists it, and neither takes it.
    assert "drill-1" not in client.get("/offers/quote/").content.decode()
    assert "drill-1" not in client.get("/storage/").content.decode()
    quote = api.post(
        "/api/v1/quotes",
        {
            "gpu": "l40s",
            "nodes": 128,
            "interconnect": "ethernet",
            "location": "drill-1",
            "start_date": "2099-01-01",
            "duration_weeks": 4,
            "contact_name": "Ada",
            "contact_email": "ada@example.com",
        },
        content_type="application/json",
    )
    assert quote.status_code == 422 and "Unknown location 'drill-1'" in quote.content.decode()
    volume = api.post(
        "/api/v1/volumes",
        {"name": "data", "location": "drill-1", "size_gb": 10},
        content_type="application/json",
    )
    assert (volume.status_code, volume.json()["error"]["code"]) == (422, "unknown_location")
    assert not QuoteRequest.objects.exists() and not Volume.objects.exists()


def test_staff_and_a_project_flagged_for_drills_are_offered_it(client, catalog):
    user, project, key = signed_up(client)
    api = Client(headers={"authorization": f"Bearer {key}"})
    credit(project)
    ssh_key(project)

    Project.objects.filter(pk=project.pk).update(drills=True)
    flagged = offered(client, api)
    Project.objects.filter(pk=project.pk).update(drills=False)
    User.objects.filter(pk=user.pk).update(is_staff=True)
    as_staff = Client()
    as_staff.force_login(User.objects.get(pk=user.pk))
    staff = offered(as_staff, Client(headers={"authorization": f"Bearer {new_key(user, project)}"}))
    created = Client(headers={"authorization": f"Bearer {new_key(user, project)}"}).post(
        "/api/v1/clusters",
        {"name": "drill", "offer_id": DRILL, "nodes": 2, "software": "none"},
        content_type="application/json",
    )

    assert flagged == dict.fromkeys(("page", "api", "gpus", "create_form"), True)
    assert staff == dict.fromkeys(("page", "api", "gpus", "create_form"), True)
    assert created.status_code == 201, created.content
    # Still never in the quote form nor storage, even for staff.
    assert "drill-1" not in as_staff.get("/offers/quote/").content.decode()
    assert "drill-1" not in as_staff.get("/storage/").content.decode()


def new_key(user: User, project: Project) -> str:
    """A fresh key (a cached one would remember the user as they were)."""
    return issue_key(user=user, project=project, name=f"k-{ApiKey.objects.count()}")


def test_a_failed_cluster_never_suggests_the_drill_location_even_to_staff(owner, catalog):
    User.objects.filter(pk=owner.user.pk).update(is_staff=True)
    Project.objects.filter(pk=owner.project.pk).update(drills=True)
    gone = machine_type_with_hosts(
        free=0,
        gpu=GpuModelFactory(slug="l40s"),
        slug="gone-l40s",
        gpus_per_machine=8,
        location=LocationFactory(code="zz-9"),
    )
    cluster = ClusterFactory(
        project=owner.project,
        machine_type=gone,
        size=2,
        status=Cluster.Status.FAILED,
        failure_reason=Event.Reason.BOOT_TIMEOUT,
        failure_node="node-0",
        failure_step=Node.Step.RUNNING,
        failure_message="node-0 did not come up.",
    )

    html = owner.browser_client().get(f"/clusters/{cluster.pk}/").content.decode()

    section = html[html.index('<section class="offers-now">') :]
    rows = re.findall(r'<tr data-offer="([^"]+)"', section[: section.index("</section>")])
    assert rows == [PLAIN]


def test_the_demo_inventory_marks_its_drill_location_and_names_no_real_domain(db):
    data = parse_inventory(INVENTORY.read_text())

    load_inventory(data)

    assert list(Location.objects.filter(drill=True).values_list("code", flat=True)) == ["drill-1"]
    gateways = [loc["ssh_gateway"] for loc in data["locations"] if loc["ssh_gateway"]]
    assert gateways and all(g.split(":")[0].endswith(".invalid") for g in gateways)
    assert "runcrate.net" not in json.dumps(data)


def test_the_inventory_refuses_a_drill_flag_that_is_not_a_boolean(db):
    data = parse_inventory(INVENTORY.read_text())
    data["locations"][-1]["drill"] = "yes"

    with pytest.raises(Exception, match=r"drill-1\)\.drill: must be true or false"):
        load_inventory(data)
