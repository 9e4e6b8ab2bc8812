"""The offers kept for one tick (offers/offers.py `cached`): per GPU, size and community
choice, forgotten when staff change the inventory, never trusted by create."""

from datetime import timedelta
from decimal import Decimal

import pytest
import time_machine
from django.test import Client
from django.utils import timezone

from accounts.models import User
from clusters import lifecycle
from clusters.models import Cluster
from offers import offers as offers_module
from offers.inventory import load_inventory, return_hosts_to_service, take_hosts_offline
from offers.models import Host, MachineType
from offers.offers import cache_seconds, cached, inventory_changed
from tests.clusters.front import credit, ssh_key
from tests.factories import GpuModelFactory
from tests.offers.catalog import offer_rows, offer_type

PICKER = "/offers/"
ME = "/api/v1/me"


def free_count(person, query: str = "gpu=h100-sxm&nodes=2") -> list[int | None]:
    response = person.api().get(f"/api/v1/offers?{query}")
    assert response.status_code == 200, response.content
    return [offer["nodes_available"] for offer in response.json()["data"]]


def take_free_hosts(machine_type: MachineType, count: int) -> None:
    """What a reservation does to the inventory: an UPDATE no cache hears of."""
    hosts = Host.objects.filter(machine_type=machine_type, state=Host.State.FREE)[:count]
    Host.objects.filter(pk__in=list(hosts.values_list("pk", flat=True))).update(
        state=Host.State.RESERVED
    )


def after_a_tick():
    return time_machine.travel(timezone.now() + timedelta(seconds=cache_seconds() + 1))


def test_it_keeps_the_answer_for_one_tick_of_the_beat(owner, h100, settings):
    machine_type = offer_type(gpu=h100, slug="x", free=5)
    assert cache_seconds() == 2 == settings.RUNCRATE_TICK_SECONDS
    assert free_count(owner) == [5]

    take_free_hosts(machine_type, 2)

    assert free_count(owner) == [5]  # within the tick
    with after_a_tick():
        assert free_count(owner) == [3]


def test_it_keeps_an_answer_per_gpu_size_and_community_choice(owner, h100):
    offer_type(gpu=h100, slug="dc", free=5)
    offer_type(gpu=h100, slug="cm", location="cm-us", free=9, community=True)
    l40s = GpuModelFactory(slug="l40s", name="L40S", memory_gib=48)
    offer_type(gpu=l40s, slug="l40", location="us-west-1", free=7)
    api = owner.api()

    def availability(query: str) -> list[tuple[str, str]]:
        data = api.get(f"/api/v1/offers?{query}").json()["data"]
        return [(offer["id"], offer["availability"]) for offer in data]

    for _ in range(2):  # the second round is answered from the cache, with the same answers
        assert availability("gpu=h100-sxm&nodes=4") == [("dc", "available")]
        assert availability("gpu=h100-sxm&nodes=6") == [("dc", "not_in_stock")]
        assert availability("gpu=h100-sxm&nodes=6&include_community=true") == [
            ("cm", "available"),
            ("dc", "not_in_stock"),
        ]
        assert availability("gpu=l40s&nodes=6") == [("l40", "available")]


def test_it_forgets_the_offers_when_staff_take_hosts_out_of_service_and_back(owner, h100):
    machine_type = offer_type(gpu=h100, slug="x", free=5)
    assert free_count(owner) == [5]
    hosts = list(machine_type.hosts.values_list("pk", flat=True)[:2])

    take_hosts_offline(host_ids=hosts)
    assert free_count(owner) == [3]

    return_hosts_to_service(host_ids=hosts)
    assert free_count(owner) == [5]


def test_it_forgets_the_offers_when_staff_load_the_inventory(owner, h100):
    offer_type(gpu=h100, slug="x", free=1, price="2.00")
    api = owner.api()
    assert api.get("/api/v1/offers?gpu=h100-sxm&nodes=2").json()["data"][0]["price_per_hour"] == (
        "4.00"
    )
    document = {
        "machine_types": [
            {
                "slug": "x",
                "location": "us-east-2",
                "gpu": "h100-sxm",
                "gpus_per_machine": 8,
                "machine_kind": "vm",
                "price_per_hour": "3.00",
            }
        ],
        "hosts": [{"machine_type": "x", "count": 4, "name_prefix": "more-"}],
    }

    load_inventory(document)

    (offer,) = api.get("/api/v1/offers?gpu=h100-sxm&nodes=2").json()["data"]
    assert (offer["price_per_hour"], offer["nodes_available"]) == ("6.00", 5)


def test_it_keeps_the_offers_through_a_dry_run(owner, h100, django_assert_num_queries):
    offer_type(gpu=h100, slug="x", free=1)
    api = owner.api()
    api.get("/api/v1/offers?gpu=h100-sxm&nodes=2")

    load_inventory(
        {"hosts": [{"machine_type": "x", "count": 4, "name_prefix": "dry-"}]}, dry_run=True
    )

    with django_assert_num_queries(0):
        assert api.get("/api/v1/offers?gpu=h100-sxm&nodes=2").status_code == 200


def test_it_forgets_the_offers_when_staff_edit_a_machine_type_in_the_admin(owner, h100):
    machine_type = offer_type(gpu=h100, slug="x", free=3, price="2.00")
    assert free_count(owner) == [3]
    staff = Client()
    staff.force_login(User.objects.create_superuser(email="staff@example.com", password="x"))
    form = {
        "slug": "x",
        "location": machine_type.location_id,
        "gpu": h100.pk,
        "gpus_per_machine": machine_type.gpus_per_machine,
        "machine_kind": machine_type.machine_kind,
        "interconnect": "ethernet",
        "community": "",
        "price_per_hour": "5.00",
        "boot_seconds": machine_type.boot_seconds,
    }

    response = staff.post(f"/admin/offers/machinetype/{machine_type.pk}/change/", form)

    assert response.status_code == 302, response.content.decode()[:2000]
    assert MachineType.objects.get(pk=machine_type.pk).price_per_hour == Decimal("5.00")
    data = owner.api().get("/api/v1/offers?gpu=h100-sxm&nodes=2").json()["data"]
    assert data[0]["machine_price_per_hour"] == "5.00"


def test_it_keeps_the_picker_for_one_tick_too(owner, h100):
    machine_type = offer_type(gpu=h100, slug="x", free=3)
    browser = owner.browser_client()

    def rows() -> list[tuple[str, str]]:
        return offer_rows(browser.get(f"{PICKER}?gpu=h100-sxm&nodes=3").content.decode())

    assert rows() == [("x", "available")]
    take_free_hosts(machine_type, 1)

    assert rows() == [("x", "available")]
    with after_a_tick():
        assert rows() == [("x", "not_in_stock")]


def test_it_never_lets_a_stale_offer_reserve_hosts_that_are_gone(owner, h100):
    """The safety the tick rests on: create reads its offer again and reserves under row
    locks, whatever the cached offers say."""
    machine_type = offer_type(gpu=h100, slug="x", free=2, machine_kind="vm")
    ssh_key(owner.project)
    credit(owner.project, "500.00")
    assert free_count(owner) == [2]
    take_free_hosts(machine_type, 1)
    assert free_count(owner) == [2]  # the cached answer still says two are free

    body = {"name": "train", "offer_id": "x", "nodes": 2, "software": "none"}
    with lifecycle.dispatching_to(lifecycle.CollectingDispatcher()):
        response = owner.api().post("/api/v1/clusters", body, content_type="application/json")

    assert response.status_code == 409
    assert response.json()["error"]["code"] == "not_enough_machines"
    assert not Cluster.objects.exists()
    assert Host.objects.filter(machine_type=machine_type, state=Host.State.FREE).count() == 1


@pytest.mark.parametrize("gpu", ["h100 sxm", "x" * 41, "h100-sxm%00", "ünicode", "a:b"])
def test_it_answers_a_gpu_no_slug_could_be_fresh_without_the_cache(
    owner, h100, gpu, django_assert_num_queries
):
    offer_type(gpu=h100, slug="x", free=2)
    api = owner.api()
    api.get(ME)  # the key is kept: what follows counts only the offers

    for _ in range(2):
        with django_assert_num_queries(2):  # the offers, the GPU: each time, nothing kept
            response = api.get("/api/v1/offers", {"gpu": gpu, "nodes": "2"})
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "unknown_gpu"


def test_it_answers_an_unknown_gpu_404_from_the_cache_too(owner, h100, django_assert_num_queries):
    api = owner.api()
    api.get(ME)
    for queries in (2, 0):  # the offers and the GPU, then nothing within the tick
        with django_assert_num_queries(queries):
            response = api.get("/api/v1/offers?gpu=no-such-gpu&nodes=2")
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "unknown_gpu"

    GpuModelFactory(slug="no-such-gpu", name="Now it exists", memory_gib=8)
    with after_a_tick():
        assert owner.api().get("/api/v1/offers?gpu=no-such-gpu&nodes=2").status_code == 200


# --- cached() itself ----------------------------------------------------------------------------


def test_it_drops_an_answer_computed_while_the_inventory_changed(db):
    answers = iter([1, 2, 3])

    def compute() -> int:
        answer = next(answers)
        if answer == 1:
            inventory_changed()  # staff's change lands while the first answer is computed
        return answer

    assert cached("test", compute) == 1
    assert cached("test", compute) == 2  # the first was computed under the old version
    assert cached("test", compute) == 2


def test_it_computes_every_time_when_the_cache_does_not_answer(db, monkeypatch):
    calls = []
    monkeypatch.setattr(offers_module.cache, "get_many", lambda keys: {})

    for _ in range(3):
        cached("test", lambda: calls.append(1) or len(calls))

    assert len(calls) == 3
