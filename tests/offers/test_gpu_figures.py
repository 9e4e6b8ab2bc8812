"""Compare offers by the GPU (issue 13, item 1): GPUs in all, GPU memory in all, the price per
GPU-hour, sorting by it and narrowing to so many GPUs per machine, on the picker and the API."""

from decimal import Decimal

import pytest

from offers.offers import SortBy, narrow_offers
from tests.factories import MachineTypeFactory
from tests.offers.catalog import cell, offer_row, offer_rows, offer_type, text

PICKER = "/offers/"


@pytest.fixture
def shapes(h100):
    """Three shapes whose order by cluster price is not their order per GPU-hour."""
    offer_type(gpu=h100, slug="eight", location="aa-1", price="20.00", gpus_per_machine=8)
    offer_type(gpu=h100, slug="two", location="bb-2", price="5.10", gpus_per_machine=2)
    offer_type(gpu=h100, slug="one", location="cc-3", price="2.49", gpus_per_machine=1)
    offer_type(gpu=h100, slug="eight-cheap", location="dd-4", price="1.00", gpus_per_machine=8)


def get(person, query: str, **headers) -> str:
    response = person.browser_client().get(f"{PICKER}?{query}", headers=headers)
    assert response.status_code == 200
    return response.content.decode()


def api(person, query: str) -> dict:
    response = person.api().get(f"/api/v1/offers?{query}")
    assert response.status_code == 200, response.content
    return response.json()


# --- the figures --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("slug", "nodes", "gpus", "memory", "per_gpu_api", "per_gpu_page"),
    [
        ("eight", 2, 16, 1280, "2.50", "$2.50"),  # $20.00 over 8 GPUs
        ("two", 3, 6, 480, "2.55", "$2.55"),  # 3 machines × 2 GPUs
        ("one", 5, 5, 400, "2.49", "$2.49"),
        ("eight-cheap", 2, 16, 1280, "0.125", "$0.13"),  # exact in the API, half up on pages
    ],
)
def test_it_shows_gpus_memory_and_price_per_gpu_hour_exactly(
    owner, shapes, slug, nodes, gpus, memory, per_gpu_api, per_gpu_page
):
    (offer,) = [o for o in api(owner, f"gpu=h100-sxm&nodes={nodes}")["data"] if o["id"] == slug]
    row = offer_row(get(owner, f"gpu=h100-sxm&nodes={nodes}"), slug)

    assert offer["gpus_total"] == gpus
    assert offer["gpu_memory_total_gib"] == memory
    assert offer["price_per_gpu_hour"] == per_gpu_api
    # Columns of their own beside the cluster price (issue 21): GPUs, per GPU-hour.
    assert cell(row, "gpus-total") == f"{gpus} {memory:,} GiB"
    assert cell(row, "price-gpu") == per_gpu_page


def test_it_keeps_the_price_per_gpu_hour_exact(owner, h100):
    offer_type(gpu=h100, slug="odd", price="2.49", gpus_per_machine=8)

    (offer,) = api(owner, "gpu=h100-sxm&nodes=2")["data"]
    row = offer_row(get(owner, "gpu=h100-sxm&nodes=2"), "odd")

    assert offer["price_per_gpu_hour"] == "0.31125"
    assert Decimal(offer["price_per_gpu_hour"]) * 8 == Decimal(offer["machine_price_per_hour"])
    assert cell(row, "price-gpu") == "$0.31"


def test_it_says_from_what_per_gpu_hour_on_each_card(owner, shapes):
    page = text(get(owner, ""))

    assert "from $0.13 per GPU-hour from $1.00/h per machine 1, 2, 8 GPUs per machine" in page
    gpus = owner.api().get("/api/v1/gpus").json()["data"]
    assert gpus[0]["lowest_price_per_gpu_hour"] == "0.125"


# --- sorting ------------------------------------------------------------------------------


def test_it_sorts_by_cluster_price_unless_asked(owner, shapes):
    expected = ["eight-cheap", "one", "two", "eight"]  # $2, $4.98, $10.20, $40 for 2 machines

    assert [slug for slug, _ in offer_rows(get(owner, "gpu=h100-sxm&nodes=2"))] == expected
    assert [o["id"] for o in api(owner, "gpu=h100-sxm&nodes=2")["data"]] == expected


def test_it_sorts_by_price_per_gpu_hour(owner, shapes):
    # $0.125, $2.49, $2.50, $2.55 per GPU-hour
    expected = ["eight-cheap", "one", "eight", "two"]

    html = get(owner, "gpu=h100-sxm&nodes=2&sort=price_per_gpu_hour")
    body = api(owner, "gpu=h100-sxm&nodes=2&sort=price_per_gpu_hour")

    assert [slug for slug, _ in offer_rows(html)] == expected
    assert '<option value="price_per_gpu_hour" selected>Price per GPU-hour</option>' in html
    assert [o["id"] for o in body["data"]] == expected
    assert body["meta"]["sort"] == "price_per_gpu_hour"


def test_it_keeps_offers_that_cannot_start_after_the_others_in_either_order(owner, h100):
    offer_type(gpu=h100, slug="short", location="aa-1", price="1.00", free=1)
    offer_type(gpu=h100, slug="plenty", location="bb-2", price="30.00", free=9)

    rows = offer_rows(get(owner, "gpu=h100-sxm&nodes=4&sort=price_per_gpu_hour"))

    assert rows == [("plenty", "available"), ("short", "not_in_stock")]


def test_it_names_an_unknown_sort_and_shows_the_offers_by_cluster_price(owner, shapes):
    html = get(owner, "gpu=h100-sxm&nodes=2&sort=cheapest")
    page = text(html)

    assert (
        "There is no sort 'cheapest': sort by cluster price (price) or by price per GPU-hour"
        in page
    )
    assert [slug for slug, _ in offer_rows(html)] == ["eight-cheap", "one", "two", "eight"]

    response = owner.api().get("/api/v1/offers?gpu=h100-sxm&nodes=2&sort=cheapest")
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "invalid_sort"


# --- GPUs per machine ---------------------------------------------------------------------


def test_it_narrows_to_so_many_gpus_per_machine(owner, shapes):
    html = get(owner, "gpu=h100-sxm&nodes=2&gpus=8&sort=price_per_gpu_hour")
    body = api(owner, "gpu=h100-sxm&nodes=2&gpus_per_machine=8")

    assert [slug for slug, _ in offer_rows(html)] == ["eight-cheap", "eight"]
    assert '<input type="radio" name="gpus" value="8" checked>' in html
    assert [o["id"] for o in body["data"]] == ["eight-cheap", "eight"]
    assert body["meta"]["gpus_per_machine"] == 8


def test_it_says_when_no_machine_has_that_many_gpus(owner, shapes):
    page = text(get(owner, "gpu=h100-sxm&nodes=2&gpus=4"))

    assert "No offer of H100 SXM 80GB has 4 GPUs per machine" in page
    assert "comes with 1, 2, 8 GPUs per machine: show every machine" in page


@pytest.mark.parametrize("raw", ["3", "16", "eight", "-1"])
def test_it_names_a_bad_gpu_count_and_shows_every_machine(owner, shapes, raw):
    html = get(owner, f"gpu=h100-sxm&nodes=2&gpus={raw}")

    assert f"Machines have 1, 2, 4 or 8 GPUs, not '{raw}'. Showing every machine." in text(html)
    assert len(offer_rows(html)) == 4

    response = owner.api().get(f"/api/v1/offers?gpu=h100-sxm&nodes=2&gpus_per_machine={raw}")
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "invalid_gpus_per_machine"


def test_it_sends_sort_and_filter_with_the_htmx_form_and_their_messages_out_of_band(owner, shapes):
    full = get(owner, "gpu=h100-sxm&nodes=2")
    assert 'hx-params="gpu,nodes,community,sort,gpus"' in full

    swapped = get(owner, "gpu=h100-sxm&nodes=2&sort=nope&gpus=8", **{"HX-Request": "true"})

    assert "<form" not in swapped
    assert [slug for slug, _ in offer_rows(swapped)] == ["eight-cheap", "eight"]
    assert '<div id="compare-errors" hx-swap-oob="true">' in swapped
    assert "There is no sort 'nope'" in text(swapped)


def test_it_sorts_and_narrows_the_cached_list_without_a_query(
    owner, shapes, django_assert_num_queries
):
    client = owner.browser_client()
    client.get(f"{PICKER}?gpu=h100-sxm&nodes=2")  # the GPU cards and the offers, cached

    # session, user, project and the top bar's balance: the cards and the offers come from the
    # one cached entry
    with django_assert_num_queries(4):
        response = client.get(f"{PICKER}?gpu=h100-sxm&nodes=2&sort=price_per_gpu_hour&gpus=8")

    assert [slug for slug, _ in offer_rows(response.content.decode())] == ["eight-cheap", "eight"]


def test_narrow_offers_sorts_ties_per_gpu_hour_by_cluster_price(h100):
    from offers.offers import list_offers

    offer_type(gpu=h100, slug="x8", location="aa-1", price="16.00", gpus_per_machine=8)
    offer_type(gpu=h100, slug="x2", location="bb-2", price="4.00", gpus_per_machine=2)
    MachineTypeFactory(gpu=h100, slug="sold-out", price_per_hour=Decimal("0.50"))

    offers = list_offers(gpu=h100, nodes=2, include_community=False)
    ordered = narrow_offers(offers, sort=SortBy.PRICE_PER_GPU_HOUR)

    # both $2.00 per GPU-hour: the cheaper cluster first; no hosts: last
    assert [o.id for o in ordered] == ["x2", "x8", "sold-out"]
