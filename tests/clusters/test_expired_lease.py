"""Node work whose lease ran out before it began is never begun (clusters/lifecycle/work.py):
the driver is not asked, and nothing of the node is written, so the pass that took the lease
back (or hands the work out again) is the only one that acts on the node."""

from datetime import timedelta

import pytest

from clusters import lifecycle
from clusters.machines.simulated import SimulatedDriver
from clusters.models import Event, Node
from tests.clusters.lifecycle_kit import Sim, create, inventory


@pytest.fixture
def started(monkeypatch):
    """Record every node the simulated driver is asked to start."""
    calls: list[int] = []
    original = SimulatedDriver.start

    def start(self, node, **kwargs):
        calls.append(node.pk)
        return original(self, node, **kwargs)

    monkeypatch.setattr(SimulatedDriver, "start", start)
    return calls


def handed_off(project) -> tuple[Sim, list[tuple[int, str, str]]]:
    """A new cluster's first pass: the start of each node, handed off under a lease."""
    cluster = create(project, inventory(hosts=2, boot_seconds=60))
    sim = Sim()
    with sim:
        lifecycle.advance(cluster_id=cluster.pk)
    work = list(sim.dispatcher.work)
    assert len(work) == 2 and all(token for _, _, token in work)
    return sim, work


def row(node_id: int) -> tuple:
    node = Node.objects.get(pk=node_id)
    return (
        node.status,
        node.step,
        node.step_started_at,
        node.step_deadline,
        node.driver_state,
        node.lease_token,
        node.lease_expires_at,
    )


def lease_ends(node_id: int):
    expires = Node.objects.get(pk=node_id).lease_expires_at
    assert expires is not None
    return expires


def test_work_begun_in_the_last_second_of_its_lease_runs_and_lands(project, clock, started):
    sim, work = handed_off(project)
    node_id, action, token = work[0]
    clock.move_to(lease_ends(node_id) - timedelta(seconds=1))

    with sim:
        assert lifecycle.do_node_work(node_id=node_id, action=action, token=token) is True

    assert started == [node_id]
    assert Node.objects.get(pk=node_id).lease_token == ""  # given back with the write-back


@pytest.mark.parametrize("late", [timedelta(0), timedelta(seconds=1), timedelta(hours=1)])
def test_work_whose_lease_ran_out_is_not_begun_and_writes_nothing(project, clock, started, late):
    sim, work = handed_off(project)
    node_id, action, token = work[0]
    before, events = row(node_id), Event.objects.count()
    clock.move_to(lease_ends(node_id) + late)

    with sim:
        assert lifecycle.do_node_work(node_id=node_id, action=action, token=token) is False

    assert started == []
    assert row(node_id) == before
    assert Event.objects.count() == events
    assert sim.dispatcher.work == work  # nothing handed off anew by this call


def test_a_batch_begins_only_the_nodes_whose_lease_still_holds(project, clock, started):
    sim, work = handed_off(project)
    (late_id, action, late_token), (live_id, _, live_token) = work
    # One node's lease ran out earlier (its worker held it, then died): the other's holds.
    ends = lease_ends(live_id)
    Node.objects.filter(pk=late_id).update(lease_expires_at=ends - timedelta(seconds=5))
    before = Node.objects.get(pk=late_id)
    clock.move_to(ends - timedelta(seconds=1))

    with sim:
        written = lifecycle.do_work(
            action=action, leases=[(late_id, late_token), (live_id, live_token)]
        )

    assert written == 1
    assert started == [live_id]
    # Its start never ran, so no result of it landed; the advance that the other's write-back
    # ran hands it out again, under a new lease.
    after = Node.objects.get(pk=late_id)
    assert (
        (after.status, after.driver_state)
        == (before.status, before.driver_state)
        == (
            Node.Status.STARTING,
            {},
        )
    )
    assert after.lease_token not in ("", late_token)
