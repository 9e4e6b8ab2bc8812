"""An API key's limits, enforced by the server: at most N machines per cluster, at most X USD
per hour across the live clusters the key created. A call beyond them is 403
`key_limit_exceeded`, naming the limit and the figures, and reserves nothing."""

import threading
from decimal import Decimal

import pytest
from django.db import connection
from django.test import Client

from accounts import keys
from clusters import lifecycle
from clusters.models import Cluster, Node
from offers.models import Host, MachineType
from tests.clusters.front import credit, machine_type_with_hosts, ssh_key
from tests.conftest import postgres_only
from tests.factories import LocationFactory

URL = "/api/v1/clusters"


@pytest.fixture(autouse=True)
def _work_in_memory():
    with lifecycle.dispatching_to(lifecycle.CollectingDispatcher()):
        yield


@pytest.fixture
def offer(owner) -> MachineType:
    """10 free machines at 4 USD an hour, a key and 1000 USD on the owner's project."""
    ssh_key(owner.project)
    credit(owner.project, "1000.00")
    return machine_type_with_hosts(
        free=10,
        slug="use2-h100x8-vm",
        price_per_hour=Decimal("4.00"),
        location=LocationFactory(code="us-east-2"),
    )


def agent(person, **limits):
    key, raw = keys.issue_api_key(user=person.user, project=person.project, name="agent", **limits)
    return key, Client(headers={"authorization": f"Bearer {raw}"})


def create(client, name="train", nodes=2):
    body = {"name": name, "offer_id": "use2-h100x8-vm", "nodes": nodes, "software": "none"}
    return client.post(URL, body, content_type="application/json")


def reserved(machine_type) -> int:
    return Host.objects.filter(machine_type=machine_type).exclude(state=Host.State.FREE).count()


def error_of(response) -> tuple[int, str, str]:
    error = response.json()["error"]
    return response.status_code, error["code"], error["message"]


def test_it_records_the_key_that_created_a_cluster(owner, offer):
    key, client = agent(owner)

    response = create(client)

    assert response.status_code == 201
    assert Cluster.objects.get(pk=response.json()["data"]["id"]).created_by_key == key


def test_it_refuses_more_machines_than_the_key_allows_and_reserves_nothing(owner, offer):
    _, client = agent(owner, max_machines_per_cluster=4)

    status, code, message = error_of(create(client, nodes=8))

    assert (status, code) == (403, "key_limit_exceeded")
    assert "at most 4 machines" in message and "max_machines_per_cluster" in message
    assert "would have 8" in message
    assert not Cluster.objects.exists()
    assert reserved(offer) == 0
    assert create(client, nodes=4).status_code == 201


def test_it_keeps_the_keys_clusters_within_its_hourly_limit(owner, offer):
    _, client = agent(owner, max_usd_per_hour="10.00")
    assert create(client, name="first", nodes=2).status_code == 201  # 8.00 per hour

    status, code, message = error_of(create(client, name="second", nodes=2))

    assert (status, code) == (403, "key_limit_exceeded")
    assert "at most $10.00 per hour" in message and "max_usd_per_hour" in message
    assert "cost $8.00 per hour" in message and "adds $8.00" in message
    assert "$16.00 in all" in message
    assert list(Cluster.objects.values_list("name", flat=True)) == ["first"]
    assert reserved(offer) == 2


def test_it_counts_only_the_keys_own_live_clusters(owner, offer):
    _, client = agent(owner, max_usd_per_hour="10.00")
    first = Cluster.objects.get(pk=create(client, name="first").json()["data"]["id"])
    # Another key's cluster (here the owner's full key) is not this key's spend.
    assert create(owner.api(), name="theirs", nodes=4).status_code == 201

    lifecycle.terminate(cluster=first, user=owner.user)

    assert create(client, name="second", nodes=2).status_code == 201


def test_it_lets_a_key_without_limits_create_any_size(owner, offer):
    assert create(owner.api(), nodes=10).status_code == 201


def test_it_holds_the_limits_when_adding_workers(owner, offer):
    key, client = agent(owner, max_machines_per_cluster=3, max_usd_per_hour="12.00")
    cluster = Cluster.objects.get(pk=create(client).json()["data"]["id"])
    Cluster.objects.filter(pk=cluster.pk).update(status=Cluster.Status.READY)
    Node.objects.filter(cluster=cluster).update(status=Node.Status.JOINED)
    workers = f"{URL}/{cluster.pk}/workers"

    too_many = client.post(workers, {"count": 2}, content_type="application/json")
    one = client.post(workers, {"count": 1}, content_type="application/json")

    status, code, message = error_of(too_many)
    assert (status, code) == (403, "key_limit_exceeded") and "would have 4" in message
    assert one.status_code == 202
    assert Node.objects.filter(cluster=cluster).count() == 3
    assert lifecycle.key_spend_per_hour(key) == Decimal("12.00")


def test_it_refuses_workers_past_the_hourly_limit_on_another_keys_cluster(owner, offer):
    cluster = Cluster.objects.get(pk=create(owner.api()).json()["data"]["id"])
    Cluster.objects.filter(pk=cluster.pk).update(status=Cluster.Status.READY)
    _, client = agent(owner, max_usd_per_hour="6.00")

    response = client.post(
        f"{URL}/{cluster.pk}/workers", {"count": 2}, content_type="application/json"
    )

    status, code, message = error_of(response)
    assert (status, code) == (403, "key_limit_exceeded")
    assert "cost $0.00 per hour and this adds $8.00" in message
    assert Node.objects.filter(cluster=cluster).count() == 2


@postgres_only
@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_it_lets_one_of_two_racing_creates_through_the_hourly_limit(owner):
    ssh_key(owner.project)
    credit(owner.project, "1000.00")
    machine_type_with_hosts(
        free=10, slug="use2-h100x8-vm", price_per_hour=Decimal("4.00"), location=LocationFactory()
    )
    _, client = agent(owner, max_usd_per_hour="10.00")
    barrier = threading.Barrier(2)
    statuses = []

    def send(name):
        barrier.wait()
        try:
            statuses.append(create(client, name=name).status_code)
        finally:
            connection.close()

    threads = [threading.Thread(target=send, args=(name,)) for name in ("one", "two")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert sorted(statuses) == [201, 403]
    assert Cluster.objects.count() == 1
