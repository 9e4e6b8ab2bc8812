"""API key scopes, enforced by the server: each operation needs one (read, create, terminate,
billing), a key without it is refused 403 `scope_missing` before anything is read or changed."""

import pytest
from django.test import Client

from accounts import keys
from accounts.api_auth import FULL_KEY, ApiKeyAuth, needs
from accounts.models import ApiKey
from clusters import lifecycle
from clusters.models import Cluster
from offers.models import Host
from runcrate.api import api
from tests.clusters.front import credit, machine_type_with_hosts, ssh_key
from tests.factories import ClusterFactory, LocationFactory


@pytest.fixture(autouse=True)
def _work_in_memory():
    with lifecycle.dispatching_to(lifecycle.CollectingDispatcher()):
        yield


def narrowed(person, *scopes: str, **limits) -> Client:
    _, raw = keys.issue_api_key(
        user=person.user, project=person.project, name="agent", scopes=scopes, **limits
    )
    return Client(headers={"authorization": f"Bearer {raw}"})


@pytest.fixture
def offer(owner):
    ssh_key(owner.project)
    credit(owner.project, "500.00")
    return machine_type_with_hosts(
        free=4, slug="use2-h100x8-vm", location=LocationFactory(code="us-east-2")
    )


CREATE = {"name": "train", "offer_id": "use2-h100x8-vm", "nodes": 2, "software": "none"}


def post(client, path, body=None):
    return client.post(path, body or {}, content_type="application/json")


def test_it_lets_a_read_key_list_but_not_create(owner, offer):
    reader = narrowed(owner, "read")

    listed = reader.get("/api/v1/clusters")
    created = post(reader, "/api/v1/clusters", CREATE)

    assert listed.status_code == 200
    assert created.status_code == 403
    error = created.json()["error"]
    assert error["code"] == "scope_missing"
    assert "POST /api/v1/clusters needs the 'create' scope" in error["message"]
    assert "'agent'" in error["message"] and "the scopes read" in error["message"]
    assert not Cluster.objects.exists()
    assert not Host.objects.exclude(state=Host.State.FREE).exists()


def test_it_refuses_a_missing_scope_before_reading_the_body(owner, offer):
    response = post(narrowed(owner, "read"), "/api/v1/clusters", {"nodes": "many"})

    assert response.status_code == 403
    assert response.json()["error"]["code"] == "scope_missing"


def test_it_lets_a_create_key_create_but_not_read_or_terminate(owner, offer):
    creator = narrowed(owner, "create")

    created = post(creator, "/api/v1/clusters", CREATE)
    cluster_id = created.json()["data"]["id"]

    assert created.status_code == 201
    assert creator.get(f"/api/v1/clusters/{cluster_id}").status_code == 403
    refused = post(creator, f"/api/v1/clusters/{cluster_id}/terminate")
    assert refused.status_code == 403
    assert "'terminate' scope" in refused.json()["error"]["message"]
    assert Cluster.objects.get(pk=cluster_id).status == Cluster.Status.PROVISIONING


def test_it_lets_a_terminate_key_terminate(owner):
    cluster = ClusterFactory(project=owner.project, status=Cluster.Status.READY)

    response = post(narrowed(owner, "terminate"), f"/api/v1/clusters/{cluster.pk}/terminate")

    assert response.status_code == 202
    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.TERMINATING


BILLING_USAGE = "/api/v1/billing/usage"


@pytest.mark.parametrize(
    ("scopes", "status"), [(("read", "create", "terminate"), 403), (("billing",), 200)]
)
def test_it_needs_the_billing_scope_for_billing(owner, scopes, status):
    client = narrowed(owner, *scopes)

    for path in ("/api/v1/billing/balance", "/api/v1/billing/transactions", BILLING_USAGE):
        assert client.get(path).status_code == status, path
    budget = client.put(
        "/api/v1/environments/default/budget", {"amount": "50.00"}, content_type="application/json"
    )
    assert budget.status_code == status


@pytest.mark.parametrize(
    ("method", "path", "scope"),
    [
        ("get", "/api/v1/me", "read"),
        ("get", "/api/v1/gpus", "read"),
        ("get", "/api/v1/volumes", "read"),
        ("get", "/api/v1/ssh-keys", "read"),
        ("get", "/api/v1/quotes", "read"),
        ("post", "/api/v1/volumes", "create"),
        ("post", "/api/v1/ssh-keys", "create"),
        ("post", "/api/v1/quotes", "create"),
        ("post", "/api/v1/clusters/1/workers", "create"),
        ("post", "/api/v1/clusters/1/retry-install", "create"),
        ("post", "/api/v1/clusters/1/network-test", "create"),
        ("delete", "/api/v1/volumes/1", "terminate"),
        ("delete", "/api/v1/ssh-keys/1", "terminate"),
        ("delete", "/api/v1/clusters/1/machines/node-1", "terminate"),
    ],
)
def test_it_maps_each_endpoint_to_its_scope(owner, method, path, scope):
    others = [s for s in ApiKey.Scope.values if s != scope]

    response = getattr(narrowed(owner, *others), method)(path, content_type="application/json")

    assert response.status_code == 403
    assert f"needs the '{scope}' scope" in response.json()["error"]["message"]


def test_it_lets_a_key_made_before_scopes_do_everything(owner):
    key = ApiKey.objects.get(project=owner.project)  # the fixture's, with no scope stored
    assert key.scopes == []

    assert owner.api().get("/api/v1/billing/balance").status_code == 200
    assert owner.api().get("/api/v1/keys").status_code == 200


def test_it_declares_a_scope_on_every_operation_of_the_api():
    """An operation that forgets its scope gets the API's default, which needs a full key (it
    fails closed); this keeps every one explicit. The agents' endpoints use node tokens."""
    declared = {id(needs(scope)) for scope in ApiKey.Scope.values} | {id(FULL_KEY)}

    def is_declared(auth) -> bool:
        # needs(scope), FULL_KEY, or needs_as(scope, call) (a scope, answered as another call);
        # the API's default is another ApiKeyAuth(None), which is none of these.
        return id(auth) in declared or (isinstance(auth, ApiKeyAuth) and auth.scope is not None)

    seen, undeclared = 0, []
    for _prefix, router in api._routers:
        for path, path_view in router.path_operations.items():
            for operation in path_view.operations:
                if not operation.auth_callbacks:
                    assert path.startswith("/agent/"), path
                    continue
                seen += 1
                auths = operation.auth_callbacks
                if len(auths) != 1 or not is_declared(auths[0]):
                    undeclared.append(f"{operation.methods} {path}")
    assert seen > 25
    assert undeclared == []
