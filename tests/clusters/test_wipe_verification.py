"""The ssh driver's release verifies what it cleaned (clusters/machines/ssh.py `SshDriver.stop`):
after the wipe, verify.sh over a new session; after a reimage, the host read against its
baseline. A verification that finds something left means the release fails (the wipe) or the
host is not pristine (the reimage), naming what was left. Stand-in SSH sessions replace the
connection at its boundary (`ssh.host_session`), as tests/clusters/test_network_test_hosts.py
does."""

from __future__ import annotations

from contextlib import contextmanager

import pytest
from django.utils import timezone

from clusters.machines import pristine, ssh
from clusters.machines.base import DriverError
from clusters.models import Cluster, Node
from offers.models import Host
from tests.factories import ClusterFactory

LEFTOVERS = (
    "runcrate: checking\n"
    "leftover: /etc/runcrate\n"
    "leftover: process 4242 (sleep infinity) of the cluster\n"
)


class Hosts:
    """Stand-in SSH sessions: each script run answers what `answers` says for it; every
    session opened and every script run is recorded."""

    def __init__(self, answers: dict[str, tuple[int, str]]) -> None:
        self.answers = answers  # script name ("wipe.sh", "verify.sh") or command -> answer
        self.sessions = 0
        self.ran: list[tuple[int, str]] = []  # (session, script name or command)

    def _script(self, stdin: str | None) -> str | None:
        for name in ("wipe.sh", "verify.sh"):
            if stdin is not None and stdin == ssh.host_script(name):
                return name
        return None

    @contextmanager
    def session(self, host):
        self.sessions += 1
        number, hosts = self.sessions, self

        class Session:
            where = f"{host.address}:{host.port}"

            def run(self, command, *, stdin=None, timeout=None):
                what = hosts._script(stdin) or command
                hosts.ran.append((number, what))
                return hosts.answers.get(what, (0, ""))

        yield Session()


def released_node(**host_fields) -> Node:
    now = timezone.now()
    cluster = ClusterFactory(
        size=2,
        status=Cluster.Status.TERMINATING,
        joined_at=now,
        ready_at=now,
        machines=True,
        machines__status=Node.Status.JOINED,
    )
    node = cluster.nodes.select_related("host", "cluster__machine_type__location").get(index=1)
    Host.objects.filter(pk=node.host_id).update(driver="ssh", user="root", **host_fields)
    node.host.refresh_from_db()
    return node


def stop(monkeypatch, hosts: Hosts, node: Node):
    monkeypatch.setattr(ssh, "host_session", hosts.session)
    return ssh.SshDriver().stop(node)


# --- the wipe, then verify.sh -----------------------------------------------------------------


def test_a_wipe_that_leaves_something_fails_the_release_naming_it(db, monkeypatch):
    node = released_node()
    hosts = Hosts({"wipe.sh": (0, "runcrate: ok\n"), "verify.sh": (1, LEFTOVERS)})

    with pytest.raises(DriverError) as failed:
        stop(monkeypatch, hosts, node)

    assert failed.value.message == (
        f"{node.host.name} is not clean after the wipe: /etc/runcrate; "
        "process 4242 (sleep infinity) of the cluster"
    )
    assert "leftover: /etc/runcrate" in failed.value.output
    # The verification ran after the wipe, over a session of its own.
    assert hosts.ran == [(1, "wipe.sh"), (2, "verify.sh")]


def test_a_wipe_verified_clean_releases_the_host_as_not_pristine(db, monkeypatch):
    node = released_node()
    hosts = Hosts({"wipe.sh": (0, "runcrate: ok\n"), "verify.sh": (0, "runcrate: clean\n")})

    released = stop(monkeypatch, hosts, node)

    assert hosts.ran == [(1, "wipe.sh"), (2, "verify.sh")]
    # Without a reimage a tenant's root may have left what no wipe finds: never pristine.
    assert released.pristine is False
    assert "reimage it" in released.why


# --- the reimage, then the baseline ----------------------------------------------------------


BASELINE = {
    "version": pristine.VERSION,
    "files": {"/etc/passwd": "f 0644 0:0 aa"},
    "packages": {"openssh-server": "1:9.2p1-2+deb12u3"},
    "users": ["root"],
    "authorized_keys": {"/root/.ssh/authorized_keys": "k1"},
    "sockets": ["tcp 0.0.0.0:22"],
    "programs": ["/usr/sbin/sshd"],
    "cluster_processes": [],
}


@pytest.mark.parametrize(
    ("left", "named"),
    [
        (
            {"files": {**BASELINE["files"], "/etc/cron.d/backdoor": "f 0644 0:0 bb"}},
            "/etc/cron.d/backdoor was added",
        ),
        (
            {"sockets": ["tcp 0.0.0.0:22", "tcp 0.0.0.0:8088"]},
            "something listens on tcp 0.0.0.0:8088",
        ),
    ],
)
def test_a_reimaged_host_that_differs_from_its_baseline_is_not_pristine(
    db, monkeypatch, left, named
):
    node = released_node(reimage="true", baseline=BASELINE)
    monkeypatch.setattr(ssh, "read_host", lambda host, baseline: {**BASELINE, **left})
    hosts = Hosts({})

    released = stop(monkeypatch, hosts, node)

    assert released.pristine is False
    assert named in released.why
    assert hosts.ran == [(1, "true")]  # the reimage's wait for the host: nothing wiped


def test_a_reimaged_host_equal_to_its_baseline_is_pristine(db, monkeypatch):
    node = released_node(reimage="true", baseline=BASELINE)
    monkeypatch.setattr(ssh, "read_host", lambda host, baseline: dict(BASELINE))

    released = stop(monkeypatch, Hosts({}), node)

    assert (released.pristine, released.why) == (True, "")
