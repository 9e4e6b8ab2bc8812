"""Helpers for the CLI and MCP tests: a funded account with an API key, the `runcrate` command
run against pytest-django's live server, and a driver that moves the simulated data center on
(the reconciler ticks, the frozen clock advances) while a client waits.

`run_cli` runs the CLI's `main` in this process (tests/cli/in_process.py), with an environment
and files of its own; `run_cli_tty`, and `run_cli` when asked, run `python -m runcrate_cli` from
the checkout as a real process, exactly what the `runcrate` console script runs. Either way the
CLI has a home of its own (HOME, XDG_CONFIG_HOME under tmp_path), so nothing of the developer's
~/.config or ~/.ssh is read or written.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest
import time_machine
from django.test import Client

from accounts.models import Project, User
from clusters import lifecycle
from tests.cli import in_process
from tests.clusters.lifecycle_kit import T0, Sim, create, inventory, new_project
from tests.factories import issue_key

REPO = Path(__file__).resolve().parents[2]
# The interpreter that runs the CLI: this one (the server's .venv, which has the client
# installed), or with RUNCRATE_CLI_PYTHON the Python of a virtualenv that has only the client
# (to run the CLI tests by hand against an installed package; tests/cli/test_package.py runs
# its smoke tests through such a virtualenv's `runcrate` with `program=`).
CLI_PYTHON = os.environ.get("RUNCRATE_CLI_PYTHON", sys.executable)
# Simulated seconds per tick: every step of the simulated data center takes a few.
TICK_SECONDS = 30
MAX_TICKS = 400


@dataclass
class Account:
    user: User
    project: Project
    key: str

    def api(self) -> Client:
        return Client(headers={"authorization": f"Bearer {self.key}"})

    def api_data(self, path: str):
        response = self.api().get(f"/api/v1{path}")
        assert response.status_code == 200, response.content
        return response.json()["data"]


def funded_account(*, balance: str = "10000.00") -> Account:
    """An owner with a project, credit, an SSH key and an API key."""
    user, project = new_project(balance=balance)
    return Account(user=user, project=project, key=issue_key(user=user, project=project))


def cli_env(home: Path, *, url: str, key: str | None) -> dict[str, str]:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "RUNCRATE_API_URL": url,
        "RUNCRATE_POLL_SECONDS": "0.05",
        "COLUMNS": "160",
        "LANG": "C.UTF-8",
    }
    if key is not None:
        env["RUNCRATE_API_KEY"] = key
    home.mkdir(parents=True, exist_ok=True)
    return env


@dataclass
class Result:
    code: int
    stdout: str
    stderr: str

    def json(self):
        return json.loads(self.stdout)


class Ticker:
    """Each call is one beat of the simulated data center: when a cluster has work, the
    reconciler ticks, then the frozen clock moves TICK_SECONDS on. Time stands still while
    nothing moves (a client still starting, a cluster not created yet), and after MAX_TICKS
    beats nothing moves any more: a test that waits for more has a bug, and times out."""

    def __init__(self, sim: Sim, clock) -> None:
        self.sim = sim
        self.clock = clock
        self.ticks = 0

    def __call__(self) -> None:
        if self.ticks >= MAX_TICKS or not lifecycle.clusters_needing_work():
            return
        self.sim.tick()
        self.clock.shift(timedelta(seconds=TICK_SECONDS))
        self.ticks += 1


def drive_until(
    done: Callable[[float], bool], *, drive: Callable[[], None], timeout: float
) -> None:
    """Call `drive` until `done(seconds)` (which may block that long for what it waits on) is
    true, for at most `timeout` seconds of real time."""
    deadline = time.monotonic() + timeout
    while not done(0.02):
        if time.monotonic() > deadline:
            raise AssertionError(f"still waiting after {timeout} s")
        drive()


def ready_cluster(
    account: Account,
    ticker: Ticker,
    *,
    name: str = "train",
    software: str = "none",
    **inventory_args,
):
    """A cluster of 2 machines of a fresh simulated offer, driven until it is ready."""
    from clusters.models import Cluster

    cluster = create(account.project, inventory(**inventory_args), name=name, software=software)

    def is_ready(_seconds: float) -> bool:
        cluster.refresh_from_db()
        assert cluster.status not in Cluster.TERMINAL, cluster.failure_message
        return cluster.status == Cluster.Status.READY

    drive_until(is_ready, drive=ticker, timeout=30)
    return cluster


def runcrate(program: Sequence[str] | None) -> list[str]:
    """The command that runs `runcrate`: `program` (e.g. a virtualenv's bin/runcrate), or by
    default CLI_PYTHON's `-m runcrate_cli`."""
    return list(program) if program is not None else [CLI_PYTHON, "-m", "runcrate_cli"]


def run_cli(
    *args: str,
    env: dict[str, str],
    tmp_path: Path,
    drive: Callable[[], None] | None = None,
    stdin: str | None = None,
    timeout: float = 60,
    program: Sequence[str] | None = None,
    process: bool = False,
) -> Result:
    """Run `runcrate ARGS` to its end (driving the data center meanwhile, when given) and
    return its exit code and output. Output goes to files, so a chatty CLI never blocks on a
    full pipe while the test drives.

    By default the CLI runs in this process (tests/cli/in_process.py), with `env` as its whole
    environment. `process=True` runs it as a real process instead, as does `program` (a
    command that replaces `python -m runcrate_cli`, e.g. an installed package's `runcrate`),
    and `runcrate ssh`, which ends by exec'ing ssh in place of its process."""
    out_path, err_path = tmp_path / "cli.out", tmp_path / "cli.err"
    if process or program is not None or args[:1] == ("ssh",):
        code = _run_process(args, env, out_path, err_path, drive, stdin, timeout, program)
    else:
        code = _run_in_process(args, env, out_path, err_path, drive, stdin, timeout)
    return Result(code, out_path.read_text(), err_path.read_text())


def _run_in_process(args, env, out_path, err_path, drive, stdin, timeout) -> int:
    # Line-buffered, as a process's stderr is: a test reads cli.err while the CLI runs.
    with out_path.open("w", buffering=1) as out, err_path.open("w", buffering=1) as err:
        running = in_process.start(args, environ=env, stdin=stdin or "", stdout=out, stderr=err)
        deadline = time.monotonic() + timeout
        while not running.wait(0.05 if drive else timeout):
            if time.monotonic() > deadline:
                # A thread cannot be killed: it is left behind, a daemon, and the test fails.
                raise AssertionError(
                    f"runcrate {' '.join(args)} ran past {timeout} s; stderr: "
                    f"{err_path.read_text()[-2000:]}"
                )
            if drive is not None:
                drive()
    assert running.code is not None
    return running.code


def _run_process(args, env, out_path, err_path, drive, stdin, timeout, program) -> int:
    with out_path.open("w") as out, err_path.open("w") as err:
        process = subprocess.Popen(
            [*runcrate(program), *args],
            cwd=REPO,
            env=env,
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            text=True,
        )
        if stdin is not None:
            process.stdin.write(stdin)
            process.stdin.close()
        deadline = time.monotonic() + timeout
        while True:
            try:
                process.wait(timeout=0.05 if drive else timeout)
                break
            except subprocess.TimeoutExpired:
                if time.monotonic() > deadline:
                    process.kill()
                    process.wait()
                    raise AssertionError(
                        f"runcrate {' '.join(args)} ran past {timeout} s; stderr: "
                        f"{err_path.read_text()[-2000:]}"
                    ) from None
                if drive is not None:
                    drive()
    return process.returncode


ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|\r")


def run_cli_tty(
    *args: str,
    env: dict[str, str],
    tmp_path: Path,
    drive: Callable[[], None] | None = None,
    timeout: float = 60,
    columns: int = 160,
    answer: str | None = None,
    before_answer: Callable[[], None] | None = None,
    program: Sequence[str] | None = None,
) -> Result:
    """`run_cli` with stdout on a pseudo-terminal `columns` wide (COLUMNS too, which rich
    reads first), as a person runs it: rich tables and the live display instead of JSON. The
    escape sequences are stripped. With `answer`, stdin is the terminal too, and `answer` is
    typed once the command asks a yes/no question (`before_answer` runs first). `program` as
    for `run_cli`."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    err_path = tmp_path / "cli.err"
    with err_path.open("w") as err:
        process = subprocess.Popen(
            [*runcrate(program), *args],
            cwd=REPO,
            env={**env, "TERM": "xterm-256color", "COLUMNS": str(columns)},
            stdin=follower if answer is not None else subprocess.DEVNULL,
            stdout=follower,
            stderr=err,
        )
    os.close(follower)
    chunks: list[bytes] = []
    asked = False
    deadline = time.monotonic() + timeout
    try:
        while True:
            if time.monotonic() > deadline:
                process.kill()
                raise AssertionError(f"runcrate {' '.join(args)} ran past {timeout} s")
            readable, _, _ = select.select([leader], [], [], 0.05)
            if readable:
                try:
                    chunk = os.read(leader, 65536)
                except OSError:  # EIO: the process closed the terminal
                    break
                if not chunk:
                    break
                chunks.append(chunk)
            if answer is not None and not asked and b"[y/N]" in b"".join(chunks):
                asked = True
                if before_answer is not None:
                    before_answer()
                os.write(leader, answer.encode() + b"\n")
            if drive is not None:
                drive()
    finally:
        os.close(leader)
        process.wait(timeout=10)
    text = ANSI.sub("", b"".join(chunks).decode("utf-8", "replace"))
    return Result(process.returncode, text, err_path.read_text())


def assert_no_traceback(result: Result) -> None:
    assert "Traceback" not in result.stderr + result.stdout, result.stderr


# --- fixtures, imported by tests/cli/conftest.py and tests/mcp/conftest.py ----------------------


@pytest.fixture
def clock():
    """The clock frozen at T0 for the test and the live server alike (one process)."""
    with time_machine.travel(T0, tick=False) as traveller:
        yield traveller


@pytest.fixture
def sim(clock):
    with Sim() as simulation:
        yield simulation


@pytest.fixture
def ticker(sim, clock) -> Ticker:
    return Ticker(sim, clock)


@pytest.fixture
def account(transactional_db, sim) -> Account:
    return funded_account()


@pytest.fixture
def env(tmp_path, live_server, account) -> dict[str, str]:
    return cli_env(tmp_path / "home", url=live_server.url, key=account.key)
