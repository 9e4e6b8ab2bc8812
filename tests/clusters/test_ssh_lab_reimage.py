"""Tenants never meet on the lab's real hosts (issue 18, docs/inventory.md "Reimage before
reuse"): a tenant is root on their nodes, so a host goes back to the pool only reimaged and
verified against its baseline by the product's own reader; without a reimage command it stays
dirty, out of every offer. The tenant here is root inside the host (what every user is)."""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import pytest
from django.utils import timezone

from clusters import lifecycle
from clusters.errors import ClusterRefused
from clusters.machines import hosts, pristine
from clusters.machines.ssh import verify_host
from clusters.models import Cluster, Node
from lab import hostlab
from offers.models import Host, Location
from offers.offers import get_offer
from tests.clusters.lifecycle_kit import Sim, create
from tests.clusters.test_ssh_lab import (
    WAIT,
    assert_clean,
    drive,
    machine_type,
    project_with,
    released,
)

pytestmark = [pytest.mark.lab, pytest.mark.django_db(transaction=True)]

READY = Cluster.Status.READY
TYPE = "lab-h100x2-vm"

# What a tenant with root leaves behind to come back later, and a verification of the host's
# own making that lies: a pgrep that never finds anything, an `sh` that says the wipe went well
# and the host is clean whatever it is asked.
BACKDOOR = r"""
key=$(cat)
printf '%s\n' "$key" >> /root/.ssh/authorized_keys
useradd --create-home eve
echo '* * * * * root /usr/local/bin/backdoor' > /etc/cron.d/backdoor
printf '#!/bin/sh\necho owned\n' > /usr/local/bin/backdoor && chmod 755 /usr/local/bin/backdoor
nohup python3 -m http.server 8088 --bind 0.0.0.0 >/dev/null 2>&1 &
i=0
until python3 -c 'import socket; socket.create_connection(("127.0.0.1", 8088))' 2>/dev/null; do
  i=$((i+1)); [ $i -lt 100 ] || exit 1; sleep 0.1
done
"""
LIARS = r"""
printf '#!/usr/bin/dash\nexit 1\n' > /usr/bin/pgrep
printf '#!/usr/bin/dash\ncat >/dev/null\necho "runcrate: wiped"\necho "runcrate: clean"\n' \
  > /usr/local/bin/lying-sh && chmod 755 /usr/local/bin/lying-sh
ln -sf /usr/local/bin/lying-sh /usr/bin/sh
"""
LEFTOVERS = {
    "the key": "grep -q attacker@test /root/.ssh/authorized_keys",
    "the user": "grep -q '^eve:' /etc/passwd",
    "the home": "test -e /home/eve",
    "the cron file": "test -e /etc/cron.d/backdoor",
    "the binary": "test -e /usr/local/bin/backdoor",
    "the listener": "python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", 8088))'",
}


def keygen(path: Path, comment: str) -> Path:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True,
    )
    return path


def ssh_as(key: Path, host: Host, tmp_path: Path) -> subprocess.CompletedProcess:
    """The real ssh client, logging in as root with `key`, the host key pinned."""
    known = tmp_path / "known_hosts_attacker"
    known.write_text(f"{host.address} {host.host_key}\n")
    return subprocess.run(
        [
            "ssh", "-i", str(key), "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
            "-o", f"UserKnownHostsFile={known}", "-o", "StrictHostKeyChecking=yes",
            "-o", "ConnectTimeout=10", f"root@{host.address}", "hostname",
        ],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip


def leave_things(lab, cluster: Cluster, attacker: Path) -> list[Host]:
    """As root on each of the cluster's machines: the backdoor, seen to be there, then the liars
    (from then on every `sh -c` in the host, `lab.exec`'s included, answers yes)."""
    machines = [n.host for n in cluster.nodes.select_related("host").order_by("index")]
    public = attacker.with_suffix(".pub").read_text()
    for host in machines:
        lab.exec(host.name, BACKDOOR, input=public)
        assert found(lab, host) == list(LEFTOVERS), host.name
        lab.exec(host.name, LIARS)
    return machines


def found(lab, host: Host) -> list[str]:
    return [
        what
        for what, command in LEFTOVERS.items()
        if lab.exec(host.name, command, check=False).returncode == 0
    ]


def terminated(cluster: Cluster, *, allowed) -> None:
    with Sim():
        lifecycle.terminate(cluster=cluster)
    drive(cluster, Cluster.Status.TERMINATED)
    released(cluster, allowed=allowed)


def test_a_reimage_removes_everything_a_tenant_left_and_the_old_key_never_logs_in_again(
    fleet, user_key, tmp_path
):
    cluster = create(project_with(user_key), machine_type(TYPE), nodes=2)
    drive(cluster, READY)
    attacker = keygen(tmp_path / "attacker", "attacker@test")
    machines = leave_things(fleet, cluster, attacker)
    head = machines[0]
    assert ssh_as(attacker, head, tmp_path).returncode == 0  # and the backdoor opens

    terminated(cluster, allowed={Host.State.FREE})

    for host in machines:
        host.refresh_from_db()
        assert host.state == Host.State.FREE and host.pristine_report == ""
        assert found(fleet, host) == [], host.name
        assert verify_host(host) == []
        assert_clean(fleet, host)
    refused = ssh_as(attacker, head, tmp_path)
    assert refused.returncode == 255 and "Permission denied" in refused.stderr
    assert "stopped and wiped" in cluster.events.get(reason="terminated").message


def test_without_a_reimage_command_the_hosts_stay_dirty_and_out_of_every_offer(
    fleet, user_key, tmp_path
):
    Location.objects.filter(code="lab").update(reimage="")
    lab_type = machine_type(TYPE)
    project = project_with(user_key)
    cluster = create(project, lab_type, nodes=2)
    drive(cluster, READY)
    attacker = keygen(tmp_path / "attacker", "attacker@test")
    # The tenant's liars make the wipe and verify.sh say all is well: the host goes dirty all
    # the same, since a tenant was root on it and nothing reimaged it.
    machines = leave_things(fleet, cluster, attacker)

    terminated(cluster, allowed={Host.State.DIRTY})

    for host in machines:
        host.refresh_from_db()
        assert host.state == Host.State.DIRTY
        assert "reimage command" in host.pristine_report
    assert get_offer(slug=TYPE, nodes=1).nodes_available == lab_type.hosts.count() - 2
    with pytest.raises(ClusterRefused) as refused:
        create(project, lab_type, nodes=2)
    assert refused.value.code == "not_enough_machines"

    # Staff's Mark free verifies with the product's own reader: the lies change nothing.
    ids = [h.pk for h in machines]
    outcome = hosts.return_to_service(ids)
    assert outcome.done == []
    for host in machines:
        host.refresh_from_db()
        assert host.state == Host.State.DIRTY
        report = host.pristine_report
        for expected in (
            "a user eve",
            "/root/.ssh/authorized_keys is not what it was",
            "/etc/cron.d/backdoor was added",
            "/usr/local/bin/backdoor was added",
            "something listens on tcp 0.0.0.0:8088",
            "/usr/bin/pgrep changed",
            "/usr/bin/sh changed",
        ):
            assert expected in report, (expected, report)

    # A "reimage" that does nothing is found out too.
    Location.objects.filter(code="lab").update(reimage="true")
    assert hosts.reimage_now(ids).done == []
    assert set(Host.objects.filter(pk__in=ids).values_list("state", flat=True)) == {"dirty"}

    # The lab's real reimage: pristine, and back in the pool.
    Location.objects.filter(code="lab").update(reimage=hostlab.reimage_command())
    outcome = hosts.reimage_now(ids)
    assert sorted(outcome.done) == sorted(h.name for h in machines), outcome.refused
    for host in machines:
        host.refresh_from_db()
        assert host.state == Host.State.FREE and found(fleet, host) == []
    assert get_offer(slug=TYPE, nodes=1).nodes_available == lab_type.hosts.count()


def test_mark_free_returns_an_offline_host_only_once_it_is_verified_pristine(fleet, tmp_path):
    host = Host.objects.get(name=fleet.hosts[0].name)
    Host.objects.filter(pk=host.pk).update(state=Host.State.OFFLINE)
    fleet.exec(host.name, "useradd mallory")

    assert hosts.return_to_service([host.pk]).done == []
    host.refresh_from_db()
    assert host.state == Host.State.DIRTY and "a user mallory" in host.pristine_report

    fleet.reset(host.name)
    assert hosts.return_to_service([host.pk]).done == [host.name]
    host.refresh_from_db()
    assert host.state == Host.State.FREE and host.pristine_report == ""


def test_a_terminate_during_the_bootstrap_waits_for_it_and_leaves_the_hosts_pristine(
    fleet, user_key
):
    cluster = create(project_with(user_key), machine_type(TYPE), nodes=2)
    head = cluster.nodes.select_related("host").get(index=0)
    failures = []

    def boot() -> None:  # the machines worker: hands off and runs the starts
        try:
            with Sim() as sim:
                sim.tick()
        except Exception as error:  # noqa: BLE001 (reported by the test below)
            failures.append(error)

    worker = threading.Thread(target=boot, daemon=True)
    worker.start()
    deadline = time.monotonic() + WAIT
    # The bracket keeps pgrep from finding the shell that runs it (`sh -c 'pgrep …'`, whose
    # command line holds the pattern): without it the wait ended at once, before the bootstrap
    # (or even the start's hand-off) began.
    bootstrap = "pgrep -f 'incoming/[b]ootstrap.sh'"
    while fleet.exec(head.host.name, bootstrap, check=False).returncode:
        assert worker.is_alive() and time.monotonic() < deadline, "the bootstrap never began"
        time.sleep(0.05)
    lifecycle.terminate(cluster=cluster)  # while node-0's bootstrap runs
    head.refresh_from_db()
    # The start keeps its lease.
    held = (head.lease_token, head.lease_expires_at, timezone.now(), head.driver_state)
    assert head.status == Node.Status.ENDED and head.lease_is_held(), held
    worker.join(WAIT)
    assert not worker.is_alive() and failures == []

    drive(cluster, Cluster.Status.TERMINATED)
    released(cluster, allowed={Host.State.FREE})
    head.refresh_from_db()
    # The bootstrap finished and landed before the stop began; node-1's never began.
    assert head.driver_state["start"]["ok"] is True, head.driver_state["start"]
    assert head.driver_state["start"]["at"] < head.driver_state["stop"]["at"]
    worker_node = cluster.nodes.get(index=1)
    assert "start" not in worker_node.driver_state
    for node in cluster.nodes.select_related("host"):
        assert verify_host(node.host) == [], node.name
        assert_clean(fleet, node.host)


# What a tenant plants to hang or flood the check before reuse (issue 33, L2): a FIFO, which
# blocks whoever opens it, and links to /dev/zero, which never end.
TRAPS = r"""
useradd --create-home evil
mkdir -p /home/evil/.ssh
mkfifo /home/evil/.ssh/authorized_keys
ln -s /dev/zero /root/.ssh/authorized_keys2
mv /var/lib/dpkg/status /var/lib/dpkg/status.real
ln -s /dev/zero /var/lib/dpkg/status
"""


def test_mark_free_on_a_booby_trapped_host_answers_in_time_and_leaves_it_dirty(fleet):
    host = Host.objects.get(name=fleet.hosts[0].name)
    Host.objects.filter(pk=host.pk).update(state=Host.State.DIRTY)
    fleet.exec(host.name, TRAPS)
    try:
        started = time.monotonic()
        outcome = hosts.return_to_service([host.pk])
        took = time.monotonic() - started

        assert outcome.done == []
        assert took < 60, took  # it took forever (the FIFO) or grew without end (/dev/zero)
        host.refresh_from_db()
        assert host.state == Host.State.DIRTY
        for planted in (
            "/home/evil/.ssh/authorized_keys is a FIFO",
            "/root/.ssh/authorized_keys2 is a link to /dev/zero",
            "/var/lib/dpkg/status is a link to /dev/zero",
        ):
            assert planted in host.pristine_report
    finally:
        fleet.reset(host.name)


def test_a_same_size_system_program_with_its_time_restored_is_found(fleet):
    host = Host.objects.get(name=fleet.hosts[0].name)
    fleet.exec(
        host.name,
        "size=$(stat -c %s /usr/bin/pgrep); cp -p /usr/bin/pgrep /tmp/pgrep.orig; "
        "{ printf '#!/bin/sh\\nexit 1\\n'; head -c $((size - 17)) /dev/zero; } > /usr/bin/pgrep; "
        "touch -r /tmp/pgrep.orig /usr/bin/pgrep; rm /tmp/pgrep.orig; "
        'test "$(stat -c %s /usr/bin/pgrep)" = "$size"',
    )
    try:
        started = time.monotonic()
        found = [d.message for d in verify_host(host)]
        print(f"verified in {time.monotonic() - started:.1f} s")
        assert "/usr/bin/pgrep changed" in found
    finally:
        fleet.reset(host.name)


# A tenant's leftovers that only a check by content finds (issue 33, L3 and L3b): a library with
# one byte changed, its size and time kept; a file in /var/lib; one byte in the middle of a big
# file (hashed on the host: it never crosses SFTP).
BIG = "/usr/local/share/big.bin"
LEFT_BY_CONTENT = f"""
lib=$(readlink -f /usr/lib/x86_64-linux-gnu/libz.so.1) && echo "$lib"
cp -p "$lib" /tmp/lib.orig && printf X | dd of="$lib" bs=1 seek=4096 conv=notrunc 2>/dev/null
touch -r /tmp/lib.orig "$lib" && rm /tmp/lib.orig
cp -p {BIG} /tmp/big.orig 2>/dev/null
printf X | dd of={BIG} bs=1 seek=100000000 conv=notrunc 2>/dev/null
touch -r /tmp/big.orig {BIG} && rm /tmp/big.orig
echo evil > /var/lib/evil.dat
"""
# And what makes the host's own sha256sum lie: a function in root's .bashrc (bash reads it for
# every command sshd runs) and a wrapper in place of the program.
LIARS_FOR_THE_HASH = r"""
echo 'sha256sum() { echo lies; }' >> /root/.bashrc
mv /usr/bin/sha256sum /usr/bin/sha256sum.real
printf '#!/bin/sh\nexec /usr/bin/sha256sum.real "$@"\n' > /usr/bin/sha256sum
chmod 755 /usr/bin/sha256sum
"""


def test_a_changed_library_a_var_lib_file_and_a_big_file_are_found_by_content(fleet, monkeypatch):
    host = Host.objects.get(name=fleet.hosts[0].name)
    fleet.exec(host.name, f"yes runcrate | head -c {256 * 1024 * 1024} > {BIG}")
    read_over_sftp = []
    capped = pristine._capped
    monkeypatch.setattr(
        pristine, "_capped", lambda *a, **k: read_over_sftp.append(len(r := capped(*a, **k))) or r
    )
    try:
        assert hosts.record_baselines([host.pk]).done == [host.name]
        host.refresh_from_db()
        library = fleet.exec(host.name, LEFT_BY_CONTENT).stdout.strip()
        read_over_sftp.clear()

        found = [d.message for d in verify_host(host)]

        assert found == [
            f"{library} changed",
            f"{BIG} changed",
            "/var/lib/evil.dat was added",
        ], found
        # 256 MiB compared by content, and what crossed SFTP is what the hash depends on.
        assert 0 < sum(read_over_sftp) < 32 * 1024 * 1024, sum(read_over_sftp)

        fleet.exec(host.name, LIARS_FOR_THE_HASH)
        Host.objects.filter(pk=host.pk).update(state=Host.State.DIRTY)
        assert hosts.return_to_service([host.pk]).done == []
        host.refresh_from_db()
        first, *rest = host.pristine_report.splitlines()
        assert first.startswith("the host's own sha256sum was not trusted"), first
        assert "/root/.bashrc is not what it was" in first
        assert "/usr/bin/sha256sum is not what it was" in first
        assert "/var/lib/evil.dat was added" in rest
        assert "/usr/bin/sha256sum.real was added" in rest

        # A name that is not UTF-8 (paramiko cannot decode it) is no verification, not a crash.
        fleet.exec(host.name, "touch \"/var/lib/$(printf '\\377')\"")
        outcome = hosts.return_to_service([host.pk])
        assert "a name in /var/lib is not UTF-8" in outcome.refused[host.name], outcome.refused
        host.refresh_from_db()
        assert host.state == Host.State.DIRTY
    finally:
        fleet.reset(host.name)
