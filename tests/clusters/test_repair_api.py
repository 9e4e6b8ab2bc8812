"""Repair over the API (issue 36; docs/api.md "Replacing a machine"): the plan and its token, the
replacement, refusals that change nothing, the repair policy at create and later, the machines'
`drained`, `replaces`, `replaced_by` and `joining`, and an audit entry for each change."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from accounts.models import Environment, SshKey
from audit.models import Entry
from billing import ledger, metering
from clusters import lifecycle
from clusters.models import Cluster, Node
from tests.clusters.lifecycle_kit import Sim, create, inventory
from tests.clusters.test_repair import ecc, live

BOOT = 180
pytestmark = pytest.mark.django_db


def ready(owner, clock, *, nodes=3, software="slurm", policy="ask"):
    machine_type = inventory(hosts=nodes + 1, boot_seconds=BOOT)
    ledger.credit(project=owner.project, amount="10000.00", note="test credit")
    SshKey.objects.create(
        project=owner.project,
        name="k",
        public_key="ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9 k",
        fingerprint="SHA256:k",
    )
    with Sim() as sim:
        cluster = create(
            owner.project,
            machine_type,
            nodes=nodes,
            software=software,
            user=owner.user,
            repair_policy=policy,
        )
        sim.run_until(clock, timezone.now() + timedelta(seconds=BOOT * 3))
    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.READY
    return cluster


def url(cluster, name="node-1", plan=False):
    return f"/api/v1/clusters/{cluster.pk}/nodes/{name}/replace" + ("/plan" if plan else "")


def test_plan_then_replace_with_its_token(owner, client, clock):
    cluster = ready(owner, clock)
    ecc(client, cluster, 1)
    api = owner.api()
    plan = api.post(url(cluster, plan=True))
    assert plan.status_code == 200, plan.content
    data = plan.json()["data"]
    assert data["node"] == "node-1" and data["private_ip"] == "10.77.0.2"
    assert "ECC" in data["why"]
    assert data["price_per_hour"] == "20.00" and data["cluster_price_per_hour"] == "60.00"
    assert "billing ends now" in data["billing"]
    assert cluster.nodes.count() == 3  # the plan reserved nothing

    # A token for another machine is refused, changing nothing.
    other = api.post(url(cluster, "node-2"), {"plan_token": data["plan_token"]}, "application/json")
    assert other.status_code == 422 and other.json()["error"]["code"] == "plan_mismatch"
    assert cluster.nodes.count() == 3

    with Sim():
        done = api.post(url(cluster), {"plan_token": data["plan_token"]}, "application/json")
    assert done.status_code == 202, done.content
    machines = done.json()["data"]["machines"]
    old, new = [m for m in machines if m["name"] == "node-1"]
    assert old["status"] == "ended" and old["replaced_by"] == new["id"]
    assert new["status"] == "starting" and new["replaces"] == old["id"] and new["joining"]
    assert old["drained"].startswith("node-1 GPU 0: 2 uncorrectable ECC errors")
    entry = Entry.objects.filter(action__contains="replace_node", outcome="done").get()
    assert entry.summary.startswith(f"replaced node-1 of cluster `{cluster.name}` (node-1 GPU 0")
    assert entry.changes == {"replaced": {"before": old["id"], "after": new["id"]}}


def test_the_head_and_a_healthy_machine_are_refused_with_their_words(owner, clock):
    cluster = ready(owner, clock)
    api = owner.api()
    head = api.post(url(cluster, "node-0", plan=True))
    assert head.status_code == 409
    assert head.json()["error"] == {
        "code": "head_not_replaceable",
        "message": lifecycle.HEAD_REFUSAL,
    }
    with Sim():
        healthy = api.post(url(cluster, "node-1"), content_type="application/json")
    assert healthy.status_code == 409
    assert healthy.json()["error"]["code"] == "node_not_replaceable"
    unknown = api.post(url(cluster, "node-7", plan=True))
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "unknown_node"
    assert cluster.nodes.count() == 3


def test_a_stranger_gets_404(owner, stranger, client, clock):
    cluster = ready(owner, clock)
    ecc(client, cluster, 1)
    assert stranger.api().post(url(cluster, plan=True)).status_code == 404
    with Sim():
        assert stranger.api().post(url(cluster), content_type="application/json").status_code == 404
    assert cluster.nodes.count() == 3


def test_a_replacement_over_the_budget_is_refused_like_a_create(owner, client, clock):
    cluster = ready(owner, clock)
    ecc(client, cluster, 1)
    Environment.objects.filter(pk=cluster.environment_id).update(monthly_budget=Decimal("1.00"))
    clock.shift(3600)  # the cluster's first hour is spent
    metering.charge_accrued(now=timezone.now())
    refused = owner.api().post(url(cluster, plan=True))
    assert refused.status_code == 402, refused.content
    assert refused.json()["error"]["code"] == "budget_reached"
    assert cluster.nodes.count() == 3


def test_the_repair_policy_at_create_and_later(owner, clock):
    cluster = ready(owner, clock, policy="auto")
    api = owner.api()
    assert api.get(f"/api/v1/clusters/{cluster.pk}").json()["data"]["repair_policy"] == "auto"
    changed = api.patch(
        f"/api/v1/clusters/{cluster.pk}", {"repair_policy": "ask"}, "application/json"
    )
    assert changed.status_code == 200 and changed.json()["data"]["repair_policy"] == "ask"
    cluster.refresh_from_db()
    assert cluster.repair_policy == Cluster.RepairPolicy.ASK
    assert cluster.events.filter(reason="repair_policy").count() == 1
    wrong = api.patch(f"/api/v1/clusters/{cluster.pk}", {"repair_policy": "x"}, "application/json")
    assert wrong.status_code == 422
    cluster.refresh_from_db()
    assert cluster.repair_policy == Cluster.RepairPolicy.ASK
    with Sim():
        lifecycle.terminate(cluster=cluster)
    ended = api.patch(
        f"/api/v1/clusters/{cluster.pk}", {"repair_policy": "auto"}, "application/json"
    )
    assert ended.status_code == 409 and ended.json()["error"]["code"] == "invalid_state"


def test_reading_a_cluster_with_replacements_costs_the_same_queries(owner, client, clock):
    cluster = ready(owner, clock)
    api = owner.api()
    with CaptureQueriesContext(connection) as before:
        assert api.get(f"/api/v1/clusters/{cluster.pk}").status_code == 200
    ecc(client, cluster, 1)
    with Sim():
        lifecycle.replace_node(cluster=cluster, node_name="node-1")
    assert Node.objects.filter(cluster=cluster).count() == 4
    with CaptureQueriesContext(connection) as after:
        assert api.get(f"/api/v1/clusters/{cluster.pk}").status_code == 200
    assert len(after) == len(before)
    assert live(cluster, 1).replaces is not None
