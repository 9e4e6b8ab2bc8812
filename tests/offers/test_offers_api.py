"""`GET /api/v1/gpus` and `GET /api/v1/offers` (SPEC §1, §8)."""

import pytest
from django.core.cache import cache
from django.test import Client
from django.utils import timezone

from accounts.models import ApiKey
from offers.models import Location
from tests.factories import GpuModelFactory, MachineTypeFactory
from tests.offers.catalog import add_hosts, offer_type

BOOLEAN = Location.CapacityReporting.BOOLEAN
# Each machine's specs (docs/inventory.md, "Machine specs"), as the inventory states them.
SPECS = {
    "vcpus": 208,
    "memory_gib": 1800,
    "nvme_gib": 2048,
    "gpu_link": "nvlink",
    "os_image": "Ubuntu 22.04",
    "driver_version": "570",
    "cuda_version": "12.8",
}


def offers(person, query: str) -> list[dict]:
    response = person.api().get(f"/api/v1/offers?{query}")
    assert response.status_code == 200, response.content
    return response.json()["data"]


def by_id(data: list[dict]) -> dict[str, dict]:
    return {offer["id"]: offer for offer in data}


def test_it_describes_each_offer_exactly(owner, h100):
    offer_type(
        gpu=h100,
        slug="use2-h100x8-bm",
        location="us-east-2",
        price="23.92",
        free=12,
        busy=5,
        gpus_per_machine=8,
        machine_kind="bare_metal",
        **SPECS,
    )

    response = owner.api().get("/api/v1/offers?gpu=h100-sxm&nodes=4")

    assert response.status_code == 200
    assert response.json() == {
        "data": [
            {
                "id": "use2-h100x8-bm",
                "gpu": "h100-sxm",
                "gpus_per_machine": 8,
                "location": "us-east-2",
                "interconnect": "ethernet",
                "machine_kind": "bare_metal",
                "community": False,
                "machine_price_per_hour": "23.92",
                "price_per_hour": "95.68",
                "gpus_total": 32,
                "gpu_memory_total_gib": 2560,
                "price_per_gpu_hour": "2.99",
                "nodes_available": 12,
                "max_nodes": 12,
                "availability": "available",
                "software": ["none", "slurm", "kubernetes", "ray"],
                "specs": {
                    **SPECS,
                    "summary": "208 vCPUs · 1.8 TiB RAM · 2 TiB NVMe · NVLink · Ubuntu 22.04 · "
                    "driver 570 · CUDA 12.8",
                },
                "track_record": None,
            }
        ],
        "meta": {
            "count": 1,
            "gpu": "h100-sxm",
            "nodes": 4,
            "include_community": False,
            "sort": "price",
            "gpus_per_machine": None,
        },
    }


# --- SPEC §1's table -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("free", "nodes", "max_nodes", "availability"),
    [(5, 2, 5, "available"), (5, 5, 5, "available"), (5, 6, 5, "not_in_stock"),
     (0, 2, 0, "not_in_stock"), (64, 64, 64, "available"), (100, 64, 64, "available"),
     (30, 31, 30, "not_in_stock")],
)  # fmt: skip
def test_it_counts_free_machines_where_the_location_counts_them(
    owner, h100, free, nodes, max_nodes, availability
):
    offer_type(gpu=h100, slug="x", free=free, busy=3)

    (offer,) = offers(owner, f"gpu=h100-sxm&nodes={nodes}")

    assert offer["nodes_available"] == free
    assert offer["max_nodes"] == max_nodes
    assert offer["availability"] == availability


@pytest.mark.parametrize(
    ("free", "nodes", "max_nodes", "availability"),
    [(1, 2, 8, "available"), (3, 8, 8, "available"), (30, 9, 8, "reserved_ahead"),
     (30, 64, 8, "reserved_ahead"),
     (0, 2, 0, "not_in_stock"), (0, 8, 0, "not_in_stock"), (0, 9, 0, "reserved_ahead"),
     (0, 64, 0, "reserved_ahead")],
)  # fmt: skip
def test_it_stops_a_boolean_location_at_8_machines(
    owner, h100, free, nodes, max_nodes, availability
):
    offer_type(gpu=h100, slug="x", reporting=BOOLEAN, location="us-west-1", free=free, busy=2)

    (offer,) = offers(owner, f"gpu=h100-sxm&nodes={nodes}")

    assert offer["nodes_available"] is None
    assert offer["max_nodes"] == max_nodes
    assert offer["availability"] == availability


# --- filters and rules ---------------------------------------------------------------------


def test_it_includes_community_hosts_only_when_asked(owner, h100):
    offer_type(gpu=h100, slug="dc")
    offer_type(gpu=h100, slug="cm", location="cm-us", community=True)

    default = offers(owner, "gpu=h100-sxm&nodes=2")
    excluded = offers(owner, "gpu=h100-sxm&nodes=2&include_community=false")
    included = offers(owner, "gpu=h100-sxm&nodes=2&include_community=true")

    assert [o["id"] for o in default] == [o["id"] for o in excluded] == ["dc"]
    assert sorted(o["id"] for o in included) == ["cm", "dc"]
    assert by_id(included)["cm"]["community"] is True
    assert by_id(included)["dc"]["community"] is False


def test_it_offers_kubernetes_only_on_vms_and_bare_metal(owner, h100):
    offer_type(gpu=h100, slug="ctr", machine_kind="container")
    offer_type(gpu=h100, slug="vm", location="eu-central-1", machine_kind="vm")
    offer_type(gpu=h100, slug="bm", location="us-west-1", machine_kind="bare_metal")

    data = by_id(offers(owner, "gpu=h100-sxm&nodes=2"))

    assert data["ctr"]["software"] == ["none", "slurm", "ray"]
    assert data["vm"]["software"] == ["none", "slurm", "kubernetes", "ray"]
    assert data["bm"]["software"] == ["none", "slurm", "kubernetes", "ray"]


@pytest.mark.parametrize(
    ("price", "nodes", "total"),
    [("2.49", 3, "7.47"), ("23.92", 64, "1530.88"), ("0.39", 2, "0.78"), ("11.10", 10, "111.00")],
)
def test_it_prices_the_cluster_as_machine_price_times_nodes(owner, h100, price, nodes, total):
    offer_type(gpu=h100, slug="x", price=price, free=64)

    (offer,) = offers(owner, f"gpu=h100-sxm&nodes={nodes}")

    assert offer["machine_price_per_hour"] == price
    assert offer["price_per_hour"] == total


def test_it_sorts_available_first_then_by_cluster_price_then_location(owner, h100):
    offer_type(gpu=h100, slug="later-loc", location="zz-west", price="3.00", free=4)
    offer_type(gpu=h100, slug="earlier-loc", location="aa-east", price="3.00", free=4)
    offer_type(gpu=h100, slug="cheapest", location="mm-mid", price="2.00", free=4)
    offer_type(gpu=h100, slug="short", location="bb-low", price="1.00", free=1)
    offer_type(gpu=h100, slug="ahead", location="ab-bool", price="0.50", reporting=BOOLEAN)
    offer_type(gpu=h100, slug="short-dear", location="ab-low", price="9.00", free=0)
    offer_type(gpu=h100, slug="short-tie", location="aa-low", price="9.00", free=0)

    four = offers(owner, "gpu=h100-sxm&nodes=4")
    assert [o["id"] for o in four] == [
        "ahead",  # boolean with machines: available up to 8, and the cheapest
        "cheapest",
        "earlier-loc",
        "later-loc",
        "short",
        "short-tie",  # same cluster price as short-dear: by location code
        "short-dear",
    ]
    assert [o["availability"] for o in four] == ["available"] * 4 + ["not_in_stock"] * 3


def test_it_leaves_out_quoted_interconnects(owner, h100):
    offer_type(gpu=h100, slug="eth")
    offer_type(gpu=h100, slug="ib", location="eu-central-1", interconnect="infiniband")
    offer_type(gpu=h100, slug="roce", location="us-west-1", interconnect="roce")

    assert [o["id"] for o in offers(owner, "gpu=h100-sxm&nodes=2")] == ["eth"]


def test_it_lists_only_the_asked_gpu(owner, h100):
    offer_type(gpu=h100, slug="h100-vm")
    offer_type(gpu=GpuModelFactory(slug="a100", name="A100", memory_gib=80), slug="a100-vm")

    assert [o["id"] for o in offers(owner, "gpu=a100&nodes=2")] == ["a100-vm"]


# --- refusals ------------------------------------------------------------------------------


@pytest.mark.parametrize("nodes", ["", "1", "65", "0", "-2", "abc", "2.5"])
def test_it_refuses_a_size_outside_2_to_64(owner, h100, nodes):
    query = "gpu=h100-sxm" + (f"&nodes={nodes}" if nodes else "")

    response = owner.api().get(f"/api/v1/offers?{query}")

    assert response.status_code == 422
    error = response.json()["error"]
    assert error["code"] == "invalid_nodes"
    assert "nodes must be a whole number from 2 to 64" in error["message"]


def test_it_answers_404_for_an_unknown_gpu(owner, h100):
    response = owner.api().get("/api/v1/offers?gpu=h999&nodes=2")

    assert response.status_code == 404
    assert response.json()["error"]["code"] == "unknown_gpu"
    assert "h999" in response.json()["error"]["message"]


def test_it_answers_an_empty_list_for_a_known_gpu_without_offers(owner, h100):
    offer_type(gpu=h100, slug="ib", interconnect="infiniband")

    response = owner.api().get("/api/v1/offers?gpu=h100-sxm&nodes=2")

    assert response.status_code == 200
    assert response.json()["data"] == []


def test_it_needs_a_gpu(owner, h100):
    response = owner.api().get("/api/v1/offers?nodes=2")

    assert response.status_code == 422
    assert response.json()["error"]["code"] == "invalid_request"
    assert "gpu" in response.json()["error"]["message"]


@pytest.mark.parametrize("path", ["/api/v1/gpus", "/api/v1/offers?gpu=h100-sxm&nodes=2"])
def test_it_answers_401_without_a_key_or_with_a_revoked_one(owner, h100, path):
    assert Client().get(path).status_code == 401
    bogus = Client(headers={"authorization": "Bearer rc_live_not-a-key"})
    assert bogus.get(path).status_code == 401

    ApiKey.objects.filter(project=owner.project).update(revoked_at=timezone.now())

    response = owner.api().get(path)
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "unauthenticated"


# --- GPUs ----------------------------------------------------------------------------------


def test_it_lists_gpus_with_lowest_machine_price_and_gpu_counts(owner, h100):
    offer_type(gpu=h100, slug="a", price="2.39", gpus_per_machine=1)
    offer_type(gpu=h100, slug="b", location="eu-central-1", price="23.12", gpus_per_machine=8)
    offer_type(gpu=h100, slug="c", location="eu-central-1", price="1.00", gpus_per_machine=2,
               interconnect="infiniband")  # fmt: skip
    offer_type(gpu=h100, slug="d", location="cm-us", price="0.99", gpus_per_machine=4,
               community=True)  # fmt: skip
    GpuModelFactory(slug="a100", name="A100 SXM 80GB", memory_gib=80)

    response = owner.api().get("/api/v1/gpus")
    community = owner.api().get("/api/v1/gpus?include_community=true").json()["data"]

    assert response.status_code == 200
    assert response.json() == {
        "data": [
            {
                "slug": "a100",
                "name": "A100 SXM 80GB",
                "memory_gib": 80,
                "lowest_machine_price_per_hour": None,
                "gpu_counts": [],
                "lowest_price_per_gpu_hour": None,
            },
            {
                "slug": "h100-sxm",
                "name": "H100 SXM 80GB",
                "memory_gib": 80,
                "lowest_machine_price_per_hour": "2.39",
                "gpu_counts": [1, 8],
                "lowest_price_per_gpu_hour": "2.39",
            },
        ],
        "meta": {"count": 2, "include_community": False},
    }
    assert community[1]["lowest_machine_price_per_hour"] == "0.99"
    assert community[1]["gpu_counts"] == [1, 4, 8]
    # 0.99 over 4 GPUs, exact (the InfiniBand type's 1.00 over 2 is not self-serve)
    assert community[1]["lowest_price_per_gpu_hour"] == "0.2475"


# --- a constant number of queries ------------------------------------------------------------


@pytest.mark.parametrize("hosts", [10, 5000])
def test_it_runs_the_same_queries_for_10_and_5000_hosts(
    owner, h100, django_assert_num_queries, hosts
):
    types = [
        offer_type(gpu=h100, slug="q-a", location="q-1", free=0),
        offer_type(gpu=h100, slug="q-b", location="q-2", free=0, machine_kind="container"),
        offer_type(gpu=h100, slug="q-c", location="q-3", reporting=BOOLEAN, free=0),
        offer_type(gpu=h100, slug="q-d", location="q-4", free=0, community=True),
    ]
    for index, machine_type in enumerate(types):
        share = hosts // len(types) + (1 if index < hosts % len(types) else 0)
        add_hosts(machine_type, free=share // 2, busy=share - share // 2)
    MachineTypeFactory(gpu=GpuModelFactory(slug="l40s", name="L40S", memory_gib=48))
    client = owner.api()
    offers_url = "/api/v1/offers?gpu=h100-sxm&nodes=8&include_community=true"
    cache.clear()

    # the key (its last use stamped), the offers (the GPU is looked up only when it has none)
    with django_assert_num_queries(3):
        response = client.get(offers_url)
    assert response.status_code == 200
    assert len(response.json()["data"]) == 4

    # within the tick, the key and the answer both come from the cache
    with django_assert_num_queries(0):
        again = client.get(offers_url)
    assert again.status_code == 200
    assert again.content == response.content

    # the GPU cards, once a tick
    with django_assert_num_queries(1):
        response = client.get("/api/v1/gpus?include_community=true")
    assert response.status_code == 200
    with django_assert_num_queries(0):
        assert client.get("/api/v1/gpus?include_community=true").content == response.content


def test_it_documents_the_endpoints_in_the_openapi_schema(client, db):
    paths = client.get("/api/v1/openapi.json").json()["paths"]

    assert "/api/v1/gpus" in paths
    assert "/api/v1/offers" in paths
    parameters = {p["name"] for p in paths["/api/v1/offers"]["get"]["parameters"]}
    assert {"gpu", "nodes", "include_community"} <= parameters


def test_it_keeps_the_offers_body_to_its_documented_schema(owner, h100):
    from offers.api import OfferList

    offer_type(gpu=h100, slug="x", free=3)
    offer_type(gpu=h100, slug="y", location="us-west-1", reporting=BOOLEAN, free=0)

    body = owner.api().get("/api/v1/offers?gpu=h100-sxm&nodes=4").json()

    assert OfferList.model_validate(body).model_dump() == body
