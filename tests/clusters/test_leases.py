"""Per-node work's leases: short enough that a dead worker costs one lease and not the step,
renewed while live work runs, and a lease taken back while the work runs makes its write-back
change nothing (clusters/lifecycle/work.py)."""

import threading
import time
from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from clusters import lifecycle
from clusters.lifecycle.rules import INSTALL_SECONDS, LEASE_SECONDS
from clusters.lifecycle.work import renewing_lease
from clusters.machines.simulated import SimulatedDriver
from clusters.models import Node
from tests.clusters.lifecycle_kit import Sim, create, inventory, node


def test_every_lease_runs_out_well_inside_the_deadline_it_serves():
    # The machine, agent and network steps never get less than RUNCRATE_MIN_STEP_SECONDS; a
    # worker killed holding their work must leave time to hand it out again, twice.
    for kind in ("start", "agent", "network", "check", "replan"):
        assert LEASE_SECONDS[kind] * 2 <= settings.RUNCRATE_MIN_STEP_SECONDS, kind
    assert LEASE_SECONDS["install"] * 2 <= INSTALL_SECONDS


@pytest.mark.django_db(transaction=True)  # the renewer is another thread, on its own connection
def test_a_lease_is_renewed_while_its_work_runs_and_a_lease_taken_back_stays_taken(project):
    cluster = create(project, inventory(hosts=2, boot_seconds=60))
    n = node(cluster, 0)
    first = timezone.now() + timedelta(seconds=1)
    Node.objects.filter(pk=n.pk).update(lease_token="mine", lease_expires_at=first)

    def lease():
        return Node.objects.values_list("lease_token", "lease_expires_at").get(pk=n.pk)

    with renewing_lease(n.pk, "mine", seconds=0.3):
        deadline = time.monotonic() + 5
        while lease()[1] == first:  # bounded wait for the renewer's first round
            assert time.monotonic() < deadline, "the lease was never renewed"
            time.sleep(0.02)
        assert lease()[0] == "mine"
        # Terminate takes it back while the work still runs.
        taken = timezone.now()
        Node.objects.filter(pk=n.pk).update(lease_token="", lease_expires_at=taken)
        time.sleep(0.35)  # longer than a renewal round
        assert lease() == ("", taken)
    assert not any(t.name == f"lease-{n.pk}" for t in threading.enumerate())


@pytest.mark.django_db
def test_a_lease_taken_back_while_the_work_runs_makes_its_write_back_change_nothing(
    project, monkeypatch
):
    cluster = create(project, inventory(hosts=2, boot_seconds=60))
    original = SimulatedDriver.start

    def start_while_it_is_taken_back(self, node, **kwargs):
        # Halfway through the start, the node's lease goes to someone else (a retry, a
        # terminate): what this start found must not land.
        Node.objects.filter(pk=node.pk).update(lease_token="someone-else")
        return original(self, node, **kwargs)

    monkeypatch.setattr(SimulatedDriver, "start", start_while_it_is_taken_back)
    with Sim() as sim:
        lifecycle.advance(cluster_id=cluster.pk)
        node_id, action, token = sim.dispatcher.work[0]
        before = Node.objects.get(pk=node_id)
        assert lifecycle.do_node_work(node_id=node_id, action=action, token=token) is False
    after = Node.objects.get(pk=node_id)
    assert after.driver_state == before.driver_state == {}
    assert (after.lease_token, after.status) == ("someone-else", before.status)
