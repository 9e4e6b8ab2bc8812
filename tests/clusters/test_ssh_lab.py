"""The ssh driver on real Linux hosts: the lab's namespaces, each with its own sshd (docs/lab.md).

Clusters come up through the real bootstrap, the real agent (talking to a live dashboard on
the lab's bridge) and a real WireGuard network; users log in with the real `ssh` client and the
product's SSH config; faults are made inside the hosts; terminate leaves them clean. Skipped,
with the reason, where the lab cannot start (not root, no namespaces).
"""

from __future__ import annotations

import subprocess
import time
from datetime import timedelta
from pathlib import Path

import pytest
import time_machine
from django.utils import timezone

from accounts.models import SshKey
from billing.models import UsageRecord
from clusters import connect, lifecycle
from clusters.lifecycle import unit
from clusters.machines import get_driver
from clusters.machines.base import DriverError
from clusters.models import Cluster, Event, Node
from lab import hostlab
from offers.models import Host, Location, MachineType
from tests.clusters.lab_kit import BOOT
from tests.clusters.lifecycle_kit import Sim, create, new_project

pytestmark = [pytest.mark.lab, pytest.mark.django_db(transaction=True)]

WAIT = 180  # seconds any one test waits for a cluster to move


@pytest.fixture
def quick_retries(monkeypatch):
    monkeypatch.setattr(unit, "RETRY_AFTER", timedelta(seconds=1))


def project_with(user_key: Path):
    _, project = new_project(keys=0)
    public = user_key.with_suffix(".pub").read_text().strip()
    SshKey.objects.create(project=project, name="mine", public_key=public, fingerprint="SHA256:x")
    return project


def machine_type(slug: str) -> MachineType:
    return MachineType.objects.get(slug=slug)


def drive(cluster: Cluster, *statuses: str, timeout: float = WAIT) -> Cluster:
    """Run the reconciler and its per-node work here (the agents talk to the live dashboard)
    until the cluster reaches one of `statuses`; a bounded wait on real hosts."""
    deadline = time.monotonic() + timeout
    with Sim() as sim:
        while True:
            sim.tick()
            cluster.refresh_from_db()
            if cluster.status in statuses:
                return cluster
            if time.monotonic() > deadline:
                events = "\n".join(f"  {e.reason}: {e.message}" for e in cluster.events.all())
                raise AssertionError(
                    f"cluster is {cluster.status}, not {statuses}:\n{events}\n{agent_logs(cluster)}"
                )
            time.sleep(0.5)


def agent_logs(cluster: Cluster) -> str:
    """The agents' logs on the cluster's hosts, for a test that timed out."""
    lab = hostlab.current()
    if lab is None:
        return ""
    logs = []
    for n in cluster.nodes.select_related("host"):
        done = lab.exec(n.host.name, "tail -n 20 /var/log/runcrate-agent.log", check=False)
        logs.append(f"--- {n.name} ({n.host.name}):\n{done.stdout}{done.stderr}")
    return "\n".join(logs)


def released(cluster: Cluster, timeout: float = WAIT, allowed=(Host.State.FREE,)) -> None:
    """Every host the cluster held is wiped and free again."""
    deadline = time.monotonic() + timeout
    with Sim() as sim:
        while cluster.nodes.filter(holds_host=True).exists():
            assert time.monotonic() < deadline, list(cluster.events.values_list("message"))
            sim.tick()
            time.sleep(0.5)
    hosts = Host.objects.filter(nodes__cluster=cluster)
    assert set(hosts.values_list("state", flat=True)) <= set(allowed)


def assert_clean(lab, host: Host) -> None:
    """Nothing of the cluster is left inside the host."""
    checks = {
        "agent": "! pgrep -f '/opt/runcrate/[r]uncrate_agent.py'",
        "wireguard": "! ip link show rc0",
        "shared": "test ! -e /shared",
        "user key": "! grep -q 'user@test' /root/.ssh/authorized_keys",
        "operator key kept": "grep -q runcrate-operator /root/.ssh/authorized_keys",
        "hostname": f'test "$(hostname)" = {host.name}',
        "state": "test ! -e /var/lib/runcrate -a ! -e /etc/runcrate",
    }
    failed = [
        what
        for what, command in checks.items()
        if lab.exec(host.name, command, check=False).returncode != 0
    ]
    assert failed == [], f"{host.name} is not clean: {failed}"


def terminate_and_check(lab, cluster: Cluster) -> None:
    """Terminate; every host is wiped, verified clean inside, and free again: but for the host
    of a machine that was lost (or replaced as unhealthy), quarantined offline for staff
    (docs/lifecycle.md, "Repair")."""
    with Sim():
        lifecycle.terminate(cluster=cluster)
    drive(cluster, Cluster.Status.TERMINATED)
    released(cluster, allowed=(Host.State.FREE, Host.State.OFFLINE))
    quarantined = set(cluster.nodes.exclude(quarantine="").values_list("host_id", flat=True))
    for host in Host.objects.filter(nodes__cluster=cluster).distinct():
        wanted = Host.State.OFFLINE if host.pk in quarantined else Host.State.FREE
        assert host.state == wanted, (host.name, host.state, host.pristine_report)
        assert_clean(lab, host)


def ssh_config_file(cluster: Cluster, tmp_path: Path, user_key: Path, lab) -> Path:
    """The product's SSH config and known_hosts (the pinned host keys: ssh never asks to trust
    one), with what a user's own ~/.ssh/config adds: their key."""
    shape = connect.shape_for(
        Cluster.objects.select_related("machine_type__location")
        .prefetch_related("nodes", "volumes")
        .get(pk=cluster.pk)
    )
    known = tmp_path / "known_hosts"
    known.write_text(connect.known_hosts(shape))
    assert len(known.read_text().splitlines()) == len(shape.nodes) + bool(shape.gateway)
    config = tmp_path / "ssh_config"
    config.write_text(
        connect.ssh_config(shape)
        + f"\nHost *\n    IdentityFile {user_key}\n    IdentitiesOnly yes\n"
        f"    UserKnownHostsFile {known}\n    StrictHostKeyChecking yes\n    BatchMode yes\n"
        "    ConnectTimeout 10\n"
    )
    return config


def ssh(config: Path, target: str, command: str) -> str:
    """Run `command` on `target`, a node's name inside the cluster (node-i), by the name the
    cluster's SSH config gives it on the user's computer (NAME-node-i: never a bare node-i)."""
    hosts = [
        name for line in config.read_text().splitlines() if line.startswith("Host ")
        for name in line.split()[1:]
    ]  # fmt: skip
    assert target not in hosts, f"the SSH config declares a bare {target}"
    (host,) = [name for name in hosts if name.endswith(f"-{target}")]
    done = subprocess.run(
        ["ssh", "-F", str(config), host, command],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def assert_failed_at(cluster: Cluster, reason: str, node: str, step: str) -> Event:
    assert (cluster.status, cluster.failure_reason, cluster.failure_node, cluster.failure_step) == (
        Cluster.Status.FAILED,
        reason,
        node,
        step,
    ), cluster.failure_message
    assert not UsageRecord.objects.filter(cluster=cluster).exists()  # nothing was billed
    return cluster.events.get(reason=reason)


# --- a cluster on real hosts -------------------------------------------------------------------


def test_a_cluster_comes_up_on_real_hosts_users_log_in_and_terminate_wipes_them(
    fleet, user_key, tmp_path
):
    lab = fleet
    project = project_with(user_key)
    cluster = create(project, machine_type("lab-h100x2-vm"), nodes=3, name="real")
    drive(cluster, Cluster.Status.READY, Cluster.Status.FAILED)
    assert cluster.status == Cluster.Status.READY, cluster.failure_message

    # Billing started once, for all three machines at the same instant.
    starts = set(UsageRecord.objects.filter(cluster=cluster).values_list("started_at", flat=True))
    assert (
        starts == {cluster.joined_at} and UsageRecord.objects.filter(cluster=cluster).count() == 3
    )
    # The acceptance report: GPUs seen, reachability, and what each node measured to node-0.
    rows = {row["name"]: row for row in cluster.acceptance["nodes"]}
    assert [g["name"] for g in rows["node-1"]["gpus"]] == ["NVIDIA H100 80GB HBM3"] * 2
    assert rows["node-2"]["reachability"] == {"node-0": True, "node-1": True}
    for name in ("node-1", "node-2"):
        assert rows[name]["bandwidth_mbit"] > 0 and rows[name]["latency_ms"] > 0
        assert rows[name]["method"] in ("iperf3", "tcp-stream")

    # The user's own key logs in to every node with the product's SSH config.
    config = ssh_config_file(cluster, tmp_path, user_key, lab)
    for i in range(3):
        assert ssh(config, f"node-{i}", "hostname") == f"node-{i}"
    # The private network: node-0 reaches node-1 at 10.77.0.2 over WireGuard, and every node
    # by name without a password (the cluster's own key).
    assert ssh(config, "node-0", "ip -o -4 addr show rc0").split()[3] == "10.77.0.1/24"
    assert ssh(config, "node-0", "ping -c 1 -W 5 10.77.0.2 >/dev/null && echo up") == "up"
    for i in (1, 2):
        assert ssh(config, "node-0", f"ssh -o BatchMode=yes node-{i} hostname") == f"node-{i}"
    assert ssh(config, "node-1", "cat /shared/hostfile") == (
        "node-0 slots=2\nnode-1 slots=2\nnode-2 slots=2"
    )
    # The agents heartbeat.
    assert all(n.heartbeat_at is not None for n in cluster.nodes.all())
    # The bootstrap installed what the image lacks from the location's mirror, the optional
    # iperf3 with the needed ones (in one apt-get).
    installed = "for c in wg wireguard-go nft iperf3; do command -v $c >/dev/null || exit 1; done"
    for node in cluster.nodes.select_related("host"):
        assert lab.exec(node.host.name, installed, check=False).returncode == 0, node.name

    # Running the bootstrap again on a node changes nothing.
    node1 = cluster.nodes.select_related("host", "cluster__machine_type__location").get(index=1)
    before = lab.exec(node1.host.name, "cat /etc/hosts /etc/hostname; wg show rc0 public-key")
    again = get_driver(node1.host).start(
        node1, agent_token=lifecycle.agent_token(node1), plan=lifecycle.node_plan_for(node1)
    )
    assert again["changed"] == []
    assert (
        lab.exec(node1.host.name, "cat /etc/hosts /etc/hostname; wg show rc0 public-key").stdout
        == before.stdout
    )

    terminate_and_check(lab, cluster)


def test_users_reach_nodes_behind_the_location_gateway(fleet, user_key, tmp_path):
    lab = fleet
    project = project_with(user_key)
    cluster = create(project, machine_type("lab-gw-h100x2-vm"), nodes=2, name="behind")
    drive(cluster, Cluster.Status.READY, Cluster.Status.FAILED)
    assert cluster.status == Cluster.Status.READY, cluster.failure_message

    config = ssh_config_file(cluster, tmp_path, user_key, lab)
    assert f"ProxyJump c{cluster.pk}@{lab.gateway.address}:22" in config.read_text()
    assert ssh(config, "node-1", "hostname") == "node-1"
    # The jump user may only forward to this cluster's hosts.
    direct = subprocess.run(
        ["ssh", "-F", str(config), "-J", f"c{cluster.pk}@{lab.gateway.address}",
         f"root@{lab.hosts[0].address}", "hostname"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert direct.returncode != 0

    with Sim():
        lifecycle.terminate(cluster=cluster)
    drive(cluster, Cluster.Status.TERMINATED)
    released(cluster)
    assert lab.exec(lab.gateway.name, f"id c{cluster.pk}", check=False).returncode != 0


# --- faults on real hosts: each fails the cluster at its step, releasing every host ---------


def test_a_host_whose_sshd_does_not_answer_fails_the_cluster(fleet, user_key, quick_retries):
    lab = fleet
    rule = "INPUT -p tcp --dport 22 -j REJECT --reject-with tcp-reset"
    lab.exec(lab.hosts[1].name, f"iptables -I {rule}")
    try:
        cluster = create(project_with(user_key), machine_type("lab-h100x2-vm"), nodes=2)
        drive(cluster, Cluster.Status.FAILED)
    finally:
        # The failure's release reimaged the host, rule and all, unless the test broke first.
        lab.exec(lab.hosts[1].name, f"iptables -D {rule}", check=False)
    assert_failed_at(cluster, "machine_failed", "node-1", "running")
    refused = f"could not connect to {lab.hosts[1].address}:22: connection refused"
    assert refused in cluster.failure_message
    released(cluster)
    assert_clean(lab, Host.objects.get(name=lab.hosts[0].name))


def test_a_host_whose_key_does_not_match_is_never_bootstrapped(fleet, user_key):
    lab = fleet
    # The second host is told the third one's key.
    Host.objects.filter(name=lab.hosts[1].name).update(host_key=lab.hosts[2].host_key)
    cluster = create(project_with(user_key), machine_type("lab-h100x2-vm"), nodes=2)
    drive(cluster, Cluster.Status.FAILED)
    # Never wiped either (nothing was done to it): offline at once, for staff.
    released(cluster, allowed={Host.State.FREE, Host.State.OFFLINE})
    assert cluster.events.get(reason="release_failed").node.host.name == lab.hosts[1].name
    assert Host.objects.get(name=lab.hosts[1].name).state == Host.State.OFFLINE
    event = assert_failed_at(cluster, "host_key_mismatch", "node-1", "running")
    assert "offered host key SHA256:" in cluster.failure_message
    assert f"offered: {lab.hosts[1].host_key}" in event.output  # what staff look at
    assert lab.exec(lab.hosts[1].name, "test -e /var/lib/runcrate", check=False).returncode != 0
    assert_clean(lab, Host.objects.get(name=lab.hosts[0].name))


def test_an_agent_that_cannot_reach_the_dashboard_fails_the_cluster(fleet, user_key, settings):
    lab = fleet
    settings.RUNCRATE_AGENT_URL = f"http://{hostlab.BRIDGE_ADDRESS}:8999"  # nothing listens
    cluster = create(project_with(user_key), machine_type("lab-h100x2-vm"), nodes=2)
    deadline = time.monotonic() + WAIT
    while cluster.nodes.filter(step=Node.Step.AGENT).count() != 2:
        assert time.monotonic() < deadline
        drive(cluster, Cluster.Status.PROVISIONING, timeout=5)
        time.sleep(0.5)
    # The agents run and retry; past the agent step's deadline the cluster fails.
    with time_machine.travel(timezone.now() + timedelta(seconds=BOOT + 1), tick=True):
        drive(cluster, Cluster.Status.FAILED, timeout=10)
    assert_failed_at(cluster, "agent_timeout", "node-0", "agent")
    released(cluster)
    for host in Host.objects.filter(nodes__cluster=cluster):
        assert_clean(lab, host)


def test_a_peer_whose_private_traffic_is_dropped_fails_the_network_step(fleet, user_key):
    lab = fleet
    lab.exec(lab.hosts[2].name, "iptables -I INPUT -i rc0 -j DROP")
    try:
        cluster = create(project_with(user_key), machine_type("lab-h100x2-vm"), nodes=3)
        drive(cluster, Cluster.Status.FAILED)
    finally:
        # The failure's release reimaged the host, rule and all, unless the test broke first.
        lab.exec(lab.hosts[2].name, "iptables -D INPUT -i rc0 -j DROP", check=False)
    event = assert_failed_at(cluster, "network_unreachable", cluster.failure_node, "network")
    assert "node-2" in cluster.failure_message  # the third host serves node-2
    assert "FAIL" in event.output  # the N×N matrix
    released(cluster)
    for host in Host.objects.filter(nodes__cluster=cluster):
        assert_clean(lab, host)


def test_a_host_with_another_gpu_model_fails_the_hardware_check(fleet, user_key):
    lab = fleet
    lab.set_gpus(lab.hosts[1].name, model="NVIDIA A100-SXM4-80GB", memory_mib=81920, count=2)
    try:
        cluster = create(project_with(user_key), machine_type("lab-h100x2-vm"), nodes=2)
        drive(cluster, Cluster.Status.FAILED)
    finally:
        lab.set_gpus(lab.hosts[1].name, model="NVIDIA H100 80GB HBM3", memory_mib=81559, count=2)
    assert_failed_at(cluster, "hardware_mismatch", "node-1", "agent")
    assert "NVIDIA A100-SXM4-80GB" in cluster.failure_message
    released(cluster)


# --- watching a ready cluster ----------------------------------------------------------------


def test_a_node_whose_agent_is_killed_is_lost_and_billed_to_its_last_heartbeat(
    fleet, user_key, settings
):
    lab = fleet
    cluster = create(project_with(user_key), machine_type("lab-h100x2-vm"), nodes=2)
    drive(cluster, Cluster.Status.READY, Cluster.Status.FAILED)
    assert cluster.status == Cluster.Status.READY, cluster.failure_message
    node1 = cluster.nodes.select_related("host").get(index=1)
    lab.exec(node1.host.name, "pkill -f '/opt/runcrate/[r]uncrate_agent.py'")
    node1.refresh_from_db()
    last = node1.heartbeat_at
    later = timezone.now() + timedelta(seconds=settings.RUNCRATE_HEARTBEAT_LOST_SECONDS + 1)
    with time_machine.travel(later, tick=True), Sim() as sim:
        # The clock jumps for the dashboard too: node-0's agent, alive, heartbeats within 30 s
        # (on the moved clock); node-1's, killed, never again.
        deadline = time.monotonic() + 45
        node0 = cluster.nodes.get(index=0)
        while node0.heartbeat_at < later:
            assert time.monotonic() < deadline, "node-0's agent stopped heartbeating"
            time.sleep(0.5)
            node0.refresh_from_db()
        assert lifecycle.watch_heartbeats() == [f"{cluster.pk}/node-1"]
        sim.dispatcher.run()
    cluster.refresh_from_db()
    node1.refresh_from_db()
    assert cluster.status == Cluster.Status.DEGRADED
    assert node1.status == Node.Status.LOST
    # Billed up to its last heartbeat (or nothing, if that came before billing started).
    usage = UsageRecord.objects.get(node=node1)
    assert usage.ended_at == max(last, usage.started_at) < later
    assert UsageRecord.objects.get(node__index=0, cluster=cluster).ended_at is None

    terminate_and_check(lab, cluster)


# --- the bootstrap on its own ----------------------------------------------------------------


def started(cluster: Cluster, index: int):
    node = cluster.nodes.select_related("host", "cluster__machine_type__location").get(index=index)
    return node, get_driver(node.host)


def bootstrap(cluster: Cluster, index: int) -> dict:
    node, driver = started(cluster, index)
    return driver.start(
        node, agent_token=lifecycle.agent_token(node), plan=lifecycle.node_plan_for(node)
    )


def test_the_bootstrap_refuses_a_system_it_does_not_support_and_changes_nothing(fleet, user_key):
    lab = fleet
    lab.exec(lab.hosts[0].name, "printf 'ID=centos\\nVERSION_ID=\"9\"\\n' > /etc/os-release")
    try:
        cluster = create(project_with(user_key), machine_type("lab-h100x2-vm"), nodes=2)
        drive(cluster, Cluster.Status.FAILED)
    finally:
        lab.reset(lab.hosts[0].name)
    assert_failed_at(cluster, "machine_failed", "node-0", "running")
    assert "centos 9 is not supported" in cluster.failure_message
    assert "Debian 12, Ubuntu 22.04 or Ubuntu 24.04" in cluster.failure_message


def test_an_imaged_host_needs_no_package_source_and_a_bare_one_says_what_it_lacks(fleet, user_key):
    lab = fleet
    cluster = create(project_with(user_key), machine_type("lab-h100x2-vm"), nodes=2)
    first = bootstrap(cluster, 0)  # from the lab's mirror where the first host lacks the packages
    assert first["wireguard"] == "wireguard-go"
    Location.objects.filter(code="lab").update(apt_mirror="", pip_index_url="")
    # The first host has everything now, like a host its operator imaged: no package source needed.
    again = bootstrap(cluster, 0)
    assert not [c for c in again["changed"] if c.startswith(("packages", "apt-source"))]
    # The second, made anew, lacks WireGuard: with no mirror the bootstrap refuses, naming it.
    lab.reset(lab.hosts[1].name)
    with pytest.raises(DriverError) as refused:
        bootstrap(cluster, 1)
    assert refused.value.reason == "machine_failed"
    assert "lacks wireguard-tools wireguard-go" in refused.value.message
    assert "no apt_mirror" in refused.value.message
    assert lab.exec(lab.hosts[1].name, "test -e /etc/runcrate", check=False).returncode != 0
    with Sim():
        lifecycle.terminate(cluster=cluster)
    drive(cluster, Cluster.Status.TERMINATED)


def test_a_worker_added_to_a_ready_cluster_joins_its_private_network(fleet, user_key, tmp_path):
    lab = fleet
    cluster = create(project_with(user_key), machine_type("lab-h100x2-vm"), nodes=2)
    drive(cluster, Cluster.Status.READY, Cluster.Status.FAILED)
    assert cluster.status == Cluster.Status.READY, cluster.failure_message
    with Sim():
        lifecycle.add_workers(cluster=cluster, count=1)
    deadline = time.monotonic() + WAIT
    with Sim() as sim:
        while not cluster.events.filter(reason__in=["worker_joined", "worker_failed"]).exists():
            assert time.monotonic() < deadline, agent_logs(cluster)
            sim.tick()
            time.sleep(0.5)
    joined = cluster.events.get(reason__in=["worker_joined", "worker_failed"])
    assert joined.reason == "worker_joined", f"{joined.message}\n{agent_logs(cluster)}"
    # The joined nodes took the worker into their WireGuard mesh, and it is billed from now.
    config = ssh_config_file(cluster, tmp_path, user_key, lab)
    assert ssh(config, "node-2", "hostname") == "node-2"
    assert ssh(config, "node-0", "ssh -o BatchMode=yes node-2 hostname") == "node-2"
    assert ssh(config, "node-2", "ping -c 1 -W 5 10.77.0.1 >/dev/null && echo up") == "up"
    assert UsageRecord.objects.filter(cluster=cluster).count() == 3
    assert [r["name"] for r in Cluster.objects.get(pk=cluster.pk).acceptance["nodes"]] == [
        "node-0",
        "node-1",
        "node-2",
    ]
    terminate_and_check(lab, cluster)
