"""Acceptance on real hosts (issue 18, D3; in rounds since issue 38): an 8-node cluster measures
in two rounds of pairs that never share a link, each in waves of what the lab's fabric
carries at once (its two CPUs: `hostlab.LAB_MEASUREMENTS_AT_ONCE`, five), so healthy hosts
pass, and a host whose own link is shaped to 8 Mbit/s fails the cluster naming exactly its
node, with its peer and the peer's own figure (docs/lifecycle.md, "Acceptance before billing").

Its own lab fixture: 9 of the run's hosts in location `lab` (the shared `fleet` has 5), each
reimaged and its baseline recorded as `fleet` does.
"""

from __future__ import annotations

import dataclasses
import re

import pytest

from clusters.lifecycle import rounds
from clusters.models import Cluster
from lab import hostlab
from tests.clusters.lab_kit import BOOT, register
from tests.clusters.lifecycle_kit import create
from tests.clusters.test_ssh_lab import (
    assert_failed_at,
    drive,
    machine_type,
    project_with,
    released,
    terminate_and_check,
)

pytestmark = [pytest.mark.lab, pytest.mark.django_db(transaction=True)]

NODES = 8
HOSTS = NODES + 1  # a spare, as an operator's pool has
WAIT = 420  # seconds: 8 bootstraps, then 2 rounds to measure, each in waves of the lab's figure
SLOW = 5  # the node whose host's link is shaped
SHAPE = "tc qdisc add dev eth0 root tbf rate 8mbit burst 32kbit latency 400ms"
# The lab's links are veths through userspace WireGuard (wireguard-go): the inventory's expected
# link (hostlab.LAB_LINK_MBIT, 200 Mbit/s) gives the floor, RUNCRATE_ACCEPTANCE_MIN_MBIT (50),
# as the minimum: healthy hosts measure well above it alone, and 8 Mbit/s is far below.
LAB_LINK_MBIT = hostlab.LAB_LINK_MBIT


@pytest.fixture(scope="module")
def many(lab_run):
    """The first HOSTS of this process's lab hosts (lab_kit's lab_run)."""
    assert len(lab_run.hosts) >= HOSTS, "lab_kit.RUN_HOSTS brings up too few hosts"
    return dataclasses.replace(lab_run, hosts=lab_run.hosts[:HOSTS])


@pytest.fixture
def pool(many, dashboard, tmp_path):
    """Nine hosts in the inventory (`lab-h100x2-vm`), reimaged, with their baselines."""
    for host in many.hosts:
        many.reset(host.name)
    register(many.inventory(boot_seconds=BOOT, gateway_hosts=0), tmp_path)
    yield many
    # A test that failed half-way leaves nothing (no cluster's files, no qdisc) for the next.
    for host in many.hosts:
        shaped = many.exec(host.name, "tc qdisc show dev eth0 | grep -q tbf", check=False)
        used = many.exec(host.name, "test -e /var/lib/runcrate", check=False)
        if shaped.returncode == 0 or used.returncode == 0:
            many.reset(host.name)


def test_eight_healthy_nodes_pass_acceptance_each_measured_alone(pool, user_key):
    project = project_with(user_key)
    cluster = create(project, machine_type("lab-h100x2-vm"), nodes=NODES, name="eight")
    drive(cluster, Cluster.Status.READY, Cluster.Status.FAILED, timeout=WAIT)
    assert cluster.status == Cluster.Status.READY, cluster.failure_message

    expected = cluster.acceptance["expected"]
    assert (expected["link_mbit"], expected["min_bandwidth_mbit"]) == (LAB_LINK_MBIT, 50)
    rows = {row["name"]: row for row in cluster.acceptance["nodes"]}
    figures = {f"node-{i}": rows[f"node-{i}"]["bandwidth_mbit"] for i in range(NODES)}
    assert all(mbit >= 2 * expected["min_bandwidth_mbit"] for mbit in figures.values()), figures
    # In rounds: round 1 the even nodes to the next, round 2 the odd ones (node-7 to node-0),
    # and every report of round 2 came after every report of round 1.
    placed = {name: (row["round"], row["peer"]) for name, row in rows.items()}
    assert placed == {f"node-{i}": (1 + i % 2, f"node-{(i + 1) % NODES}") for i in range(NODES)}, (
        placed
    )
    reported = {n.name: n.network_reported_at for n in cluster.nodes.all()}
    first = [reported[name] for name, (number, _) in placed.items() if number == 1]
    second = [reported[name] for name, (number, _) in placed.items() if number == 2]
    assert max(first) <= min(second)
    # In waves of the lab's figure (its fabric, its CPUs, carries that many measurements at once:
    # hostlab): every report of a wave came after every report of the wave before it.
    at_once = cluster.machine_type.location.measurements_at_once
    assert at_once == hostlab.LAB_MEASUREMENTS_AT_ONCE
    waves: dict[int, list] = {}
    for index, number in rounds.wave_of(list(range(NODES)), at_once).items():
        waves.setdefault(number, []).append(reported[f"node-{index}"])
    # Two rounds of NODES / 2 pairs, each in waves of at most `at_once` pairs.
    assert len(waves) == 2 * -(-(NODES // 2) // at_once)
    assert all(max(waves[n]) <= min(waves[n + 1]) for n in range(1, len(waves))), waves

    terminate_and_check(pool, cluster)


def test_a_host_whose_own_link_is_slow_fails_acceptance_naming_its_node(pool, user_key):
    project = project_with(user_key)
    cluster = create(project, machine_type("lab-h100x2-vm"), nodes=NODES, name="slow")
    slow = cluster.nodes.select_related("host").get(index=SLOW)
    pool.exec(slow.host.name, SHAPE)  # its egress: what it sends its peer when it measures
    drive(cluster, Cluster.Status.READY, Cluster.Status.FAILED, timeout=WAIT)

    event = assert_failed_at(cluster, "acceptance_failed", f"node-{SLOW}", "network")
    message = cluster.failure_message
    # node-5 sends to node-6 in round 2; node-6's own figure (to node-7, round 1) is healthy.
    peer = f"node-{SLOW + 1}"
    figure = re.match(rf"node-{SLOW} moves ([\d,.]+) Mbit/s to {peer} ", message)
    assert figure, message
    assert float(figure.group(1).replace(",", "")) <= 10  # its own 8 Mbit/s, measured alone
    own = re.search(rf"in round 2; {peer}'s own figure is ([\d,.]+) Mbit/s", message)
    assert own and float(own.group(1).replace(",", "")) >= 50, message  # the peer not blamed
    assert "at least 50 Mbit/s" in message and f"{LAB_LINK_MBIT} Mbit/s link" in message
    # It names its peer only as where it measured to, and no other node.
    others = {f"node-{i}" for i in range(NODES)} - {f"node-{SLOW}", peer}
    assert not any(re.search(rf"\b{name}\b", message) for name in others), message
    assert event.node.index == SLOW and slow.host.name not in message

    # The failure released every host through the reimage: the qdisc went with it.
    released(cluster, timeout=WAIT)
    shaped = pool.exec(slow.host.name, "tc qdisc show dev eth0 | grep -q tbf", check=False)
    assert shaped.returncode != 0
