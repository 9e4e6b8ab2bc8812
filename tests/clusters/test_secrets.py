"""A cluster's derived secrets (clusters/secrets.py) outlive a SECRET_KEY rotation: the new key
becomes SECRET_KEY, the old one moves to SECRET_KEY_FALLBACKS, and the running cluster's kube
token, its CA, its node keys and its agents' tokens stay what it was given."""

import pytest
from django.test import override_settings

from clusters import connect, secrets
from clusters.lifecycle import agent_token
from clusters.lifecycle.rules import token_hash
from clusters.machines.ssh import cluster_keys
from clusters.models import Cluster, Node
from tests.clusters.lifecycle_kit import Sim, create, inventory, new_project, node

OLD_KEY = "the-key-the-cluster-was-created-under-" + "o" * 20
NEW_KEY = "the-key-after-the-rotation-" + "n" * 30


@pytest.fixture
def cluster(db) -> Cluster:
    _, project = new_project()
    with override_settings(SECRET_KEY=OLD_KEY, SECRET_KEY_FALLBACKS=[]), Sim():
        return create(project, inventory(hosts=3), nodes=3, software="kubernetes")


def _given(cluster: Cluster) -> dict:
    """Everything derived that a running cluster holds."""
    cluster = Cluster.objects.prefetch_related("nodes", "volumes").get(pk=cluster.pk)
    shape = connect.shape_for(cluster, planning=True)
    nodes = list(cluster.nodes.order_by("index"))
    return {
        "kube_token": connect.kube_token(shape),
        "kube_ca": connect.kube_ca(shape),
        # The public half: the private one is written with a random check number each time.
        "node_keys": [cluster_keys(n)[1] for n in nodes],
        "agent_tokens": [agent_token(n) for n in nodes],
    }


def test_it_keeps_every_secret_of_a_running_cluster_across_a_key_rotation(cluster):
    with override_settings(SECRET_KEY=OLD_KEY, SECRET_KEY_FALLBACKS=[]):
        before = _given(cluster)

    with override_settings(SECRET_KEY=NEW_KEY, SECRET_KEY_FALLBACKS=[OLD_KEY]):
        after = _given(cluster)
        # The agents' tokens still verify against the hashes their nodes keep.
        for n, token in zip(cluster.nodes.order_by("index"), after["agent_tokens"], strict=True):
            assert token_hash(token) == n.agent_token_hash

    assert after == before
    assert len(set(before["node_keys"])) == 1  # one pair for the whole cluster


def test_a_cluster_created_after_the_rotation_gets_secrets_of_the_new_key(cluster):
    with override_settings(SECRET_KEY=OLD_KEY, SECRET_KEY_FALLBACKS=[]):
        old_cluster = _given(cluster)
    with override_settings(SECRET_KEY=NEW_KEY, SECRET_KEY_FALLBACKS=[OLD_KEY]):
        _, project = new_project()
        with Sim():
            fresh = create(project, inventory(hosts=3), nodes=3, software="kubernetes")
        founder = node(fresh, 0)
        assert secrets.cluster_key(founder) == NEW_KEY
        assert secrets.cluster_key(node(cluster, 0)) == OLD_KEY
        # Same purposes, another key: nothing of the old cluster's is the new one's.
        assert _given(fresh)["kube_token"] != old_cluster["kube_token"]


def test_a_worker_added_after_the_rotation_joins_with_the_clusters_secrets(cluster):
    with override_settings(SECRET_KEY=OLD_KEY, SECRET_KEY_FALLBACKS=[]):
        before = _given(cluster)
    with override_settings(SECRET_KEY=NEW_KEY, SECRET_KEY_FALLBACKS=[OLD_KEY]):
        reserved = node(cluster, 0).reserved_at
        worker = Node(cluster=cluster, index=3, reserved_at=reserved, is_worker=True)
        # Its own agent token is the current key's (it is new)...
        context = f"{cluster.pk}:3:{reserved.isoformat()}"
        assert agent_token(worker) == secrets.derive(NEW_KEY, secrets.AGENT, context).hex()
        # ...while what the whole cluster shares stays the key it was created under.
        assert cluster_keys(worker)[1] == before["node_keys"][0]


def test_once_the_old_key_is_dropped_the_secrets_change(cluster):
    """The fallbacks are what keeps them: without the old key nothing can derive them again."""
    with override_settings(SECRET_KEY=OLD_KEY, SECRET_KEY_FALLBACKS=[]):
        before = _given(cluster)
    with override_settings(SECRET_KEY=NEW_KEY, SECRET_KEY_FALLBACKS=[]):
        after = _given(cluster)

    assert after["kube_token"] != before["kube_token"]
    assert after["node_keys"] != before["node_keys"]
    assert after["agent_tokens"] != before["agent_tokens"]
