"""Logs and jobs (issue 23, item 6): a machine's logs and the head's jobs, read on demand by a task
over the node's driver (the simulated one here; the ssh one against stand-in sessions, and on the
lab's hosts in test_ssh_lab_logs.py), each capped to its last 256 KB, kept with the command that
produced it and when; the jobs refreshed at most every 30 s; refusals that change nothing; a
stranger sees nothing."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from html import unescape

import pytest
import time_machine
from django.db import connection
from django.test.utils import CaptureQueriesContext

from clusters import tasks
from clusters.machines import ssh
from clusters.machines.base import (
    LOG_CAP_BYTES,
    NODE_LOG_KINDS,
    DriverError,
    LogKind,
    cap_text,
    log_script,
    log_sources,
    read_log_text,
)
from clusters.machines.simulated import SimulatedDriver
from clusters.models import Cluster, LogFetch, Node, NodeLog
from clusters.telemetry import logs
from tests.billing.conftest import bill_cluster

NOW = datetime(2026, 3, 20, 12, 0, tzinfo=UTC)
HTMX = {"HX-Request": "true"}
HEAD_IP = "10.77.0.1"


@pytest.fixture(autouse=True)
def _frozen():
    with time_machine.travel(NOW, tick=False) as traveller:
        yield traveller


@pytest.fixture
def queued(monkeypatch) -> list[int]:
    """The fetches handed to the task queue (after the commit), in order."""
    sent: list[int] = []
    monkeypatch.setattr(tasks.fetch_logs, "delay", lambda fetch_id: sent.append(fetch_id))
    return sent


def cluster_of(person, *, software: str = "none", size: int = 2) -> Cluster:
    cluster = bill_cluster(person.project, size=size, at=NOW - timedelta(hours=1))
    Cluster.objects.filter(pk=cluster.pk).update(software=software)
    cluster.refresh_from_db()
    return cluster


def run_queued(queued: list[int]) -> None:
    """What the `machines` worker does with every queued fetch."""
    while queued:
        logs.run_fetch(fetch_id=queued.pop(0))


def post_fetch(client, cluster, *, node="node-0", group="logs", htmx=False, capture=None):
    url = f"/clusters/{cluster.pk}/logs/fetch/"
    headers = HTMX if htmx else {}
    with capture(execute=True):
        return client.post(url, {"node": node, "group": group}, headers=headers)


# --- the commands, on a real shell --------------------------------------------------------------


def run_on_this_shell(kind: LogKind, tmp_path, tools: dict[str, str]) -> str:
    """`log_script(kind)` run by sh with only `tools` (name -> script) and the base commands on
    PATH: the host's side of a fetch, for real."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, body in tools.items():
        tool = bin_dir / name
        tool.write_text(f"#!/bin/sh\n{body}\n")
        tool.chmod(0o755)
    for base in ("tail", "head", "cat", "yes"):
        (bin_dir / base).unlink(missing_ok=True)
        (bin_dir / base).symlink_to(shutil.which(base) or f"/usr/bin/{base}")
    done = subprocess.run(
        [shutil.which("sh") or "/bin/sh", "-c", log_script(kind, head_ip=HEAD_IP)],
        capture_output=True,
        env={"PATH": str(bin_dir), "HOME": os.environ.get("HOME", "/tmp")},
        timeout=30,
    )
    return done.stdout.decode()


def test_it_says_which_command_produced_a_text_and_caps_it_on_the_host(tmp_path):
    # squeue prints 300 KB (stderr too): the host keeps the last 256 KB and names squeue.
    body = "yes 'JOBID PARTITION NAME' | head -c 307200; echo 'squeue: warning' >&2"
    text = read_log_text(
        LogKind.SLURM_QUEUE, run_on_this_shell(LogKind.SLURM_QUEUE, tmp_path, {"squeue": body})
    )
    assert text.command == "squeue"
    assert len(text.output.encode()) == LOG_CAP_BYTES
    assert text.output.endswith("squeue: warning\n")


def test_it_says_so_where_the_host_has_no_such_command(tmp_path):
    text = read_log_text(LogKind.RAY_JOBS, run_on_this_shell(LogKind.RAY_JOBS, tmp_path, {}))
    assert text.command == ""
    assert text.output == "ray is not installed on this host.\n"


def test_ray_is_asked_at_the_heads_private_address(tmp_path):
    text = read_log_text(
        LogKind.RAY_JOBS, run_on_this_shell(LogKind.RAY_JOBS, tmp_path, {"ray": 'echo "$@"'})
    )
    assert text.command == f"ray job list --address http://{HEAD_IP}:8265"
    assert text.output == f"job list --address http://{HEAD_IP}:8265\n"


def test_the_system_log_is_the_journal_or_syslog_decided_by_one_command_on_the_host():
    script = log_script(LogKind.SYSTEM, head_ip=HEAD_IP)
    assert script.startswith("if [ -d /run/systemd/system ] && command -v journalctl")
    assert "journalctl --no-pager -n 5000 2>&1 | tail -c 262144" in script
    assert "elif [ -r /var/log/syslog ]; then" in script
    assert "tail -c 262144 /var/log/syslog" in script
    assert script.endswith("fi")


def test_a_nul_the_host_printed_is_kept_as_a_replacement_character(owner, queued, monkeypatch):
    # PostgreSQL refuses NUL in text: a fetch of a log with one must still be kept.
    cluster = cluster_of(owner)
    node = cluster.nodes.get(index=0)
    said = "runcrate: source=tail -c 262144 x\x00y\nbefore\x00after\n"

    def read_logs(self, node, *, kinds, head_ip):
        return [read_log_text(kind, said) for kind in kinds]

    monkeypatch.setattr(SimulatedDriver, "read_logs", read_logs)
    fetch = logs.request_fetch(cluster=cluster, node=node, group="logs")
    assert logs.run_fetch(fetch_id=fetch.pk)
    kept = NodeLog.objects.filter(fetch=fetch).first()
    assert kept.output == "before\ufffdafter\n"
    assert kept.command == "tail -c 262144 x\ufffdy"


def test_a_reply_the_host_did_not_cut_is_cut_here_without_splitting_a_character():
    text = "é" * LOG_CAP_BYTES  # two bytes each
    capped = cap_text(text)
    assert len(capped.encode()) <= LOG_CAP_BYTES
    assert capped == "é" * (LOG_CAP_BYTES // 2)
    assert read_log_text(LogKind.AGENT, "no source line\n").output == "no source line\n"


# --- the task with the simulated driver ----------------------------------------------------------


def test_fetch_logs_reads_every_log_of_the_machine_and_the_tab_shows_them(
    owner, queued, django_capture_on_commit_callbacks
):
    cluster = cluster_of(owner, software="slurm")
    client = owner.browser_client()

    answer = post_fetch(client, cluster, node="node-1", capture=django_capture_on_commit_callbacks)
    assert answer.status_code == 302
    assert answer["Location"] == f"/clusters/{cluster.pk}/logs/node/?node=node-1"
    assert len(queued) == 1
    run_queued(queued)

    node1 = cluster.nodes.get(index=1)
    kept = {t.kind: t for t in NodeLog.objects.filter(fetch__node=node1)}
    assert set(kept) == set(NODE_LOG_KINDS)
    for kind, text in kept.items():
        assert text.command == log_sources(kind, head_ip=HEAD_IP)[0][0].command
        assert text.fetched_at == NOW
        assert text.output
    assert "node-1" in kept[LogKind.INSTALL].output  # the installer's words, for that machine

    page = client.get(answer["Location"]).content.decode()
    assert "<h1>Logs of" in page
    assert '<option value="node-1" selected>' in page
    for text in kept.values():
        assert f"<code>{text.command}</code>" in unescape(page)
    assert page.count('<pre role="region" tabindex="0" aria-labelledby="log-node-1-') == 4
    assert '<time datetime="2026-03-20T12:00:00Z"' in page


def test_the_tab_shows_the_picker_fetch_form_and_jobs_panel(owner, queued):
    cluster = cluster_of(owner, software="slurm", size=3)
    page = owner.browser_client().get(f"/clusters/{cluster.pk}/logs/").content.decode()
    assert re.findall(r'<option value="(node-\d)"', page) == ["node-0", "node-1", "node-2"]
    forms = re.findall(
        r'<form method="post" action="/clusters/\d+/logs/fetch/".*?</form>', page, re.S
    )
    (fetch_logs,) = [f for f in forms if "Fetch logs</button>" in f]
    assert "csrfmiddlewaretoken" in fetch_logs and 'name="group" value="logs"' in fetch_logs
    (refresh,) = [f for f in forms if "Refresh jobs</button>" in f]
    assert 'name="group" value="jobs"' in refresh
    # Never read: the panel asks at once, then every 30 s.
    assert f'hx-get="/clusters/{cluster.pk}/logs/jobs/" hx-trigger="load, every 30s"' in page
    assert '<h3 id="logs-jobs-title">Jobs on the head (node-0)</h3>' in page
    assert queued == []  # showing the tab reads nothing


def test_a_machine_that_cannot_be_reached_says_why_and_nothing_else_changes(
    owner, queued, monkeypatch, django_capture_on_commit_callbacks, _frozen
):
    cluster = cluster_of(owner)
    client = owner.browser_client()
    post_fetch(client, cluster, capture=django_capture_on_commit_callbacks)
    run_queued(queued)
    before = list(NodeLog.objects.order_by("pk").values_list("pk", "output"))
    version, status = cluster.version, cluster.status

    def unreachable(self, node, *, kinds, head_ip):
        raise DriverError("could not connect to 203.0.113.7:22: timed out")

    monkeypatch.setattr(SimulatedDriver, "read_logs", unreachable)
    _frozen.shift(timedelta(seconds=31))
    answer = post_fetch(client, cluster, htmx=True, capture=django_capture_on_commit_callbacks)
    assert answer.status_code == 200
    run_queued(queued)

    page = client.get(f"/clusters/{cluster.pk}/logs/").content.decode()
    assert "could not connect to 203.0.113.7:22: timed out" in page
    assert "What follows is from the read before." in page
    assert list(NodeLog.objects.order_by("pk").values_list("pk", "output")) == before
    cluster.refresh_from_db()
    assert (cluster.version, cluster.status) == (version, status)
    assert set(cluster.nodes.values_list("status", flat=True)) == {Node.Status.JOINED}


def test_a_read_that_finds_the_machine_gone_keeps_an_error_not_a_text(owner, queued, db):
    cluster = cluster_of(owner)
    fetch = LogFetch.objects.create(node=cluster.nodes.get(index=1), group="logs", requested_at=NOW)
    Node.objects.filter(pk=fetch.node_id).update(status=Node.Status.LOST)
    assert logs.run_fetch(fetch_id=fetch.pk) is False
    fetch.refresh_from_db()
    assert fetch.error == "That machine is not running: there is nothing to read on it."
    assert fetch.fetched_at == NOW
    assert not fetch.texts.exists()


# --- the jobs, at most every 30 s ----------------------------------------------------------------


def test_the_jobs_poll_reads_the_head_at_most_every_30_seconds_and_never_twice_at_once(
    owner, queued, django_capture_on_commit_callbacks, _frozen
):
    cluster = cluster_of(owner, software="ray")
    client = owner.browser_client()
    url = f"/clusters/{cluster.pk}/logs/jobs/"

    def poll() -> str:
        with django_capture_on_commit_callbacks(execute=True):
            return client.get(url, headers=HTMX).content.decode()

    first = poll()
    assert len(queued) == 1  # the first poll reads the jobs
    assert 'hx-trigger="every 2s"' in first and "Reading the jobs on node-0" in first
    poll()
    assert len(queued) == 1  # one runs: no second

    run_queued(queued)
    head = cluster.nodes.get(index=0)
    assert set(NodeLog.objects.filter(fetch__node=head).values_list("kind", flat=True)) == {
        LogKind.RAY_JOBS,
        LogKind.RAY_STATUS,
    }
    _frozen.shift(timedelta(seconds=29))
    shown = poll()
    assert queued == []  # 29 s after the last read: not yet
    assert 'hx-trigger="every 30s"' in shown  # not due: no read at load
    assert f"<code>ray job list --address http://{HEAD_IP}:8265</code>" in unescape(shown)
    assert '<time datetime="2026-03-20T12:00:00Z"' in shown

    _frozen.shift(timedelta(seconds=1))
    poll()
    assert len(queued) == 1  # 30 s: read again

    # A read lost with its worker blocks nothing for long: after 5 minutes another starts.
    _frozen.shift(timedelta(minutes=4, seconds=59))
    poll()
    assert len(queued) == 1
    _frozen.shift(timedelta(seconds=1))
    poll()
    assert len(queued) == 2


def test_the_jobs_poll_costs_the_same_queries_at_2_and_6_machines(owner, queued):
    counts = []
    for size in (2, 6):
        cluster = cluster_of(owner, software="slurm", size=size)
        fetch = LogFetch.objects.create(
            node=cluster.nodes.get(index=0), group="jobs", requested_at=NOW, fetched_at=NOW
        )
        NodeLog.objects.create(fetch=fetch, kind="slurm_queue", command="squeue", fetched_at=NOW)
        client = owner.browser_client()
        client.get(f"/clusters/{cluster.pk}/logs/jobs/", headers=HTMX)  # the session, warmed
        with CaptureQueriesContext(connection) as captured:
            answer = client.get(f"/clusters/{cluster.pk}/logs/jobs/", headers=HTMX)
        assert answer.status_code == 200
        counts.append(len(captured))
    assert counts[0] == counts[1]
    assert counts[0] <= 12
    assert queued == []


def test_fetches_running_at_once_are_bounded_per_cluster_and_per_project(
    owner, queued, django_capture_on_commit_callbacks
):
    first, second, third = (cluster_of(owner, size=3) for _ in range(3))
    client = owner.browser_client()
    for node in ("node-0", "node-1"):
        post_fetch(client, first, node=node, capture=django_capture_on_commit_callbacks)
    refused = post_fetch(
        client, first, node="node-2", htmx=True, capture=django_capture_on_commit_callbacks
    )
    assert "2 reads of this cluster&#x27;s machines are running" in refused.content.decode()
    for node in ("node-0", "node-1"):
        post_fetch(client, second, node=node, capture=django_capture_on_commit_callbacks)
    refused = post_fetch(
        client, third, node="node-0", htmx=True, capture=django_capture_on_commit_callbacks
    )
    assert "4 reads of this project&#x27;s machines are running" in refused.content.decode()
    assert len(queued) == 4
    # The jobs poll starts nothing past the bound either.
    Cluster.objects.filter(pk=third.pk).update(software="slurm")
    third.refresh_from_db()
    assert logs.refresh_jobs(third) is not None
    assert len(queued) == 4
    # Once they finish, the places are free again.
    run_queued(queued)
    post_fetch(client, third, node="node-0", capture=django_capture_on_commit_callbacks)
    assert len(queued) == 1


def test_a_cluster_without_a_scheduler_says_so_and_never_reads_jobs(owner, queued):
    cluster = cluster_of(owner, software="none")
    browser = owner.browser_client()
    page = browser.get(f"/clusters/{cluster.pk}/logs/").content.decode()
    assert "no scheduler, so there is no job queue to show" in page
    assert "every 30s" not in page
    assert browser.get(f"/clusters/{cluster.pk}/logs/jobs/", headers=HTMX).status_code == 200
    assert queued == [] and not LogFetch.objects.filter(group="jobs").exists()


def test_kubernetes_shows_its_pods():
    assert log_sources(LogKind.KUBERNETES_PODS, head_ip=HEAD_IP)[0][0].command == (
        "kubectl get pods -A"
    )
    assert logs.JOB_KINDS["kubernetes"] == (LogKind.KUBERNETES_PODS,)


# --- refusals -----------------------------------------------------------------------------------


def test_a_second_fetch_within_30_seconds_is_refused_in_words(
    owner, queued, django_capture_on_commit_callbacks
):
    cluster = cluster_of(owner)
    client = owner.browser_client()
    post_fetch(client, cluster, capture=django_capture_on_commit_callbacks)
    again = post_fetch(client, cluster, htmx=True, capture=django_capture_on_commit_callbacks)
    assert "node-0&#x27;s logs are being read now." in again.content.decode()
    run_queued(queued)
    third = post_fetch(client, cluster, capture=django_capture_on_commit_callbacks)
    page = client.get(third["Location"]).content.decode()
    assert "were read less than 30 seconds ago" in page
    assert queued == []


def test_an_ended_cluster_says_so_and_reads_nothing(
    owner, queued, django_capture_on_commit_callbacks
):
    cluster = cluster_of(owner)
    Cluster.objects.filter(pk=cluster.pk).update(status=Cluster.Status.TERMINATED)
    client = owner.browser_client()
    page = client.get(f"/clusters/{cluster.pk}/logs/").content.decode()
    assert "This cluster has ended: its machines are gone" in page
    answer = post_fetch(client, cluster, capture=django_capture_on_commit_callbacks)
    assert answer.status_code == 302
    assert "This cluster has ended" in client.get(answer["Location"]).content.decode()
    assert client.get(f"/clusters/{cluster.pk}/logs/jobs/", headers=HTMX).status_code == 286
    assert queued == [] and not LogFetch.objects.exists()


@pytest.mark.parametrize(
    "node, group", [("node-9", "logs"), ("; rm -rf /", "logs"), ("node-1", "jobs")]
)
def test_a_machine_that_is_not_the_clusters_or_jobs_off_the_head_are_refused(
    owner, queued, django_capture_on_commit_callbacks, node, group
):
    cluster = cluster_of(owner, software="slurm")
    client = owner.browser_client()
    answer = post_fetch(
        client,
        cluster,
        node=node,
        group=group,
        htmx=True,
        capture=django_capture_on_commit_callbacks,
    )
    assert answer.status_code == 200
    body = answer.content.decode()
    assert "is not running" in body or "Jobs are read on the head" in body
    assert queued == [] and not LogFetch.objects.filter(requested_at__isnull=False).exists()


def test_an_unknown_group_is_read_as_logs_and_never_reaches_a_shell(
    owner, queued, django_capture_on_commit_callbacks
):
    cluster = cluster_of(owner)
    post_fetch(
        owner.browser_client(),
        cluster,
        group="squeue; id",
        capture=django_capture_on_commit_callbacks,
    )
    assert LogFetch.objects.get().group == "logs"


def test_a_stranger_gets_404_everywhere(
    owner, stranger, queued, django_capture_on_commit_callbacks
):
    cluster = cluster_of(owner, software="slurm")
    fetch = LogFetch.objects.create(node=cluster.nodes.get(index=0), group="logs", fetched_at=NOW)
    NodeLog.objects.create(fetch=fetch, kind="agent", command="tail", output="x", fetched_at=NOW)
    client = stranger.browser_client()
    base = f"/clusters/{cluster.pk}/logs"
    assert client.get(f"{base}/node/?node=node-0").status_code == 404
    assert client.get(f"{base}/jobs/", headers=HTMX).status_code == 404
    assert client.get(f"{base}/node-0/agent.txt").status_code == 404
    with django_capture_on_commit_callbacks(execute=True):
        assert client.post(f"{base}/fetch/", {"node": "node-0"}).status_code == 404
    assert queued == []


# --- the download ---------------------------------------------------------------------------------


def test_download_is_a_text_plain_attachment_of_the_kept_text(owner):
    cluster = cluster_of(owner)
    fetch = LogFetch.objects.create(node=cluster.nodes.get(index=1), group="logs", fetched_at=NOW)
    NodeLog.objects.create(
        fetch=fetch, kind="system", command="journalctl", output="line one\n", fetched_at=NOW
    )
    client = owner.browser_client()
    answer = client.get(f"/clusters/{cluster.pk}/logs/node-1/system.txt")
    assert answer.status_code == 200
    assert answer["Content-Type"] == "text/plain; charset=utf-8"
    assert answer["Content-Disposition"] == (
        f'attachment; filename="{cluster.name}-node-1-system-20260320T120000Z.txt"'
    )
    assert answer.content == b"line one\n"
    assert client.get(f"/clusters/{cluster.pk}/logs/node-1/agent.txt").status_code == 404
    assert client.get(f"/clusters/{cluster.pk}/logs/node-0/system.txt").status_code == 404


# --- the ssh driver, against stand-in sessions ----------------------------------------------------


def test_the_ssh_driver_runs_each_log_script_over_one_session(owner, monkeypatch):
    cluster = cluster_of(owner)
    node = cluster.nodes.select_related("host").get(index=0)
    ran: list[str] = []
    named: list[str] = []  # what an error would call each read (never the script's "if")
    sessions: list[str] = []

    @contextmanager
    def session(host):
        sessions.append(host.name)

        class Session:
            where = "203.0.113.7:22"

            def run(self, command, *, stdin=None, timeout=None, max_bytes=None, name=None):
                assert timeout is not None and timeout <= ssh.LOG_FETCH_SECONDS
                assert max_bytes == ssh.LOG_READ_BYTES
                ran.append(command)
                named.append(name)
                return 0, "runcrate: source=tail -c 262144 /var/log/runcrate-agent.log\nheard\n"

        yield Session()

    monkeypatch.setattr(ssh, "host_session", session)
    texts = ssh.SshDriver().read_logs(node, kinds=NODE_LOG_KINDS, head_ip=HEAD_IP)
    assert sessions == [node.host.name]
    assert ran == [log_script(kind, head_ip=HEAD_IP) for kind in NODE_LOG_KINDS]
    assert named == [
        "the read of the bootstrap log",
        "the read of the install log",
        "the read of the agent log",
        "the read of the system log",
    ]
    assert [t.command for t in texts] == ["tail -c 262144 /var/log/runcrate-agent.log"] * 4
    assert {t.output for t in texts} == {"heard\n"}


def test_the_ssh_driver_keeps_what_the_bootstrap_printed_on_the_host():
    ran = []

    class Session:
        where = "203.0.113.7:22"

        def run(self, command, *, stdin=None, timeout=None):
            ran.append((command, stdin))
            return 0, ""

    ssh.keep_output(Session(), "bootstrap", "runcrate: ok\n")  # type: ignore[arg-type]
    ((command, stdin),) = ran
    assert (
        command
        == "mkdir -p -m 700 /var/lib/runcrate/log && cat >> /var/lib/runcrate/log/bootstrap.log"
    )
    assert stdin == "==> bootstrap, 2026-03-20T12:00:00+00:00\nruncrate: ok\n\n"


def test_the_task_runs_on_the_logs_queue_never_the_machines_one(settings):
    # A tenant's host answers a log read: it must never hold the threads that start and stop
    # other customers' machines.
    assert settings.CELERY_TASK_ROUTES["clusters.tasks.fetch_logs"] == {"queue": "logs"}


def test_the_picker_swaps_the_machines_region_alone_with_htmx(owner):
    cluster = cluster_of(owner, size=3)
    client = owner.browser_client()
    url = f"/clusters/{cluster.pk}/logs/node/?node=node-2"
    fragment = client.get(url, headers=HTMX).content.decode()
    assert fragment.lstrip().startswith('<section id="logs-node"')
    assert "<html" not in fragment
    assert '<h3 id="logs-node-title">Logs of node-2</h3>' in fragment
    # An unknown name shows the head's, never another cluster's machine.
    other = cluster_of(owner, size=2)
    shown = client.get(f"/clusters/{other.pk}/logs/node/?node=node-2", headers=HTMX)
    assert '<h3 id="logs-node-title">Logs of node-0</h3>' in shown.content.decode()


def test_an_ended_clusters_texts_are_not_downloadable(owner):
    cluster = cluster_of(owner)
    fetch = LogFetch.objects.create(node=cluster.nodes.get(index=0), group="logs", fetched_at=NOW)
    NodeLog.objects.create(fetch=fetch, kind="agent", command="tail", output="x", fetched_at=NOW)
    client = owner.browser_client()
    assert client.get(f"/clusters/{cluster.pk}/logs/node-0/agent.txt").status_code == 200
    Cluster.objects.filter(pk=cluster.pk).update(status=Cluster.Status.TERMINATED)
    assert client.get(f"/clusters/{cluster.pk}/logs/node-0/agent.txt").status_code == 404


def test_a_redraw_keeps_the_machine_the_picker_shows(owner, queued):
    """Issue 38: the tab's poll sends the picker's machine (`hx-include`), so a redraw of the
    panel (the cluster changed) shows that machine's logs, not node-0's again."""
    cluster = cluster_of(owner, size=3)
    client = owner.browser_client()
    page = client.get(f"/clusters/{cluster.pk}/logs/").content.decode()
    header = re.search(r'<section id="cluster-status"[^>]*>', page).group(0)
    assert 'hx-include="#logs-node-pick"' in header
    poll = unescape(re.search(r'hx-get="([^"]+)"', header).group(1))
    Cluster.objects.filter(pk=cluster.pk).update(version=cluster.version + 1)

    body = client.get(f"{poll}&node=node-2", headers=HTMX).content.decode()

    assert '<section id="cluster-tab"' in body
    assert re.findall(r'<option value="(node-\d)" selected', body) == ["node-2"]
    assert "Logs of node-2" in body
    # A machine the cluster does not have: the head, as the tab shows by default.
    body = client.get(f"{poll}&node=node-9", headers=HTMX).content.decode()
    assert re.findall(r'<option value="(node-\d)" selected', body) == ["node-0"]
