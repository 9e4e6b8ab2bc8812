"""A size below 2 gets its own message (issue 13, item 8), the same on the picker, the create
form and the API: a cluster has at least 2 machines; never "request a quote", which is for
clusters bigger than self-serve."""

import re
from decimal import Decimal

import pytest

from clusters.models import Cluster
from offers.models import TOO_FEW_NODES
from tests.clusters.front import credit, machine_type_with_hosts, ssh_key
from tests.factories import GpuModelFactory
from tests.offers.catalog import offer_type

SLUG = "use2-h100x8-vm"


def text_of(html: str) -> str:
    return " ".join(re.sub(r"<[^>]+>", " ", html).split())


@pytest.fixture
def offer(owner):
    ssh_key(owner.project, "laptop")
    credit(owner.project, "500.00")
    return machine_type_with_hosts(free=4, slug=SLUG, price_per_hour=Decimal("10.00"))


def test_the_message_says_at_least_two_and_what_to_do_for_one_machine():
    assert TOO_FEW_NODES.startswith("A cluster has at least 2 machines; for one machine")
    assert "quote" not in TOO_FEW_NODES


@pytest.mark.parametrize("nodes", ["1", "0", "-3"])
def test_the_picker_says_it_beside_the_size_and_offers_no_quote_for_it(owner, nodes):
    offer_type(gpu=GpuModelFactory(slug="h100-sxm"), slug="use2-vm", free=5)
    html = owner.browser_client().get(f"/offers/?gpu=h100-sxm&nodes={nodes}").content.decode()
    error = re.search(r'<p id="nodes-error"[^>]*>(.*?)</p>', html, re.S).group(1)
    assert error == TOO_FEW_NODES.replace("'", "&#x27;")
    offers = html.split('id="offers"', 1)[1].split("</section>", 1)[0]
    assert "Request a quote" not in offers


def test_the_picker_still_offers_a_quote_above_64(owner):
    offer_type(gpu=GpuModelFactory(slug="h100-sxm"), slug="use2-vm", free=5)
    html = owner.browser_client().get("/offers/?gpu=h100-sxm&nodes=65").content.decode()
    offers = html.split('id="offers"', 1)[1].split("</section>", 1)[0]
    assert "Request a quote" in offers and "at least 2" not in html


def test_the_create_form_refuses_it_with_the_message_beside_nodes(owner, offer):
    keys = [str(pk) for pk in owner.project.ssh_keys.values_list("pk", flat=True)]
    response = owner.browser_client().post(
        "/clusters/new/",
        {
            "offer": SLUG,
            "nodes": "1",
            "name": "train",
            "environment": "default",
            "software": "none",
            "ssh_keys": keys,
        },
    )
    assert response.status_code == 400
    assert TOO_FEW_NODES in text_of(response.content.decode()).replace("&#x27;", "'")
    assert Cluster.objects.count() == 0


def test_the_create_forms_price_says_it_for_a_size_of_one(owner, offer):
    response = owner.browser_client().get(f"/clusters/new/?offer={SLUG}&nodes=1")
    summary = response.content.decode().split('id="price-summary"', 1)[1].split("</div>", 2)
    assert "A cluster has at least 2 machines" in "".join(summary[:2])


def test_the_api_refuses_a_cluster_of_one_with_the_message(owner, offer):
    body = {"name": "train", "offer_id": SLUG, "nodes": 1, "software": "none"}
    response = owner.api().post("/api/v1/clusters", body, content_type="application/json")
    assert response.status_code == 422
    assert response.json()["error"] == {"code": "invalid_nodes", "message": TOO_FEW_NODES}
    big = owner.api().post(
        "/api/v1/clusters", {**body, "nodes": 65}, content_type="application/json"
    )
    assert "at least 2" not in big.json()["error"]["message"]


def test_the_offers_api_says_it_too(owner):
    GpuModelFactory(slug="h100-sxm")
    response = owner.api().get("/api/v1/offers?gpu=h100-sxm&nodes=1")
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["code"] == "invalid_nodes" and error["message"].endswith(TOO_FEW_NODES)
    assert "quote" not in error["message"]
