"""`runcrate clusters top NAME` (issue 23, item 7): the metrics answer once with --json (or
without a terminal), a live table on a terminal that follows new reports until Ctrl-C (exit 0),
and the API's refusals (an unknown cluster, another window) as every command gives them."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import signal
import struct
import subprocess
import termios
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from clusters.telemetry import metrics, simulated_metrics
from tests.cli.kit import ANSI, CLI_PYTHON, REPO, assert_no_traceback, ready_cluster, run_cli

pytestmark = pytest.mark.django_db(transaction=True)


def test_json_prints_the_metrics_answer_once(env, tmp_path, account, ticker):
    cluster = ready_cluster(account, ticker, gpus=2)
    simulated_metrics.report()
    now = timezone.now()

    result = run_cli("clusters", "top", "train", env=env, tmp_path=tmp_path)

    assert result.code == 0, result.stderr
    data = result.json()
    assert data["window"] == "15m"
    assert [node["name"] for node in data["nodes"]] == ["node-0", "node-1"]
    for node in cluster.nodes.order_by("index"):
        shown = data["nodes"][node.index]
        assert shown["health"] == {"status": "healthy", "problems": []}
        assert [g["utilization_percent"] for g in shown["gpus"]] == [
            simulated_metrics.utilization(node.pk, index, now) for index in range(2)
        ]
        assert len(shown["series"]) == 2
    assert_no_traceback(result)


def test_window_chooses_the_series_and_another_is_the_apis_refusal(env, tmp_path, account, ticker):
    ready_cluster(account, ticker)

    hour = run_cli(
        "clusters", "top", "train", "--window", "1h", "--json", env=env, tmp_path=tmp_path
    )
    wrong = run_cli("clusters", "top", "train", "--window", "2d", env=env, tmp_path=tmp_path)

    assert hour.code == 0, hour.stderr
    assert hour.json()["window"] == "1h" and hour.json()["resolution_seconds"] == 60
    assert wrong.code == 1
    assert wrong.json()["error"]["code"] == "invalid_window"
    assert "window must be one of 15m, 1h, 24h, 7d" in wrong.stderr
    assert_no_traceback(wrong)


def test_an_unknown_cluster_is_refused_as_every_command_refuses_it(env, tmp_path, account):
    by_name = run_cli("clusters", "top", "nowhere", env=env, tmp_path=tmp_path)
    by_id = run_cli("clusters", "top", "999999", env=env, tmp_path=tmp_path)

    for result in (by_name, by_id):
        assert result.code == 1
        assert result.json()["error"]["code"] == "not_found"
        assert_no_traceback(result)


class Terminal:
    """`runcrate ARGS` on a pseudo-terminal `columns` wide, read while it runs."""

    def __init__(self, *args: str, env: dict[str, str], columns: int = 160) -> None:
        self.leader, follower = pty.openpty()
        fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
        self.process = subprocess.Popen(
            [CLI_PYTHON, "-m", "runcrate_cli", *args],
            cwd=REPO,
            env={**env, "TERM": "xterm-256color", "COLUMNS": str(columns)},
            stdin=subprocess.DEVNULL,
            stdout=follower,
            stderr=subprocess.PIPE,
            text=True,
        )
        os.close(follower)
        self.screen = ""

    def wait_for(self, text: str, *, timeout: float = 30) -> None:
        """Read the screen until `text` shows (bounded)."""
        deadline = time.monotonic() + timeout
        while text not in self.screen:
            assert time.monotonic() < deadline, f"{text!r} never showed: {self.screen[-2000:]}"
            assert self.process.poll() is None, self.process.stderr.read()  # type: ignore[union-attr]
            readable, _, _ = select.select([self.leader], [], [], 0.05)
            if readable:
                chunk = os.read(self.leader, 65536)
                self.screen += ANSI.sub("", chunk.decode("utf-8", "replace"))

    def interrupt(self) -> tuple[int, str]:
        self.process.send_signal(signal.SIGINT)
        code = self.process.wait(timeout=10)
        os.close(self.leader)
        return code, self.process.stderr.read()  # type: ignore[union-attr]

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def gpu_row(index: int, utilization: float) -> dict:
    return {
        "index": index,
        "utilization_percent": utilization,
        "memory_used_mib": 70_000,
        "memory_total_mib": 81_920,
        "temperature_c": 71.0,
        "power_w": 655.0,
        "power_limit_w": 700.0,
        "sm_clock_mhz": 1980,
        "throttle": 0b1000,  # hw_slowdown
        "ecc_corrected": 0,
        "ecc_uncorrected": 0,
        "retired_pages_pending": False,
        "remapped_rows_pending": False,
    }


def test_on_a_terminal_it_follows_new_reports_until_ctrl_c(env, tmp_path, account, ticker, clock):
    cluster = ready_cluster(account, ticker, gpus=2)
    node_0, node_1 = cluster.nodes.order_by("index")
    cluster.health_problems = {
        "ecc": {"node": "node-1", "message": "node-1 GPU 1: 4 uncorrectable ECC errors."}
    }
    cluster.save(update_fields=["health_problems"])
    metrics.store(
        node_0.pk, cluster.pk, gpus=[gpu_row(0, 37.0), gpu_row(1, 38.0)], host=None,
        at=timezone.now(),
    )  # fmt: skip

    terminal = Terminal("clusters", "top", "train", "--every", "0.2", env=env)
    try:
        terminal.wait_for("node-1 GPU 1: 4 uncorrectable ECC errors.")
        first = terminal.screen
        clock.shift(timedelta(seconds=15))
        metrics.store(
            node_0.pk, cluster.pk, gpus=[gpu_row(0, 93.0), gpu_row(1, 38.0)], host=None,
            at=timezone.now(),
        )  # fmt: skip
        terminal.wait_for("93%")
        code, stderr = terminal.interrupt()
    finally:
        terminal.kill()

    assert code == 0, stderr
    assert "Traceback" not in stderr + terminal.screen
    # Columns two spaces apart at least (no borders); a value has single spaces only.
    rows = [re.split(r"\s{2,}", line.strip()) for line in first.splitlines()]
    header = rows.index(["node", "GPU", "util", "avg/max", "memory", "temp", "power", "throttle"])
    assert rows[header + 2] == [
        "node-0", "0", "37%", "37/37%", "68/80 GiB", "71 °C", "655/700 W", "hw_slowdown"
    ]  # fmt: skip
    assert rows[header + 3][:3] == ["healthy", "1", "38%"]
    # A node without a report yet: no figures, its health under its name.
    assert rows[header + 4] == ["node-1", "—", "no report yet"]
    assert rows[header + 5] == ["unhealthy"]
    # After the new report: its utilisation, and the window's mean and max of both.
    assert re.search(r"node-0\s+0\s+93%\s+65/93%", terminal.screen[len(first) :])


def test_eight_gpus_a_node_fit_80_columns_with_the_idle_notice(env, tmp_path, account, ticker):
    cluster = ready_cluster(account, ticker, gpus=8)
    cluster.idle_since = timezone.now() - timedelta(minutes=45)  # as the idle notice sets it
    cluster.save(update_fields=["idle_since"])
    simulated_metrics.report()

    terminal = Terminal("clusters", "top", str(cluster.pk), env=env, columns=80)
    try:
        terminal.wait_for("Ctrl-C to stop.")
        code, stderr = terminal.interrupt()
    finally:
        terminal.kill()

    assert code == 0, stderr
    frame = terminal.screen[: terminal.screen.index("Ctrl-C to stop.")]  # the first
    lines = frame.splitlines()
    assert max(len(line.rstrip()) for line in lines) <= 80
    gpu_rows = [
        line for line in lines if re.match(r"\s*(node-\d|healthy)?\s+\d\s+\d+(\.\d)?%", line)
    ]
    assert len(gpu_rows) == 16, frame
    assert re.search(r"16 GPUs idle for 45 min, costing \$[\d.,]+ per hour \(nothing is", frame)
