"""The production server: the Procfile's web line started for real (gunicorn, DEBUG off, SQLite
in a temporary RUNCRATE_VAR_DIR after migrate and collectstatic), static files under hashed
names with a far-future cache, and `make serve` refusing to start without what it needs."""

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from django.conf import settings
from honcho.environ import parse_procfile

from tests.runcrate.conftest import SETTINGS_VARIABLES

ROOT = Path(__file__).resolve().parents[2]
PYTHON = sys.executable
SECRET_KEY = "test-only-secret-key-for-the-production-server-test-0123456789"
ONE_YEAR = 365 * 24 * 3600
# What a proxy in front of the web process says about a request that reached it over HTTPS.
THROUGH_HTTPS = {"x-forwarded-proto": "https"}


def _production_env(var_dir: Path) -> dict[str, str]:
    env = {
        name: value
        for name, value in os.environ.items()
        if name not in SETTINGS_VARIABLES
        and name not in {"HOST", "WEB_CONCURRENCY"}
        and not name.startswith(("RUNCRATE_", "ANYMAIL_", "STRIPE_"))
    }
    # The venv's gunicorn and celery, as `make serve` puts them on PATH for honcho.
    env["PATH"] = f"{Path(PYTHON).parent}{os.pathsep}{env.get('PATH', '')}"
    env.update(
        RUNCRATE_VAR_DIR=str(var_dir),
        DEBUG="false",
        SECRET_KEY=SECRET_KEY,
        ALLOWED_HOSTS="127.0.0.1",
        PYTHONUNBUFFERED="1",
    )
    return env


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Server:
    url: str
    process: subprocess.Popen
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def _wait_until_it_answers(server: Server, *, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            pytest.fail(f"gunicorn exited with {server.process.returncode}:\n{server.output()}")
        try:
            httpx.get(f"{server.url}/healthz", timeout=1)
            return
        except httpx.TransportError:
            time.sleep(0.1)
    pytest.fail(f"gunicorn did not answer within {timeout} s:\n{server.output()}")


def _stop(process: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=40)  # the Procfile's graceful timeout is 30 s
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Server]:
    var_dir = tmp_path_factory.mktemp("production-var")
    env = _production_env(var_dir)
    for command in (["migrate", "--noinput"], ["collectstatic", "--noinput"]):
        done = subprocess.run(
            [PYTHON, "manage.py", *command, "--verbosity", "0"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert done.returncode == 0, f"manage.py {command[0]}:\n{done.stdout}{done.stderr}"

    web = parse_procfile((ROOT / "Procfile").read_text()).processes["web"]
    port = _free_port()
    log = var_dir / "web.log"
    with log.open("w") as out:
        process = subprocess.Popen(  # the Procfile's own line, through a shell as honcho runs it
            ["/bin/sh", "-c", web],
            cwd=ROOT,
            env={**env, "HOST": "127.0.0.1", "PORT": str(port), "WEB_CONCURRENCY": "2"},
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    running = Server(url=f"http://127.0.0.1:{port}", process=process, log=log)
    try:
        _wait_until_it_answers(running, timeout=60)
        yield running
    finally:
        _stop(process)


@pytest.mark.procs  # gunicorn
def test_it_answers_the_health_probes_over_plain_http(server):
    health = httpx.get(f"{server.url}/healthz", timeout=10)
    ready = httpx.get(f"{server.url}/readyz", timeout=10)
    page = httpx.get(f"{server.url}/accounts/login/", timeout=10)

    assert health.status_code == 200
    assert health.json() == {"status": "ok"}
    # Readiness reads the migrated SQLite database; no beat runs here, so it is not ready, and
    # says so instead of being redirected to HTTPS like every other page.
    assert ready.status_code == 503
    assert ready.json()["checks"]["database"] == "ok"
    assert ready.json()["checks"]["tick"].startswith("never ran")
    assert page.status_code == 301
    assert page.headers["location"].startswith("https://127.0.0.1")


@pytest.mark.procs  # gunicorn
def test_it_logs_each_request_on_stdout(server):
    httpx.get(f"{server.url}/healthz?access-log-probe", timeout=10)

    deadline = time.monotonic() + 10
    while "GET /healthz?access-log-probe HTTP/1.1" not in server.output():
        assert time.monotonic() < deadline, f"no access log line in:\n{server.output()}"
        time.sleep(0.1)
    line = next(line for line in server.output().splitlines() if "access-log-probe" in line)
    assert '" 200 ' in line


@pytest.mark.procs  # gunicorn
def test_it_serves_static_files_under_hashed_names_cached_for_a_year(server):
    page = httpx.get(f"{server.url}/accounts/login/", headers=THROUGH_HTTPS, timeout=10)
    assert page.status_code == 200
    script = re.search(r'src="(/static/js/app\.[0-9a-f]{12}\.js)"', page.text)
    assert script, f"no hashed app.js in the page:\n{page.text[:2000]}"

    hashed = httpx.get(
        f"{server.url}{script[1]}",
        headers={**THROUGH_HTTPS, "accept-encoding": "gzip"},
        timeout=10,
    )

    assert hashed.status_code == 200
    assert hashed.content == (ROOT / "static" / "js" / "app.js").read_bytes()
    assert hashed.headers["content-encoding"] == "gzip"
    cache = hashed.headers["cache-control"]
    assert "immutable" in cache
    assert int(re.search(r"max-age=(\d+)", cache)[1]) >= ONE_YEAR


@pytest.mark.procs  # gunicorn
def test_it_caches_a_file_asked_for_by_its_plain_name_only_briefly(server):
    plain = httpx.get(f"{server.url}/static/js/app.js", headers=THROUGH_HTTPS, timeout=10)

    assert plain.status_code == 200
    assert "immutable" not in plain.headers["cache-control"]
    assert int(re.search(r"max-age=(\d+)", plain.headers["cache-control"])[1]) < 3600


def test_it_serves_source_static_files_with_debug_on_and_in_tests(load_settings):
    development = load_settings()
    production = load_settings(DEBUG="false", SECRET_KEY=SECRET_KEY)

    plain = "django.contrib.staticfiles.storage.StaticFilesStorage"
    assert settings.STORAGES["staticfiles"]["BACKEND"] == plain
    assert development.STORAGES["staticfiles"]["BACKEND"] == plain
    assert development.WHITENOISE_USE_FINDERS is True
    assert (
        production.STORAGES["staticfiles"]["BACKEND"]
        == "whitenoise.storage.CompressedManifestStaticFilesStorage"
    )
    assert production.WHITENOISE_USE_FINDERS is False


@pytest.mark.parametrize(
    ("unset", "says"),
    [
        ({"SECRET_KEY", "DATABASE_URL"}, "make serve needs SECRET_KEY"),
        ({"DATABASE_URL"}, "make serve needs DATABASE_URL"),
    ],
)
def test_make_serve_refuses_to_start_without_what_it_needs(tmp_path, unset, says):
    env = {
        **_production_env(tmp_path),
        "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
        "MAKEFLAGS": "",
    }
    for name in unset:
        env.pop(name)

    done = subprocess.run(
        ["make", "--no-print-directory", "serve"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert done.returncode != 0
    assert says in done.stdout
    # Refused before anything ran: no migrate, so no database file.
    assert list(tmp_path.iterdir()) == []
