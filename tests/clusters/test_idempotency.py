"""`Idempotency-Key` on POST /api/v1/clusters: a retry answers what the first create did and
never reserves twice; the same key with another body is refused; keys are kept 24 hours."""

import threading
from datetime import timedelta
from decimal import Decimal

import pytest
import time_machine
from django.db import connection
from django.test import Client
from django.utils import timezone

from accounts import keys
from clusters import idempotency, lifecycle
from clusters.models import Cluster, Event, IdempotentRequest
from offers.models import Host, MachineType
from tests.clusters.front import credit, machine_type_with_hosts, ssh_key
from tests.conftest import postgres_only
from tests.factories import LocationFactory

URL = "/api/v1/clusters"
BODY = {"name": "train", "offer_id": "use2-h100x8-vm", "nodes": 2, "software": "none"}


@pytest.fixture(autouse=True)
def _work_in_memory():
    with lifecycle.dispatching_to(lifecycle.CollectingDispatcher()):
        yield


def _offer(project) -> MachineType:
    ssh_key(project)
    credit(project, "500.00")
    return machine_type_with_hosts(
        free=6,
        slug="use2-h100x8-vm",
        price_per_hour=Decimal("10.00"),
        location=LocationFactory(code="us-east-2"),
    )


@pytest.fixture
def offer(owner) -> MachineType:
    return _offer(owner.project)


def create(client: Client, key: str | None = "retry-1", **fields):
    headers = {} if key is None else {"Idempotency-Key": key}
    return client.post(URL, {**BODY, **fields}, content_type="application/json", headers=headers)


def reserved(machine_type) -> int:
    return Host.objects.filter(machine_type=machine_type).exclude(state=Host.State.FREE).count()


def test_it_answers_a_retry_with_the_first_result_and_creates_once(owner, offer):
    client = owner.api()

    first = create(client)
    retry = create(client)

    assert first.status_code == retry.status_code == 201
    assert retry.content == first.content
    assert Cluster.objects.count() == 1
    assert retry.json()["data"]["id"] == Cluster.objects.get().pk
    assert reserved(offer) == 2
    assert Event.objects.filter(reason=Event.Reason.CREATED).count() == 1


def test_it_answers_like_a_create_without_the_header(owner, offer):
    with_key = create(owner.api()).json()["data"]
    Cluster.objects.all().delete()
    Host.objects.update(state=Host.State.FREE)

    without = create(owner.api(), key=None).json()["data"]

    assert set(with_key) == set(without)
    assert with_key["price_per_hour"] == without["price_per_hour"] == "20.00"


def test_it_replays_in_a_fixed_number_of_queries(owner, offer, django_assert_num_queries):
    client = owner.api()
    create(client)

    # The insert the unique key refuses, in its savepoint (4); the first record; the
    # transaction's savepoint (2); the audit log's entry for the request, in its own savepoint
    # (3: audit/log.py). The API key comes from the cache; nothing about the cluster is read
    # again.
    with django_assert_num_queries(10):
        assert create(client).status_code == 201


def test_it_refuses_the_same_key_with_another_body(owner, offer):
    client = owner.api()
    create(client)

    response = create(client, nodes=3)

    assert response.status_code == 422
    error = response.json()["error"]
    assert error["code"] == "idempotency_key_reused"
    assert "'retry-1'" in error["message"] and "another body" in error["message"]
    assert Cluster.objects.count() == 1
    assert reserved(offer) == 2


def test_it_keeps_keys_per_api_key(owner, offer):
    _, raw = keys.issue_api_key(user=owner.user, project=owner.project, name="agent")
    other = Client(headers={"authorization": f"Bearer {raw}"})
    create(owner.api())

    response = create(other, name="other")

    assert response.status_code == 201
    assert Cluster.objects.count() == 2


def test_it_decides_a_refused_create_afresh(owner, offer):
    credit(owner.project, "-490.00")  # 10 USD: two machines need 20
    client = owner.api()

    refused = create(client)
    credit(owner.project, "100.00")
    retried = create(client)

    assert refused.status_code == 402
    assert retried.status_code == 201
    assert Cluster.objects.count() == 1


def test_it_forgets_a_key_after_24_hours(owner, offer):
    client = owner.api()
    create(client)

    with time_machine.travel(timezone.now() + timedelta(hours=24, seconds=1)):
        response = create(client, name="next-day")

    assert response.status_code == 201
    assert Cluster.objects.count() == 2
    assert IdempotentRequest.objects.count() == 1


def test_it_sweeps_records_older_than_24_hours(owner, offer):
    create(owner.api(), key="old")
    create(owner.api(), key="new", name="second")
    IdempotentRequest.objects.filter(key="old").update(
        created_at=timezone.now() - timedelta(hours=25)
    )

    assert idempotency.forget_expired() == 1
    assert list(IdempotentRequest.objects.values_list("key", flat=True)) == ["new"]


@pytest.mark.parametrize("key", ["", "has space", "x" * 256, "naïve"])
def test_it_refuses_a_malformed_key(owner, offer, key):
    response = create(owner.api(), key=key)

    assert response.status_code == 422
    assert response.json()["error"]["code"] == "invalid_idempotency_key"
    assert not Cluster.objects.exists()


@postgres_only
@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_it_creates_once_when_two_retries_race(owner):
    machine_type = _offer(owner.project)
    barrier = threading.Barrier(2)
    responses = []

    def send():
        barrier.wait()
        try:
            responses.append(create(owner.api(), key="race"))
        finally:
            connection.close()

    threads = [threading.Thread(target=send) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert [r.status_code for r in responses] == [201, 201]
    assert responses[0].content == responses[1].content
    assert Cluster.objects.count() == 1
    assert reserved(machine_type) == 2
