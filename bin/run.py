"""Start the whole product: web server, Celery worker and beat scheduler. Ctrl-C stops all.

Called by `make run` after migrate and seed_demo. Each process gets the same environment, so
DATABASE_URL, REDIS_URL, RUNCRATE_VAR_DIR and the other settings apply to all three.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
PORT = os.environ.get("PORT", "8000")
HOST = os.environ.get("RUNCRATE_BIND", "127.0.0.1")


def main() -> int:
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    # The demo's simulated machines boot in their real boot time divided by this. A 600 s
    # bare-metal boot takes 20 s at 30x, so the demo is lively; set RUNCRATE_SIM_SPEED=1 for
    # real timings.
    env.setdefault("RUNCRATE_SIM_SPEED", "30")
    var_dir = env.get("RUNCRATE_VAR_DIR", str(ROOT / "var"))
    celery = [PYTHON, "-m", "celery", "-A", "runcrate"]
    commands = {
        "web": [PYTHON, "manage.py", "runserver", f"{HOST}:{PORT}", "--noreload"],
        "worker": celery + ["worker", "--loglevel=INFO", "--pool=threads", "--concurrency=4"],
        "beat": celery
        + ["beat", "--loglevel=INFO", f"--schedule={Path(var_dir) / 'celerybeat-schedule'}"],
    }
    processes = {
        name: subprocess.Popen(cmd, cwd=ROOT, env=env, start_new_session=True)  # noqa: S603
        for name, cmd in commands.items()
    }
    print(
        f"\n  Runcrate Clusters is starting on http://{HOST}:{PORT}/\n"
        f"  Demo login: demo@runcrate.localhost / demo-gpus-2026\n"
        f"  Simulated machines boot {env['RUNCRATE_SIM_SPEED']}x faster than real "
        f"(RUNCRATE_SIM_SPEED).\n  Mail is written to {var_dir}/mail/. Ctrl-C stops everything.\n",
        flush=True,
    )

    stopping = False

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    exit_code = 0
    while not stopping:
        for name, process in processes.items():
            if process.poll() is not None:
                print(f"{name} exited with {process.returncode}; stopping the rest.", flush=True)
                exit_code = process.returncode or 1
                stopping = True
        time.sleep(0.5)
    for process in processes.values():
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    for process in processes.values():
        try:
            process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
