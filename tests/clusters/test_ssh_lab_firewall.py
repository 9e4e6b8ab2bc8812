"""The private network is private, on the lab's real hosts (issue 18): each node's firewall
(bootstrap.sh's nftables table `inet runcrate`), Ray's token authentication, the Ray dashboard
through the SSH tunnel the product hands out, and no /shared session left after terminate
(docs/security.md, "Each node's firewall"). Skipped, with the reason, where the lab cannot start.

An outsider here is another lab host with a route to the head's private address added by hand
(`ip route add 10.77.0.1/32 via <head's address>`), as an attacker with root on another
cluster's node would: nothing of the cluster answers it, and on the head's public address only
sshd does.
"""

from __future__ import annotations

import json
import shlex
import socket
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from clusters import connect
from clusters.models import Cluster
from offers.models import Host
from tests.clusters.lifecycle_kit import create
from tests.clusters.test_ssh_lab import (
    drive,
    machine_type,
    project_with,
    ssh,
    ssh_config_file,
    terminate_and_check,
)
from tests.clusters.test_ssh_lab_ray import ray_logs

pytestmark = [pytest.mark.lab, pytest.mark.django_db(transaction=True)]

# Run inside a lab host: "open", "refused" or "silent" (dropped: no answer in 3 s) per port.
PROBE = """
import json, socket, sys
found = {}
for port in sys.argv[2:]:
    try:
        socket.create_connection((sys.argv[1], int(port)), timeout=3).close()
        found[port] = "open"
    except ConnectionRefusedError:
        found[port] = "refused"
    except OSError:
        found[port] = "silent"
print(json.dumps(found))
"""
# Started on the head by the test: one listener on its private address, one on every address.
PRIVATE_LISTENER = "python3 -m http.server --bind 10.77.0.1 8088"
PUBLIC_LISTENER = "python3 -m http.server --bind 0.0.0.0 8089"


def probe(lab, host: str, address: str, *ports: int) -> dict[str, str]:
    done = lab.exec(host, f"python3 - {address} {' '.join(map(str, ports))}", input=PROBE)
    return json.loads(done.stdout)


def wait_until(what: str, check, timeout: float = 30):
    """Poll `check` until it returns a true value (bounded); its last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout} s"
        time.sleep(0.5)


def free_local_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 (127.0.0.1)
            return response.status, response.read().decode(errors="replace")
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(errors="replace")


def shape_of(cluster: Cluster) -> connect.ClusterShape:
    return connect.shape_for(
        Cluster.objects.select_related("machine_type__location")
        .prefetch_related("nodes", "volumes")
        .get(pk=cluster.pk)
    )


def test_nothing_of_a_cluster_answers_outsiders_and_its_dashboard_comes_through_the_tunnel(
    fleet, user_key, tmp_path
):
    lab = fleet
    cluster = create(project_with(user_key), machine_type("lab-h100x2-vm"), nodes=2, software="ray")
    try:
        drive(cluster, Cluster.Status.READY, Cluster.Status.DEGRADED, Cluster.Status.FAILED)
    except AssertionError as error:
        raise AssertionError(f"{error}\n{ray_logs(lab, cluster)}") from None
    # The peers' WireGuard handshakes passed the firewall: the cluster joined and Ray runs.
    assert cluster.status == Cluster.Status.READY, f"{cluster.failure_message}\n" + ray_logs(
        lab, cluster
    )
    head = Host.objects.get(nodes__cluster=cluster, nodes__index=0)
    worker = Host.objects.get(nodes__cluster=cluster, nodes__index=1)
    outsider = next(h for h in lab.hosts[:3] if h.name not in (head.name, worker.name))

    # The ruleset: WireGuard's port only from the peers' set, which holds the worker's address
    # (and not the outsider's); sshd; everything else inbound dropped.
    table = lab.exec(head.name, "nft list table inet runcrate").stdout
    assert "policy drop" in table
    assert "udp dport 51820 ip saddr @wg_peers accept" in table
    assert "tcp dport 22 accept" in table or "tcp dport { 22 } accept" in table
    peers = lab.exec(head.name, "nft -j list set inet runcrate wg_peers").stdout
    elements = next(i["set"] for i in json.loads(peers)["nftables"] if "set" in i)["elem"]
    assert elements == [worker.address], elements
    # The bootstrap run again changes nothing, its firewall included.
    incoming = "/var/lib/runcrate/incoming"
    again = lab.exec(head.name, f"env INCOMING={incoming} sh {incoming}/bootstrap.sh", timeout=120)
    assert [line for line in again.stdout.splitlines() if "changed" in line] == [], again.stdout
    assert again.stdout.strip().splitlines()[-1] == "runcrate: ok"

    lab.exec(head.name, f"{PRIVATE_LISTENER} >/dev/null 2>&1 & {PUBLIC_LISTENER} >/dev/null 2>&1 &")
    lab.exec(outsider.name, f"ip route add 10.77.0.1/32 via {head.address}")
    try:
        # The listeners are up: the head reaches both, and the worker the private one, over rc0.
        wait_until(
            "the listeners",
            lambda: (
                set(probe(lab, head.name, "127.0.0.1", 8089).values()) == {"open"}
                and set(probe(lab, head.name, "10.77.0.1", 8088).values()) == {"open"}
            ),
        )
        assert probe(lab, worker.name, "10.77.0.1", 8088, 8265, 22) == dict.fromkeys(
            ("8088", "8265", "22"), "open"
        )

        # From outside the cluster, with a route to 10.77.0.1 by hand: nothing answers, not
        # sshd, not Ray's dashboard and job API (8265), GCS (6379), client (10001), nor the
        # listener on the private address.
        private = probe(lab, outsider.name, "10.77.0.1", 22, 8265, 6379, 10001, 8088)
        assert private == dict.fromkeys(private, "silent"), private
        # On the head's public address only sshd answers: not Ray's ports (some of Ray's listen
        # on every address), nor a listener on 0.0.0.0, nor the agent's sink.
        public = probe(lab, outsider.name, head.address, 22, 8265, 6379, 10001, 8089, 7077, 7078)
        assert public == {"22": "open", **dict.fromkeys(list(public)[1:], "silent")}, public
    finally:
        lab.exec(outsider.name, f"ip route del 10.77.0.1/32 via {head.address}", check=False)
        lab.exec(head.name, "pkill -f 'http.server --bind'", check=False)

    # Ray asks for its token: the head's own ray commands have it (the check passed), and
    # `ray get-auth-token` on node-0 prints it, as the connect panel says.
    config = ssh_config_file(cluster, tmp_path, user_key, lab)
    shape = shape_of(cluster)
    info = connect.ray_info(shape)
    token = ssh(config, "node-0", info["token_command"])
    assert len(token) == 64, token

    # The tunnel the product hands out, run with the real ssh client and the user's key, on a
    # free local port: it brings back Ray's dashboard, whose API wants the token.
    command = shlex.split(info["dashboard_tunnel"])
    assert command[:4] == ["ssh", "-N", "-L", "8265:10.77.0.1:8265"], command
    port = free_local_port()
    known = tmp_path / "known_hosts"
    alias = shape.host_key_alias(shape.head)
    tunnel = subprocess.Popen(
        [
            "ssh",
            "-i", str(user_key), "-o", "IdentitiesOnly=yes",
            "-o", f"UserKnownHostsFile={known}", "-o", f"HostKeyAlias={alias}",
            "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes",
            "-o", "ExitOnForwardFailure=yes",
            "-N", "-L", f"{port}:10.77.0.1:8265", *command[4:],
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:

        def dashboard():
            assert tunnel.poll() is None, tunnel.stderr.read()
            try:
                return get(f"http://127.0.0.1:{port}/")
            except OSError:
                return None

        status, page = wait_until("the tunnel", dashboard)
        assert status == 200 and "<title>Ray Dashboard</title>" in page, page[:300]
        jobs = f"http://127.0.0.1:{port}/api/jobs/"
        assert get(jobs)[0] == 401  # the job API without the token
        assert get(jobs, {"Authorization": "Bearer wrong"})[0] == 403
        assert get(jobs, {"Authorization": f"Bearer {token}"})[0] == 200
    finally:
        tunnel.terminate()
        try:
            tunnel.wait(10)
        except subprocess.TimeoutExpired:  # our own client, slow to leave: it is killed
            tunnel.kill()
            tunnel.wait(10)

    # /shared's session is there before terminate, and gone after it, on both hosts.
    assert lab.exec(worker.name, "pgrep -af '[s]shfs'").stdout.strip()
    assert lab.exec(head.name, "pgrep -af '[s]ftp-server'").stdout.strip()
    terminate_and_check(lab, cluster)
    for host in (head, worker):
        for what in ("[s]shfs", "[s]ftp-server", "[-]s sftp"):
            left = lab.exec(host.name, f"pgrep -af -- '{what}'", check=False)
            assert left.stdout.strip() == "", f"{host.name} keeps {left.stdout}"
        assert lab.exec(host.name, "nft list table inet runcrate", check=False).returncode != 0
