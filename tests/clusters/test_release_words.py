"""The release event says what the stop did (issue 33, item 11, L6): a machine reimaged and
found clean, or one that was not (no reimage command ran; the host went `dirty`), never
"reimaged" of a machine no reimage touched."""

from __future__ import annotations

from datetime import timedelta

import pytest

from clusters import lifecycle
from clusters.lifecycle.steps.release import released_words
from clusters.machines.base import Released
from clusters.machines.simulated import SimulatedDriver
from clusters.models import Cluster, Node
from offers.models import Host
from tests.clusters.lifecycle_kit import T0, create, inventory

BOOT = 180


def terminated(user, project, sim, clock, monkeypatch, *, pristine_nodes: set[str]) -> Cluster:
    machine_type = inventory(hosts=2, boot_seconds=BOOT)
    cluster = create(project, machine_type)
    sim.run_until(clock, T0 + timedelta(seconds=BOOT * 2))
    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.READY

    def stop(self, node: Node, *, attempt: int = 1) -> Released:
        if node.name in pristine_nodes:
            return Released(pristine=True)
        return Released(pristine=False, why="No reimage command is set for this host.")

    monkeypatch.setattr(SimulatedDriver, "stop", stop)
    lifecycle.terminate(cluster=cluster, user=user)
    clock.shift(timedelta(seconds=2))
    sim.tick()
    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.TERMINATED
    return cluster


def released_message(cluster: Cluster) -> str:
    return cluster.events.get(reason="host_released").message


def test_a_machine_no_reimage_touched_is_not_said_to_be_reimaged(person, sim, clock, monkeypatch):
    user, project = person
    cluster = terminated(user, project, sim, clock, monkeypatch, pristine_nodes=set())

    assert released_message(cluster) == (
        "Released node-0, node-1: stopped and not reimaged yet; no one else gets them until "
        "staff reimage them. Every machine of this cluster is released."
    )
    hosts = Host.objects.filter(nodes__cluster=cluster).distinct()
    assert {h.state for h in hosts} == {Host.State.DIRTY}


def test_machines_reimaged_and_not_are_each_said_so(person, sim, clock, monkeypatch):
    user, project = person
    cluster = terminated(user, project, sim, clock, monkeypatch, pristine_nodes={"node-1"})

    assert released_message(cluster) == (
        "Released node-1: stopped, reimaged and found clean; node-0: stopped and not reimaged "
        "yet; no one else gets it until staff reimage it. Every machine of this cluster is "
        "released."
    )


@pytest.mark.parametrize(
    ("reimaged", "kept_out", "words"),
    [
        (["node-0"], [], "Released node-0: stopped, reimaged and found clean."),
        (
            [],
            ["node-2"],
            "Released node-2: stopped and not reimaged yet; no one else gets it until staff "
            "reimage it.",
        ),
    ],
)
def test_released_words(reimaged, kept_out, words):
    def nodes(names):
        return [Node(index=int(name.split("-")[1])) for name in names]

    assert released_words(reimaged=nodes(reimaged), kept_out=nodes(kept_out)) == words
