"""bin/run.py supervises the web server, the worker and the scheduler: they start together and
stop together. Here it supervises small stand-in commands through the same function."""

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from config.management.commands import seed_demo

ROOT = Path(__file__).resolve().parents[2]
RUN_PY = ROOT / "bin" / "run.py"
PYTHON = sys.executable

# Loads bin/run.py as `make run` does, supervises the commands given as JSON, and prints the
# children's process ids once they are started.
SUPERVISOR = f"""
import importlib.util, json, os, sys
spec = importlib.util.spec_from_file_location("run", {str(RUN_PY)!r})
run = importlib.util.module_from_spec(spec)
spec.loader.exec_module(run)

def on_start(processes):
    # One write, so no child's line, written by the supervisor's reader threads, lands inside
    # it (print writes the text and the newline apart).
    sys.stdout.write("PIDS " + json.dumps({{name: p.pid for name, p in processes.items()}}) + "\\n")
    sys.stdout.flush()

sys.exit(run.supervise(
    json.loads(sys.argv[1]), cwd=".", env=os.environ, on_start=on_start,
    grace_seconds=float(sys.argv[2]),
))
"""


def _sleeper(announce: str = "") -> list[str]:
    return [PYTHON, "-c", f"import time; print({announce!r}, flush=True); time.sleep(300)"]


class Supervisor:
    def __init__(self, commands: dict[str, list[str]], *, grace_seconds: float = 10.0) -> None:
        self.process = subprocess.Popen(
            [PYTHON, "-c", SUPERVISOR, json.dumps(commands), str(grace_seconds)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.output: list[str] = []
        self._changed = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()
        self.pids: dict[str, int] = json.loads(self.wait_for("PIDS ").removeprefix("PIDS "))

    def _read(self) -> None:
        for line in self.process.stdout:
            with self._changed:
                self.output.append(line)
                self._changed.notify_all()

    def wait_for(self, text: str, timeout: float = 15.0) -> str:
        """The first line of output containing `text`; fails after `timeout` seconds."""

        def found() -> str | None:
            return next((line for line in self.output if text in line), None)

        with self._changed:
            line = self._changed.wait_for(found, timeout=timeout)
        assert line, f"no line with {text!r} in:\n{''.join(self.output)}"
        return line

    def finish(self, timeout: float = 20.0) -> int:
        return self.process.wait(timeout=timeout)

    @property
    def text(self) -> str:
        return "".join(self.output)


@pytest.fixture
def start():
    """Starts supervisors; whatever a failed test leaves running is killed afterwards."""
    started: list[Supervisor] = []

    def start(commands: dict[str, list[str]], **options: float) -> Supervisor:
        started.append(Supervisor(commands, **options))
        return started[-1]

    yield start
    for supervisor in started:
        if supervisor.process.poll() is None:
            supervisor.process.kill()
            supervisor.process.wait()
        for pid in supervisor.pids.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.procs  # bin/run.py
def test_it_stops_every_child_when_it_gets_sigterm(start):
    supervisor = start(
        {"web": _sleeper("web up"), "worker": _sleeper("worker up"), "beat": _sleeper("beat up")}
    )
    for name in ("web", "worker", "beat"):
        supervisor.wait_for(f"{name} up")
    assert all(_alive(pid) for pid in supervisor.pids.values())

    supervisor.process.send_signal(signal.SIGTERM)

    assert supervisor.finish() == 0
    assert [name for name, pid in supervisor.pids.items() if _alive(pid)] == []


@pytest.mark.procs  # bin/run.py
def test_it_stops_every_child_on_ctrl_c(start):
    supervisor = start({"web": _sleeper("web up"), "worker": _sleeper("worker up")})
    supervisor.wait_for("worker up")

    supervisor.process.send_signal(signal.SIGINT)

    assert supervisor.finish() == 0
    assert [name for name, pid in supervisor.pids.items() if _alive(pid)] == []


@pytest.mark.procs  # bin/run.py
def test_it_shows_each_line_behind_the_name_of_its_process(start):
    supervisor = start({"web": _sleeper("listening"), "worker": _sleeper("connected")})

    assert supervisor.wait_for("listening") == "web    | listening\n"
    assert supervisor.wait_for("connected") == "worker | connected\n"
    supervisor.process.send_signal(signal.SIGTERM)
    supervisor.finish()


@pytest.mark.procs  # bin/run.py
def test_it_stops_the_rest_when_one_child_exits(start):
    supervisor = start(
        {"worker": [PYTHON, "-c", "import sys; sys.exit(3)"], "web": _sleeper("web up")}
    )

    assert supervisor.finish() == 3
    supervisor.wait_for("worker exited with code 3; stopping the rest.")
    assert not _alive(supervisor.pids["web"])


@pytest.mark.procs  # bin/run.py
def test_it_kills_a_child_that_ignores_sigterm_after_the_grace_period(start):
    stubborn = [
        PYTHON,
        "-c",
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('ignoring SIGTERM', flush=True); time.sleep(300)",
    ]
    supervisor = start({"beat": stubborn}, grace_seconds=0.5)
    supervisor.wait_for("ignoring SIGTERM")

    supervisor.process.send_signal(signal.SIGTERM)

    assert supervisor.finish(timeout=10) == 0
    assert not _alive(supervisor.pids["beat"])


def test_it_prints_the_login_that_seed_demo_creates():
    spec = importlib.util.spec_from_file_location("run", RUN_PY)
    run = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run)

    assert run.DEMO_LOGIN == (seed_demo.DEMO_EMAIL, seed_demo.DEMO_PASSWORD)


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"HOST": "lab.example"}, "HOST must be an IPv4 address to bind (e.g. 127.0.0.1), not"),
        ({"PORT": "eighty"}, "PORT must be a port number (1-65535), not 'eighty'"),
    ],
)
def test_make_run_refuses_a_bad_host_or_port_before_starting_anything(env, says):
    done = subprocess.run(
        [PYTHON, str(RUN_PY)],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2
    assert says in done.stderr


def test_make_run_prints_the_demo_password_only_with_debug_on(monkeypatch, tmp_path):
    spec = importlib.util.spec_from_file_location("run", RUN_PY)
    run = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run)
    env = {"RUNCRATE_SIM_SPEED": "30"}

    monkeypatch.setenv("DEBUG", "true")
    laptop = run.banner(env=env, port="8000", var_dir=tmp_path)
    monkeypatch.setenv("DEBUG", "false")
    deployed = run.banner(env=env, port="8000", var_dir=tmp_path)

    assert "Demo login:  demo@runcrate.localhost / demo-gpus-2026" in laptop
    assert "demo-gpus-2026" not in deployed
    assert "Demo login:  none (DEBUG is off: seed_demo makes no demo account)" in deployed


def test_make_run_on_another_address_mails_links_to_that_address():
    spec = importlib.util.spec_from_file_location("run", RUN_PY)
    run = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run)

    lab = {}
    run.listening_at(lab, host="172.30.77.1", port="8000")
    assert lab["SITE_URL"] == lab["RUNCRATE_AGENT_URL"] == "http://172.30.77.1:8000"
    assert lab["ALLOWED_HOSTS"] == "localhost,127.0.0.1,172.30.77.1"

    chosen = {"SITE_URL": "https://clusters.example"}
    run.listening_at(chosen, host="172.30.77.1", port="8000")
    assert chosen["SITE_URL"] == "https://clusters.example"

    laptop = {}
    run.listening_at(laptop, host="127.0.0.1", port="8000")
    assert laptop == {"SITE_URL": "http://localhost:8000"}  # SITE_URL's default, said once


def test_make_run_prints_the_address_its_emails_link_to(tmp_path):
    """One origin: the address printed is the one Django's SITE_URL (the emails' links) reads,
    never 127.0.0.1 beside localhost, whose cookies a browser keeps apart."""
    spec = importlib.util.spec_from_file_location("run", RUN_PY)
    run = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run)
    env = {k: v for k, v in os.environ.items() if k != "SITE_URL"}
    env.update(RUNCRATE_SIM_SPEED="30", PORT="8123")
    run.HOST = "127.0.0.1"  # make run's default
    run.listening_at(env, host=run.HOST, port="8123")

    printed = run.banner(env=env, port="8123", var_dir=tmp_path)
    django = subprocess.run(
        [
            PYTHON,
            "-c",
            "import django; django.setup(); from django.conf import settings; "
            "print(settings.SITE_URL)",
        ],
        env={**env, "DJANGO_SETTINGS_MODULE": "config.settings"},
        cwd=RUN_PY.parent.parent,
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert django.returncode == 0, django.stderr
    site = django.stdout.strip()
    assert site == "http://localhost:8123"
    assert f"Runcrate Clusters is running: {site}/" in printed
    assert "127.0.0.1" not in printed.splitlines()[1]
