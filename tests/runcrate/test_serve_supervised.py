"""`make serve` supervises its processes (bin/serve.py): started for real (migrate, collectstatic,
the Procfile's four processes, DEBUG off) on a throwaway database, a free port of 127.0.0.1 and
a broker of files of its own, a SIGKILLed worker is back and consuming within 10 s while the
web keeps answering /healthz with 200 throughout; the output says that a process that dies is
restarted, and the access log carries no password-reset token."""

import contextlib
import importlib.util
import io
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import httpx
import psycopg
import pytest
from django.conf import settings

from tests.runcrate.test_serve import ROOT, SECRET_KEY, _free_port, _production_env

BACK_WITHIN = 10.0  # seconds from the SIGKILL to a worker that is consuming again
STARTED = re.compile(r"serve\s+\| (\w+) started with pid (\d+)\.")
READY = re.compile(r"worker\s+\| .*default@\S+ ready")
RESET_TOKEN = "c4v8qz-0f1e2d3c4b5a69788796a5b4c3d2e1f0"


@dataclass
class Served:
    url: str
    make: subprocess.Popen
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def pids(self, name: str) -> list[int]:
        return [int(pid) for which, pid in STARTED.findall(self.output()) if which == name]


@contextlib.contextmanager
def _throwaway_database(tmp: Path) -> Iterator[str]:
    """A DATABASE_URL of its own: a new PostgreSQL database beside this session's (dropped
    after), or a SQLite file when the session runs on SQLite."""
    if not settings.IS_POSTGRES:
        yield f"sqlite:///{tmp / 'serve.sqlite3'}"
        return
    url = urlsplit(os.environ["DATABASE_URL"])
    name = f"{url.path.lstrip('/') or 'runcrate'}_serve_{os.getpid()}"
    admin = urlunsplit(url._replace(path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        connection.execute(f'CREATE DATABASE "{name}"')
    try:
        yield urlunsplit(url._replace(path=f"/{name}"))
    finally:
        with psycopg.connect(admin, autocommit=True) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _wait_for(condition, *, timeout: float, served: Served, what: str) -> float:
    """Poll `condition` until it holds (bounded); the seconds it took."""
    start = time.monotonic()
    while not condition():
        if served.make.poll() is not None:
            pytest.fail(f"make serve exited with {served.make.returncode}:\n{served.output()}")
        if time.monotonic() - start > timeout:
            pytest.fail(f"{what} not within {timeout} s:\n{served.output()[-6000:]}")
        time.sleep(0.1)
    return time.monotonic() - start


def _ready_again(output: str) -> bool:
    """A second worker started after the first exited, and it is consuming (celery's ready)."""
    exited = output.find("worker exited with code")
    return exited >= 0 and bool(READY.search(output, exited))


def _answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def _stop(served: Served) -> None:
    """SIGTERM to make's group (the supervisor stops its processes), then SIGKILL to every
    process group it started and to make's, whatever is left."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(served.make.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        served.make.wait(timeout=45)
    deadline = time.monotonic() + 45
    groups = [pid for _, pid in STARTED.findall(served.output())]
    while time.monotonic() < deadline and any(_alive(int(pid)) for pid in groups):
        time.sleep(0.2)
    for pid in [served.make.pid, *map(int, groups)]:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        served.make.wait(timeout=10)


def _alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[Served]:
    var_dir = tmp_path_factory.mktemp("serve-var")
    port = _free_port()
    log = var_dir / "serve.log"
    with _throwaway_database(var_dir) as database_url:
        env = {
            **_production_env(var_dir),
            "DATABASE_URL": database_url,
            "SECRET_KEY": SECRET_KEY,
            "HOST": "127.0.0.1",
            "PORT": str(port),
            "WEB_CONCURRENCY": "2",
            "MAKEFLAGS": "",
        }
        env.pop("DEBUG")  # make serve sets it
        # No REDIS_URL: the broker is files in var_dir, so this beat's ticks never reach a
        # queue that this session's other tests (or their real workers) read.
        with log.open("w") as out:
            make = subprocess.Popen(
                ["make", "--no-print-directory", "serve"],
                cwd=ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        running = Served(url=f"http://127.0.0.1:{port}", make=make, log=log)
        try:
            _wait_for(lambda: _answers(running.url), timeout=180, served=running, what="/healthz")
            _wait_for(
                lambda: READY.search(running.output()),
                timeout=120,
                served=running,
                what="the worker's ready",
            )
            yield running
        finally:
            _stop(running)


@pytest.mark.procs  # bin/serve.py
def test_it_says_it_restarts_a_process_that_dies(served):
    output = served.output()

    assert "make serve: supervising web, worker, machines, releases, logs, notify, beat." in output
    assert "A process that dies is restarted" in output
    assert {name for name, _ in STARTED.findall(output)} == {
        "web",
        "worker",
        "machines",
        "releases",
        "logs",
        "notify",
        "beat",
    }


@pytest.mark.procs  # bin/serve.py
def test_a_killed_worker_is_back_within_10_s_and_the_web_answers_throughout(served):
    [worker] = served.pids("worker")
    answers: list[int | str] = []
    polling = threading.Event()

    def poll_health() -> None:
        with httpx.Client(timeout=2) as client:
            while not polling.is_set():
                try:
                    answers.append(client.get(f"{served.url}/healthz").status_code)
                except httpx.TransportError as error:
                    answers.append(type(error).__name__)
                polling.wait(0.1)

    poller = threading.Thread(target=poll_health, daemon=True)
    poller.start()
    try:
        time.sleep(0.5)  # a few answers before the kill
        os.killpg(worker, signal.SIGKILL)  # the worker and everything of it, as the OOM killer
        took = _wait_for(
            lambda: _ready_again(served.output()),
            timeout=BACK_WITHIN,
            served=served,
            what="the worker back and ready",
        )
        time.sleep(0.5)  # a few answers after it
    finally:
        polling.set()
        poller.join(timeout=5)

    restarted = served.pids("worker")[-1]
    assert restarted != worker
    assert took <= BACK_WITHIN
    assert "worker exited with code -9; restarting it in 1 s (restart 1)." in served.output()
    assert len(answers) >= 10
    assert set(answers) == {200}, answers
    # Only the worker was restarted: web, machines and beat run on from their first start.
    assert [len(served.pids(name)) for name in ("web", "machines", "beat")] == [1, 1, 1]


@pytest.mark.procs  # bin/serve.py
def test_the_access_log_carries_no_password_reset_token(served):
    httpx.get(f"{served.url}/accounts/password-reset/MTI/{RESET_TOKEN}/", timeout=10)

    _wait_for(
        lambda: "GET /accounts/password-reset/[redacted]/[redacted]/ HTTP/1.1" in served.output(),
        timeout=10,
        served=served,
        what="the reset request's access-log line",
    )
    assert RESET_TOKEN not in served.output()


# --- the supervisor's rules, on its own ---------------------------------------------------------


def _load_serve():
    """bin/serve.py as a module (bin/ is no package); registered, as dataclasses need."""
    if "bin_serve" not in sys.modules:
        spec = importlib.util.spec_from_file_location("bin_serve", ROOT / "bin" / "serve.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["bin_serve"] = module
        spec.loader.exec_module(module)
    return sys.modules["bin_serve"]


def test_it_reads_the_procfile_as_honcho_does_web_first_on_port(tmp_path):
    serve = _load_serve()
    procfile = tmp_path / "Procfile"
    procfile.write_text("web: run-web\nworker: run-worker\n")
    (tmp_path / ".env").write_text("FROM_DOTENV=yes\n")

    web, worker = serve.definitions(procfile, {"PORT": "8123", "KEEP": "1"})

    assert (web.name, web.command, web.env["PORT"]) == ("web", "run-web", "8123")
    assert (worker.name, worker.env["PORT"]) == ("worker", "8223")
    assert web.env["KEEP"] == "1" and web.env["FROM_DOTENV"] == "yes"


@pytest.mark.procs  # the supervisor's children
def test_a_process_that_keeps_dying_is_restarted_after_a_growing_pause(tmp_path):
    serve = _load_serve()
    procfile = tmp_path / "Procfile"
    procfile.write_text("dies: exit 3\nlives: sleep 60\n")
    out = io.StringIO()
    supervisor = serve.Supervisor(serve.definitions(procfile, {}), cwd=tmp_path, out=out)
    dies, lives = supervisor.processes

    def exited() -> None:
        deadline = time.monotonic() + 10
        while dies.process.poll() is None:
            assert time.monotonic() < deadline, "exit 3 did not exit"
            time.sleep(0.05)

    try:
        for supervised in supervisor.processes:
            supervisor._start(supervised)
        first = dies.process
        exited()
        now = time.monotonic()
        supervisor._check(now)
        supervisor._check(now + serve.FIRST_PAUSE / 2)
        assert dies.process is first  # not yet: the pause is not over
        supervisor._check(now + serve.FIRST_PAUSE)
        assert dies.process is not first and dies.restarts == 1
        exited()
        supervisor._check(time.monotonic())
    finally:
        supervisor._stop_all()

    said = out.getvalue()
    assert "dies exited with code 3; restarting it in 1 s (restart 1)." in said
    assert "dies exited with code 3; restarting it in 2 s (restart 2)." in said
    assert lives.restarts == 0 and said.count("lives started with pid") == 1
    assert lives.process.poll() is not None  # stopped with the rest
