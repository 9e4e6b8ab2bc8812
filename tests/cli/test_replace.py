"""`runcrate clusters replace` (issue 36): the server's plan for replacing a lost or unhealthy
worker (POST /api/v1/clusters/{id}/nodes/{name}/replace/plan) shown, a question on a terminal,
--yes, the replacement carrying the plan's token, node-0 refused with the server's words;
`clusters repair-policy` and `clusters create --repair-policy`; and `clusters show` naming the
machine replaced, the one replacing it, why a machine was drained and the repair policy."""

from datetime import timedelta

import pytest
from django.utils import timezone

from clusters import lifecycle
from clusters.models import Cluster, Node
from tests.cli.kit import assert_no_traceback, ready_cluster, run_cli, run_cli_tty
from tests.clusters.lifecycle_kit import inventory

pytestmark = pytest.mark.django_db(transaction=True)

REPLACE_NODE_1 = ("clusters", "replace", "train", "node-1")


def lose(cluster: Cluster, index: int = 1) -> Node:
    """Mark the worker node-INDEX lost (its agent went silent), as the reconciler would."""
    node = cluster.nodes.get(index=index)
    assert lifecycle.mark_lost(node_id=node.pk, last_heard=timezone.now(), why="test")
    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.DEGRADED
    return node


def replacements(cluster: Cluster) -> list[Node]:
    return list(Node.objects.filter(cluster=cluster, replaces__isnull=False))


def test_with_yes_it_shows_the_plan_and_replaces_the_lost_worker(env, tmp_path, account, ticker):
    cluster = ready_cluster(account, ticker, hosts=3, price="20.00")
    lost = lose(cluster)

    result = run_cli(*REPLACE_NODE_1, "--yes", env=env, tmp_path=tmp_path)

    assert result.code == 0, result.stderr
    plan = " ".join(result.stderr.split())
    assert f"Replace node-1 of train (id {cluster.pk})" in plan
    assert "why node-1" in plan  # the server's sentence of what happened to it
    assert f"address {lost.private_ip}, kept by the new machine under its name" in plan
    assert "price $20.00/h for the new machine; the cluster $40.00/h once it is up" in plan
    assert "billing node-1's billing ended at its last heartbeat" in plan
    (new,) = replacements(cluster)
    assert (new.name, new.private_ip, new.replaces_id) == ("node-1", lost.private_ip, lost.pk)
    printed = {m["id"]: m for m in result.json()["machines"]}  # the API's cluster, unchanged
    assert printed[new.pk]["replaces"] == lost.pk and printed[new.pk]["status"] == "starting"
    assert printed[lost.pk]["replaced_by"] == new.pk
    assert "A new machine is starting as node-1 of train" in result.stderr
    assert "`runcrate clusters show train` follows it" in result.stderr


def test_without_a_terminal_or_yes_it_prints_the_plan_and_replaces_nothing(
    env, tmp_path, account, ticker
):
    cluster = ready_cluster(account, ticker, hosts=3)
    lose(cluster)

    result = run_cli("clusters", "replace", "train", "1", env=env, tmp_path=tmp_path)

    assert result.code == 2
    assert result.stdout == ""
    assert "Replace node-1 of train" in result.stderr  # "1" is node-1, as for `runcrate ssh`
    assert "nothing was replaced; pass --yes" in result.stderr
    assert replacements(cluster) == []
    assert_no_traceback(result)


def test_dry_run_prints_the_servers_plan_as_json(env, tmp_path, account, ticker):
    cluster = ready_cluster(account, ticker, hosts=3, price="20.00")
    lost = lose(cluster)

    result = run_cli(*REPLACE_NODE_1, "--dry-run", "--json", env=env, tmp_path=tmp_path)

    assert result.code == 0, result.stderr
    printed = result.json()
    assert printed.pop("plan_token") and printed.pop("plan_expires_at")
    assert printed["cluster_id"] == cluster.pk and printed["node"] == "node-1"
    assert printed["private_ip"] == lost.private_ip
    assert (printed["price_per_hour"], printed["cluster_price_per_hour"]) == ("20.00", "40.00")
    assert "Dry run: nothing was changed." in result.stderr
    assert replacements(cluster) == []


def test_a_yes_on_the_terminal_replaces_it(env, tmp_path, account, ticker):
    cluster = ready_cluster(account, ticker, hosts=3, price="20.00")
    lose(cluster)

    result = run_cli_tty(*REPLACE_NODE_1, env=env, tmp_path=tmp_path, answer="y")

    assert result.code == 0, result.stderr
    assert "Replace node-1 of train with a new machine at $20.00/h? [y/N]" in result.stdout
    assert len(replacements(cluster)) == 1


def test_the_replacement_carries_the_plan_so_a_stale_one_is_refused(
    env, tmp_path, account, ticker, clock
):
    cluster = ready_cluster(account, ticker, hosts=3)
    lose(cluster)

    # The question stays open for 11 minutes: the plan it showed is no longer the truth.
    result = run_cli_tty(
        *REPLACE_NODE_1, env=env, tmp_path=tmp_path, answer="y",
        before_answer=lambda: clock.shift(timedelta(minutes=11)),
    )  # fmt: skip

    assert result.code == 1
    assert "(plan_expired, HTTP 422)" in result.stderr
    # The API's path, in the CLI's words.
    assert f"`runcrate clusters replace {cluster.pk} node-1`" in result.stderr
    assert "Run the same command again: it plans anew." in result.stderr
    assert replacements(cluster) == []


def test_node_0_is_refused_with_the_servers_words(env, tmp_path, account, ticker):
    cluster = ready_cluster(account, ticker, hosts=3)

    result = run_cli("clusters", "replace", "train", "node-0", "--yes", env=env, tmp_path=tmp_path)

    assert result.code == 1
    assert result.json()["error"]["code"] == "head_not_replaceable"
    assert "node-0 is the cluster's head: it holds /shared" in result.stderr
    assert "(head_not_replaceable, HTTP 409)" in result.stderr
    assert "Replace node-0" not in result.stderr  # refused at the plan: no plan shown
    assert replacements(cluster) == []
    assert_no_traceback(result)


def test_a_healthy_worker_is_refused(env, tmp_path, account, ticker):
    cluster = ready_cluster(account, ticker, hosts=3)

    result = run_cli(*REPLACE_NODE_1, "--yes", env=env, tmp_path=tmp_path)

    assert result.code == 1
    assert result.json()["error"]["code"] == "node_not_replaceable"
    assert "node-1 is healthy: only a lost or unhealthy machine is replaced." in result.stderr
    assert replacements(cluster) == []


def test_the_repair_policy_is_set_at_create_and_changed_later(env, tmp_path, account):
    offer = inventory(hosts=2)

    created = run_cli(
        "clusters", "create", "--offer", offer.slug, "--nodes", "2", "--name", "train",
        "--repair-policy", "auto", "--yes", env=env, tmp_path=tmp_path,
    )  # fmt: skip
    assert created.code == 0, created.stderr
    assert created.json()["repair_policy"] == "auto"
    cluster = Cluster.objects.get(project=account.project)
    assert cluster.repair_policy == Cluster.RepairPolicy.AUTO

    changed = run_cli("clusters", "repair-policy", "train", "ask", env=env, tmp_path=tmp_path)
    assert changed.code == 0, changed.stderr
    assert changed.json()["repair_policy"] == "ask"
    cluster.refresh_from_db()
    assert cluster.repair_policy == Cluster.RepairPolicy.ASK
    assert "ask: you replace a lost or unhealthy worker" in changed.stderr

    refused = run_cli("clusters", "repair-policy", "train", "often", env=env, tmp_path=tmp_path)
    assert refused.code == 2  # a usage error: the API is not asked
    cluster.refresh_from_db()
    assert cluster.repair_policy == Cluster.RepairPolicy.ASK


def test_show_names_the_machine_replaced_its_replacement_and_the_drain(
    env, tmp_path, account, ticker
):
    # Slurm: a cluster without software has no scheduling to drain a machine from.
    cluster = ready_cluster(account, ticker, hosts=3, software="slurm")
    lost = lose(cluster)
    replaced = run_cli(*REPLACE_NODE_1, "--yes", env=env, tmp_path=tmp_path)
    assert replaced.code == 0, replaced.stderr
    (new,) = replacements(cluster)
    # The wait lasts until the new machine installed its software: the cluster is ready again
    # only then, degraded until it.
    waited = run_cli(
        "clusters", "wait", "train", "--json", env=env, tmp_path=tmp_path, drive=ticker
    )  # fmt: skip

    as_json = run_cli("clusters", "show", "train", "--json", env=env, tmp_path=tmp_path)
    screen = run_cli_tty("clusters", "show", "train", env=env, tmp_path=tmp_path)

    assert waited.code == 0, waited.stderr
    assert waited.json()["status"] == "ready"
    assert as_json.code == 0, as_json.stderr
    shown = as_json.json()
    assert shown["repair_policy"] == "ask"
    machines = {m["id"]: m for m in shown["machines"]}
    assert machines[lost.pk]["replaced_by"] == new.pk and machines[lost.pk]["status"] == "lost"
    assert machines[lost.pk]["drained"].startswith("it was lost")
    assert machines[new.pk]["replaces"] == lost.pk and machines[new.pk]["status"] == "joined"
    assert screen.code == 0, screen.stderr
    text = " ".join(screen.stdout.split())
    assert "repair ask: you replace a lost or unhealthy worker" in text
    assert "node-1 (replaced)" in text
    assert f"#{lost.pk}, replaced by #{new.pk}; drained: it was lost" in text
    assert f"#{new.pk}, replaces #{lost.pk}" in text


def test_a_wait_on_a_cluster_that_lost_a_worker_names_the_replace_command(
    env, tmp_path, account, ticker
):
    cluster = ready_cluster(account, ticker, hosts=3)
    lose(cluster)

    result = run_cli("clusters", "wait", "train", env=env, tmp_path=tmp_path)

    assert result.code == 3
    assert "is degraded: machine_lost on node-1" in result.stderr
    assert f"`runcrate clusters replace {cluster.pk} node-1` replaces it." in result.stderr
    assert "retry-install" not in result.stderr  # reinstalling brings no machine back
