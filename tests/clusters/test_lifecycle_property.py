"""A property of the whole lifecycle (hypothesis): whatever the size, the faults and where they
sit, and however often the reconciler runs, a cluster ends either with every node joined and
one shared billing start, or failed with every host released and nothing billed; and no host
is ever held by two nodes."""

from datetime import timedelta

import pytest
import time_machine
from django.db.models import Count, Q
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from billing.models import UsageRecord
from clusters.models import Cluster, DueCluster, Node
from offers.models import Host
from tests.clusters.lifecycle_kit import T0, Sim, create, inventory, new_project

BOOT = 180
JOIN_FAULTS = {"boot", "crash", "agent", "network"}


@st.composite
def scenarios(draw):
    size = draw(st.integers(min_value=2, max_value=8))
    faults = draw(
        st.lists(
            st.sampled_from(["", "", "", "boot", "crash", "agent", "network", "install"]),
            min_size=size,
            max_size=size,
        )
    )
    spare = draw(st.integers(min_value=0, max_value=2))
    software = draw(st.sampled_from(["none", "slurm"]))
    every = draw(st.sampled_from([15, 30, 45]))
    return size, faults, spare, software, every


def assert_no_host_held_twice(machine_type) -> None:
    held = Node.objects.filter(host__machine_type=machine_type, holds_host=True)
    assert not held.values("host").annotate(n=Count("pk")).filter(n__gt=1).exists()
    # a host is taken exactly when a node holds it
    taken = Host.objects.filter(machine_type=machine_type).exclude(state=Host.State.FREE)
    assert set(taken.values_list("pk", flat=True)) == set(held.values_list("host", flat=True))


def assert_the_tick_sees_it(cluster) -> None:
    """What the tick reads (the flag, and the DueCluster row with it) says what the rows say:
    still moving, or a node that ended still holds its host, or a ready cluster's worker is
    starting or installing."""
    moving = Cluster.objects.filter(pk=cluster.pk).filter(
        Q(status__in=["provisioning", "installing", "terminating"])
        | Q(nodes__status="starting")
        | Q(nodes__holds_host=True, nodes__status__in=["failed", "ended", "lost"])
        | Q(status="ready", nodes__step="install", nodes__status="joined")
    )
    assert cluster.needs_work == moving.exists()
    assert DueCluster.objects.filter(cluster=cluster).exists() == cluster.needs_work


@pytest.mark.django_db
@settings(
    max_examples=20,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(scenario=scenarios())
def test_it_ends_all_joined_or_all_released(scenario):
    size, faults, spare, software, every = scenario
    _, project = new_project()
    # the spare hosts sit after the cluster's: they are never reserved
    machine_type = inventory(hosts=size + spare, boot_seconds=BOOT, faults=dict(enumerate(faults)))
    with time_machine.travel(T0, tick=False) as clock, Sim() as sim:
        cluster = create(project, machine_type, nodes=size, software=software)
        limit = T0 + timedelta(minutes=30)
        while timezone.now() < limit:
            sim.tick()
            assert_no_host_held_twice(machine_type)
            cluster.refresh_from_db()
            assert_the_tick_sees_it(cluster)
            settled = not cluster.nodes.filter(
                holds_host=True, status__in=[Node.Status.FAILED, Node.Status.ENDED]
            ).exists()
            if settled and cluster.status not in (Cluster.Status.PROVISIONING, "installing"):
                break
            clock.shift(timedelta(seconds=every))

    records = UsageRecord.objects.filter(cluster=cluster)
    join_faults = [i for i, fault in enumerate(faults) if fault in JOIN_FAULTS]
    if join_faults:
        assert cluster.status == Cluster.Status.FAILED
        assert int(cluster.failure_node.split("-")[1]) in join_faults
        assert cluster.events.filter(reason=cluster.failure_reason, step=cluster.failure_step)
        assert not records.exists()
        assert not cluster.nodes.filter(holds_host=True).exists()
        assert Host.objects.filter(machine_type=machine_type, state="free").count() == (
            size + spare
        )
    else:
        install_fails = software != "none" and "install" in faults
        expected = Cluster.Status.DEGRADED if install_fails else Cluster.Status.READY
        assert cluster.status == expected
        assert set(cluster.nodes.values_list("status", flat=True)) == {Node.Status.JOINED}
        assert records.count() == size
        assert set(records.values_list("started_at", flat=True)) == {cluster.joined_at}
        assert Host.objects.filter(machine_type=machine_type, state="in_use").count() == size
