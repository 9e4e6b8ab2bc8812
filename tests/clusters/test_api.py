"""The clusters API: create, list, read, the actions, every refusal code, and the 405."""

from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from accounts.models import Environment
from clusters import lifecycle
from clusters.models import Cluster, Event, Node
from offers.models import Host, MachineType
from tests.clusters.front import credit, machine_type_with_hosts, reported_cluster, ssh_key
from tests.factories import ClusterFactory, EventFactory, LocationFactory, NodeFactory

URL = "/api/v1/clusters"


@pytest.fixture(autouse=True)
def _work_in_memory():
    # Nothing is handed to Celery: what the lifecycle hands off stays in memory, unrun.
    with lifecycle.dispatching_to(lifecycle.CollectingDispatcher()) as dispatcher:
        yield dispatcher


@pytest.fixture
def offer(owner) -> MachineType:
    """An offer of 4 free machines at 10 USD an hour, a key and 500 USD on the owner's project."""
    ssh_key(owner.project)
    credit(owner.project, "500.00")
    return machine_type_with_hosts(
        free=4,
        slug="use2-h100x8-vm",
        price_per_hour=Decimal("10.00"),
        location=LocationFactory(code="us-east-2", name="Columbus, Ohio"),
    )


def create(person, **fields):
    body = {"name": "train", "offer_id": "use2-h100x8-vm", "nodes": 2, "software": "none"}
    return person.api().post(URL, {**body, **fields}, content_type="application/json")


def error_of(response) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["code"]


def assert_nothing_reserved(machine_type: MachineType) -> None:
    assert Cluster.objects.count() == 0
    assert not Host.objects.filter(machine_type=machine_type).exclude(state=Host.State.FREE)


# --- create -------------------------------------------------------------------------------


def test_it_creates_a_cluster_and_answers_201_with_it(owner, offer):
    response = create(owner, nodes=3, software="slurm")

    assert response.status_code == 201
    data = response.json()["data"]
    cluster = Cluster.objects.get(pk=data["id"])
    assert cluster.project == owner.project and cluster.created_by == owner.user
    assert data["name"] == "train"
    assert data["status"] == "provisioning"
    assert data["environment"] == "default"
    assert data["offer_id"] == "use2-h100x8-vm"
    assert data["gpu"] == "h100-sxm" and data["gpus_per_machine"] == 8
    assert data["location"] == "us-east-2"
    assert data["nodes"] == 3
    assert data["software"] == "slurm"
    assert data["price_per_hour"] == "30.00"
    assert data["billing_started_at"] is None and data["failure"] is None
    assert [m["name"] for m in data["machines"]] == ["node-0", "node-1", "node-2"]
    assert data["machines"][2]["private_ip"] == "10.77.0.3"
    assert data["events"][0]["reason"] == "created"
    assert Host.objects.filter(machine_type=offer, state=Host.State.FREE).count() == 1


def test_it_creates_in_a_named_environment_with_chosen_keys(owner, offer):
    staging = Environment.objects.create(project=owner.project, name="staging")
    second = ssh_key(owner.project, "second")

    response = create(owner, environment="staging", ssh_key_ids=[second.pk])

    assert response.status_code == 201
    cluster = Cluster.objects.get(pk=response.json()["data"]["id"])
    assert cluster.environment == staging
    assert list(cluster.ssh_keys.all()) == [second]


@pytest.mark.parametrize(
    ("fields", "status", "code"),
    [
        ({"nodes": 1}, 422, "invalid_nodes"),
        ({"nodes": 65}, 422, "invalid_nodes"),
        ({"offer_id": "no-such-offer"}, 404, "unknown_offer"),
        ({"nodes": 5}, 409, "not_enough_machines"),
        ({"name": "Not_A_Label"}, 422, "invalid_name"),
        ({"name": "train\n"}, 422, "invalid_name"),
        ({"software": "nomad"}, 422, "software_not_offered"),
        ({"environment": "nowhere"}, 404, "unknown_environment"),
        ({"ssh_key_ids": [987654]}, 422, "unknown_ssh_key"),
    ],
)
def test_it_refuses_a_bad_request_with_its_code_and_reserves_nothing(
    owner, offer, fields, status, code
):
    response = create(owner, **fields)

    assert error_of(response) == (status, code)
    assert response.json()["error"]["message"]
    assert_nothing_reserved(offer)


def test_it_refuses_kubernetes_on_containers(owner, offer):
    MachineType.objects.filter(pk=offer.pk).update(machine_kind=MachineType.Kind.CONTAINER)

    response = create(owner, software="kubernetes")

    assert error_of(response) == (422, "software_not_offered")
    assert "Kubernetes" in response.json()["error"]["message"]
    assert_nothing_reserved(offer)


def test_it_refuses_a_short_balance_naming_both_sums(owner, offer):
    credit(owner.project, "-480.00")  # 20 USD left; two machines need one hour, 20 USD: fine
    four = create(owner, nodes=4)  # four machines need 40 USD

    assert error_of(four) == (402, "insufficient_balance")
    message = four.json()["error"]["message"]
    assert "$20.00" in message and "$40.00" in message
    assert_nothing_reserved(offer)


def test_it_refuses_a_name_taken_by_a_live_cluster(owner, offer):
    assert create(owner).status_code == 201

    response = create(owner)

    assert error_of(response) == (409, "name_taken")
    assert Cluster.objects.count() == 1


def test_it_refuses_without_any_ssh_key(owner, offer):
    owner.project.ssh_keys.all().delete()

    response = create(owner)

    assert error_of(response) == (422, "no_ssh_keys")
    assert_nothing_reserved(offer)


def test_it_refuses_an_empty_choice_of_ssh_keys(owner, offer):
    response = create(owner, ssh_key_ids=[])

    assert error_of(response) == (422, "no_ssh_keys")
    assert_nothing_reserved(offer)


def test_it_refuses_another_projects_ssh_key(owner, stranger, offer):
    theirs = ssh_key(stranger.project, "theirs")

    response = create(owner, ssh_key_ids=[theirs.pk])

    assert error_of(response) == (422, "unknown_ssh_key")
    assert_nothing_reserved(offer)


def test_it_refuses_a_malformed_body_naming_the_field(owner, offer):
    response = create(owner, nodes="many")

    assert error_of(response) == (422, "invalid_request")
    assert "nodes" in response.json()["error"]["message"]
    assert_nothing_reserved(offer)


# --- read ---------------------------------------------------------------------------------


def test_it_lists_the_projects_clusters_newest_first_with_meta(owner, stranger):
    older = ClusterFactory(project=owner.project, name="older", machines=True)
    newer = ClusterFactory(project=owner.project, name="newer", machines=True)
    ClusterFactory(project=stranger.project, name="theirs")

    body = owner.api().get(URL).json()

    assert [c["id"] for c in body["data"]] == [newer.pk, older.pk]
    assert body["meta"] == {"total": 2, "limit": 50, "offset": 0}
    assert "events" not in body["data"][0]
    assert len(body["data"][0]["machines"]) == 2
    assert owner.api().get(URL, {"limit": 1, "offset": 1}).json()["data"][0]["id"] == older.pk


def test_it_reads_a_failed_cluster_with_its_failure_machines_and_events(owner):
    cluster = ClusterFactory(
        project=owner.project,
        status=Cluster.Status.FAILED,
        failure_reason=Event.Reason.BOOT_TIMEOUT,
        failure_node="node-1",
        failure_step=Node.Step.RUNNING,
        failure_message="node-1 did not come up within 6 minutes.",
        ended_at=timezone.now(),
        machines=True,
        machines__status=Node.Status.ENDED,
    )
    node = cluster.nodes.get(index=1)
    EventFactory(
        cluster=cluster,
        node=node,
        step=Node.Step.RUNNING,
        reason=Event.Reason.BOOT_TIMEOUT,
        message="node-1 did not come up within 6 minutes.",
    )

    data = owner.api().get(f"{URL}/{cluster.pk}").json()["data"]

    assert data["status"] == "failed"
    assert data["failure"] == {
        "reason": "boot_timeout",
        "node": "node-1",
        "step": "running",
        "message": "node-1 did not come up within 6 minutes.",
    }
    assert data["stop_reason"] is None
    assert data["ended_at"].endswith("Z")
    assert data["machines"][1] == {
        "id": node.pk,
        "name": "node-1",
        "private_ip": "10.77.0.2",
        "step": "running",
        "status": "ended",
        "health": {"status": "healthy", "problems": []},
        "drained": None,
        "replaces": None,
        "replaced_by": None,
        "joining": False,
        "ended_at": None,  # the factory's node records no end of its own
        "cost": "0.00",  # never billed
    }
    assert data["events"][-1]["node"] == "node-1"
    assert data["events"][-1]["step"] == "running"
    assert data["events"][-1]["reason"] == "boot_timeout"
    assert set(data) >= {
        "created_at",
        "joined_at",
        "billing_started_at",
        "ready_at",
        "ended_at",
        "price_per_hour",
    }


def test_it_gives_billing_started_at_as_the_joining_instant(owner):
    joined = timezone.now()
    cluster = ClusterFactory(
        project=owner.project, status=Cluster.Status.READY, joined_at=joined, ready_at=joined
    )

    data = owner.api().get(f"{URL}/{cluster.pk}").json()["data"]

    assert data["billing_started_at"] == data["joined_at"] is not None


def test_it_reads_a_cluster_in_the_same_number_of_queries_for_2_and_64_nodes(
    owner, django_assert_num_queries
):
    small = ClusterFactory(project=owner.project, size=2, machines=True)
    large = ClusterFactory(project=owner.project, size=64, machines=True)
    for cluster in (small, large):
        for node in cluster.nodes.all():
            EventFactory(cluster=cluster, node=node, reason=Event.Reason.MACHINE_RUNNING)
    client = owner.api()
    client.get(f"{URL}/{small.pk}")  # the key's last use is written once a minute

    with CaptureQueriesContext(connection) as queries:
        client.get(f"{URL}/{small.pk}")
    with django_assert_num_queries(len(queries)):
        data = client.get(f"{URL}/{large.pk}").json()["data"]

    assert len(data["machines"]) == 64 and len(data["events"]) == 64


def test_a_reported_cluster_reads_in_the_same_queries_for_8_and_64_nodes_and_whole(
    owner, django_assert_num_queries
):
    small = reported_cluster(owner.project, size=8)
    large = reported_cluster(owner.project, size=64)
    client = owner.api()
    client.get(f"{URL}/{small.pk}")  # the key's last use is written once a minute

    with CaptureQueriesContext(connection) as queries:
        client.get(f"{URL}/{small.pk}")
    with django_assert_num_queries(len(queries)):
        data = client.get(f"{URL}/{large.pk}").json()["data"]

    assert len(data["machines"]) == 64 and len(data["events"]) == 3 * 64
    assert data["events"][-1]["node"] == "node-63"
    rows = data["acceptance"]["nodes"]
    assert [len(row["gpus"]) for row in rows] == [8] * 64
    assert rows[5]["reachability"] == {f"node-{i}": True for i in range(64) if i != 5}


def test_each_event_names_its_machine_a_replaced_one_included(owner):
    cluster = ClusterFactory(project=owner.project, size=2, machines=True)
    lost = cluster.nodes.get(index=1)
    lost.status = Node.Status.LOST
    lost.save()
    replacement = NodeFactory(cluster=cluster, index=1, replaces=lost)
    EventFactory(cluster=cluster, node=lost, reason=Event.Reason.MACHINE_LOST, message="Lost.")
    EventFactory(cluster=cluster, node=replacement, reason=Event.Reason.MACHINE_RUNNING)
    EventFactory(cluster=cluster, reason=Event.Reason.CREATED)

    events = owner.api().get(f"{URL}/{cluster.pk}").json()["data"]["events"]

    assert [(e["node"], e["reason"]) for e in events] == [
        ("node-1", "machine_lost"),
        ("node-1", "machine_running"),
        (None, "created"),
    ]


def test_it_answers_404_for_a_strangers_cluster_everywhere(owner, stranger):
    cluster = ClusterFactory(project=owner.project, status=Cluster.Status.READY, machines=True)
    api = stranger.api()

    responses = [
        api.get(f"{URL}/{cluster.pk}"),
        api.post(f"{URL}/{cluster.pk}/terminate"),
        api.post(f"{URL}/{cluster.pk}/retry-install"),
        api.post(f"{URL}/{cluster.pk}/workers", {"count": 1}, content_type="application/json"),
        api.delete(f"{URL}/{cluster.pk}/machines/node-1"),
    ]

    assert [error_of(r) for r in responses] == [(404, "not_found")] * 5
    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.READY


# --- actions ---------------------------------------------------------------------------------


def test_it_terminates_with_202_and_refuses_a_second_time_with_409(owner, offer):
    cluster_id = create(owner).json()["data"]["id"]

    first = owner.api().post(f"{URL}/{cluster_id}/terminate")
    second = owner.api().post(f"{URL}/{cluster_id}/terminate")

    assert first.status_code == 202
    assert first.json()["data"]["status"] == "terminating"
    assert first.json()["data"]["events"][-1]["reason"] == "terminate_requested"
    assert error_of(second) == (409, "invalid_state")


def test_it_retries_the_install_of_a_degraded_cluster_only(owner):
    degraded = ClusterFactory(
        project=owner.project,
        software=Cluster.Software.SLURM,
        status=Cluster.Status.DEGRADED,
        failure_reason="install_failed",  # degraded because Slurm did not install
        joined_at=timezone.now(),
        machines=True,
        machines__status=Node.Status.JOINED,
        machines__step=Node.Step.INSTALL,
    )
    ready = ClusterFactory(project=owner.project, status=Cluster.Status.READY, machines=True)

    retried = owner.api().post(f"{URL}/{degraded.pk}/retry-install")
    refused = owner.api().post(f"{URL}/{ready.pk}/retry-install")

    assert retried.status_code == 202
    assert retried.json()["data"]["status"] == "installing"
    assert error_of(refused) == (409, "invalid_state")


def test_it_adds_workers_to_a_ready_cluster_only(owner):
    now = timezone.now()
    machine_type = machine_type_with_hosts(free=3)
    ready = ClusterFactory(
        project=owner.project,
        machine_type=machine_type,
        status=Cluster.Status.READY,
        joined_at=now,
        ready_at=now,
        machines=True,
        machines__status=Node.Status.JOINED,
    )
    starting = ClusterFactory(project=owner.project, machine_type=machine_type, machines=True)
    credit(owner.project)  # adding workers needs an hour of the grown cluster
    api = owner.api()

    def add(cluster, count):
        body = {"count": count}
        return api.post(f"{URL}/{cluster.pk}/workers", body, content_type="application/json")

    added = add(ready, 2)
    refused = add(starting, 1)
    too_many = add(ready, 70)

    assert added.status_code == 202
    assert [m["name"] for m in added.json()["data"]["machines"]][-2:] == ["node-2", "node-3"]
    assert added.json()["data"]["nodes"] == 4
    assert error_of(refused) == (409, "invalid_state")
    assert error_of(too_many) == (422, "invalid_count")


def test_it_refuses_to_terminate_one_machine_with_405(owner):
    cluster = ClusterFactory(project=owner.project, status=Cluster.Status.READY, machines=True)

    response = owner.api().delete(f"{URL}/{cluster.pk}/machines/node-1")

    assert error_of(response) == (405, "terminate_cluster")
    message = response.json()["error"]["message"]
    assert "terminate the cluster" in message.lower()
    assert f"/api/v1/clusters/{cluster.pk}/terminate" in message
    assert cluster.nodes.filter(status=Node.Status.STARTING).count() == 2


def test_it_lists_the_clusters_in_the_openapi_schema(client, db):
    paths = client.get("/api/v1/openapi.json").json()["paths"]

    assert {"/api/v1/clusters", "/api/v1/clusters/{cluster_id}"} <= set(paths)
    assert "delete" in paths["/api/v1/clusters/{cluster_id}/machines/{name}"]


def test_it_reads_the_acceptance_report_of_a_joined_cluster_and_null_before(owner):
    report = {
        "measured_at": "2026-03-02T12:04:30+00:00",
        "expected": {"gpu": "H100 SXM 80GB", "gpus_per_machine": 2, "memory_gib": 80},
        "nodes": [
            {
                "name": "node-1",
                "gpus": [{"name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559}],
                "reachability": {"node-0": True},
                "latency_ms": 0.31,
                "bandwidth_mbit": 1712.4,
                "method": "tcp-stream",
            }
        ],
    }
    joined = ClusterFactory(project=owner.project, acceptance=report, joined_at=timezone.now())
    starting = ClusterFactory(project=owner.project)

    data = owner.api().get(f"/api/v1/clusters/{joined.pk}").json()["data"]
    assert data["acceptance"]["measured_at"] == "2026-03-02T12:04:30Z"
    assert data["acceptance"]["nodes"][0]["bandwidth_mbit"] == 1712.4
    assert data["acceptance"]["nodes"][0]["reachability"] == {"node-0": True}
    assert owner.api().get(f"/api/v1/clusters/{starting.pk}").json()["data"]["acceptance"] is None


@pytest.mark.parametrize(
    ("status", "running", "can_terminate"),
    [
        (Cluster.Status.PROVISIONING, False, True),
        (Cluster.Status.READY, True, True),
        (Cluster.Status.DEGRADED, True, True),
        (Cluster.Status.TERMINATING, False, False),
        (Cluster.Status.FAILED, False, False),
    ],
)
def test_it_says_whether_a_cluster_runs_and_may_be_terminated(
    owner, status, running, can_terminate
):
    """The API carries what the dashboard decides (clusters/policy.py, the Terminate button's
    `can_terminate`), in the list and the detail alike, so no client decides it from status."""
    cluster = ClusterFactory(project=owner.project, status=status)

    detail = owner.api().get(f"/api/v1/clusters/{cluster.pk}").json()["data"]
    listed = owner.api().get("/api/v1/clusters").json()["data"][0]

    assert (detail["running"], detail["can_terminate"]) == (running, can_terminate)
    assert (listed["running"], listed["can_terminate"]) == (running, can_terminate)
