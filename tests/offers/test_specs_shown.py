"""A machine type with NVLink, 2 TiB NVMe and CUDA 12.8 shows those figures wherever it is
offered (issue 37; docs/inventory.md, "Machine specs"): the offers page, the create page, the
offers API and the plan API, in one wording."""

import re
from decimal import Decimal

import pytest
from django.utils import timezone

from clusters import lifecycle
from clusters.models import Cluster, Node
from offers.models import MachineType
from tests.clusters.front import credit, machine_type_with_hosts, ssh_key
from tests.factories import ClusterFactory, LocationFactory
from tests.offers.catalog import cell, offer_row, text

SLUG = "use2-h100x8-bm"
SPECS = {
    "vcpus": 208,
    "memory_gib": 1800,
    "nvme_gib": 2048,
    "gpu_link": "nvlink",
    "os_image": "Ubuntu 22.04",
    "driver_version": "570",
    "cuda_version": "12.8",
}
WORDS = "208 vCPUs · 1.8 TiB RAM · 2 TiB NVMe · NVLink · Ubuntu 22.04 · driver 570 · CUDA 12.8"


@pytest.fixture(autouse=True)
def _work_in_memory():
    with lifecycle.dispatching_to(lifecycle.CollectingDispatcher()):
        yield


@pytest.fixture
def offer(owner, h100) -> MachineType:
    ssh_key(owner.project)
    credit(owner.project, "500.00")
    return machine_type_with_hosts(
        free=4,
        slug=SLUG,
        gpu=h100,
        gpus_per_machine=8,
        machine_kind=MachineType.Kind.BARE_METAL,
        price_per_hour=Decimal("23.92"),
        location=LocationFactory(code="us-east-2"),
        **SPECS,
    )


def test_the_offers_page_shows_each_machines_specs_under_its_machine(owner, offer):
    response = owner.browser_client().get("/offers/?gpu=h100-sxm&nodes=2")

    assert response.status_code == 200
    machine = cell(offer_row(response.content.decode(), SLUG), "machine")
    assert WORDS in machine


def test_an_offer_without_specs_shows_no_empty_line(owner, h100):
    machine_type_with_hosts(free=2, slug="bare", gpu=h100)

    html = owner.browser_client().get("/offers/?gpu=h100-sxm&nodes=2").content.decode()

    assert "data-specs" not in offer_row(html, "bare")


def test_the_create_page_shows_the_specs_on_its_offer_card(owner, offer):
    response = owner.browser_client().get(f"/clusters/new/?offer={SLUG}&nodes=2")

    assert response.status_code == 200
    card = re.search(
        r"<dt>Per machine</dt><dd[^>]*data-specs>(.*?)</dd>", response.content.decode(), re.S
    )
    assert card and text(card.group(1)) == WORDS


def test_the_offers_api_gives_every_figure_and_the_summary(owner, offer):
    response = owner.api().get("/api/v1/offers?gpu=h100-sxm&nodes=2")

    assert response.status_code == 200
    [listed] = response.json()["data"]
    assert listed["specs"] == {**SPECS, "summary": WORDS}


def test_the_plan_gives_the_specs_of_the_machines_it_would_start(owner, offer):
    response = owner.api().post(
        "/api/v1/clusters/plan",
        {"name": "train", "offer_id": SLUG, "nodes": 2},
        content_type="application/json",
    )

    assert response.status_code == 200, response.content
    assert response.json()["data"]["specs"] == {**SPECS, "summary": WORDS}


def test_the_acceptance_report_shows_what_was_sold_and_what_each_machine_had(owner):
    gpu = {"name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559}
    report = {
        "measured_at": timezone.now().isoformat(),
        "expected": {
            "gpu": "H100 SXM 80GB",
            "gpus_per_machine": 8,
            "memory_gib": 80,
            "specs": {**SPECS, "summary": WORDS},
        },
        "nodes": [
            {
                "name": f"node-{i}",
                "gpus": [{**gpu, "driver_version": "570.124.06"}] * 8,
                "vcpus": 208,
                "memory_mib": 1815606,  # MemTotal of 1.8 TiB sold: 1,773 GiB
                "reachability": {f"node-{1 - i}": True},
            }
            for i in range(2)
        ],
    }
    cluster = ClusterFactory(
        project=owner.project,
        status=Cluster.Status.READY,
        joined_at=timezone.now(),
        ready_at=timezone.now(),
        acceptance=report,
        machines=True,
        machines__status=Node.Status.JOINED,
    )

    page = text(owner.browser_client().get(f"/clusters/{cluster.pk}/machines/").content.decode())

    assert f"its driver, vCPUs and memory against what was sold ({WORDS})" in page
    assert "8 × NVIDIA H100 80GB HBM3 driver 570.124.06" in page
    assert page.count("208 · 1,773 GiB") == 2
