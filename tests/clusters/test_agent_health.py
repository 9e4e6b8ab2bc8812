"""The agent's health reports on a ready cluster (clusters/machines/runcrate_agent.py; issue 18,
D8), against the stand-in dashboard of test_agent_program: the peers it reaches, the services
it finds running, whether /shared answers, and how the reports ride on its heartbeats."""

from __future__ import annotations

import json
import logging
import time

import pytest

from clusters.machines import runcrate_agent
from clusters.machines.runcrate_agent import Settings
from tests.clusters import test_agent_program as program
from tests.clusters.test_agent_program import TOKEN, answer, new_agent, refusal

# The stand-in dashboard and a listening port, as the program's own tests have them.
dashboard = program.dashboard
listening_port = program.listening_port

HEALTH = {"peers": {"node-0": "127.0.0.1"}, "services": ["sshd"]}


def fake_proc(tmp_path, processes: dict[int, tuple[str, str, str]]):
    """A /proc of `processes`: pid -> (command name, state, command line)."""
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "self").mkdir()  # not a process
    for pid, (command, state, cmdline) in processes.items():
        folder = proc / str(pid)
        folder.mkdir()
        (folder / "stat").write_text(f"{pid} ({command}) {state} 1 1 1 0 -1\n")
        (folder / "cmdline").write_bytes(cmdline.replace(" ", "\0").encode() + b"\0")
    return proc


def test_it_names_the_running_processes_by_command_and_program(tmp_path):
    proc = fake_proc(
        tmp_path,
        {
            1: ("sshd", "S", "sshd: /usr/sbin/sshd -D [listener]"),
            20: ("k3s-server", "S", "/usr/local/bin/k3s server"),
            30: ("slurmd", "Z", ""),  # a zombie does not run
            40: ("my (odd) name", "R", "/opt/x/raylet --flag"),
        },
    )
    running = runcrate_agent.running_processes(proc)
    assert {"sshd", "k3s", "k3s-server", "raylet", "my (odd) name"} <= running
    assert "slurmd" not in running


def test_it_reads_mounts_from_the_table_without_touching_the_path(tmp_path):
    mounts = tmp_path / "mounts"
    mounts.write_text(
        "proc /proc proc rw 0 0\nroot@10.77.0.1:/shared /shared fuse.sshfs rw,nosuid 0 0\n"
    )
    assert runcrate_agent.mounted("/shared", mounts)
    assert not runcrate_agent.mounted("/shar", mounts)
    assert not runcrate_agent.mounted("/shared", tmp_path / "missing")


def test_a_folder_that_lists_answers_and_one_that_hangs_does_not(tmp_path, monkeypatch):
    assert runcrate_agent.answers_within(str(tmp_path), 5) == (True, None)
    answers, why = runcrate_agent.answers_within(str(tmp_path / "gone"), 5)
    assert not answers and "FileNotFoundError" in why
    # A listing that never ends (a hung mount) is given up on in time and killed.
    hang = tmp_path / "hang"
    hang.write_text("#!/bin/sh\nexec sleep 30\n")
    hang.chmod(0o755)
    monkeypatch.setattr(runcrate_agent.sys, "executable", str(hang))
    started = time.monotonic()
    assert runcrate_agent.answers_within(str(tmp_path), 0.3) == (
        False,
        "listing it took more than 0.3 s",
    )
    assert time.monotonic() - started < 3
    assert runcrate_agent._STUCK == [] or runcrate_agent._STUCK[0].wait(5) is not None


def test_the_report_says_which_peers_answer_and_which_services_run(
    listening_port, monkeypatch, tmp_path
):
    monkeypatch.setattr(
        runcrate_agent,
        "running_processes",
        lambda: {"sshd", "slurmd"},
    )
    settings = Settings(probe_port=listening_port)
    request = {
        "peers": {"node-0": "127.0.0.1", "node-2": "127.0.0.3"},  # nothing listens on .3
        "services": ["sshd", "slurmd", "slurmctld"],
    }
    started = time.monotonic()
    report = runcrate_agent.check_health(request, settings)
    assert report == {
        "peers": {"node-0": True, "node-2": False},
        "services": {"sshd": True, "slurmd": True, "slurmctld": False},
        "shared": None,
    }
    assert time.monotonic() - started < 2 * runcrate_agent.PROBE_TIMEOUT + 3

    # A worker that mounts /shared says whether it is mounted, and whether it answers.
    monkeypatch.setattr(runcrate_agent, "mounted", lambda path: path == str(tmp_path))
    mounted = runcrate_agent.check_health({}, Settings(shared_mount=str(tmp_path)))
    assert mounted["shared"] == {
        "path": str(tmp_path),
        "mounted": True,
        "answers": True,
        "error": None,
    }
    absent = runcrate_agent.check_health({}, Settings(shared_mount="/nowhere"))
    assert absent["shared"] == {
        "path": "/nowhere",
        "mounted": False,
        "answers": None,
        "error": None,
    }


def test_probing_every_peer_at_once_is_bounded_by_the_timeout_not_the_peers(monkeypatch):
    def unanswered(address, port, timeout):  # a cut-off peer: each probe waits out its timeout
        time.sleep(timeout)
        return False

    monkeypatch.setattr(runcrate_agent, "probe", unanswered)
    peers = {f"node-{i}": f"10.77.0.{i + 1}" for i in range(1, 9)}
    started = time.monotonic()
    reached = runcrate_agent.probe_all(peers, 22, timeout=0.3, attempts=2)
    assert reached == dict.fromkeys(sorted(peers), False)
    assert time.monotonic() - started < 2.5  # 2 × 0.3 s and the pause, not 8 × that


def test_a_peer_that_answers_on_the_second_try_is_reached(monkeypatch):
    calls = []

    def flaky(address, port, timeout):
        calls.append(address)
        return len(calls) > 1

    monkeypatch.setattr(runcrate_agent, "probe", flaky)
    assert runcrate_agent.probe_all({"node-0": "10.77.0.1"}, 22) == {"node-0": True}
    assert calls == ["10.77.0.1", "10.77.0.1"]


def test_it_adds_its_health_report_to_the_heartbeat_when_asked_and_due(
    dashboard, listening_port, monkeypatch, caplog
):
    caplog.set_level(logging.INFO, logger="runcrate-agent")
    monkeypatch.setattr(runcrate_agent, "running_processes", lambda: set())
    dashboard.answers = [answer(status="joined", step="done", health=HEALTH)]
    agent = new_agent(dashboard, heartbeat_seconds=30, health_seconds=10, probe_port=listening_port)

    agent.run_once()  # the first answer says what to check
    assert "health" not in dashboard.sent[0].body
    agent.run_once()
    sent = dashboard.sent[1].body
    assert sent["health"] == {
        "peers": {"node-0": True},
        "services": {"sshd": False},
        "shared": None,
    }
    assert "health: sshd is not running" in caplog.text
    agent.run_once()  # not due again for 10 s
    assert "health" not in dashboard.sent[2].body
    # It checks in again when the next report is due, sooner than its heartbeat.
    assert 8 < agent.next_check_in_seconds() <= 10


def test_it_reports_no_health_before_the_cluster_is_ready(dashboard):
    dashboard.answers = [answer(status="joined", step="install", health=None)]
    agent = new_agent(dashboard, health_seconds=0.01)
    agent.run_once()
    agent.run_once()
    assert all("health" not in sent.body for sent in dashboard.sent)
    assert agent.next_check_in_seconds() == agent.settings.heartbeat_seconds


def test_a_refused_health_report_never_costs_the_heartbeat(dashboard, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="runcrate-agent")
    monkeypatch.setattr(runcrate_agent, "running_processes", lambda: {"sshd"})
    joined = answer(status="joined", step="done", health={"peers": {}, "services": ["sshd"]})
    dashboard.answers = [
        joined,
        refusal(422, "invalid_report", "health.services must map service names"),
        joined,
    ]
    agent = new_agent(dashboard)
    agent.run_once()
    agent.run_once()
    assert ["health" in sent.body for sent in dashboard.sent] == [False, True, False]
    assert "refused a health report: health.services must map" in caplog.text


def test_it_reads_the_health_interval_from_its_configuration(tmp_path):
    path = tmp_path / "agent.json"
    path.write_text(
        json.dumps(
            {
                "runcrate_url": "https://file.example",
                "runcrate_node_id": 3,
                "runcrate_node_token": TOKEN,
                "health_seconds": 15,
            }
        )
    )
    assert runcrate_agent.load_config({}, path).settings.health_seconds == 15
    assert runcrate_agent.load_config({}, path).settings == Settings(health_seconds=15)
    environ = {"RUNCRATE_AGENT_HEALTH_SECONDS": "0"}
    with pytest.raises(SystemExit, match="health_seconds must be positive"):
        runcrate_agent.load_config(environ, path)


def test_the_report_says_whether_the_private_interface_is_up(tmp_path):
    from clusters.machines.runcrate_agent import interface_up

    (tmp_path / "rc0").mkdir()
    (tmp_path / "rc0" / "flags").write_text("0x1091\n")  # UP, POINTOPOINT, NOARP, RUNNING
    assert interface_up("rc0", tmp_path) is True
    (tmp_path / "rc0" / "flags").write_text("0x1090\n")  # `ip link set rc0 down`
    assert interface_up("rc0", tmp_path) is False
    assert interface_up("wg9", tmp_path) is None  # no such interface: left out of the report
    assert interface_up(None, tmp_path) is None
