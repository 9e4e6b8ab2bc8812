"""Acceptance on real hosts (issue 18, D3): an 8-node cluster's workers measure their way to
node-0 one at a time, so healthy hosts pass, and a host whose own link is shaped to 8 Mbit/s
fails the cluster naming exactly its node (docs/lifecycle.md, "Acceptance before billing").

Its own lab fixture: 9 of the run's hosts in location `lab` (the shared `fleet` has 5), each
reimaged and its baseline recorded as `fleet` does.
"""

from __future__ import annotations

import dataclasses
import re

import pytest

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
WAIT = 420  # seconds: 8 bootstraps, then 7 turns to measure
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
    figures = {f"node-{i}": rows[f"node-{i}"]["bandwidth_mbit"] for i in range(1, NODES)}
    assert all(mbit >= 2 * expected["min_bandwidth_mbit"] for mbit in figures.values()), figures
    # One after another, lowest index first: each worker reported after the one before it.
    reported = [n.network_reported_at for n in cluster.nodes.filter(index__gt=0).order_by("index")]
    assert reported == sorted(reported) and len(set(reported)) == NODES - 1

    terminate_and_check(pool, cluster)


def test_a_host_whose_own_link_is_slow_fails_acceptance_naming_its_node(pool, user_key):
    project = project_with(user_key)
    cluster = create(project, machine_type("lab-h100x2-vm"), nodes=NODES, name="slow")
    slow = cluster.nodes.select_related("host").get(index=SLOW)
    pool.exec(slow.host.name, SHAPE)  # its egress: what it sends node-0 when it measures
    drive(cluster, Cluster.Status.READY, Cluster.Status.FAILED, timeout=WAIT)

    event = assert_failed_at(cluster, "acceptance_failed", f"node-{SLOW}", "network")
    message = cluster.failure_message
    figure = re.match(rf"node-{SLOW} moves ([\d,.]+) Mbit/s to node-0", message)
    assert figure, message
    assert float(figure.group(1).replace(",", "")) <= 10  # its own 8 Mbit/s, measured alone
    assert "at least 50 Mbit/s" in message and f"{LAB_LINK_MBIT} Mbit/s link" in message
    # It names node-0 only as where it measured to, and no other worker.
    others = {f"node-{i}" for i in range(1, NODES)} - {f"node-{SLOW}"}
    assert not any(re.search(rf"\b{name}\b", message) for name in others), message
    assert event.node.index == SLOW and slow.host.name not in message

    # The failure released every host through the reimage: the qdisc went with it.
    released(cluster, timeout=WAIT)
    shaped = pool.exec(slow.host.name, "tc qdisc show dev eth0 | grep -q tbf", check=False)
    assert shaped.returncode != 0
