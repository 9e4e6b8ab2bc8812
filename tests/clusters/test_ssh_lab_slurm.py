"""Slurm on the lab's real hosts: the real installer
(clusters/machines/software/host/install-slurm.sh),
packages from the lab's mirror, munge, slurmctld and slurmd as daemons (no systemd), the real
`sinfo` check; users run jobs over the product's SSH config; terminate leaves the hosts clean
(docs/drivers.md, "Slurm on ssh hosts"). Skipped, with the reason, where the lab cannot start.
"""

from __future__ import annotations

import re
import time

import pytest
from django.utils import timezone

from clusters.machines.base import CheckState
from clusters.models import Cluster, Event
from offers.models import Host
from tests.clusters import test_ssh_lab as base
from tests.clusters.lifecycle_kit import create
from tests.clusters.test_ssh_lab import (
    drive,
    machine_type,
    project_with,
    ssh,
    ssh_config_file,
    terminate_and_check,
)

pytestmark = [pytest.mark.lab, pytest.mark.django_db(transaction=True)]

SLURM_LEFTOVERS = {
    "slurmd": "! pgrep -x 'slurmd|slurmd-wlm'",
    "slurmctld": "! pgrep -x 'slurmctld|slurmctld-wlm'",
    "munged": "! pgrep -x munged",
    "munge key": "test ! -e /etc/munge/munge.key",
    "slurm.conf": "test ! -e /etc/slurm/slurm.conf",
}


def slurm_logs(lab, cluster: Cluster) -> str:
    """What Slurm said on the cluster's hosts, for a test that failed."""
    logs = []
    for node in cluster.nodes.select_related("host"):
        done = lab.exec(
            node.host.name,
            "sinfo -N -l; ps -eo pid,comm,args | grep -E '[s]lurm|[m]unge';"
            " tail -n 25 /var/log/slurm/*.log /var/log/munge/munged.log",
            check=False,
        )
        logs.append(f"--- {node.name} ({node.host.name}):\n{done.stdout}{done.stderr}")
    return "\n".join(logs)


def test_a_slurm_cluster_runs_jobs_on_real_hosts_and_terminate_wipes_it(fleet, user_key, tmp_path):
    lab = fleet
    cluster = create(
        project_with(user_key), machine_type("lab-h100x2-vm"), nodes=2, software="slurm"
    )
    try:
        drive(cluster, Cluster.Status.READY, Cluster.Status.DEGRADED, Cluster.Status.FAILED)
    except AssertionError as error:
        raise AssertionError(f"{error}\n{slurm_logs(lab, cluster)}") from None
    events = "\n".join(
        f"  {e.reason}: {e.message}\n{e.output[-3000:]}" for e in cluster.events.all()
    )
    assert cluster.status == Cluster.Status.READY, events

    config = ssh_config_file(cluster, tmp_path, user_key, lab)
    # The real check's command, as the lifecycle ran it: every node idle with its 2 GPUs.
    assert sorted(ssh(config, "node-0", "sinfo -h -N -o '%N|%T|%G'").splitlines()) == [
        "node-0|idle|gpu:2",
        "node-1|idle|gpu:2",
    ]
    # One slurm.conf on every node; each node with the CPUs its host has.
    confs = {ssh(config, f"node-{i}", "cat /etc/slurm/slurm.conf") for i in range(2)}
    assert len(confs) == 1
    assert "SlurmctldHost=node-0(10.77.0.1)" in confs.pop()
    cpus = ssh(config, "node-1", "nproc")
    assert f"CPUTot={cpus}" in ssh(config, "node-0", "scontrol show node node-1")

    # The user's jobs, as root on node-0.
    assert sorted(ssh(config, "node-0", "srun -N2 hostname").splitlines()) == ["node-0", "node-1"]
    submitted = ssh(config, "node-0", "sbatch --parsable -o /dev/null --wrap hostname")
    assert re.fullmatch(r"\d+", submitted), submitted
    queue = ssh(config, "node-0", "squeue -h -o '%i %T'")  # running, or done already
    assert queue == "" or queue.startswith(f"{submitted} "), queue
    deadline = time.monotonic() + 30
    while True:
        job = ssh(config, "node-0", f"scontrol show job {submitted}")
        if "JobState=COMPLETED" in job:
            break
        assert "JobState=FAILED" not in job, job
        assert time.monotonic() < deadline, job
        time.sleep(0.5)
    assert ssh(config, "node-0", "squeue -h") == ""

    # Running the installer again changes nothing.
    again = lab.exec(
        Host.objects.get(nodes__cluster=cluster, nodes__index=1).name,
        "sh /var/lib/runcrate/software/install-slurm.sh",
    )
    assert [line for line in again.stdout.splitlines() if "changed" in line] == [], again.stdout
    assert again.stdout.strip().splitlines()[-1] == "runcrate: ok"

    terminate_and_check(lab, cluster)
    for host in Host.objects.filter(nodes__cluster=cluster):
        left = [
            what
            for what, command in SLURM_LEFTOVERS.items()
            if lab.exec(host.name, command, check=False).returncode != 0
        ]
        assert left == [], f"{host.name} keeps {left}"


def test_a_broken_package_source_degrades_the_cluster_and_retry_install_reaches_ready(
    fleet, user_key
):
    lab = fleet
    # A bare second host whose apt sees no Slurm package at all: the fault is in that host's own
    # package configuration (a pin that hides them), the rest of the mirror works.
    lab.reset(lab.hosts[1].name)
    hide = "/etc/apt/preferences.d/zz-no-slurm"
    lab.exec(
        lab.hosts[1].name,
        f"printf 'Package: slurmd slurmctld slurm-client munge\\nPin: release *\\n"
        f"Pin-Priority: -1\\n' > {hide}",
    )
    cluster = create(
        project_with(user_key), machine_type("lab-h100x2-vm"), nodes=2, software="slurm"
    )
    drive(cluster, Cluster.Status.DEGRADED, Cluster.Status.READY, Cluster.Status.FAILED)
    assert cluster.status == Cluster.Status.DEGRADED, cluster.failure_message
    event = cluster.events.get(reason="install_failed")
    assert event.node.name == "node-1"
    # The real installer's output, apt's own words included.
    assert "runcrate: failed: could not install" in event.output
    assert re.search(r"^E: .*(slurm|munge)", event.output, re.MULTILINE), event.output

    lab.exec(lab.hosts[1].name, f"rm -f {hide}")
    with base.Sim():
        base.lifecycle.retry_install(cluster=cluster)
    drive(cluster, Cluster.Status.READY, Cluster.Status.DEGRADED, timeout=240)
    assert cluster.status == Cluster.Status.READY, slurm_logs(lab, cluster)
    terminate_and_check(lab, cluster)


def wait_ready(check) -> None:
    deadline = time.monotonic() + 30
    while (result := check()).state != CheckState.READY:
        assert time.monotonic() < deadline, result.output
        time.sleep(1)


def test_the_check_reads_real_sinfo_states_drained_down_and_no_controller(fleet, user_key):
    lab = fleet
    cluster = create(
        project_with(user_key), machine_type("lab-h100x2-vm"), nodes=2, software="slurm"
    )
    drive(cluster, Cluster.Status.READY, Cluster.Status.DEGRADED, Cluster.Status.FAILED)
    assert cluster.status == Cluster.Status.READY, slurm_logs(lab, cluster)
    head = cluster.nodes.select_related("host", "cluster__machine_type__location").get(index=0)
    plan = base.lifecycle.install_plan(cluster, list(cluster.nodes.all()))

    def check():
        return base.get_driver(head.host).check(head, plan=plan, now=timezone.now())

    def on_head(command: str) -> None:
        lab.exec(head.host.name, command)

    assert check().state == CheckState.READY
    # The real sinfo's words for each state, read by the real parser through the driver.
    on_head("scontrol update nodename=node-1 state=drain reason=maintenance")
    drained = check()
    assert drained.state == CheckState.PENDING
    assert drained.problems["node-1"].startswith("state drain"), drained.output
    assert "node-0" in drained.ready_nodes
    # (A drained node set down stays "drained" in sinfo: resume it first.)
    on_head("scontrol update nodename=node-1 state=resume")
    wait_ready(check)
    on_head("scontrol update nodename=node-1 state=down reason=broken")
    down = check()
    assert down.state == CheckState.PENDING and "down" in down.problems["node-1"], down.output
    on_head("scontrol update nodename=node-1 state=resume")
    wait_ready(check)
    # A controller that is gone: sinfo's error is "not ready yet", never a broken check.
    on_head("pkill -x slurmctld || pkill -x slurmctld-wlm")
    deadline = time.monotonic() + 15
    while "Unable to contact slurm controller" not in (result := check()).output:
        assert time.monotonic() < deadline, result.output
        time.sleep(0.5)
    assert result.state == CheckState.PENDING
    terminate_and_check(lab, cluster)


def test_a_worker_added_to_a_ready_slurm_cluster_joins_every_node_runs_srun_n3(
    fleet, user_key, tmp_path
):
    """2 + 1: the worker's installer gives the two running nodes the new slurm.conf (the
    controller restarted with it, `scontrol reconfigure`), so Slurm knows the worker on every
    node and `srun -N3` runs on three machines; every daemon listens on the private network."""
    lab = fleet
    cluster = create(
        project_with(user_key), machine_type("lab-h100x2-vm"), nodes=2, software="slurm"
    )
    try:
        drive(cluster, Cluster.Status.READY, Cluster.Status.DEGRADED, Cluster.Status.FAILED)
        assert cluster.status == Cluster.Status.READY, cluster.failure_message
        with base.Sim():
            base.lifecycle.add_workers(cluster=cluster, count=1)
        deadline = time.monotonic() + base.WAIT
        with base.Sim() as sim:
            while not cluster.events.filter(
                reason__in=[Event.Reason.WORKER_JOINED, Event.Reason.WORKER_FAILED]
            ).exists():
                assert time.monotonic() < deadline, "the worker neither joined nor failed"
                sim.tick()
                time.sleep(0.5)
    except AssertionError as error:
        raise AssertionError(f"{error}\n{slurm_logs(lab, cluster)}") from None
    events = "\n".join(
        f"  {e.reason}: {e.message}\n{e.output[-3000:]}" for e in cluster.events.all()
    )
    assert cluster.events.filter(reason=Event.Reason.WORKER_JOINED).exists(), events
    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.READY, events

    config = ssh_config_file(cluster, tmp_path, user_key, lab)
    assert sorted(ssh(config, "node-0", "sinfo -h -N -o '%N|%T|%G'").splitlines()) == [
        "node-0|idle|gpu:2",
        "node-1|idle|gpu:2",
        "node-2|idle|gpu:2",
    ]
    # One slurm.conf, the same on all three; each node at its private address.
    confs = {ssh(config, f"node-{i}", "cat /etc/slurm/slurm.conf") for i in range(3)}
    assert len(confs) == 1, confs
    conf = confs.pop()
    for i in range(3):
        assert f"NodeName=node-{i} NodeAddr=10.77.0.{i + 1} " in conf, conf
    ran = ssh(config, "node-0", "srun -N3 hostname").splitlines()
    assert sorted(ran) == ["node-0", "node-1", "node-2"], ran
    # The daemons listen on the private network, never on every address.
    for i in range(3):
        listening = ssh(config, f"node-{i}", "ss -Hltn '( sport = :6818 or sport = :6817 )'")
        local = {line.split()[3] for line in listening.splitlines()}
        expected = {f"10.77.0.{i + 1}:6818"} | ({"10.77.0.1:6817"} if i == 0 else set())
        assert local == expected, listening

    terminate_and_check(lab, cluster)
    for host in Host.objects.filter(nodes__cluster=cluster):
        left = [
            what
            for what, command in SLURM_LEFTOVERS.items()
            if lab.exec(host.name, command, check=False).returncode != 0
        ]
        assert left == [], f"{host.name} keeps {left}"


def test_a_lost_node_is_taken_out_of_slurm_and_the_others_hosts_files(fleet, user_key, tmp_path):
    """D9: after node-2 is lost, node-0 and node-1 no longer name it in /etc/hosts or the
    hostfile, and Slurm's slurm.conf on both is the one without it: `srun -N2` runs."""
    lab = fleet
    cluster = create(
        project_with(user_key), machine_type("lab-h100x2-vm"), nodes=3, software="slurm"
    )
    try:
        drive(cluster, Cluster.Status.READY, Cluster.Status.DEGRADED, Cluster.Status.FAILED)
        assert cluster.status == Cluster.Status.READY, cluster.failure_message
        lost = cluster.nodes.get(index=2)
        with base.Sim() as sim:
            assert base.lifecycle.mark_lost(
                node_id=lost.pk, last_heard=timezone.now(), why="the test took it away"
            )
            deadline = time.monotonic() + base.WAIT
            head = cluster.nodes.get(index=0)
            while "prune" not in head.driver_state:
                assert time.monotonic() < deadline, "node-0 was never pruned"
                sim.tick()
                time.sleep(0.5)
                head.refresh_from_db()
    except AssertionError as error:
        raise AssertionError(f"{error}\n{slurm_logs(lab, cluster)}") from None
    assert head.driver_state["prune"]["ok"] is True, head.driver_state["prune"]["output"]

    config = ssh_config_file(cluster, tmp_path, user_key, lab)
    for i in (0, 1):
        files = "cat /etc/hosts /shared/hostfile /etc/runcrate/hostfile 2>/dev/null; true"
        assert "node-2" not in ssh(config, f"node-{i}", files)
        assert "node-2" not in ssh(config, f"node-{i}", "cat /etc/slurm/slurm.conf")
    deadline = time.monotonic() + 60
    while (nodes := ssh(config, "node-0", "sinfo -h -N -o '%N|%T'").split()) != [
        "node-0|idle",
        "node-1|idle",
    ]:
        assert time.monotonic() < deadline, nodes
        time.sleep(1)
    assert sorted(ssh(config, "node-0", "srun -N2 hostname").splitlines()) == ["node-0", "node-1"]
    terminate_and_check(lab, cluster)
