"""Logs and jobs on the lab's real hosts (issue 23, item 6): the ssh driver reads a machine's logs
and the head's jobs over its pinned SSH session (`SshDriver.read_logs`, the commands of
`clusters.machines.base.log_sources`), through the task's own body
(`clusters.telemetry.logs.run_fetch`):

- the bootstrap's and the installer's output as the driver kept them on the host, the agent's
  log, and the system log decided on the host (the journal, else /var/log/syslog, else a
  sentence), each cut to its last 256 KB on the host;
- on a Slurm cluster, `squeue` shows a job a user submitted and `sinfo -N -l` both nodes;
- on a Ray cluster, `ray job list` shows a job a user submitted and `ray status` the nodes;
- (issue 33, L1) a tenant is root on their hosts, and their `tail` and `cat` may trickle a byte
  every 20 s: with *Fetch logs* pressed for each of their machines, the fetches run on the `logs`
  queue's own worker, as production runs it (a process of its own, Procfile's `logs` line),
  while another customer's cluster is created, ready before either fetch ends, and terminated by
  the worker of the default, `machines` and `releases` queues (were the fetches on that queue,
  as before issue 33, they would hold its threads and the cluster would wait); the fetches end at
  the dashboard's deadline saying so, and a `tail` that prints 400 MB leaves the `logs` worker's
  peak memory within its bound.

Skipped, with the reason, where the lab cannot start (tests/clusters/lab_kit.py).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from celery.contrib.testing.worker import start_worker
from django.utils import timezone

from clusters import lifecycle, tasks
from clusters.errors import ClusterRefused
from clusters.machines import ssh as ssh_driver
from clusters.machines.base import LOG_CAP_BYTES, LogKind
from clusters.models import Cluster, LogFetch, Node
from clusters.telemetry import logs
from config.celery import app
from offers.models import Host
from tests.clusters.lifecycle_kit import create
from tests.clusters.test_ssh_lab import (
    WAIT,
    assert_clean,
    drive,
    machine_type,
    project_with,
    ssh,
    ssh_config_file,
    terminate_and_check,
)
from tests.clusters.test_ssh_lab_ray import connect_job_submit, ray_logs
from tests.clusters.test_ssh_lab_slurm import slurm_logs
from tests.worker_kit import procfile_worker

pytestmark = [pytest.mark.lab, pytest.mark.django_db(transaction=True)]

AGENT_LOG = "/var/log/runcrate-agent.log"


def ready(lab, user_key, software: str) -> Cluster:
    """A ready two-node cluster of `software` on the lab's hosts, as the other lab tests make it."""
    cluster = create(
        project_with(user_key), machine_type("lab-h100x2-vm"), nodes=2, software=software
    )
    explain = slurm_logs if software == "slurm" else ray_logs
    try:
        drive(cluster, Cluster.Status.READY, Cluster.Status.DEGRADED, Cluster.Status.FAILED)
    except AssertionError as error:
        raise AssertionError(f"{error}\n{explain(lab, cluster)}") from None
    events = "\n".join(f"  {e.reason}: {e.message}" for e in cluster.events.all())
    assert cluster.status == Cluster.Status.READY, f"{events}\n{explain(lab, cluster)}"
    return cluster


def read(node: Node, group: str) -> dict[str, object]:
    """Claim a fetch as the tab does and run the task's body here; the texts by kind."""
    fetch = logs.fetch_for(node, group)
    LogFetch.objects.filter(pk=fetch.pk).update(requested_at=None, fetched_at=None)
    fetch.refresh_from_db()
    assert logs.claim(fetch, now=timezone.now())
    ok = logs.run_fetch(fetch_id=fetch.pk)
    fetch.refresh_from_db()
    assert ok, fetch.error
    assert fetch.error == ""
    return {text.kind: text for text in fetch.texts.all()}


def fails(node: Node, group: str) -> str:
    """Claim a fetch and run the task's body here, expecting it to fail: its error."""
    fetch = logs.fetch_for(node, group)
    LogFetch.objects.filter(pk=fetch.pk).update(requested_at=None, fetched_at=None)
    fetch.refresh_from_db()
    assert logs.claim(fetch, now=timezone.now())
    assert not logs.run_fetch(fetch_id=fetch.pk)
    fetch.refresh_from_db()
    assert fetch.fetched_at is not None  # ended, not left running
    return fetch.error


def test_a_machines_logs_come_back_capped_with_their_commands(fleet, user_key, monkeypatch):
    lab = fleet
    cluster = ready(lab, user_key, "slurm")
    node = cluster.nodes.select_related("host").get(index=1)
    host = node.host.name
    try:
        texts = read(node, logs.Group.LOGS)
        assert set(texts) == {"bootstrap", "install", "agent", "system"}

        bootstrap, install = texts["bootstrap"], texts["install"]
        assert bootstrap.command == f"tail -c {LOG_CAP_BYTES} /var/lib/runcrate/log/bootstrap.log"
        assert "==> bootstrap, " in bootstrap.output
        assert "runcrate: ok" in bootstrap.output
        assert install.command == f"tail -c {LOG_CAP_BYTES} /var/lib/runcrate/log/install.log"
        assert "==> install, " in install.output
        assert "runcrate: ok" in install.output  # the Slurm installer's own last line

        # The lab runs the agent as a daemon (no systemd): its log file.
        agent = texts["agent"]
        assert agent.command == f"tail -c {LOG_CAP_BYTES} {AGENT_LOG}"
        first_line = lab.exec(host, f"head -n 1 {AGENT_LOG}").stdout.strip()
        assert first_line and first_line in agent.output

        # The system log, as the host decides: the journal where systemd runs, else syslog.
        journal = lab.exec(host, "[ -d /run/systemd/system ] && command -v journalctl", check=False)
        system = texts["system"]
        if journal.returncode == 0:
            assert system.command == "journalctl --no-pager -n 5000"
        else:
            assert system.command == ""
            assert "neither a systemd journal nor /var/log/syslog" in system.output
            lab.exec(host, "echo 'runcrate-logs-test: a line of the system log' >> /var/log/syslog")
            system = read(node, logs.Group.LOGS)["system"]
            assert system.command == f"tail -c {LOG_CAP_BYTES} /var/log/syslog"
            assert "runcrate-logs-test: a line of the system log" in system.output

        # An agent log over 256 KB comes back as its last 256 KB exactly, cut on the host.
        lab.exec(host, f"head -c 400000 /dev/zero | tr '\\0' x >> {AGENT_LOG}; echo >> {AGENT_LOG}")
        agent = read(node, logs.Group.LOGS)["agent"]
        assert len(agent.output.encode()) == LOG_CAP_BYTES
        assert "x" * 1000 in agent.output

        # The tenant is root: their `tail` may trickle for ever or print without end. The
        # dashboard ends the fetch at its own deadline, or at its own cap, saying which.
        monkeypatch.setattr(ssh_driver, "LOG_FETCH_SECONDS", 6)
        lab.exec(host, "cp -p /usr/bin/tail /usr/bin/tail.real")
        trickle = "#!/bin/sh\nwhile :; do printf x; sleep 1; done\n"
        lab.exec(host, f"printf '{trickle}' > /usr/bin/tail")
        started = time.monotonic()
        error = fails(node, logs.Group.LOGS)
        assert time.monotonic() - started < 30
        assert "did not finish within" in error or "did not come within 6 seconds" in error
        flood = "#!/bin/sh\nexec cat /dev/zero\n"
        lab.exec(host, f"printf '{flood}' > /usr/bin/tail")
        error = fails(node, logs.Group.LOGS)
        assert f"printed more than {ssh_driver.LOG_READ_BYTES // 1024} KiB" in error
        lab.exec(host, "mv -f /usr/bin/tail.real /usr/bin/tail")

        # The cluster is untouched by any of it.
        cluster.refresh_from_db()
        assert cluster.status == Cluster.Status.READY
    finally:
        real = "/usr/bin/tail.real"
        lab.exec(host, f"[ -f {real} ] && mv -f {real} /usr/bin/tail", check=False)
        lab.exec(host, "rm -f /var/log/syslog", check=False)
        terminate_and_check(lab, cluster)


def test_squeue_and_sinfo_answer_on_a_slurm_head(fleet, user_key, tmp_path):
    lab = fleet
    cluster = ready(lab, user_key, "slurm")
    head = cluster.nodes.select_related("host").get(index=0)
    try:
        config = ssh_config_file(cluster, tmp_path, user_key, lab)
        job = ssh(config, "node-0", "sbatch --parsable -o /dev/null -N2 --wrap 'sleep 120'")
        assert re.fullmatch(r"\d+", job), job

        texts = read(head, logs.Group.JOBS)
        assert set(texts) == {LogKind.SLURM_QUEUE, LogKind.SLURM_NODES}
        queue, nodes = texts[LogKind.SLURM_QUEUE], texts[LogKind.SLURM_NODES]
        assert queue.command == "squeue"
        assert queue.output.split()[0] == "JOBID"
        assert re.search(rf"^\s*{job}\s", queue.output, re.MULTILINE), queue.output
        assert nodes.command == "sinfo -N -l"
        for name in ("node-0", "node-1"):
            assert re.search(rf"^{name}\s", nodes.output, re.MULTILINE), nodes.output
        ssh(config, "node-0", f"scancel {job}")
    finally:
        terminate_and_check(lab, cluster)


def test_ray_job_list_and_ray_status_answer_on_a_ray_head(fleet, user_key, tmp_path):
    lab = fleet
    cluster = ready(lab, user_key, "ray")
    head = cluster.nodes.select_related("host").get(index=0)
    try:
        config = ssh_config_file(cluster, tmp_path, user_key, lab)
        submit = connect_job_submit(cluster)
        out = ssh(config, "node-0", f"{submit} -- python -c \"print('logs-test')\"")
        submission = re.search(r"raysubmit_\w+", out)
        assert submission, out

        texts = read(head, logs.Group.JOBS)
        assert set(texts) == {LogKind.RAY_JOBS, LogKind.RAY_STATUS}
        jobs, status = texts[LogKind.RAY_JOBS], texts[LogKind.RAY_STATUS]
        assert jobs.command == f"ray job list --address http://{head.private_ip}:8265"
        assert submission.group(0) in jobs.output, jobs.output
        assert status.command == f"ray status --address {head.private_ip}:6379"
        assert "Node status" in status.output, status.output
        assert "GPU" in status.output, status.output
    finally:
        terminate_and_check(lab, cluster)


# --- a tenant's hosts cannot hold another customer's machines (issue 33, L1) --------------------

# The finding's trickle: a byte every 20 s, so no silent read ever waits long.
TRICKLE = "#!/bin/sh\nwhile :; do printf x; sleep 20; done\n"
FLOOD = "#!/bin/sh\nexec head -c 400000000 /dev/zero\n"  # 400 MB, as in the finding
TOOLS = ("tail", "cat")
# The default and `machines` queues' worker here has as many threads as the tenant has
# trickling machines (production: 8, and the finding filled them with 8): were the fetches on
# its queue, they would hold every one of its threads.
MACHINES_THREADS = 2
WORKER_GROWTH = 64 * 1024 * 1024  # the most the logs worker's peak memory may grow by a flood


def replace_tools(lab, host: str, script: str) -> None:
    """The tenant, root on `host`, replaces its `tail` and `cat` with `script` (the real ones
    kept beside them, for `restore_tools`)."""
    for tool in TOOLS:
        path = f"/usr/bin/{tool}"
        lab.exec(host, f"[ -f {path}.real ] || cp -p {path} {path}.real")
        lab.exec(host, f"printf '%s' '{script}' > {path}.new && chmod 755 {path}.new")
        lab.exec(host, f"mv -f {path}.new {path}")


def restore_tools(lab, host: str) -> None:
    for tool in TOOLS:
        path = f"/usr/bin/{tool}"
        lab.exec(host, f"[ -f {path}.real ] && mv -f {path}.real {path}", check=False)


def peak_memory(pid: int) -> int:
    """A process's peak resident memory so far (VmHWM), in bytes."""
    status = Path(f"/proc/{pid}/status").read_text()
    (line,) = [line for line in status.splitlines() if line.startswith("VmHWM:")]
    return int(line.split()[1]) * 1024


def beat_until(done: Callable[[], bool], *, seconds: float, what: str) -> float:
    """Send the tick as the beat does (every second here) until `done()`: the seconds it took,
    at most `seconds`."""
    started = time.monotonic()
    while not done():
        assert time.monotonic() - started < seconds, f"{what} not within {seconds:.0f} s"
        tasks.tick.delay()
        time.sleep(1)
    return time.monotonic() - started


def settled(cluster: Cluster) -> bool:
    """Whether `cluster` is past its start (ready, or failed)."""
    cluster.refresh_from_db()
    return cluster.status not in (Cluster.Status.PROVISIONING, Cluster.Status.INSTALLING)


def running(fetch: LogFetch) -> bool:
    fetch.refresh_from_db()
    return logs.is_running(fetch, timezone.now())


def test_a_tenants_trickling_hosts_hold_no_other_customers_machines(fleet, user_key, tmp_path):
    lab = fleet
    app.control.purge()  # messages left in this broker by earlier runs
    tenant = create(project_with(user_key), machine_type("lab-h100x2-vm"), nodes=2)
    drive(tenant, Cluster.Status.READY, Cluster.Status.FAILED)
    assert tenant.status == Cluster.Status.READY, tenant.failure_message
    nodes = list(tenant.nodes.select_related("host").order_by("index"))
    hosts = [n.host.name for n in nodes]
    try:
        for host in hosts:
            replace_tools(lab, host, TRICKLE)
        with (
            procfile_worker("logs", tmp_path / "logs-worker.log") as worker,
            start_worker(
                app,
                pool="threads",
                concurrency=MACHINES_THREADS,
                # The other cluster's hosts are released on the `releases` queue's threads.
                queues=["celery", "machines", "releases"],
                perform_ping_check=False,
                shutdown_timeout=60,
            ),
        ):
            # The tenant presses Fetch logs for each machine; a third press is refused while
            # two of the cluster's fetches run (and each machine's fetch is not started again).
            fetches = [
                logs.request_fetch(cluster=tenant, node=n, group=logs.Group.LOGS) for n in nodes
            ]
            with pytest.raises(ClusterRefused) as refused:
                logs.request_fetch(cluster=tenant, node=nodes[0], group=logs.Group.LOGS)
            assert refused.value.code == "logs_fetches_busy", refused.value.message
            # Both fetches are being trickled to on the tenant's hosts.
            give_up = time.monotonic() + 60
            for host in hosts:
                while lab.exec(host, "pgrep -f '[s]h /usr/bin/tail'", check=False).returncode:
                    assert time.monotonic() < give_up, f"no fetch reached {host}"
                    time.sleep(0.5)

            # Meanwhile another customer's cluster comes up and goes, on the workers.
            # (Two machines behind the location's gateway: the tenant holds two of the three
            # others.)
            other = create(project_with(user_key), machine_type("lab-gw-h100x2-vm"), nodes=2)
            up = beat_until(lambda: settled(other), seconds=WAIT, what="the other cluster's start")
            other.refresh_from_db()
            assert other.status == Cluster.Status.READY, other.failure_message
            assert all(running(f) for f in fetches), "the fetches ended before the other start"
            lifecycle.terminate(cluster=other)
            down = beat_until(
                lambda: not other.nodes.filter(holds_host=True).exists(),
                seconds=WAIT,
                what="the other cluster's stop",
            )
            other.refresh_from_db()
            assert other.status == Cluster.Status.TERMINATED
            for host in Host.objects.filter(nodes__cluster=other):
                assert host.state == Host.State.FREE
                assert_clean(lab, host)

            # The fetches end at the dashboard's deadline, each saying so.
            beat_until(
                lambda: not any(running(f) for f in fetches),
                seconds=ssh_driver.LOG_FETCH_SECONDS + 60,
                what="the fetches' end",
            )
            deadline = ssh_driver.LOG_FETCH_SECONDS
            held = []
            for fetch in fetches:
                assert fetch.fetched_at is not None and fetch.requested_at is not None
                held.append((fetch.fetched_at - fetch.requested_at).total_seconds())
                closed = (
                    f"the read of the bootstrap log did not finish within {deadline} seconds; "
                    "the dashboard closed it"
                )
                assert closed in fetch.error, fetch.error
            assert all(deadline <= s < deadline + 30 for s in held), held

            # A tail that prints 400 MB: the fetch ends at the dashboard's cap, and the logs
            # worker's memory grows by far less than what the host printed.
            replace_tools(lab, hosts[0], FLOOD)
            before = peak_memory(worker.pid)
            LogFetch.objects.filter(pk=fetches[0].pk).update(requested_at=None, fetched_at=None)
            flood = logs.request_fetch(cluster=tenant, node=nodes[0], group=logs.Group.LOGS)
            beat_until(lambda: not running(flood), seconds=60, what="the flooded fetch's end")
            cap = ssh_driver.LOG_READ_BYTES // 1024
            capped = f"the read of the bootstrap log printed more than {cap} KiB"
            assert capped in flood.error, flood.error
            grown = peak_memory(worker.pid) - before
            assert grown < WORKER_GROWTH, grown
            print(
                f"other cluster: ready in {up:.0f} s, stopped in {down:.0f} s; fetches held "
                f"{', '.join(f'{s:.1f}' for s in held)} s; flood: worker peak +{grown >> 20} MiB"
            )
    finally:
        app.set_current()
        app.set_default()
        for host in hosts:
            restore_tools(lab, host)
        terminate_and_check(lab, tenant)
