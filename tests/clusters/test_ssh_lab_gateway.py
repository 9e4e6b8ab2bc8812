"""The jump user on the lab's real SSH gateway (lab-gw; clusters/machines/software/host/gateway.sh,
and
`gateway_sync` in clusters/machines/ssh.py): created once per cluster under the gateway's lock
however many node starts race for it, its home its own, reachable by the user's key through the
gateway to the cluster's hosts only, and removed whole (user, group, home, mail spool, the
gateway's record) when the last node leaves, even while a jump session is open. Skipped, with the
reason, where the lab cannot start (docs/lab.md).
"""

from __future__ import annotations

import base64
import threading
from pathlib import Path

import paramiko
import pytest

from clusters import lifecycle
from clusters.machines.ssh import gateway_sync
from clusters.models import Cluster, Node
from tests.clusters.lifecycle_kit import Sim, create
from tests.clusters.test_ssh_lab import (
    drive,
    machine_type,
    project_with,
    released,
    ssh,
    ssh_config_file,
)

pytestmark = [pytest.mark.lab, pytest.mark.django_db(transaction=True)]

ROUNDS = 10  # the loop of 10: every round reachable, nothing left after it
WHOLE_ROUNDS = 10


def gateway_client(lab, user: str, user_key: Path) -> paramiko.SSHClient:
    """A session as the jump user on the gateway, its host key pinned, the user's key only."""
    client = paramiko.SSHClient()
    gateway = lab.gateway
    kind, blob = gateway.host_key.split()[:2]
    pinned = paramiko.PKey.from_type_string(kind, base64.b64decode(blob))
    client.get_host_keys().add(gateway.address, kind, pinned)
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    client.connect(
        gateway.address,
        port=gateway.port,
        username=user,
        pkey=paramiko.Ed25519Key.from_private_key_file(str(user_key)),
        look_for_keys=False,
        allow_agent=False,
        timeout=10,
        banner_timeout=10,
        auth_timeout=10,
    )
    return client


def banner_through(client: paramiko.SSHClient, address: str, port: int = 22) -> bytes:
    """What the host at address:port says first, through the gateway's forwarding (what
    `ssh -J` does); raises paramiko.ChannelException where the gateway refuses it."""
    channel = client.get_transport().open_channel(
        "direct-tcpip", (address, port), ("127.0.0.1", 0), timeout=10
    )
    try:
        channel.settimeout(10)
        return channel.recv(64)
    finally:
        channel.close()


def gateway_has_nothing_of(lab, user: str) -> None:
    done = lab.exec(
        lab.gateway.name,
        f"getent passwd {user}; getent group {user}; ls -d /home/{user} /var/mail/{user}"
        f" /var/lib/runcrate-gateway/{user} 2>/dev/null; pgrep -u {user} 2>/dev/null",
        check=False,
    )
    assert done.stdout == "", f"the gateway keeps {user}: {done.stdout}"


def concurrently(*calls) -> None:
    """Every call at once (each in its own thread, its own database connection); re-raises."""
    from django.db import connection

    errors = []
    barrier = threading.Barrier(len(calls))

    def run(call):
        try:
            barrier.wait(10)
            call()
        except BaseException as error:  # noqa: BLE001 - re-raised below
            errors.append(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(call,)) for call in calls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not any(t.is_alive() for t in threads), "a gateway_sync did not end within 120 s"
    if errors:
        raise errors[0]


def test_racing_node_starts_and_stops_make_one_jump_user_and_leave_nothing(fleet, user_key):
    """Each round: both nodes' starts (and the install's second start) sync at once, the user
    reaches both hosts and nothing else; then both nodes leave at once, a jump session still
    open, and the gateway keeps nothing of the user. The first round finds a stale home, owned
    by another uid, where the user is about to be made (what the deep test found)."""
    lab = fleet
    cluster = create(project_with(user_key), machine_type("lab-gw-h100x2-vm"), nodes=2)
    nodes = list(
        Node.objects.filter(cluster=cluster)
        .select_related("host", "cluster__machine_type__location")
        .order_by("index")
    )
    assert [n.holds_host for n in nodes] == [True, True]
    assert all(n.status in Node.LIVE for n in nodes)
    hosts = [n.host.address for n in nodes]
    user = f"c{cluster.pk}"
    outsider = next(h.address for h in lab.hosts if h.address not in hosts)
    gw = lab.gateway.name
    lab.exec(gw, f"mkdir -p /home/{user}/.ssh && chown -R 4242:4242 /home/{user}")
    try:
        for _ in range(ROUNDS):
            concurrently(*[lambda n=n: gateway_sync(n) for n in nodes + nodes])
            info = lab.exec(
                gw,
                f"getent passwd {user} | wc -l; stat -c '%U %a' /home/{user} /home/{user}/.ssh"
                f" /home/{user}/.ssh/authorized_keys; ls -A /home/{user}/.ssh",
            ).stdout.split("\n")
            assert info[:5] == ["1", f"{user} 750", f"{user} 700", f"{user} 600", "authorized_keys"]
            keys = lab.exec(gw, f"cat /home/{user}/.ssh/authorized_keys").stdout.splitlines()
            assert len(keys) == 1 and keys[0].endswith("user@test")
            assert keys[0].startswith(
                "restrict,port-forwarding,"
                + ",".join(f'permitopen="{a}:22"' for a in sorted(hosts))
                + " "
            )
            client = gateway_client(lab, user, user_key)
            try:
                for address in hosts:
                    assert banner_through(client, address).startswith(b"SSH-2.0-")
                with pytest.raises(paramiko.ChannelException):
                    banner_through(client, outsider)
                # Both leave at once while the user's session is open; each still holds its
                # host in the dashboard's eyes (a stop syncs before the host is released).
                concurrently(*[lambda n=n: gateway_sync(n, leaving=True) for n in nodes])
            finally:
                client.close()
            gateway_has_nothing_of(lab, user)
    finally:
        lab.exec(gw, f"pkill -u {user}; userdel -r -f {user}; rm -rf /home/{user}", check=False)


def test_every_gateway_cluster_is_reachable_and_terminate_leaves_no_home(fleet, user_key, tmp_path):
    """Whole clusters, one after another on the gateway's two hosts: the user reaches every
    node through the gateway with the product's SSH config (a real `ssh -J`), never a host of
    another cluster; terminate leaves the gateway nothing of the jump user."""
    lab = fleet
    project = project_with(user_key)
    for round in range(WHOLE_ROUNDS):
        cluster = create(project, machine_type("lab-gw-h100x2-vm"), nodes=2, name=f"gw-{round}")
        drive(cluster, Cluster.Status.READY, Cluster.Status.FAILED)
        assert cluster.status == Cluster.Status.READY, cluster.failure_message
        folder = tmp_path / str(round)
        folder.mkdir()
        config = ssh_config_file(cluster, folder, user_key, lab)
        for name in ("node-0", "node-1"):
            assert ssh(config, name, "hostname") == name
        held = set(cluster.nodes.values_list("host__address", flat=True))
        outsider = next(h.address for h in lab.hosts if h.address not in held)
        client = gateway_client(lab, f"c{cluster.pk}", user_key)
        try:
            with pytest.raises(paramiko.ChannelException):
                banner_through(client, outsider)
        finally:
            client.close()
        with Sim():
            lifecycle.terminate(cluster=cluster)
        drive(cluster, Cluster.Status.TERMINATED)
        gateway_has_nothing_of(lab, f"c{cluster.pk}")
        released(cluster)  # reimaged, verified pristine and free for the next round


def test_a_jump_user_may_forward_only_locally_and_leaves_no_socket(fleet, user_key):
    """`ssh -R` (a listener on the gateway) and stream-local forwards (a socket file owned by a
    uid the next jump user may get) are refused; `ssh -J` to the cluster's own hosts works; a
    file the user left in /tmp goes with the user."""
    lab = fleet
    cluster = create(project_with(user_key), machine_type("lab-gw-h100x2-vm"), nodes=2)
    nodes = list(Node.objects.filter(cluster=cluster).select_related("host").order_by("index"))
    user = f"c{cluster.pk}"
    gw = lab.gateway.name
    try:
        for node in nodes:
            gateway_sync(node)
        client = gateway_client(lab, user, user_key)
        try:
            assert banner_through(client, nodes[0].host.address).startswith(b"SSH-2.0-")
            transport = client.get_transport()
            with pytest.raises(paramiko.SSHException):
                transport.request_port_forward("127.0.0.1", 28000)
            socket_path = f"/tmp/{user}.sock"
            answer = transport.global_request(
                "streamlocal-forward@openssh.com", data=(socket_path,), wait=True
            )
            assert answer is None  # refused
            assert lab.exec(gw, f"ls {socket_path}", check=False).returncode != 0
            listening = lab.exec(gw, "ss -Hltn 'sport = :28000'", check=False).stdout
            assert listening.strip() == ""
        finally:
            client.close()
        # What the user's uid owns in /tmp (made here as that user) goes with the user.
        lab.exec(gw, f"su -s /bin/sh {user} -c 'touch /tmp/{user}.left'")
        for node in nodes:
            gateway_sync(node, leaving=True)
        assert lab.exec(gw, f"ls /tmp/{user}.left", check=False).returncode != 0
        gateway_has_nothing_of(lab, user)
    finally:
        lab.exec(gw, f"pkill -u {user}; userdel -r -f {user}; rm -rf /home/{user}", check=False)
