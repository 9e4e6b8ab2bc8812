"""Who may speak for a node: the agent's token, the same answer for an unknown node and a
wrong token, and tokens that outlive a SECRET_KEY rotation (SECRET_KEY_FALLBACKS)."""

import hmac
import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from clusters.lifecycle import agent_token
from clusters.models import Cluster, Node
from tests.clusters.lifecycle_kit import Sim, create, inventory, new_project, node

CHECK_IN = "/api/v1/agent/nodes/{}/check-in"


@pytest.fixture
def cluster(db) -> Cluster:
    _, project = new_project()
    with Sim():
        return create(project, inventory(hosts=2, boot_seconds=180), nodes=2)


def check_in(client, node_id, token):
    return client.post(
        CHECK_IN.format(node_id),
        {"gpus": []},
        content_type="application/json",
        headers={"authorization": f"Bearer {token}"},
    )


def test_it_answers_an_unknown_node_as_it_answers_a_wrong_token(cluster, client):
    n = node(cluster, 0)
    missing = Node.objects.order_by("-pk").first().pk + 1000

    wrong = check_in(client, n.pk, "guess")
    unknown = check_in(client, missing, "guess")
    unknown_with_a_real_token = check_in(client, missing, agent_token(n))
    huge = check_in(client, 2**63 + 5, "guess")

    for answer in (unknown, unknown_with_a_real_token, huge):
        assert (answer.status_code, answer.json()) == (wrong.status_code, wrong.json())
    assert wrong.status_code == 403
    assert wrong.json()["error"] == {
        "code": "bad_token",
        "message": "No node with this id has this token.",
    }
    n.refresh_from_db()
    assert n.heartbeat_at is None


def test_it_keeps_the_agents_token_valid_across_a_secret_key_rotation(cluster, client, settings):
    n = node(cluster, 0)
    token = agent_token(n)
    old_key = settings.SECRET_KEY

    settings.SECRET_KEY = "a-new-secret-key-" + "x" * 40
    settings.SECRET_KEY_FALLBACKS = [old_key]
    n.refresh_from_db()

    # The lifecycle hands the driver the same token again (a re-plan, the simulated agent)...
    assert agent_token(n) == token
    # ...and the agent that holds it still checks in.
    with Sim():
        assert check_in(client, n.pk, token).status_code == 200
    n.refresh_from_db()
    assert n.heartbeat_at is not None


def test_it_derives_a_new_nodes_token_from_the_current_key(cluster, settings):
    n = node(cluster, 0)
    old_token = agent_token(n)
    settings.SECRET_KEY_FALLBACKS = [settings.SECRET_KEY]
    settings.SECRET_KEY = "a-new-secret-key-" + "y" * 40

    fresh = Node(cluster=n.cluster, index=n.index, reserved_at=n.reserved_at)  # no hash kept yet

    assert agent_token(fresh) != old_token
    # Once the old key is gone from the fallbacks, a token made with it no longer matches.
    settings.SECRET_KEY_FALLBACKS = []
    assert agent_token(n) != old_token


def _queries_of(client, node_id, token) -> tuple[int, list[str]]:
    with CaptureQueriesContext(connection) as queries:
        status = check_in(client, node_id, token).status_code
    return status, [query["sql"] for query in queries.captured_queries]


def _locks(sqls: list[str]) -> list[str]:
    return [sql for sql in sqls if "FOR UPDATE" in sql]


def _node_reads(sqls: list[str]) -> list[str]:
    return [sql for sql in sqls if 'FROM "clusters_node"' in sql]


def test_a_wrong_token_or_an_unknown_node_locks_nothing_and_costs_the_same(cluster, client):
    n = node(cluster, 0)
    missing = Node.objects.order_by("-pk").first().pk + 1000

    wrong = _queries_of(client, n.pk, "guess")
    unknown = _queries_of(client, missing, "guess")
    impossible = _queries_of(client, 2**63 + 5, "guess")

    for status, sqls in (wrong, unknown, impossible):
        assert status == 403
        assert _locks(sqls) == []  # the cluster's row is never locked for a refused caller
        assert len(_node_reads(sqls)) == 1  # one read of the token hash, nothing more
    # The same queries, in the same number, for a known node and for an id that does not exist.
    assert len(wrong[1]) == len(unknown[1]) == len(impossible[1])
    assert _shapes(wrong[1], n.pk) == _shapes(unknown[1], missing)


def _shapes(sqls: list[str], node_id: int) -> list[str]:
    """The statements with the node id written as ID, the transaction's savepoints left out."""
    return [
        re.sub(rf"\b{node_id}\b", "ID", sql)
        for sql in sqls
        if not sql.startswith(("SAVEPOINT", "RELEASE SAVEPOINT", "ROLLBACK TO SAVEPOINT"))
    ]


def test_every_refusal_compares_one_hash_in_constant_time(cluster, client, monkeypatch):
    n = node(cluster, 0)
    missing = Node.objects.order_by("-pk").first().pk + 1000
    compared: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a, b):
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)

    for node_id, token in ((n.pk, "guess"), (missing, "guess"), (missing, ""), (n.pk, "")):
        compared.clear()
        assert check_in(client, node_id, token).status_code == 403
        [(given, expected)] = compared
        assert isinstance(given, bytes) and isinstance(expected, bytes)
        assert len(given) == len(expected) == 64


def test_the_right_token_is_checked_before_the_cluster_is_locked(cluster, client):
    n = node(cluster, 0)

    status, sqls = _queries_of(client, n.pk, agent_token(n))

    assert status == 200
    first_lock = sqls.index(_locks(sqls)[0])
    token_read = next(i for i, sql in enumerate(sqls) if "agent_token_hash" in sql)
    assert token_read < first_lock
    assert 'FROM "clusters_cluster"' in sqls[first_lock]
