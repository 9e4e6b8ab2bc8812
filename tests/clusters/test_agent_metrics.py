"""The agent's metrics report (issue 23, item 1): nvidia-smi's figures per GPU, the node's from
/proc, sent every `metrics_seconds` the dashboard asks for; and the lab's stand-in nvidia-smi,
which answers the same query with figures a test sets.

nvidia-smi outputs are files in tests/clusters/data/nvidia-smi/ written to the documented format
(its README); /proc files are written by the tests; the dashboard is a real HTTP server on
127.0.0.1, and the agent's loop runs on a clock the test moves, never sleeping.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from clusters.machines.runcrate_agent import (
    METRICS_QUERY,
    METRICS_QUERY_BEFORE_535,
    Agent,
    CpuReading,
    GpuMetrics,
    Settings,
    node_metrics,
    parse_metrics,
)
from lab.hostlab import gpu_figures_text

DATA = Path(__file__).parent / "data" / "nvidia-smi"
STAND_IN = Path(__file__).parents[2] / "lab" / "image" / "nvidia-smi"
TOKEN = "rcnode_metrics-token-never-logged"


def fixture(name: str) -> str:
    return (DATA / name).read_text()


# --- parsing nvidia-smi's figures --------------------------------------------------------------


def test_it_reads_an_h100_on_driver_550_as_the_contracts_gpu():
    gpus = parse_metrics(fixture("h100-sxm5-80gb-driver-550.csv"))

    assert [gpu["index"] for gpu in gpus] == list(range(8))
    assert gpus[0] == {
        "index": 0,
        "uuid": "GPU-8d1f0e2a-3b4c-4d5e-a6f7-08192a3b4c5d",
        "utilization_percent": 97,
        "memory_used_mib": 70000,
        "memory_total_mib": 81559,
        "temperature_c": 61,
        "power_w": 650.3,
        "power_limit_w": 700.0,
        "sm_clock_mhz": 1980,
        "throttle": [],
        "ecc_corrected": 0,
        "ecc_uncorrected": 0,
        "remapped_rows_pending": False,
    }  # retired_pages.pending is [N/A] on Hopper (it remaps rows): left out
    # HW thermal slowdown engages HW slowdown too; only the active reasons are listed.
    assert gpus[2]["throttle"] == ["hw_slowdown", "hw_thermal_slowdown"]
    assert gpus[2]["sm_clock_mhz"] == 1095
    assert (gpus[5]["ecc_uncorrected"], gpus[5]["remapped_rows_pending"]) == (2, True)
    assert gpus[4]["ecc_corrected"] == 12


def test_it_reads_an_a100_on_driver_535_at_its_power_cap_and_idle():
    gpus = parse_metrics(fixture("a100-sxm4-80gb-driver-535.csv"))

    assert len(gpus) == 4
    assert gpus[1]["throttle"] == ["sw_power_cap"]
    assert (gpus[1]["power_w"], gpus[1]["power_limit_w"]) == (399.87, 400.0)
    assert gpus[1]["ecc_corrected"] == 3
    # Idle is no throttle reason of the contract's: GPU 3 lists none.
    assert gpus[3]["throttle"] == []
    assert (gpus[3]["utilization_percent"], gpus[3]["memory_used_mib"]) == (0, 4)
    assert all("retired_pages_pending" not in gpu for gpu in gpus)


def test_it_leaves_out_what_a_consumer_gpu_on_driver_570_does_not_report():
    gpus = parse_metrics(fixture("rtx-4090-driver-570.csv"))

    assert gpus[0] == {
        "index": 0,
        "uuid": "GPU-d4e5f6a7-b8c9-4d0e-a1f2-a3b4c5d6e7f8",
        "utilization_percent": 45,
        "memory_used_mib": 12034,
        "memory_total_mib": 24564,
        "temperature_c": 58,
        "power_w": 287.45,
        "power_limit_w": 450.0,
        "sm_clock_mhz": 2745,
        "throttle": [],
    }  # no ECC, no retired pages, no remapped rows: [N/A], so absent
    assert gpus[1]["utilization_percent"] == 0


def test_it_reads_the_older_throttle_names_of_drivers_before_535():
    gpus = parse_metrics(fixture("a100-pcie-40gb-driver-525.csv"), METRICS_QUERY_BEFORE_535)

    assert gpus[0]["throttle"] == ["sw_thermal_slowdown", "sw_power_cap"]
    assert gpus[0]["memory_total_mib"] == 40960


def test_the_query_asks_for_every_figure_of_the_contract_by_its_documented_name():
    assert METRICS_QUERY[:9] == (
        "index", "uuid", "utilization.gpu", "memory.used", "memory.total", "temperature.gpu",
        "power.draw", "power.limit", "clocks.sm",
    )  # fmt: skip
    assert "clocks_event_reasons.hw_power_brake_slowdown" in METRICS_QUERY
    assert "clocks_throttle_reasons.hw_power_brake_slowdown" in METRICS_QUERY_BEFORE_535
    for name in ("ecc.errors.corrected.volatile.total", "ecc.errors.uncorrected.volatile.total",
                 "retired_pages.pending", "remapped_rows.pending"):  # fmt: skip
        assert name in METRICS_QUERY and name in METRICS_QUERY_BEFORE_535


def line(**values: str) -> str:
    """One GPU's line for METRICS_QUERY: every figure [N/A] but those given."""
    return ", ".join(values.get(name, "[N/A]") for name in METRICS_QUERY)


def test_it_skips_odd_lines_and_leaves_out_figures_it_cannot_read():
    text = "\n".join(
        [
            "",
            'Field "clocks_event_reasons.active" is not a valid field to query.',
            "0, GPU-1, 97",  # too few values
            line(index="one", uuid="GPU-x"),  # no index
            line(
                index="3",
                **{
                    "utilization.gpu": "[Unknown Error]",
                    "power.draw": "nan",
                    "memory.used": "12.5",
                    "temperature.gpu": "N/A",
                    "memory.total": "",
                    "retired_pages.pending": "Maybe",
                    "clocks.sm": "[GPU requires reset]",
                },
            ),  # fmt: skip
            line(index="4", **{"power.draw": "[Not Supported]", "temperature.gpu": "44"}),
        ]
    )

    assert parse_metrics(text) == [{"index": 3}, {"index": 4, "temperature_c": 44}]


def test_it_reads_the_active_reasons_from_the_bit_mask_when_their_own_fields_give_none():
    text = line(index="0", **{"clocks_event_reasons.active": "0x00000000000000C4"})

    [gpu] = parse_metrics(text)

    assert gpu["throttle"] == ["hw_thermal_slowdown", "hw_power_brake_slowdown", "sw_power_cap"]


# --- asking nvidia-smi, and falling back ------------------------------------------------------


@pytest.fixture
def bin_dir(tmp_path, monkeypatch) -> Path:
    """First on PATH (the rest stays: the lab's stand-in needs awk, md5sum and sed)."""
    path = tmp_path / "bin"
    path.mkdir()
    monkeypatch.setenv("PATH", f"{path}{os.pathsep}{os.environ['PATH']}")
    return path


def stand_in(bin_dir: Path, name: str, script: str) -> None:
    executable = bin_dir / name
    executable.write_text("#!/bin/sh\n" + script)
    executable.chmod(0o755)


def test_a_driver_that_refuses_a_field_is_asked_the_older_query_once_and_then_always(
    bin_dir, tmp_path, caplog
):
    calls = tmp_path / "calls"
    older = fixture("a100-pcie-40gb-driver-525.csv").strip()
    stand_in(
        bin_dir,
        "nvidia-smi",
        f"""echo "$1" >> {calls}
case "$1" in
  *clocks_event_reasons*) echo 'Field "clocks_event_reasons.active" is not a valid field to query.'
                          echo; exit 2 ;;
esac
echo '{older}'
""",
    )
    caplog.set_level(logging.INFO, logger="runcrate-agent")
    reader = GpuMetrics()

    first, second = reader.read(), reader.read()

    assert first == second
    assert first[0]["throttle"] == ["sw_thermal_slowdown", "sw_power_cap"]
    asked = calls.read_text().splitlines()
    assert asked == [
        f"--query-gpu={','.join(q)}" for q in (METRICS_QUERY, *[METRICS_QUERY_BEFORE_535] * 2)
    ]
    assert "does not know a field" in caplog.text


def test_a_failure_that_is_no_unknown_field_gives_no_gpus_and_keeps_the_query(bin_dir):
    stand_in(bin_dir, "nvidia-smi", "echo 'No devices were found'; exit 6\n")
    reader = GpuMetrics()

    assert reader.read() == []
    assert reader.fields == METRICS_QUERY


def test_without_nvidia_smi_there_are_no_gpus(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))

    assert GpuMetrics().read() == []


# --- the node's figures -----------------------------------------------------------------------


NET_DEV = """\
Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo:  918273      910    0    0    0     0          0         0   918273      910    0    0    0     0       0          0
  eth0: 5566778899 4433221    0   12    0     0          0      3301 1122334455 998877    0    0    0     0       0          0
   rc0: 123456789   98765    0    0    0     0          0         0 98765432   87654    0    0    0     0       0          0
"""  # noqa: E501


def fake_proc(tmp_path: Path, *, stat: str, mounts: str = "", meminfo: str | None = None) -> Path:
    proc = tmp_path / "proc"
    (proc / "net").mkdir(parents=True, exist_ok=True)
    (proc / "stat").write_text(stat)
    (proc / "meminfo").write_text(
        meminfo
        if meminfo is not None
        else "MemTotal:       2113929216 kB\nMemFree:        1999999999 kB\n"
        "MemAvailable:   2092957696 kB\nBuffers:         1024 kB\n"
    )
    (proc / "mounts").write_text(mounts)
    (proc / "net" / "dev").write_text(NET_DEV)
    return proc


def test_node_metrics_read_cpu_memory_disks_and_the_private_interfaces_bytes(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    mounts = f"/dev/sda1 / ext4 rw 0 0\nroot@10.77.0.1:/shared {shared} fuse.sshfs rw 0 0\n"
    # user nice system idle iowait irq softirq steal guest guest_nice
    proc = fake_proc(
        tmp_path, stat="cpu  1000 0 500 8000 500 0 0 0 0 0\ncpu0 1 2 3 4\n", mounts=mounts
    )

    first, reading = node_metrics(None, interface="rc0", shared=str(shared), proc=proc)
    (proc / "stat").write_text("cpu  1600 0 700 8950 550 0 0 0 0 0\n")
    second, _ = node_metrics(reading, interface="rc0", shared=str(shared), proc=proc)

    assert "cpu_percent" not in first  # one reading is no interval yet
    assert reading == CpuReading(busy=1500, total=10000)
    # 800 busy of 1800 jiffies (iowait counts as idle).
    assert second["cpu_percent"] == 44.4
    assert (second["memory_used_mib"], second["memory_total_mib"]) == (20480, 2064384)
    root = os.statvfs("/")
    assert second["disk_root_total_gib"] == round(root.f_blocks * root.f_frsize / 2**30, 1)
    tmp = os.statvfs(shared)
    assert second["disk_shared_total_gib"] == round(tmp.f_blocks * tmp.f_frsize / 2**30, 1)
    assert 0 <= second["disk_shared_used_gib"] <= second["disk_shared_total_gib"]
    assert (second["network_rx_bytes"], second["network_tx_bytes"]) == (123456789, 98765432)


def test_node_metrics_leave_out_an_unmounted_shared_and_a_missing_interface(tmp_path):
    proc = fake_proc(
        tmp_path,
        stat="cpu  1 0 1 1 0 0 0 0 0 0\n",
        mounts="/dev/sda1 / ext4 rw 0 0\n",
        meminfo="MemTotal: 1048576 kB\nMemFree: 262144 kB\nBuffers: 0 kB\nCached: 262144 kB\n",
    )

    node, _ = node_metrics(None, interface="wg-runcrate", shared=str(tmp_path), proc=proc)

    assert set(node) == {
        "memory_used_mib", "memory_total_mib", "disk_root_used_gib", "disk_root_total_gib",
    }  # fmt: skip
    # An old kernel without MemAvailable: free, buffers and cache count as available.
    assert (node["memory_used_mib"], node["memory_total_mib"]) == (512, 1024)


def test_node_metrics_never_fail_on_missing_or_garbled_proc_files(tmp_path):
    proc = tmp_path / "nothing-here"
    (proc / "net").mkdir(parents=True)
    (proc / "stat").write_text("garbage\n")
    (proc / "net" / "dev").write_text("rc0: not numbers\n")

    node, reading = node_metrics(None, interface="rc0", shared="/shared", proc=proc)

    assert reading is None
    assert set(node) == {"disk_root_used_gib", "disk_root_total_gib"}


# --- the agent's loop -------------------------------------------------------------------------


class Clock:
    """The agent's clock: its sleeps move it (and a loop that never sleeps fails the test)."""

    def __init__(self) -> None:
        self.now = 5000.0
        self.sleeps = 0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps += 1
        assert self.sleeps < 1000, "the loop does not stop"
        self.now += seconds


@dataclass
class Sent:
    path: str
    at: float  # seconds on the agent's clock since the start
    authorization: str
    body: dict


def joined(**changes) -> tuple[int, dict]:
    data = {"node": "node-1", "private_ip": "127.0.0.2", "step": "done", "status": "joined"}
    return 200, {"data": data | changes}


def refusal(status: int, code: str, message: str) -> tuple[int, dict]:
    return status, {"error": {"code": code, "message": message}}


RELEASED = refusal(410, "node_released", "This node was released; stop the agent.")
TAKEN = (200, {"data": {"metrics_seconds": 15}})


class _Handler(BaseHTTPRequestHandler):
    server: Dashboard

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        kind = self.path.rsplit("/", 1)[1]
        at = self.server.clock.now - self.server.started
        self.server.sent.append(Sent(kind, at, self.headers["Authorization"], body))
        answers = self.server.answers[kind]
        status, payload, *headers = answers.pop(0) if len(answers) > 1 else answers[0]
        content = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        for name, value in (headers[0] if headers else {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(content)))
        self.end_headers()
        self.wfile.write(content)

    def log_message(self, *args) -> None:
        pass


class Dashboard(ThreadingHTTPServer):
    """Answers each endpoint with its answers in turn (the last one for ever after)."""

    def __init__(self, clock: Clock) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.clock = clock
        self.started = clock.now
        # (status, body) or (status, body, headers)
        self.answers: dict[str, list[tuple]] = {
            "check-in": [RELEASED],
            "metrics": [TAKEN],
        }
        self.sent: list[Sent] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def timeline(self) -> list[tuple[str, float]]:
        return [(sent.path, sent.at) for sent in self.sent]


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def dashboard(clock):
    server = Dashboard(clock)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def lab_gpus(bin_dir, tmp_path, monkeypatch) -> Path:
    """The lab's stand-in nvidia-smi on PATH with two H100s; the figures file it reads."""
    gpus, figures = tmp_path / "gpus", tmp_path / "gpu-figures"
    gpus.write_text("NVIDIA H100 80GB HBM3,81559,2\n")
    monkeypatch.setenv("RUNCRATE_LAB_GPUS_FILE", str(gpus))
    monkeypatch.setenv("RUNCRATE_LAB_FIGURES_FILE", str(figures))
    stand_in(bin_dir, "nvidia-smi", f'exec sh {STAND_IN} "$@"\n')
    return figures


def new_agent(dashboard: Dashboard, clock: Clock, **settings) -> Agent:
    return Agent(
        dashboard.url,
        "7",
        TOKEN,
        settings=Settings(**({"heartbeat_seconds": 30, "retry_seconds": 5} | settings)),
        clock=clock,
        sleep=clock.sleep,
    )


def test_it_sends_metrics_every_metrics_seconds_between_its_heartbeats(dashboard, clock, lab_gpus):
    lab_gpus.write_text(gpu_figures_text({1: {"utilization.gpu": 88, "temperature.gpu": 71}}))
    dashboard.answers["check-in"] = [
        joined(metrics_seconds=15),
        joined(metrics_seconds=15),
        RELEASED,
    ]

    assert new_agent(dashboard, clock).run() == 1

    assert dashboard.timeline() == [
        ("check-in", 0), ("metrics", 0), ("metrics", 15),
        ("check-in", 30), ("metrics", 30), ("metrics", 45),
        ("check-in", 60),
    ]  # fmt: skip
    report = next(sent for sent in dashboard.sent if sent.path == "metrics")
    assert report.authorization == f"Bearer {TOKEN}"
    assert set(report.body) == {"gpus", "node"}
    assert [gpu["index"] for gpu in report.body["gpus"]] == [0, 1]
    assert report.body["gpus"][1]["utilization_percent"] == 88
    assert report.body["gpus"][1]["temperature_c"] == 71
    assert report.body["gpus"][0]["utilization_percent"] == 0
    assert report.body["node"]["memory_total_mib"] > 0  # this machine's own /proc
    assert "cpu_percent" in dashboard.sent[2].body["node"]  # the second has an interval


def test_it_sends_no_metrics_while_the_answers_ask_for_none(dashboard, clock, lab_gpus):
    dashboard.answers["check-in"] = [
        joined(),
        joined(metrics_seconds=None),
        joined(metrics_seconds=10),
        joined(metrics_seconds=None),  # degraded no longer: stopping, say
        RELEASED,
    ]
    dashboard.answers["metrics"] = [(200, {"data": {"metrics_seconds": 10}})]

    new_agent(dashboard, clock).run()

    assert dashboard.timeline() == [
        ("check-in", 0), ("check-in", 30),
        ("check-in", 60), ("metrics", 60), ("metrics", 70), ("metrics", 80),
        ("check-in", 90), ("check-in", 120),
    ]  # fmt: skip


def test_a_refused_or_unanswered_report_is_logged_once_and_sent_again_next_interval(
    dashboard, clock, lab_gpus, caplog
):
    caplog.set_level(logging.INFO, logger="runcrate-agent")
    dashboard.answers["check-in"] = [joined(metrics_seconds=15)] * 2 + [RELEASED]
    dashboard.answers["metrics"] = [
        refusal(422, "invalid_report", "gpus[0].utilization_percent is not a number"),
        refusal(422, "invalid_report", "gpus[0].utilization_percent is not a number"),
        (503, {"error": {"code": "unavailable", "message": "Down for a moment."}}),
        TAKEN,
    ]

    assert new_agent(dashboard, clock).run() == 1

    assert [at for path, at in dashboard.timeline() if path == "metrics"] == [0, 15, 30, 45]
    lines = [r.getMessage() for r in caplog.records if "metrics" in r.getMessage()]
    assert lines == [
        "the dashboard refused metrics: 422 (gpus[0].utilization_percent is not a number)",
        "the dashboard refused metrics: 503 (Down for a moment.)",
        "sending metrics every 15 s",
    ]
    assert TOKEN not in caplog.text


def test_a_report_refused_as_too_soon_waits_the_retry_after_it_was_told(
    dashboard, clock, lab_gpus, caplog
):
    caplog.set_level(logging.INFO, logger="runcrate-agent")
    dashboard.answers["check-in"] = [joined(metrics_seconds=15)] * 4 + [RELEASED]
    too_soon = refusal(429, "too_many_reports", "This node reports more often than every 15 s.")
    dashboard.answers["metrics"] = [
        TAKEN,
        (*too_soon, {"Retry-After": "40"}),  # longer than the interval: waited out
        (*too_soon, {"Retry-After": "5"}),  # shorter: the interval still holds
        TAKEN,
    ]

    assert new_agent(dashboard, clock).run() == 1

    sent = [at for path, at in dashboard.timeline() if path == "metrics"]
    assert sent[:5] == [0, 15, 55, 70, 85]
    assert "the dashboard refused metrics: 429 (This node reports more often" in caplog.text


def test_a_dashboard_without_the_metrics_endpoint_gets_no_more_after_its_404(
    dashboard, clock, lab_gpus, caplog
):
    caplog.set_level(logging.INFO, logger="runcrate-agent")
    dashboard.answers["check-in"] = [joined(metrics_seconds=15)] * 3 + [RELEASED]
    dashboard.answers["metrics"] = [(404, {"error": {"code": "not_found", "message": "No page."}})]

    assert new_agent(dashboard, clock).run() == 1

    assert dashboard.timeline() == [
        ("check-in", 0), ("metrics", 0), ("check-in", 30), ("check-in", 60), ("check-in", 90),
    ]  # fmt: skip
    assert "takes no metrics" in caplog.text
    assert not [
        r for r in caplog.records if r.levelno >= logging.WARNING and "metrics" in r.getMessage()
    ]


def test_an_unreachable_dashboard_costs_a_report_never_the_loop(dashboard, clock, lab_gpus):
    agent = new_agent(dashboard, clock)
    dashboard.answers["check-in"] = [joined(metrics_seconds=15)]
    agent.run_once()
    agent.base = "http://127.0.0.1:9/api/v1/agent/nodes/7"  # nothing listens on port 9

    agent.send_metrics()

    assert agent.metrics_due_in() == 15


# --- the lab's stand-in nvidia-smi ------------------------------------------------------------


def stand_in_query(tmp_path: Path, figures: str | None, fields=METRICS_QUERY) -> str:
    gpus = tmp_path / "gpus"
    gpus.write_text("NVIDIA H100 80GB HBM3,81559,2\n")
    figures_file = tmp_path / "gpu-figures"
    if figures is not None:
        figures_file.write_text(figures)
    done = subprocess.run(
        ["sh", str(STAND_IN), f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"],
        env=os.environ
        | {"RUNCRATE_LAB_GPUS_FILE": str(gpus), "RUNCRATE_LAB_FIGURES_FILE": str(figures_file)},
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return done.stdout


def test_the_stand_in_answers_the_metrics_query_with_its_defaults(tmp_path):
    gpus = parse_metrics(stand_in_query(tmp_path, None))

    assert [gpu["index"] for gpu in gpus] == [0, 1]
    assert gpus[0]["uuid"].startswith("GPU-") and gpus[0]["uuid"] != gpus[1]["uuid"]
    assert {key: value for key, value in gpus[1].items() if key not in ("index", "uuid")} == {
        "utilization_percent": 0,
        "memory_used_mib": 0,
        "memory_total_mib": 81559,
        "temperature_c": 35,
        "power_w": 70.0,
        "power_limit_w": 700.0,
        "sm_clock_mhz": 1980,
        "throttle": [],
        "ecc_corrected": 0,
        "ecc_uncorrected": 0,
        "retired_pages_pending": False,
        "remapped_rows_pending": False,
    }


def test_the_stand_in_answers_the_figures_a_test_set(tmp_path):
    figures = gpu_figures_text(
        {
            0: {"utilization.gpu": 97, "memory.used": 70000, "power.draw": "650.30"},
            1: {
                "ecc.errors.uncorrected.volatile.total": 1,
                "clocks_event_reasons.hw_thermal_slowdown": "Active",
                "clocks_throttle_reasons.hw_slowdown": "Active",  # the older name, the same figure
                "remapped_rows.pending": "Yes",
            },
        }
    )

    gpus = parse_metrics(stand_in_query(tmp_path, figures))
    older = parse_metrics(
        stand_in_query(tmp_path, figures, METRICS_QUERY_BEFORE_535), METRICS_QUERY_BEFORE_535
    )

    assert gpus[0]["utilization_percent"] == 97
    assert (gpus[0]["memory_used_mib"], gpus[0]["power_w"]) == (70000, 650.3)
    assert gpus[0]["throttle"] == []
    assert gpus[1]["ecc_uncorrected"] == 1
    assert gpus[1]["throttle"] == ["hw_slowdown", "hw_thermal_slowdown"]
    assert gpus[1]["remapped_rows_pending"] is True
    assert older == gpus


def test_the_stand_in_answers_a_field_it_has_no_figure_for_as_not_available(tmp_path):
    output = stand_in_query(tmp_path, None, ("index", "fan.speed", "active.bit.mask"))
    power_capped = gpu_figures_text({0: {"clocks_event_reasons.sw_power_cap": "Active"}})
    masks = stand_in_query(tmp_path, power_capped, ("clocks_event_reasons.active",))

    assert output == "0, [N/A], [N/A]\n1, [N/A], [N/A]\n"
    assert masks == "0x0000000000000004\n0x0000000000000000\n"


def test_gpu_figures_refuse_what_the_figures_file_cannot_hold():
    with pytest.raises(ValueError, match="not a figure"):
        gpu_figures_text({0: {"utilization.gpu": "1,2"}})
    with pytest.raises(ValueError, match="not a figure"):
        gpu_figures_text({0: {"Utilization GPU": 1}})


def test_the_stand_in_is_valid_sh_without_shellcheck_warnings():
    subprocess.run(["sh", "-n", str(STAND_IN)], check=True)
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed; sh -n passed")
    done = subprocess.run(["shellcheck", "-s", "sh", str(STAND_IN)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout
