"""A Celery worker as production starts it: the Procfile's own line for a process, run as a
process of its own on the test's database and broker (tests that show one queue's work holds
nothing of another's: docs/architecture.md, "Queues")."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from django.conf import settings
from django.db import connection

ROOT = Path(__file__).resolve().parent.parent


def procfile_command(process: str) -> list[str]:
    """The Procfile's command for `process`, runnable here: this interpreter's celery, the log
    level set, and no mingle or gossip with other workers on the broker (a test's worker only
    takes its queue's tasks)."""
    lines = (ROOT / "Procfile").read_text().splitlines()
    (line,) = [line for line in lines if line.startswith(f"{process}:")]
    words = shlex.split(line.partition(":")[2])
    assert words[0] == "celery", line
    words = [w for w in words[1:] if not w.startswith("--loglevel=")]
    return [sys.executable, "-m", "celery", *words, "--loglevel=INFO"] + [
        "--without-mingle",
        "--without-gossip",
    ]


@contextlib.contextmanager
def procfile_worker(process: str, log_file: Path, **env: str) -> Iterator[subprocess.Popen]:
    """The worker Procfile's `process` line starts, with `env` added; ready to take tasks when
    it is yielded (its log says so within 60 s), stopped after."""
    database = connection.settings_dict
    environment = {
        **os.environ,
        "DATABASE_URL": f"postgres://{database['USER']}@{database['HOST'] or '127.0.0.1'}:"
        f"{database['PORT'] or 5432}/{database['NAME']}",
        "REDIS_URL": settings.REDIS_URL,
        "SECRET_KEY": settings.SECRET_KEY,
        "RUNCRATE_SSH_KEY_FILE": str(settings.RUNCRATE_SSH_KEY_FILE),
        "DJANGO_SETTINGS_MODULE": "config.settings",
        **env,
    }
    with open(log_file, "ab") as log:
        worker = subprocess.Popen(
            procfile_command(process),
            cwd=ROOT,
            env=environment,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        give_up = time.monotonic() + 60
        while "ready." not in log_file.read_text(errors="replace"):
            assert worker.poll() is None, log_file.read_text(errors="replace")
            assert time.monotonic() < give_up, log_file.read_text(errors="replace")
            time.sleep(0.5)
        yield worker
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(worker.pid, signal.SIGTERM)
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(timeout=10)
