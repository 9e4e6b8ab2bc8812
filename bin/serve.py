"""Run the Procfile's processes and restart any that dies: what `make serve` runs.

honcho (what `make serve` ran before) stops every process when one exits, so one crashed or
OOM-killed worker took the web server down with it and nothing came back. This supervisor reads
the same process definitions honcho does (`honcho.environ`: the Procfile, `.env` if there is
one, PORT given out as honcho gives it, web first), runs each in its own process group with its
output behind its name, and restarts a process that exits, after a pause that doubles with each
quick death (1 s up to 30 s; back to 1 s once it has run a minute). SIGINT or SIGTERM stops them
all: SIGTERM to each group, SIGKILL to whatever still runs after the grace period (longer than
the web's 30 s graceful timeout). Why not supervisord or systemd: see docs/architecture.md,
"Processes". The demo's `make run` (bin/run.py) keeps its own supervision.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from honcho.environ import expand_processes, parse, parse_procfile

ROOT = Path(__file__).resolve().parent.parent
FIRST_PAUSE = 1.0  # seconds before the first restart of a process that died
LONGEST_PAUSE = 30.0
SETTLED_AFTER = 60.0  # a process that ran this long starts again from the first pause
GRACE_SECONDS = 40.0


@dataclass
class Supervised:
    """One Procfile process: its command, environment, and the run it is on."""

    name: str
    command: str
    env: dict[str, str]
    process: subprocess.Popen | None = None
    started_at: float = 0.0
    restarts: int = 0
    pause: float = FIRST_PAUSE
    due_at: float | None = None  # when a dead one is started again
    relays: list[threading.Thread] = field(default_factory=list)


def definitions(procfile: Path, env: Mapping[str, str]) -> list[Supervised]:
    """The Procfile's processes as honcho would start them: the environment, `.env` beside the
    Procfile on top of it (as `honcho start` reads it), and PORT from $PORT (default 5000, as
    honcho's), 100 more for each process after the first."""
    merged = dict(env)
    dotenv = procfile.parent / ".env"
    if dotenv.is_file():
        merged.update(parse(dotenv.read_text()))
    processes = parse_procfile(procfile.read_text()).processes
    port = int(merged.get("PORT") or 5000)
    return [
        Supervised(name=params.name.rsplit(".", 1)[0], command=params.cmd, env=params.env)
        for params in expand_processes(processes, env=merged, port=port)
    ]


class Supervisor:
    def __init__(
        self, processes: list[Supervised], *, cwd: Path, out: TextIO, grace: float = GRACE_SECONDS
    ) -> None:
        self.processes = processes
        self.cwd = cwd
        self.out = out
        self.grace = grace
        self.width = max(len(name) for name in [p.name for p in processes] + ["serve"])
        self.stop = threading.Event()
        self.hurry = threading.Event()
        self.lock = threading.Lock()

    def run(self) -> int:
        """Start every process, keep each running until asked to stop, then stop them all."""
        previous = {
            sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)
        }
        names = ", ".join(p.name for p in self.processes)
        self.say(
            f"make serve: supervising {names}. A process that dies is restarted "
            f"(after {FIRST_PAUSE:.0f} s, doubling to {LONGEST_PAUSE:.0f} s while it keeps dying); "
            "Ctrl-C stops them all."
        )
        try:
            for supervised in self.processes:
                self._start(supervised)
            while not self.stop.is_set():
                self._check(time.monotonic())
                self.stop.wait(0.2)
            self.say("Stopping " + names + "…")
        finally:
            self._stop_all()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return 0

    def _on_signal(self, signum: int, frame: object) -> None:
        if self.stop.is_set():
            self.hurry.set()  # a second Ctrl-C: kill now
        self.stop.set()

    def _check(self, now: float) -> None:
        for supervised in self.processes:
            process = supervised.process
            if supervised.due_at is not None:
                if now >= supervised.due_at:
                    supervised.restarts += 1
                    self._start(supervised)
                continue
            if process is None or process.poll() is None:
                continue
            # Whatever of it is left (the shell's child when only the shell died) goes too: a
            # gunicorn master left behind would hold the port its restart needs.
            _signal_group(process, signal.SIGKILL)
            if now - supervised.started_at >= SETTLED_AFTER:
                supervised.pause = FIRST_PAUSE
            self.say(
                f"{supervised.name} exited with code {process.returncode}; restarting it in "
                f"{supervised.pause:.0f} s (restart {supervised.restarts + 1})."
            )
            supervised.due_at = now + supervised.pause
            supervised.pause = min(supervised.pause * 2, LONGEST_PAUSE)

    def _start(self, supervised: Supervised) -> None:
        # Its own process group (session): Ctrl-C in the terminal reaches only this supervisor,
        # which stops the groups in order; a restart kills nothing of the others.
        process = subprocess.Popen(  # noqa: S603 - the Procfile's line, through a shell as honcho runs it
            ["/bin/sh", "-c", supervised.command],
            cwd=self.cwd,
            env={**os.environ, **supervised.env},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        supervised.process = process
        supervised.started_at = time.monotonic()
        supervised.due_at = None
        relay = threading.Thread(target=self._relay, args=(supervised.name, process), daemon=True)
        relay.start()
        supervised.relays = [t for t in supervised.relays if t.is_alive()] + [relay]
        self.say(f"{supervised.name} started with pid {process.pid}.", name="serve")

    def _relay(self, name: str, process: subprocess.Popen) -> None:
        for raw in process.stdout:
            self.write(name, raw.decode(errors="replace"))

    def _stop_all(self) -> None:
        running = [p.process for p in self.processes if p.process and p.process.poll() is None]
        for process in running:
            _signal_group(process, signal.SIGTERM)
        deadline = time.monotonic() + self.grace
        while time.monotonic() < deadline and not self.hurry.is_set():
            if all(process.poll() is not None for process in running):
                break
            self.hurry.wait(0.1)
        for process in running:
            if process.poll() is None:
                _signal_group(process, signal.SIGKILL)
            process.wait()
        for supervised in self.processes:
            for relay in supervised.relays:
                relay.join(timeout=2)

    def write(self, name: str, line: str) -> None:
        stamp = time.strftime("%H:%M:%S")
        with self.lock:
            self.out.write(f"{stamp} {name.ljust(self.width)} | {line.rstrip()}\n")
            self.out.flush()

    def say(self, message: str, *, name: str = "serve") -> None:
        self.write(name, message)


def _signal_group(process: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # already gone
        os.killpg(process.pid, sig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--procfile", type=Path, default=ROOT / "Procfile")
    args = parser.parse_args(argv)
    processes = definitions(args.procfile, os.environ)
    return Supervisor(processes, cwd=args.procfile.parent, out=sys.stdout).run()


if __name__ == "__main__":
    sys.exit(main())
