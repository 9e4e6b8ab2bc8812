"""The picker in a real browser: choices swap the offers in place, without a page load."""

import re

import pytest

from offers.models import Location
from tests.conftest import log_in
from tests.factories import GpuModelFactory
from tests.offers.catalog import offer_type

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def inventory(transactional_db):
    a100 = GpuModelFactory(slug="a100", name="A100 SXM 80GB", memory_gib=80)
    h100 = GpuModelFactory(slug="h100-sxm", name="H100 SXM 80GB", memory_gib=80)
    offer_type(gpu=a100, slug="a100-vm", location="us-east-2", price="1.79", free=6)
    offer_type(gpu=h100, slug="h100-vm", location="us-east-2", price="2.49", free=20)
    offer_type(
        gpu=h100,
        slug="h100-bool",
        location="us-west-1",
        reporting=Location.CapacityReporting.BOOLEAN,
        price="2.29",
        free=3,
    )
    offer_type(gpu=h100, slug="h100-cm", location="cm-us", price="1.20", free=40, community=True)


def rows(page) -> list[tuple[str, str]]:
    return [
        (row.get_attribute("data-offer"), row.get_attribute("data-availability"))
        for row in page.locator("#offers tr.offer").all()
    ]


def test_it_swaps_the_offers_in_place_as_choices_change(page, owner, inventory):
    log_in(page, owner)
    page.goto("/offers/")
    assert rows(page) == [("a100-vm", "available")]
    page.evaluate("window.__marker = 1")
    # With htmx the submit button is not needed.
    assert not page.get_by_role("button", name="Show offers").is_visible()

    page.locator("label.gpu-card", has_text="H100 SXM 80GB").click()
    page.wait_for_selector('#offers tr[data-offer="h100-vm"]')
    assert rows(page) == [("h100-bool", "available"), ("h100-vm", "available")]

    page.locator("label.size-pick", has_text="16").click()
    page.wait_for_selector('#offers tr[data-offer="h100-bool"][data-availability="reserved_ahead"]')
    assert rows(page) == [("h100-vm", "available"), ("h100-bool", "reserved_ahead")]
    assert page.input_value("#id_nodes") == "16"

    page.get_by_label("Include community hosts").check()
    page.wait_for_selector('#offers tr[data-offer="h100-cm"]')
    assert rows(page) == [
        ("h100-cm", "available"),
        ("h100-vm", "available"),
        ("h100-bool", "reserved_ahead"),
    ]
    assert page.locator("#offers .community-note").is_visible()
    facts = page.locator("#gpu-facts-h100-sxm").inner_text()
    assert facts.startswith("from $0.15 per GPU-hour")  # $1.20 over 8 GPUs
    assert "from $1.20/h per machine" in facts

    assert page.evaluate("window.__marker") == 1  # the same document: no page load
    assert re.search(r"[?&]community=1(&|$)", page.url)
    assert "gpu=h100-sxm" in page.url and "nodes=16" in page.url
    assert "prev=" not in page.url


def test_it_shows_a_typed_size_that_is_too_big_beside_the_control(page, owner, inventory):
    log_in(page, owner)
    page.goto("/offers/?gpu=h100-sxm&nodes=4")
    page.evaluate("window.__marker = 1")

    page.fill("#id_nodes", "65")
    page.press("#id_nodes", "Enter")

    page.wait_for_selector("#nodes-error:not(:empty)")
    assert "2 to 64 machines" in page.inner_text("#nodes-error")
    assert page.locator("#offers table").count() == 0
    assert page.evaluate("window.__marker") == 1

    page.fill("#id_nodes", "8")
    page.press("#id_nodes", "Enter")
    page.wait_for_selector("#offers table")
    assert page.inner_text("#nodes-error") == ""
    assert page.locator("label.size-pick:has(input:checked)").inner_text() == "8"


def test_it_sorts_by_price_per_gpu_hour_and_narrows_by_gpus_in_place(page, owner, inventory):
    # One GPU for $0.35: the cheapest cluster, the dearest GPU-hour (the others have 8 GPUs).
    offer_type(gpu=GpuModelFactory(slug="h100-sxm"), slug="h100-x1", location="eu-central-1",
               price="0.35", free=9, gpus_per_machine=1)  # fmt: skip
    log_in(page, owner)
    page.goto("/offers/?gpu=h100-sxm&nodes=2")
    page.evaluate("window.__marker = 1")
    assert [slug for slug, _ in rows(page)] == ["h100-x1", "h100-bool", "h100-vm"]

    page.select_option("#id_sort", "price_per_gpu_hour")
    page.wait_for_url(re.compile(r"sort=price_per_gpu_hour"))
    page.wait_for_selector("#offers .offers-head >> text=sorted by price per GPU-hour")
    # $0.28625, $0.31125, $0.35 per GPU-hour
    assert [slug for slug, _ in rows(page)] == ["h100-bool", "h100-vm", "h100-x1"]

    page.locator("label.gpus-pick", has_text="1").click()
    page.wait_for_url(re.compile(r"gpus=1"))
    page.wait_for_selector("#offers .offers-head >> text=1 GPU per machine")
    assert rows(page) == [("h100-x1", "available")]
    assert page.evaluate("window.__marker") == 1  # the same document: no page load
