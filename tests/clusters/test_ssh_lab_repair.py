"""Repair on the lab's real hosts (issue 36; docs/lifecycle.md "Repair"): a worker whose
stand-in GPU reports uncorrectable ECC errors is drained in the real Slurm at once and replaced
in place through the API's plan token; with the `auto` policy, a worker whose host is stopped is
lost and replaced without a click, reachable by name from node-0, billed to the second."""

from __future__ import annotations

import re
import time

import pytest
from django.core import mail
from django.test import Client

from accounts.models import SshKey
from billing.models import UsageRecord
from clusters import lifecycle
from clusters.models import Cluster, Event, Node
from clusters.notifications import send_pending_cluster_emails
from lab.hostlab import LabError
from offers.models import Host
from tests.clusters.lab_kit import BOOT, register
from tests.clusters.lifecycle_kit import Sim, create, new_project
from tests.clusters.test_ssh_lab import (
    agent_logs,
    drive,
    machine_type,
    project_with,
    ssh,
    ssh_config_file,
)
from tests.clusters.test_ssh_lab_slurm import slurm_logs
from tests.factories import issue_key

pytestmark = [pytest.mark.lab, pytest.mark.django_db(transaction=True)]

SECONDS = 3  # the agents' metrics and health intervals here (their check-ins' answers)
Status = Cluster.Status


@pytest.fixture
def pool(lab, dashboard, tmp_path):
    """The module's five hosts in the inventory, all of `lab-h100x2-vm` (none behind the
    gateway): three for a cluster, spares for its replacements; reimaged, with baselines."""
    for host in lab.hosts:
        lab.reset(host.name)
    register(lab.inventory(boot_seconds=BOOT, gateway_hosts=0), tmp_path)
    yield lab
    for host in lab.hosts:  # a test that failed half-way leaves nothing for the next one
        if lab.exec(host.name, "test -e /var/lib/runcrate", check=False).returncode == 0:
            lab.reset(host.name)


def until(sim: Sim, cluster: Cluster, condition, seconds: float, what: str, *, beat=None):
    """A bounded wait on real hosts: the reconciler's work run here (and the beat's `beat`,
    when given) until `condition()` is true; returns what it returned."""
    deadline = time.monotonic() + seconds
    while True:
        sim.tick()
        if beat is not None:
            beat()
        sim.dispatcher.run()
        found = condition()
        if found:
            return found
        if time.monotonic() > deadline:
            events = "\n".join(f"  {e.reason}: {e.message}" for e in cluster.events.all())
            nodes = "\n".join(
                f"  {n.name} #{n.pk} on {n.host.name}: {n.status} at {n.step}, heard "
                f"{n.heartbeat_at}"
                for n in cluster.nodes.select_related("host")
            )
            try:
                logs = agent_logs(cluster)
            except LabError as error:  # a host the test stopped has no logs to read
                logs = str(error)
            raise AssertionError(f"{what}: not within {seconds} s:\n{events}\n{nodes}\n{logs}")
        time.sleep(0.5)


def placed(job: str) -> str:
    """The nodes `scontrol show job` says a job runs (or ran) on: its own NodeList line, "" while
    it is pending."""
    found = re.search(r"^\s+NodeList=(\S*)", job, re.MULTILINE)
    assert found, job
    return "" if found.group(1) == "(null)" else found.group(1)


def live(cluster: Cluster, index: int) -> Node:
    return cluster.nodes.select_related("host").get(index=index, status__in=Node.LIVE)


def test_slurm_drains_a_worker_with_ecc_errors_and_a_replacement_takes_its_place(
    pool, user_key, tmp_path, settings
):
    lab = pool
    settings.RUNCRATE_METRICS_SECONDS = SECONDS
    settings.RUNCRATE_HEALTH_SECONDS = SECONDS
    user, project = new_project(keys=0)
    public = user_key.with_suffix(".pub").read_text().strip()
    SshKey.objects.create(project=project, name="mine", public_key=public, fingerprint="SHA256:x")
    api = Client(HTTP_AUTHORIZATION=f"Bearer {issue_key(user=user, project=project)}")
    cluster = create(project, machine_type("lab-h100x2-vm"), nodes=3, software="slurm")
    drive(cluster, Status.READY, Status.DEGRADED, Status.FAILED)
    assert cluster.status == Status.READY, slurm_logs(lab, cluster)
    config = ssh_config_file(cluster, tmp_path, user_key, lab)
    sick = live(cluster, 2)
    old_host = sick.host

    lab.set_gpu_figures(old_host.name, {0: {"ecc.errors.uncorrected.volatile.total": 2}})
    with Sim() as sim:

        def drained_in_slurm() -> str:
            state = ssh(config, "node-0", "sinfo -h -N -n node-2 -o '%T|%E'")
            return state if state.startswith("drain") else ""

        state = until(sim, cluster, drained_in_slurm, 60, "sinfo shows node-2 drained")
    assert "runcrate: node-2 GPU 0: 2 uncorrectable ECC errors" in state, state
    machines = api.get(f"/api/v1/clusters/{cluster.pk}").json()["data"]["machines"]
    assert "ECC" in next(m["drained"] for m in machines if m["name"] == "node-2")
    page = Client()
    page.force_login(user)
    tab = page.get(f"/clusters/{cluster.pk}/machines/").content.decode()
    assert "Drained: node-2 GPU 0: 2 uncorrectable ECC errors" in tab, tab
    # A job for two machines does not land on the drained one.
    job = ssh(config, "node-0", "sbatch --parsable -N2 -o /dev/null --wrap 'sleep 1'")
    deadline = time.monotonic() + 60
    while not (ran_on := placed(ssh(config, "node-0", f"scontrol show job {job}"))):
        assert time.monotonic() < deadline, "the job was never placed"
        time.sleep(1)
    assert ran_on == "node-[0-1]", ran_on

    plan = api.post(f"/api/v1/clusters/{cluster.pk}/nodes/node-2/replace/plan")
    assert plan.status_code == 200, plan.content
    token = plan.json()["data"]["plan_token"]
    with Sim():
        answer = api.post(
            f"/api/v1/clusters/{cluster.pk}/nodes/node-2/replace",
            {"plan_token": token},
            content_type="application/json",
        )
    assert answer.status_code == 202, answer.content
    try:
        drive(cluster, Status.READY, timeout=300)
    except AssertionError as error:
        raise AssertionError(f"{error}\n{slurm_logs(lab, cluster)}") from None
    new = live(cluster, 2)
    assert new.host != old_host and new.replaces_id == sick.pk
    config = ssh_config_file(cluster, tmp_path, user_key, lab)
    assert ssh(config, "node-0", "getent hosts node-2").split()[0] == sick.private_ip
    assert sorted(ssh(config, "node-0", "srun -N3 hostname").splitlines()) == [
        "node-0",
        "node-1",
        "node-2",
    ]
    assert ssh(config, "node-2", "mountpoint -q /shared && echo mounted") == "mounted"
    with Sim() as sim:
        until(
            sim,
            cluster,
            lambda: not Node.objects.filter(pk=sick.pk, holds_host=True).exists(),
            120,
            "the old machine is released",
        )
    old_host.refresh_from_db()
    assert old_host.state == Host.State.OFFLINE
    assert "ECC" in old_host.quarantine_reason
    with Sim():
        lifecycle.terminate(cluster=cluster)
    drive(cluster, Status.TERMINATED)
    lab.reset(old_host.name)


def test_auto_replaces_a_worker_whose_host_stopped(pool, user_key, tmp_path, settings):
    lab = pool
    settings.RUNCRATE_HEALTH_SECONDS = SECONDS
    # Heartbeats come every 3 s (the health reports'): 20 s of silence is a machine gone,
    # never a loaded test machine's slow check-in.
    settings.RUNCRATE_HEARTBEAT_LOST_SECONDS = 20
    project = project_with(user_key)
    cluster = create(
        project, machine_type("lab-h100x2-vm"), nodes=3, software="none", repair_policy="auto"
    )
    drive(cluster, Status.READY, Status.FAILED)
    assert cluster.status == Status.READY, cluster.failure_message
    send_pending_cluster_emails()
    mail.outbox.clear()
    gone = live(cluster, 2)
    # A heartbeat after its billing began, so its end is the heartbeat's (never before the
    # start: docs/lifecycle.md "Lost machines").
    billed_from = UsageRecord.objects.get(node=gone).started_at
    deadline = time.monotonic() + 60
    while (gone.heartbeat_at or billed_from) <= billed_from:
        assert time.monotonic() < deadline, "node-2's agent sent no heartbeat once billed"
        time.sleep(1)
        gone.refresh_from_db()
    lab.stop(gone.host.name)
    try:
        with Sim() as sim:
            new = until(
                sim,
                cluster,
                lambda: cluster.nodes.filter(replaces=gone, status="joined").first(),
                240,
                "node-2 is lost and replaced",
                beat=lifecycle.watch_heartbeats,
            )
        cluster.refresh_from_db()
        assert cluster.status == Status.READY, cluster.failure_message
        gone.refresh_from_db()
        assert gone.status == Node.Status.LOST
        config = ssh_config_file(cluster, tmp_path, user_key, lab)
        assert "bytes from" in ssh(config, "node-0", "ping -c 1 -W 2 node-2")
        # Billing: the lost machine to its last heartbeat, the new one from its join.
        assert UsageRecord.objects.get(node=gone).ended_at == gone.ended_at == gone.heartbeat_at
        joined = cluster.events.get(reason=Event.Reason.NODE_REPLACED)
        assert UsageRecord.objects.get(node=new).started_at == joined.at
        send_pending_cluster_emails()
        assert [m.subject for m in mail.outbox] == [
            f"Cluster {cluster.name}: node-2 was replaced; ready again"
        ]
        assert "per hour" in mail.outbox[0].body
        with Sim():
            lifecycle.terminate(cluster=cluster)
        drive(cluster, Status.TERMINATED)
    finally:
        lab.reset(gone.host.name)
