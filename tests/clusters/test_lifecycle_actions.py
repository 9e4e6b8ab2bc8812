"""What users ask of a running cluster: terminate, retry install, add workers; each refused with
`invalid_state` when the status does not fit, and the machines' billing following suit."""

from datetime import timedelta
from decimal import Decimal

import pytest

from billing import ledger
from billing.models import UsageRecord
from clusters import lifecycle
from clusters.errors import ClusterRefused
from clusters.models import Cluster, IllegalTransition, Node
from offers.models import Host
from tests.clusters.lifecycle_kit import (
    T0,
    assert_failed_cleanly,
    create,
    free_hosts,
    inventory,
    node,
)

BOOT = 180
UP = timedelta(seconds=BOOT * 1.5)  # a simulated cluster joins 1.5 boot times after creation


def ready_cluster(project, sim, clock, *, hosts=4, nodes=2, software="none", faults=None):
    machine_type = inventory(hosts=hosts, boot_seconds=BOOT, faults=faults)
    cluster = create(project, machine_type, nodes=nodes, software=software)
    sim.run_until(clock, clock_now() + UP * (2 if software != "none" else 1))
    cluster.refresh_from_db()
    return cluster, machine_type


def clock_now():
    from django.utils import timezone

    return timezone.now()


# --- terminate ----------------------------------------------------------------------------


def test_it_terminates_a_ready_cluster_and_ends_billing_at_that_instant(person, sim, clock):
    user, project = person
    cluster, machine_type = ready_cluster(project, sim, clock)
    assert cluster.status == Cluster.Status.READY
    clock.shift(timedelta(minutes=10))
    ended = clock_now()

    lifecycle.terminate(cluster=cluster, user=user)

    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.TERMINATING
    assert cluster.ended_at == ended
    assert set(UsageRecord.objects.filter(cluster=cluster).values_list("ended_at", flat=True)) == {
        ended
    }
    assert set(Host.objects.filter(machine_type=machine_type).values_list("state", flat=True)) >= {
        "cleaning"
    }
    clock.shift(timedelta(seconds=2))
    sim.tick()

    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.TERMINATED
    assert free_hosts(machine_type) == 4
    assert not cluster.nodes.filter(holds_host=True).exists()
    assert set(cluster.nodes.values_list("status", flat=True)) == {Node.Status.ENDED}
    reasons = list(cluster.events.values_list("reason", flat=True))
    assert reasons[-3:] == ["terminate_requested", "host_released", "terminated"]
    assert user.email in cluster.events.get(reason="terminate_requested").message


def test_it_terminates_a_cluster_still_provisioning_without_billing_it(person, sim, clock):
    _, project = person
    machine_type = inventory(hosts=2, boot_seconds=BOOT)
    cluster = create(project, machine_type)
    sim.run_until(clock, T0 + timedelta(seconds=BOOT))

    lifecycle.terminate(cluster=cluster)
    sim.tick()

    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.TERMINATED
    assert free_hosts(machine_type) == 2
    assert not UsageRecord.objects.filter(cluster=cluster).exists()


@pytest.mark.parametrize("status", ["terminating", "terminated", "failed", "stopped"])
def test_it_refuses_to_terminate_a_cluster_that_is_not_live(person, sim, clock, status):
    _, project = person
    machine_type = inventory(hosts=2, boot_seconds=BOOT)
    cluster = create(project, machine_type)
    Cluster.objects.filter(pk=cluster.pk).update(status=status)

    with pytest.raises(ClusterRefused) as refused:
        lifecycle.terminate(cluster=cluster)

    assert refused.value.code == "invalid_state"
    assert status in refused.value.message
    assert Cluster.objects.get(pk=cluster.pk).status == status


def test_it_stops_a_cluster_for_lack_of_balance_with_the_reason(person, sim, clock):
    _, project = person
    cluster, machine_type = ready_cluster(project, sim, clock)

    lifecycle.stop(cluster=cluster, reason=Cluster.StopReason.BALANCE)
    sim.tick()

    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.STOPPED
    assert cluster.stop_reason == "balance"
    assert free_hosts(machine_type) == 4
    assert cluster.events.filter(reason="stopped_balance").exists()


def test_it_raises_on_a_transition_the_lifecycle_never_makes(db):
    cluster = Cluster(status=Cluster.Status.TERMINATED)
    with pytest.raises(IllegalTransition):
        cluster.move_to(Cluster.Status.READY)


# --- retry install ------------------------------------------------------------------------


def test_it_retries_the_install_of_a_degraded_cluster(person, sim, clock):
    _, project = person
    cluster, machine_type = ready_cluster(
        project, sim, clock, nodes=2, software="ray", faults={1: "install"}
    )
    assert cluster.status == Cluster.Status.DEGRADED
    records = set(UsageRecord.objects.filter(cluster=cluster).values_list("pk", "started_at"))
    Host.objects.filter(machine_type=machine_type).update(fault="")  # staff fixed the image

    lifecycle.retry_install(cluster=cluster)

    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.INSTALLING
    assert cluster.install_attempts == 2
    assert node(cluster, 1).step == Node.Step.INSTALL
    sim.run_until(clock, clock_now() + UP)
    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.READY
    # billing never stopped: the same records, still open
    assert set(UsageRecord.objects.filter(cluster=cluster).values_list("pk", "started_at")) == (
        records
    )
    assert not UsageRecord.objects.filter(cluster=cluster, ended_at__isnull=False).exists()
    assert cluster.events.filter(reason="retry_install").exists()


@pytest.mark.parametrize("status", ["provisioning", "installing", "ready", "terminated"])
def test_it_refuses_to_retry_an_install_unless_degraded(person, sim, clock, status):
    _, project = person
    cluster = create(project, inventory(hosts=2, boot_seconds=BOOT))
    Cluster.objects.filter(pk=cluster.pk).update(status=status)

    with pytest.raises(ClusterRefused) as refused:
        lifecycle.retry_install(cluster=cluster)

    assert refused.value.code == "invalid_state"
    assert Cluster.objects.get(pk=cluster.pk).install_attempts == 0


# --- add workers ----------------------------------------------------------------------------


def test_it_adds_workers_that_join_and_are_billed_from_their_own_start(person, sim, clock):
    _, project = person
    cluster, machine_type = ready_cluster(project, sim, clock, hosts=5)
    clock.shift(timedelta(minutes=5))
    added_at = clock_now()

    lifecycle.add_workers(cluster=cluster, count=2)

    workers = list(cluster.nodes.filter(is_worker=True).order_by("index"))
    assert [w.name for w in workers] == ["node-2", "node-3"]
    assert workers[0].private_ip == "10.77.0.3"
    assert workers[0].step_deadline == added_at + timedelta(seconds=2 * BOOT)
    assert free_hosts(machine_type) == 1
    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.READY

    sim.run_until(clock, added_at + UP)

    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.READY
    records = UsageRecord.objects.filter(cluster=cluster)
    assert records.count() == 4
    worker_starts = set(records.filter(node__is_worker=True).values_list("started_at", flat=True))
    assert worker_starts == {added_at + UP}
    assert set(records.filter(node__is_worker=False).values_list("started_at", flat=True)) == {
        cluster.joined_at
    }
    assert cluster.events.filter(reason="worker_joined").count() == 2
    # every worker reached every other node, old and new
    assert set(node(cluster, 3).reachability) == {"node-0", "node-1", "node-2"}


def test_it_installs_the_software_on_new_workers(person, sim, clock):
    _, project = person
    cluster, _ = ready_cluster(project, sim, clock, hosts=3, software="slurm")
    assert cluster.status == Cluster.Status.READY

    lifecycle.add_workers(cluster=cluster, count=1)
    sim.run_until(clock, clock_now() + UP * 2)

    worker = node(cluster, 2)
    assert worker.status == Node.Status.JOINED
    assert worker.step == Node.Step.DONE
    assert "node-2" in node(cluster, 0).driver_state["check"]["ready"]
    # Billed from the moment it is up: its software joined, not when it passed `network`.
    record = UsageRecord.objects.get(node=worker)
    assert record.started_at == cluster.events.get(reason="worker_joined").at
    assert record.started_at > worker.network_at


def test_it_releases_a_failing_worker_alone(person, sim, clock):
    _, project = person
    cluster, machine_type = ready_cluster(project, sim, clock, hosts=4, faults={3: "agent"})

    lifecycle.add_workers(cluster=cluster, count=2)
    sim.run_until(clock, clock_now() + timedelta(seconds=2 * BOOT))

    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.READY
    failed = node(cluster, 3)
    assert failed.status == Node.Status.FAILED
    assert not failed.holds_host
    assert failed.host.state == Host.State.FREE
    event = cluster.events.get(reason="worker_failed")
    assert event.node == failed and event.step == "agent"
    assert event.notification is None
    assert node(cluster, 2).status == Node.Status.JOINED
    assert not UsageRecord.objects.filter(node=failed).exists()
    assert UsageRecord.objects.filter(cluster=cluster, ended_at__isnull=True).count() == 3


def test_it_never_bills_a_worker_whose_install_fails(person, sim, clock):
    """Issue 18: a worker is billed from the moment it is up (its software joined); one that
    never comes up was never of use."""
    _, project = person
    cluster, machine_type = ready_cluster(
        project, sim, clock, hosts=3, software="kubernetes", faults={2: "install"}
    )
    lifecycle.add_workers(cluster=cluster, count=1)
    sim.run_until(clock, clock_now() + UP * 2)

    worker = node(cluster, 2)
    assert worker.status == Node.Status.FAILED
    assert not UsageRecord.objects.filter(node=worker).exists()
    assert cluster.events.get(reason="worker_failed").step == "install"
    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.READY


@pytest.mark.parametrize(
    ("count", "code"), [(0, "invalid_count"), (-1, "invalid_count"), (63, "invalid_count")]
)
def test_it_refuses_a_bad_worker_count(person, sim, clock, count, code):
    _, project = person
    cluster, machine_type = ready_cluster(project, sim, clock)

    with pytest.raises(ClusterRefused) as refused:
        lifecycle.add_workers(cluster=cluster, count=count)

    assert refused.value.code == code
    assert cluster.nodes.count() == 2
    assert free_hosts(machine_type) == 2


def test_it_refuses_workers_when_machines_run_out_and_reserves_none(person, sim, clock):
    _, project = person
    cluster, machine_type = ready_cluster(project, sim, clock, hosts=3)

    with pytest.raises(ClusterRefused) as refused:
        lifecycle.add_workers(cluster=cluster, count=2)

    assert refused.value.code == "not_enough_machines"
    assert free_hosts(machine_type) == 1
    assert cluster.nodes.count() == 2


def test_it_refuses_workers_the_balance_cannot_run_for_an_hour_and_reserves_none(
    person, sim, clock
):
    _, project = person
    cluster, machine_type = ready_cluster(project, sim, clock, hosts=4)
    balance = ledger.balance(project=project)
    # Enough for the two machines running now and one more, not for two more (20.00 each).
    ledger.credit(project=project, amount=Decimal("60.00") - balance, note="test")

    with pytest.raises(ClusterRefused) as refused:
        lifecycle.add_workers(cluster=cluster, count=2)

    assert refused.value.code == "insufficient_balance"
    assert "$60.00" in refused.value.message and "$80.00" in refused.value.message
    assert free_hosts(machine_type) == 2
    assert cluster.nodes.count() == 2
    lifecycle.add_workers(cluster=cluster, count=1)
    assert free_hosts(machine_type) == 1


@pytest.mark.parametrize("status", ["provisioning", "installing", "degraded", "terminated"])
def test_it_adds_workers_only_to_a_ready_cluster(person, sim, clock, status):
    _, project = person
    machine_type = inventory(hosts=4, boot_seconds=BOOT)
    cluster = create(project, machine_type)
    Cluster.objects.filter(pk=cluster.pk).update(status=status)

    with pytest.raises(ClusterRefused) as refused:
        lifecycle.add_workers(cluster=cluster, count=1)

    assert refused.value.code == "invalid_state"
    assert free_hosts(machine_type) == 2


def test_it_releases_everything_when_a_cluster_fails(person, sim, clock):
    _, project = person
    machine_type = inventory(hosts=2, boot_seconds=BOOT, faults={0: "crash"})
    cluster = create(project, machine_type)
    sim.run_until(clock, T0 + UP)
    assert_failed_cleanly(cluster, machine_type)
    assert cluster.events.filter(reason="host_released").exists()
