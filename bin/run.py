"""Start the whole product: web server, Celery worker and beat scheduler. Ctrl-C stops all.

Called by `make run` after `migrate` and `seed_demo`. The three processes get the same
environment, so DATABASE_URL, REDIS_URL, RUNCRATE_VAR_DIR and the other settings apply to all
of them. Their output is shown line by line behind their name; Celery logs warnings and errors
only (LOG_LEVEL=INFO shows every task).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TextIO
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # runcrate.env: the one reader of the environment's values

from runcrate.env import env_bool  # noqa: E402

# The address the web server binds: HOST (default 127.0.0.1). The host lab's agents reach the
# dashboard on the lab's bridge: `HOST=172.30.77.1 make run`.
HOST = os.environ.get("HOST") or "127.0.0.1"
DEMO_LOGIN = ("demo@runcrate.localhost", "demo-gpus-2026")


def supervise(
    commands: Mapping[str, Sequence[str]],
    *,
    cwd: Path,
    env: Mapping[str, str],
    on_start: Callable[[dict[str, subprocess.Popen]], None] | None = None,
    grace_seconds: float = 10.0,
    out: TextIO = sys.stdout,
) -> int:
    """Run every command at once until one of them exits or this process gets SIGINT/SIGTERM,
    then stop them all: SIGTERM to each, SIGKILL to whatever still runs after `grace_seconds`
    (or at once on a second Ctrl-C).

    Returns 0 when asked to stop, else the exit code of the command that ended first (1 if
    that was 0: a server that stops by itself is a failure).
    """
    stop = threading.Event()
    hurry = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        if stop.is_set():
            hurry.set()
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    processes: dict[str, subprocess.Popen] = {}
    readers: list[threading.Thread] = []
    width = max(len(name) for name in commands)
    exit_code = 0
    try:
        for name, command in commands.items():
            # Each child leads its own process group: the terminal's Ctrl-C reaches only this
            # supervisor, which then stops the children in order instead of all at once.
            process = subprocess.Popen(  # noqa: S603
                list(command),
                cwd=cwd,
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                bufsize=1,
                start_new_session=True,
            )
            processes[name] = process
            reader = threading.Thread(
                target=_relay, args=(name.ljust(width), process.stdout, out), daemon=True
            )
            reader.start()
            readers.append(reader)
        if on_start is not None:
            on_start(processes)
        while not stop.is_set():
            for name, process in processes.items():
                if process.poll() is not None:
                    _say(out, f"{name} exited with code {process.returncode}; stopping the rest.")
                    exit_code = process.returncode or 1
                    stop.set()
                    break
            stop.wait(0.2)
        if exit_code == 0:
            _say(out, "Stopping the web server, the worker and the scheduler…")
    finally:
        _stop_all(processes, grace_seconds=grace_seconds, hurry=hurry)
        for reader in readers:
            reader.join(timeout=2)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return exit_code


def _stop_all(
    processes: Mapping[str, subprocess.Popen], *, grace_seconds: float, hurry: threading.Event
) -> None:
    for process in processes.values():
        _signal_group(process, signal.SIGTERM)
    deadline = time.monotonic() + grace_seconds
    while time.monotonic() < deadline and not hurry.is_set():
        if all(process.poll() is not None for process in processes.values()):
            break
        hurry.wait(0.1)
    for process in processes.values():
        if process.poll() is None:
            _signal_group(process, signal.SIGKILL)
        process.wait()


def _signal_group(process: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # already gone
        os.killpg(process.pid, sig)


def _relay(prefix: str, stream: TextIO, out: TextIO) -> None:
    for line in stream:
        out.write(f"{prefix} | {line}")
        out.flush()


def _say(out: TextIO, message: str) -> None:
    out.write(f"\n  {message}\n")
    out.flush()


def _wait_for_port(host: str, port: int, *, timeout: float, stop: Callable[[], bool]) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not stop():
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.2)
    return False


def _describe_database(url: str, var_dir: Path) -> str:
    if not url:
        return f"SQLite ({var_dir / 'db.sqlite3'})"
    parts = urlsplit(url)
    engine = "PostgreSQL" if parts.scheme.startswith(("postgres", "pgsql")) else parts.scheme
    return f"{engine} on {parts.hostname or 'localhost'}{parts.path}"


def _describe_broker(url: str, var_dir: Path) -> str:
    if not url:
        return f"embedded, as files in {var_dir / 'broker'} (no server needed)"
    parts = urlsplit(url)
    return f"Redis on {parts.hostname or 'localhost'}:{parts.port or 6379}{parts.path}"


def banner(*, env: Mapping[str, str], port: str, var_dir: Path) -> str:
    """What `make run` prints once the web server answers."""
    email, password = DEMO_LOGIN
    # The demo's password is published: seed_demo makes its user only with DEBUG on.
    login = (
        f"{email} / {password} (the user seed_demo creates)"
        if env_bool("DEBUG", True)
        else "none (DEBUG is off: seed_demo makes no demo account)"
    )
    return (
        f"\n  Runcrate Clusters is running: {site_url(env, host=HOST, port=port)}/\n"
        f"  Demo login:  {login}\n"
        f"  Database:    {_describe_database(env.get('DATABASE_URL', ''), var_dir)}\n"
        f"  Broker:      {_describe_broker(env.get('REDIS_URL', ''), var_dir)}\n"
        f"  Mail:        written as files to {var_dir / 'mail'}\n"
        f"  Simulated machines boot {env['RUNCRATE_SIM_SPEED']}x faster than real "
        "(RUNCRATE_SIM_SPEED).\n"
        f"  Ctrl-C stops the web server, the worker and the scheduler.\n"
    )


def site_url(env: Mapping[str, str], *, host: str, port: str) -> str:
    """The demo's one address: what `make run` prints and what its emails link to (SITE_URL),
    so the browser keeps one origin's cookies (127.0.0.1 and localhost are two). On 127.0.0.1
    it is `localhost`, SITE_URL's default; on another address (`HOST=172.30.77.1`: the host
    lab) that address, where agents and the emails' readers reach it. What the environment
    sets wins."""
    if env.get("SITE_URL"):
        return env["SITE_URL"].rstrip("/")
    return f"http://{'localhost' if host == '127.0.0.1' else host}:{port}"


def listening_at(env: dict[str, str], *, host: str, port: str) -> None:
    """Every process gets the address `site_url` chose; beyond 127.0.0.1 the agents on real
    hosts reach the dashboard where it listens, and it answers to that name."""
    env["SITE_URL"] = site_url(env, host=host, port=port)
    if host != "127.0.0.1":
        env.setdefault("RUNCRATE_AGENT_URL", f"http://{host}:{port}")
        env.setdefault("ALLOWED_HOSTS", f"localhost,127.0.0.1,{host}")


def the_demo(env: dict[str, str]) -> None:
    """`make run` is the demo (docs/settings.md, RUNCRATE_DEMO): without Stripe keys, a demo
    payment page adds credit, and webhooks may go to private addresses. Only with DEBUG on,
    like the demo user itself: never free credit on a deployment. What the environment sets
    wins."""
    if env_bool("DEBUG", True):
        env.setdefault("RUNCRATE_DEMO", "true")
        # The demo's webhooks may go to a receiver on this machine (docs/notifications.md).
        env.setdefault("RUNCRATE_WEBHOOKS_ALLOW_PRIVATE", "true")


def main() -> int:
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    port = env.get("PORT", "8000")
    if not port.isdigit() or not 0 < int(port) < 65536:
        print(f"PORT must be a port number (1-65535), not {port!r}", file=sys.stderr)
        return 2
    # The demo's simulated machines boot in their real boot time divided by this: a 600 s
    # bare-metal boot takes 20 s at 30x, so the demo is lively.
    env.setdefault("RUNCRATE_SIM_SPEED", "30")
    the_demo(env)
    try:
        ipaddress.IPv4Address(HOST)
    except ValueError:
        print(
            f"HOST must be an IPv4 address to bind (e.g. 127.0.0.1), not {HOST!r}", file=sys.stderr
        )
        return 2
    listening_at(env, host=HOST, port=port)
    var_dir = Path(env.get("RUNCRATE_VAR_DIR") or ROOT / "var").resolve()
    log_level = env.get("LOG_LEVEL", "WARNING")
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        # A container or a CI box runs the demo as root; the warning is for production.
        env.setdefault("PYTHONWARNINGS", "ignore:You're running the worker with superuser")
    python = sys.executable
    celery = [python, "-m", "celery", "--app=config", "--quiet"]
    commands = {
        "web": [python, "manage.py", "runserver", f"{HOST}:{port}", "--noreload", "--skip-checks"],
        # The default queue (advance, the tick's work, the meter, emails) and the machines'
        # queue (bootstraps, installs, wipes: slow) each have their own worker, so slow work
        # never delays the rest (docs/architecture.md, "Workers and queues").
        "worker": [
            *celery,
            "worker",
            f"--loglevel={log_level}",
            "--pool=threads",
            "--concurrency=4",
            "--queues=celery",
            "--hostname=default@%h",
        ],
        "machines": [
            *celery,
            "worker",
            f"--loglevel={log_level}",
            "--pool=threads",
            "--concurrency=8",
            "--queues=machines",
            "--hostname=machines@%h",
        ],
        # Hosts released after their clusters (wipe, reimage, verify: minutes each), side by
        # side in RUNCRATE_RELEASE_CONCURRENCY processes (config/celery.py), never on the
        # threads live clusters' steps run on.
        "releases": [
            *celery,
            "worker",
            f"--loglevel={log_level}",
            "--pool=prefork",
            "--queues=releases",
            "--hostname=releases@%h",
        ],
        # A tenant's host (log fetches) and a customer's receiver (webhooks, Slack): each on a
        # worker of its own, so neither can hold the machines' or the default queue.
        "logs": [
            *celery,
            "worker",
            f"--loglevel={log_level}",
            "--pool=threads",
            "--concurrency=4",
            "--queues=logs",
            "--hostname=logs@%h",
        ],
        "notify": [
            *celery,
            "worker",
            f"--loglevel={log_level}",
            "--pool=threads",
            "--concurrency=4",
            "--queues=notifications",
            "--hostname=notify@%h",
        ],
        "beat": [*celery, "beat", f"--loglevel={log_level}"],
    }
    stopped = threading.Event()

    def announce(processes: dict[str, subprocess.Popen]) -> None:
        def wait_then_print() -> None:
            web = processes["web"]
            if not _wait_for_port(
                HOST, int(port), timeout=60, stop=lambda: stopped.is_set() or web.poll() is not None
            ):
                return
            print(banner(env=env, port=port, var_dir=var_dir), flush=True)

        threading.Thread(target=wait_then_print, daemon=True).start()

    try:
        return supervise(commands, cwd=ROOT, env=env, on_start=announce)
    finally:
        stopped.set()


if __name__ == "__main__":
    sys.exit(main())
