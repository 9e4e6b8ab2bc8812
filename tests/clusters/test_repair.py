"""Repair on the simulated data center (issue 36; clusters/lifecycle/repair.py, steps/drain.py,
docs/lifecycle.md "Repair"): an unhealthy or lost worker is drained at once, replaced in place
under its name and private address when the user asks (or by itself with the `auto` policy),
billed to the second on both sides, and its host kept offline for staff."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.core import mail
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from billing import ledger
from billing.models import UsageRecord
from clusters import lifecycle
from clusters.errors import ClusterRefused
from clusters.lifecycle.records import ActionKind, NodeWork
from clusters.machines.base import InstallResult
from clusters.machines.simulated import SimulatedDriver
from clusters.models import Cluster, Event, Node
from clusters.notifications import send_pending_cluster_emails
from clusters.telemetry import simulated_metrics
from offers.models import Host
from tests.clusters.lifecycle_kit import Sim, create, inventory, new_project
from tests.clusters.test_gpu_health import gpu

BOOT = 180
Reason = Event.Reason
Status = Cluster.Status
pytestmark = pytest.mark.django_db


def ready(clock, *, nodes=3, software="slurm", spare=1, policy="ask", balance="10000.00"):
    """A ready cluster of `nodes` machines with `spare` free hosts beside it, its emails sent
    and forgotten."""
    _, project = new_project(balance=balance)
    machine_type = inventory(hosts=nodes + spare, boot_seconds=BOOT)
    with Sim() as sim:
        cluster = create(
            project, machine_type, nodes=nodes, software=software, repair_policy=policy
        )
        sim.run_until(clock, timezone.now() + timedelta(seconds=BOOT * 3))
    cluster.refresh_from_db()
    assert cluster.status == Status.READY, list(cluster.events.values_list("message", flat=True))
    send_pending_cluster_emails()
    mail.outbox.clear()
    return cluster


def live(cluster: Cluster, index: int) -> Node:
    return cluster.nodes.get(index=index, status__in=Node.LIVE)


def ecc(client, cluster, index, errors=2):
    """node-`index`'s metrics report: GPU 0 with uncorrectable ECC errors; the work it hands
    off (the head's drain) is run, as the `machines` queue would."""
    n = live(cluster, index)
    body = {"gpus": [gpu(i, **({"ecc_uncorrected": errors} if i == 0 else {})) for i in range(8)]}
    with Sim() as sim:
        response = client.post(
            f"/api/v1/agent/nodes/{n.pk}/metrics",
            body,
            content_type="application/json",
            headers={"authorization": f"Bearer {lifecycle.agent_token(n)}"},
        )
        assert response.status_code == 200, response.content
        sim.dispatcher.run()


def drain_key(cluster: Cluster) -> str | None:
    """What the head's scheduler was last told to hold drained."""
    done = NodeWork.of(live(cluster, 0)).get(ActionKind.DRAIN)
    return None if done is None or not done.ok else done.key


def settle(clock, seconds=BOOT * 3):
    with Sim() as sim:
        sim.run_until(clock, timezone.now() + timedelta(seconds=seconds))


def test_an_unhealthy_worker_is_drained_replaced_in_place_and_its_host_kept_for_staff(
    client, clock
):
    cluster = ready(clock)
    sick = live(cluster, 2)
    sick_host = sick.host
    ecc(client, cluster, 2)
    cluster.refresh_from_db()
    sick.refresh_from_db()
    assert cluster.status == Status.DEGRADED
    assert sick.drained.startswith("node-2 GPU 0: 2 uncorrectable ECC errors")
    drained = cluster.events.get(reason=Reason.NODE_DRAINED)
    assert drained.node == sick
    assert "drained in Slurm" in drained.message
    # The head was told at once (the simulated driver plays its scheduler).
    assert drain_key(cluster) == "node-2"

    plan = lifecycle.plan_replace(cluster=cluster, node_name="node-2")
    assert plan.price_per_hour == cluster.price_per_machine_hour
    assert "ECC" in plan.why
    clock.shift(5)
    asked_at = timezone.now()
    with Sim() as sim:
        new = lifecycle.replace_node(cluster=cluster, node_name="node-2")
        sim.dispatcher.run()
    # The name's old drain is lifted while the replacement joins (Slurm keeps a drain by
    # name: the replacement's software would never be ready under it).
    new.refresh_from_db()
    assert new.status == Node.Status.STARTING and drain_key(cluster) == ""
    sick.refresh_from_db()
    assert sick.status == Node.Status.ENDED and sick.ended_at == asked_at
    assert (new.index, new.private_ip, new.replaces_id) == (2, sick.private_ip, sick.pk)
    assert new.host != sick_host
    # The old machine's billing ended at the instant the replacement was asked for.
    assert UsageRecord.objects.get(node=sick).ended_at == asked_at

    settle(clock)
    cluster.refresh_from_db()
    new.refresh_from_db()
    assert cluster.status == Status.READY, cluster.failure_message
    assert cluster.health_problems == {}
    assert (new.status, new.step) == (Node.Status.JOINED, Node.Step.DONE)
    replaced = cluster.events.get(reason=Reason.NODE_REPLACED)
    assert "ready again" in replaced.message
    record = UsageRecord.objects.get(node=new)
    assert record.started_at == replaced.at and record.ended_at is None
    # The head no longer holds node-2 drained.
    assert drain_key(cluster) == ""
    sick_host.refresh_from_db()
    assert sick_host.state == Host.State.OFFLINE
    assert sick_host.quarantined_at is not None
    assert "ECC" in sick_host.quarantine_reason
    # One email for the replacement, saying the cluster is ready again and what it costs.
    send_pending_cluster_emails()
    subjects = [m.subject for m in mail.outbox]
    assert any("node-2 was replaced; ready again" in s for s in subjects), subjects
    body = next(m.body for m in mail.outbox if "replaced" in m.subject)
    assert "$20.00 per hour" in body


def test_a_problem_that_clears_undrains_the_worker(client, clock):
    cluster = ready(clock)
    ecc(client, cluster, 1)
    assert drain_key(cluster) == "node-1"
    clock.shift(30)
    ecc(client, cluster, 1, errors=0)
    cluster.refresh_from_db()
    assert cluster.status == Status.READY
    assert live(cluster, 1).drained == ""
    assert cluster.events.filter(reason=Reason.NODE_UNDRAINED).count() == 1
    assert drain_key(cluster) == ""


def test_the_head_a_healthy_node_and_an_unknown_one_are_refused_with_what_to_do(client, clock):
    cluster = ready(clock)
    for name, code, words in [
        ("node-0", "head_not_replaceable", "holds /shared, the scheduler and the Ray head"),
        ("node-1", "node_not_replaceable", "node-1 is healthy"),
        ("node-9", "unknown_node", "has no machine called node-9"),
    ]:
        with pytest.raises(ClusterRefused) as refused:
            lifecycle.replace_node(cluster=cluster, node_name=name)
        assert refused.value.code == code and words in refused.value.message
    assert cluster.nodes.count() == 3


def test_a_replacement_the_balance_does_not_cover_is_refused_like_a_create(client, clock):
    cluster = ready(clock)
    ecc(client, cluster, 1)
    project = cluster.project
    ledger.credit(project=project, amount=Decimal("15.00") - ledger.balance(project=project))
    with pytest.raises(ClusterRefused) as refused:
        lifecycle.plan_replace(cluster=cluster, node_name="node-1")
    assert refused.value.code == "insufficient_balance"
    assert "replacing node-1" in refused.value.message
    with pytest.raises(ClusterRefused):
        lifecycle.replace_node(cluster=cluster, node_name="node-1")
    assert cluster.nodes.filter(index=1).count() == 1


def test_a_replacement_that_fails_is_released_alone_and_the_cluster_stays_degraded(client, clock):
    cluster = ready(clock)
    spare = Host.objects.get(machine_type=cluster.machine_type, state=Host.State.FREE)
    spare.fault = Host.Fault.BOOT
    spare.save(update_fields=["fault"])
    ecc(client, cluster, 1)
    with Sim():
        new = lifecycle.replace_node(cluster=cluster, node_name="node-1")
    settle(clock, seconds=3600)
    cluster.refresh_from_db()
    new.refresh_from_db()
    assert new.status == Node.Status.FAILED and not new.holds_host
    assert cluster.status == Status.DEGRADED
    failed = cluster.events.get(reason=Reason.REPLACEMENT_FAILED)
    assert "stays degraded" in failed.message
    assert not UsageRecord.objects.filter(node=new).exists()
    # The other machines were never touched: node-0 and node-2 still joined and billed.
    assert set(cluster.nodes.filter(status="joined").values_list("index", flat=True)) == {0, 2}


def test_auto_replaces_a_lost_worker_at_once_with_one_email(clock):
    cluster = ready(clock, software="none", policy="auto")
    lost = live(cluster, 2)
    clock.shift(60)
    heard = timezone.now() - timedelta(seconds=40)
    with Sim():
        assert lifecycle.mark_lost(node_id=lost.pk, last_heard=heard, why="its agent went silent")
    lost.refresh_from_db()
    assert lost.status == Node.Status.LOST
    assert UsageRecord.objects.get(node=lost).ended_at == heard
    new = live(cluster, 2)
    assert new.replaces_id == lost.pk and new.status == Node.Status.STARTING
    settle(clock)
    cluster.refresh_from_db()
    new.refresh_from_db()
    assert cluster.status == Status.READY
    joined = cluster.events.get(reason=Reason.NODE_REPLACED)
    assert UsageRecord.objects.get(node=new).started_at == joined.at
    send_pending_cluster_emails()
    assert len(mail.outbox) == 1, [m.subject for m in mail.outbox]
    email = mail.outbox[0]
    assert "node-2 was replaced" in email.subject
    assert "Lost: its agent went silent" in email.body
    assert "$20.00 per hour" in email.body


def test_auto_waits_out_the_grace_period_for_an_unhealthy_worker(client, clock, settings):
    settings.RUNCRATE_REPAIR_GRACE_SECONDS = 300
    cluster = ready(clock, policy="auto")
    ecc(client, cluster, 1)
    clock.shift(299)
    with Sim():
        assert lifecycle.auto_repair() == []
    clock.shift(2)
    with Sim():
        assert lifecycle.auto_repair() == [f"{cluster.pk}/node-1"]
    assert live(cluster, 1).replaces is not None
    settle(clock)
    # One email: the replacement's, saying what happened and what it costs (the unhealthy
    # event said it would be replaced; its own email is not sent).
    send_pending_cluster_emails()
    assert [m.subject for m in mail.outbox] == [
        f"Cluster {cluster.name}: node-1 was replaced; ready again"
    ]
    assert "Replaced as unhealthy: node-1 GPU 0" in mail.outbox[0].body


def test_auto_replaces_at_most_the_daily_bound_and_says_so_once(client, clock, settings):
    settings.RUNCRATE_REPAIR_GRACE_SECONDS = 0
    settings.RUNCRATE_AUTO_REPAIRS_PER_DAY = 0
    cluster = ready(clock, policy="auto")
    ecc(client, cluster, 1)
    with Sim():
        assert lifecycle.auto_repair() == []
        assert lifecycle.auto_repair() == []
    told = cluster.events.filter(reason=Reason.REPLACEMENT_FAILED)
    assert told.count() == 1
    assert "the most its repair policy replaces by itself" in told.get().message


def test_asking_for_a_replacement_costs_the_same_queries_at_any_size(client, clock):
    counts = []
    for nodes in (3, 8):
        cluster = ready(clock, nodes=nodes, software="none")
        with Sim():
            lifecycle.mark_lost(node_id=live(cluster, 1).pk, last_heard=timezone.now(), why="gone")
        with Sim(), CaptureQueriesContext(connection) as queries:
            lifecycle.replace_node(cluster=cluster, node_name="node-1")
        counts.append(len(queries))
    assert counts[0] == counts[1], counts


def test_the_demos_sick_gpu_is_judged_drained_and_replaced_by_the_auto_policy(clock, settings):
    """The simulated data center's `gpu` fault (what the demo's node-1 has): its GPU 0 reports
    uncorrectable ECC errors 10 minutes after the cluster joined, judged as an agent's report;
    the `auto` policy replaces it after the grace period, from a sound host."""
    settings.RUNCRATE_REPAIR_GRACE_SECONDS = 300
    cluster = ready(clock, nodes=2, software="slurm", policy="auto")
    sick = live(cluster, 1)
    Host.objects.filter(pk=sick.host_id).update(fault=Host.Fault.GPU)
    cluster.refresh_from_db()
    joined = cluster.joined_at
    clock.move_to(joined + timedelta(seconds=simulated_metrics.GPU_FAILS_AFTER_SECONDS - 1))
    with Sim():
        simulated_metrics.report()
    cluster.refresh_from_db()
    assert cluster.status == Status.READY
    clock.move_to(joined + timedelta(seconds=simulated_metrics.GPU_FAILS_AFTER_SECONDS))
    with Sim() as sim:
        simulated_metrics.report()
        sim.dispatcher.run()
    cluster.refresh_from_db()
    assert cluster.status == Status.DEGRADED
    assert "node-1 GPU 0: 2 uncorrectable ECC errors" in cluster.failure_message
    assert live(cluster, 1).drained and drain_key(cluster) == "node-1"
    clock.shift(300)
    with Sim():
        assert lifecycle.auto_repair() == [f"{cluster.pk}/node-1"]
    settle(clock)
    cluster.refresh_from_db()
    assert cluster.status == Status.READY, cluster.failure_message
    assert live(cluster, 1).host.fault == ""
    with Sim():
        simulated_metrics.report()
    cluster.refresh_from_db()
    assert cluster.status == Status.READY
    assert Host.objects.get(pk=sick.host_id).state == Host.State.OFFLINE


def test_a_drain_the_head_could_not_apply_is_tried_again_by_the_tick(client, clock, monkeypatch):
    cluster = ready(clock)
    answers = [InstallResult(ok=False, output="runcrate: failed: scontrol timed out")]
    real = SimulatedDriver.drain

    def flaky(self, head, *, plan, drained):
        return answers.pop() if answers else real(self, head, plan=plan, drained=drained)

    monkeypatch.setattr(SimulatedDriver, "drain", flaky)
    ecc(client, cluster, 1)
    assert drain_key(cluster) is None  # it failed: the head holds nothing known
    cluster.refresh_from_db()
    assert cluster.needs_work  # so the tick comes back for it
    clock.shift(11)
    with Sim() as sim:
        sim.tick()
    assert drain_key(cluster) == "node-1"
    cluster.refresh_from_db()
    assert not cluster.needs_work


def test_the_unhealthy_and_lost_emails_say_what_replacing_costs_and_link_there(client, clock):
    cluster = ready(clock)
    ecc(client, cluster, 1)
    with Sim():
        lifecycle.mark_lost(node_id=live(cluster, 2).pk, last_heard=timezone.now(), why="gone")
    send_pending_cluster_emails()
    bodies = {m.subject: m.body for m in mail.outbox}
    unhealthy = next(b for s, b in bodies.items() if "node-1 is unhealthy" in s)
    lost = next(b for s, b in bodies.items() if "node-2 was lost" in s)
    machines = f"/clusters/{cluster.pk}/machines/"
    for body, name in ((unhealthy, "node-1"), (lost, "node-2")):
        assert f"Replace it: a new machine takes {name}'s name and private address" in body
        assert "$20.00 per hour" in body and machines in body
    assert "its billing ends at once" in unhealthy
