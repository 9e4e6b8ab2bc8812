"""The node agent as a program (clusters/machines/runcrate_agent.py), against a stand-in dashboard.

Everything runs on 127.0.0.x: a real HTTP server plays the dashboard's answers and records what
the agent sent; `nvidia-smi` and `wg` are stand-in scripts first (and alone) on PATH; the head's
bandwidth sink is the agent's own, on 127.0.0.1.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from clusters.machines import runcrate_agent
from clusters.machines.runcrate_agent import Agent, Settings, Sink

TOKEN = "rcnode_s3cret-token-never-logged"
NVIDIA_SMI = "NVIDIA H100 80GB HBM3, 81559, GPU-1, 550.54.15\n"
AGENT = Path(runcrate_agent.__file__)
FAST = {
    "retry_seconds": 0.01,
    "reach_seconds": 0.3,
    "stream_seconds": 0.2,
    "sink_bind_seconds": 0.05,
    "sink_wait_seconds": 0.3,
}


def answer(**changes) -> tuple[int, dict]:
    data = {
        "node": "node-1",
        "private_ip": "127.0.0.2",
        "step": "agent",
        "status": "starting",
        "peers": {"node-0": "127.0.0.1"},
        "peers_ready": False,
        "wireguard": {"listen_port": 51820, "peers": []},
        "head": {"name": "node-0", "private_ip": "127.0.0.1"},
    }
    return 200, {"data": data | changes}


def refusal(status: int, code: str, message: str) -> tuple[int, dict]:
    return status, {"error": {"code": code, "message": message}}


@dataclass
class Sent:
    path: str
    authorization: str
    body: dict


class _DashboardHandler(BaseHTTPRequestHandler):
    server: Dashboard

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.sent.append(Sent(self.path, self.headers["Authorization"], body))
        answers = self.server.answers
        status, payload = answers.pop(0) if len(answers) > 1 else answers[0]
        content = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(content)))
        self.end_headers()
        self.wfile.write(content)

    def log_message(self, *args) -> None:
        pass


class Dashboard(ThreadingHTTPServer):
    """Answers with `answers` in turn, the last one for ever after; records what it was sent."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _DashboardHandler)
        self.answers: list[tuple[int, dict]] = [answer()]
        self.sent: list[Sent] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


@pytest.fixture
def dashboard():
    server = Dashboard()
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def bin_dir(tmp_path, monkeypatch) -> Path:
    """The only directory on PATH, so the host's own wg, iperf3 or nvidia-smi are not found."""
    path = tmp_path / "bin"
    path.mkdir()
    monkeypatch.setenv("PATH", str(path))
    return path


def stand_in(bin_dir: Path, name: str, script: str) -> None:
    executable = bin_dir / name
    executable.write_text("#!/bin/sh\n" + script)
    executable.chmod(0o755)


@pytest.fixture
def wg_calls(bin_dir, tmp_path) -> Path:
    """A stand-in `wg` for interface rc0, which has the peers keep-key and stale-key; the file
    it records each call's arguments in."""
    calls = tmp_path / "wg-calls"
    stand_in(
        bin_dir,
        "wg",
        f"""printf '%s\\n' "$*" >> {calls}
[ "$2" = rc0 ] || exit 1
case "$1 $3" in
  "show public-key") printf 'PUBKEY-node-1=\\n' ;;
  "show peers") printf 'keep-key\\nstale-key\\n' ;;
esac
""",
    )
    return calls


def free_port() -> int:
    """A port nothing listens on (it was free a moment ago)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def listening_port():
    """A port that accepts connections on 127.0.0.1 only (not on 127.0.0.3)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        yield listener.getsockname()[1]


@pytest.fixture
def sink():
    started = Sink("127.0.0.1", free_port(), stall_seconds=0.3, retry_seconds=0.05).start()
    assert started.bound.wait(5)
    yield started
    started.stop()


def wait_for(condition, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def new_agent(dashboard: Dashboard, **settings) -> Agent:
    return Agent(dashboard.url, "7", TOKEN, settings=Settings(**(FAST | settings)))


# --- checking in -------------------------------------------------------------------------------


def test_it_checks_in_with_its_gpus_wireguard_key_and_hostname(dashboard, bin_dir, wg_calls):
    stand_in(bin_dir, "nvidia-smi", f"printf '{NVIDIA_SMI.strip()}\\n'\n")

    state = new_agent(dashboard).run_once()

    assert state["node"] == "node-1"
    [sent] = dashboard.sent
    assert sent.path == "/api/v1/agent/nodes/7/check-in"
    assert sent.authorization == f"Bearer {TOKEN}"
    assert sent.body == {
        "nvidia_smi": NVIDIA_SMI,
        "wireguard_public_key": "PUBKEY-node-1=",
        "hostname": socket.gethostname(),
    }


def test_it_reports_no_gpus_and_no_key_without_nvidia_smi_or_wg(dashboard, bin_dir, caplog):
    caplog.set_level(logging.INFO, logger="runcrate-agent")
    agent = new_agent(dashboard)

    agent.run_once()
    agent.run_once()

    # Its GPUs (none) go with the first check-in, which the dashboard records them from; later
    # check-ins say none, without running nvidia-smi again.
    assert [s.body.get("nvidia_smi") for s in dashboard.sent] == ["", None]
    assert [s.body.get("gpus") for s in dashboard.sent] == [None, []]
    assert [s.body["wireguard_public_key"] for s in dashboard.sent] == [None, None]
    assert len([r for r in caplog.records if "WireGuard" in r.getMessage()]) == 1


def test_it_sends_no_key_when_the_interface_does_not_exist(dashboard, wg_calls):
    new_agent(dashboard, interface="rc9").run_once()

    assert dashboard.sent[0].body["wireguard_public_key"] is None
    assert "set" not in wg_calls.read_text()


def test_an_answer_with_the_peers_it_has_runs_nothing_until_it_applies_them_again(
    dashboard, bin_dir, tmp_path
):
    calls = tmp_path / "wg-calls"
    stand_in(bin_dir, "wg", f"""printf '%s\\n' "$*" >> {calls}
case "$1 $3" in "show peers") printf 'keep-key\\n' ;; esac
""")  # fmt: skip
    listed = [{"name": "node-0", "public_key": "keep-key", "endpoint": "172.30.77.11:51820",
               "allowed_ip": "10.77.0.1/32"}]  # fmt: skip
    now = [100.0]
    agent = Agent(dashboard.url, "7", TOKEN, settings=Settings(**FAST), clock=lambda: now[0])

    def sets() -> int:
        return sum(line.startswith("set") for line in calls.read_text().splitlines())

    for seconds in (0, 1, 2, runcrate_agent.REAPPLY_SECONDS + 1):
        dashboard.answers = [answer(wireguard={"listen_port": 51820, "peers": listed})]
        now[0] = 100.0 + seconds
        agent.run_once()
    # Applied at the first answer and again once REAPPLY_SECONDS had passed; the answers in
    # between (every second while waiting to measure) found the interface as listed.
    assert sets() == 2

    # A peer the interface lost, or another list, is applied at once.
    listed.append({"name": "node-2", "public_key": "new-key", "endpoint": "172.30.77.13:51820",
                   "allowed_ip": "10.77.0.3/32"})  # fmt: skip
    dashboard.answers = [answer(wireguard={"listen_port": 51820, "peers": listed})]
    agent.run_once()
    assert sets() == 4


def test_it_sets_the_listed_wireguard_peers_and_removes_the_others(dashboard, wg_calls):
    listed = [
        {
            "name": "node-0",
            "public_key": "keep-key",
            "endpoint": "172.30.77.11:51820",
            "allowed_ip": "10.77.0.1/32",
        },
        {
            "name": "node-2",
            "public_key": "new-key",
            "endpoint": "172.30.77.13:51820",
            "allowed_ip": "10.77.0.3/32",
        },
    ]
    dashboard.answers = [answer(wireguard={"listen_port": 51820, "peers": listed})]

    new_agent(dashboard).run_once()

    sets = [line for line in wg_calls.read_text().splitlines() if line.startswith("set")]
    assert sets == [
        "set rc0 peer keep-key endpoint 172.30.77.11:51820 allowed-ips 10.77.0.1/32"
        " persistent-keepalive 25",
        "set rc0 peer new-key endpoint 172.30.77.13:51820 allowed-ips 10.77.0.3/32"
        " persistent-keepalive 25",
        "set rc0 peer stale-key remove",
    ]


def stand_in_nft(bin_dir: Path, tmp_path: Path, *, table: bool = True) -> Path:
    """A stand-in `nft` (shell builtins only: it is alone on PATH): `list set` answers whether
    the runcrate table is there; `-f -` records the script it was given."""
    scripts = tmp_path / "nft-scripts"
    stand_in(
        bin_dir,
        "nft",
        f"""case "$1" in
  list) [ "$*" = "list set inet runcrate wg_peers" ] && {"exit 0" if table else "exit 1"} ;;
  -f) [ "$2" = - ] || exit 2
      while IFS= read -r line; do echo "$line"; done >> {scripts}
      echo --- >> {scripts}; exit 0 ;;
esac
exit 2
""",
    )
    return scripts


def test_it_makes_the_firewalls_wireguard_peers_the_peers_endpoints(
    dashboard, wg_calls, bin_dir, tmp_path, caplog
):
    scripts = stand_in_nft(bin_dir, tmp_path)
    listed = [
        {"name": "node-0", "public_key": "keep-key", "endpoint": "172.30.77.11:51820",
         "allowed_ip": "10.77.0.1/32"},
        {"name": "node-2", "public_key": "new-key", "endpoint": "[2001:db8::3]:51820",
         "allowed_ip": "10.77.0.3/32"},
        {"name": "node-3", "public_key": "named-key", "endpoint": "node3.example:51820",
         "allowed_ip": "10.77.0.4/32"},
    ]  # fmt: skip
    dashboard.answers = [answer(wireguard={"listen_port": 51820, "peers": listed})]
    caplog.set_level(logging.INFO, logger="runcrate-agent")

    new_agent(dashboard).run_once()

    # One transaction: each set flushed and filled at once, never left empty in between; a
    # name is no address and is left out.
    assert scripts.read_text() == (
        "flush set inet runcrate wg_peers\n"
        "add element inet runcrate wg_peers { 172.30.77.11 }\n"
        "flush set inet runcrate wg_peers6\n"
        "add element inet runcrate wg_peers6 { 2001:db8::3 }\n"
        "---\n"
    )
    assert "firewall: WireGuard accepts" in caplog.text

    # No peer left: the sets are emptied, so WireGuard's port accepts no one.
    dashboard.answers = [answer(wireguard={"listen_port": 51820, "peers": []})]
    new_agent(dashboard).run_once()
    assert scripts.read_text().split("---\n")[1] == (
        "flush set inet runcrate wg_peers\nflush set inet runcrate wg_peers6\n"
    )


def test_without_the_firewall_table_it_sets_the_peers_and_says_so(
    dashboard, wg_calls, bin_dir, tmp_path, caplog
):
    scripts = stand_in_nft(bin_dir, tmp_path, table=False)
    listed = [{"name": "node-0", "public_key": "keep-key", "endpoint": "172.30.77.11:51820",
               "allowed_ip": "10.77.0.1/32"}]  # fmt: skip
    dashboard.answers = [answer(wireguard={"listen_port": 51820, "peers": listed})]
    caplog.set_level(logging.INFO, logger="runcrate-agent")

    new_agent(dashboard).run_once()

    assert not scripts.exists()
    assert "firewall: peers not set (no firewall table inet runcrate)" in caplog.text
    sets = wg_calls.read_text().splitlines()
    assert any(line.startswith("set rc0 peer keep-key") for line in sets)


def test_it_heartbeats_every_heartbeat_seconds_once_joined(dashboard):
    agent = new_agent(dashboard, heartbeat_seconds=30, retry_seconds=5)
    agent.run_once()
    assert agent.next_check_in_seconds() == 5

    dashboard.answers = [answer(status="joined", step="done")]
    agent.run_once()
    assert agent.next_check_in_seconds() == 30

    # A worker is being added: its WireGuard peer on this node is wanted soon.
    dashboard.answers = [answer(status="joined", step="done", peer_starting=True)]
    agent.run_once()
    assert agent.next_check_in_seconds() == 5


def test_it_checks_in_as_soon_as_the_dashboard_asks_while_it_waits_to_measure(dashboard):
    agent = new_agent(dashboard, heartbeat_seconds=30, retry_seconds=5)
    # Waiting in step network for its peers or its round: the answer's check_in_seconds.
    dashboard.answers = [answer(step="network", check_in_seconds=1.0)]
    agent.run_once()
    assert agent.next_check_in_seconds() == 1.0

    # Never sooner than half a second, whatever it is asked; null is the usual interval.
    dashboard.answers = [answer(step="network", check_in_seconds=0.01)]
    agent.run_once()
    assert agent.next_check_in_seconds() == 0.5
    dashboard.answers = [answer(step="network", check_in_seconds=None)]
    agent.run_once()
    assert agent.next_check_in_seconds() == 5

    # Once joined: the heartbeat's interval.
    dashboard.answers = [answer(status="joined", step="done", check_in_seconds=None)]
    agent.run_once()
    assert agent.next_check_in_seconds() == 30


# --- testing the network -----------------------------------------------------------------------


def test_it_reports_reachability_and_acceptance_measured_against_the_heads_sink(
    dashboard, bin_dir, listening_port, caplog
):
    caplog.set_level(logging.INFO, logger="runcrate-agent")
    bandwidth_port = free_port()
    head = Agent(
        dashboard.url,
        "1",
        TOKEN,
        settings=Settings(private_ip="127.0.0.1", bandwidth_port=bandwidth_port, **FAST),
    )
    head.serve_if_head({"head": {"name": "node-0", "private_ip": "127.0.0.1"}})
    assert head.sink is not None and head.sink.bound.wait(5)
    peers = {"node-0": "127.0.0.1", "node-2": "127.0.0.3"}
    dashboard.answers = [
        answer(step="network", peers_ready=True, peers=peers),
        answer(step="install", peers=peers),
    ]
    agent = new_agent(dashboard, probe_port=listening_port, bandwidth_port=bandwidth_port)

    try:
        state = agent.run_once()
    finally:
        head.sink.stop()

    assert state["step"] == "install"
    check_in, network = dashboard.sent
    assert network.path == "/api/v1/agent/nodes/7/network"
    assert network.authorization == f"Bearer {TOKEN}"
    assert network.body["reachability"] == {"node-0": True, "node-2": False}
    acceptance = network.body["acceptance"]
    assert acceptance["method"] == "tcp-stream"
    assert acceptance["latency_ms"] > 0
    assert acceptance["bandwidth_mbit"] > 0
    assert acceptance["error"] is None
    assert "reached 1/2 peers (not node-2)" in caplog.text


def test_it_tries_a_peer_again_that_opens_its_port_a_moment_later():
    with socket.socket() as late:
        late.bind(("127.0.0.1", 0))
        port = late.getsockname()[1]
        opening = threading.Timer(0.3, late.listen)
        opening.start()
        try:
            reached = runcrate_agent.reach_peers({"node-0": "127.0.0.1"}, port, within=5)
        finally:
            opening.cancel()

    assert reached == {"node-0": True}


def test_it_reports_a_failed_measurement_as_nulls_with_the_reason(dashboard, bin_dir):
    dashboard.answers = [answer(step="network", peers_ready=True), answer(step="network")]
    agent = new_agent(dashboard, probe_port=free_port(), bandwidth_port=free_port())

    agent.run_once()

    body = dashboard.sent[1].body
    assert body["reachability"] == {"node-0": False}
    acceptance = body["acceptance"]
    assert acceptance["latency_ms"] is None
    assert acceptance["bandwidth_mbit"] is None
    assert acceptance["method"] is None
    assert "latency to 127.0.0.1" in acceptance["error"]
    assert "bandwidth to 127.0.0.1" in acceptance["error"]


def test_it_measures_nothing_when_it_is_the_head_and_serves_the_sink(dashboard, bin_dir):
    bandwidth_port = free_port()
    dashboard.answers = [
        answer(node="node-0", private_ip="127.0.0.1", step="network", peers_ready=True, peers={})
    ]
    agent = new_agent(dashboard, bandwidth_port=bandwidth_port)

    state = agent.run_once()
    agent.serve_if_head(state)

    # Nothing measured to itself; its own vCPUs and memory, held to what was sold, all the same.
    assert dashboard.sent[1].body == {
        "reachability": {},
        "acceptance": {
            "latency_ms": None,
            "bandwidth_mbit": None,
            "method": None,
            "error": None,
            **runcrate_agent.machine_facts(),
        },
    }
    assert dashboard.sent[1].body["acceptance"]["vcpus"] >= 1
    assert agent.sink is not None and agent.sink.bound.wait(5)
    try:
        assert runcrate_agent.stream_bandwidth("127.0.0.1", bandwidth_port, seconds=0.05) > 0
    finally:
        agent.sink.stop()


def test_in_rounds_every_node_serves_the_sink_and_the_head_measures_to_the_peer_it_is_told(
    dashboard, bin_dir
):
    # A worker (node-2, not the head) of a dashboard that measures in rounds serves the sink:
    # any node may be the peer another measures to.
    bandwidth_port = free_port()
    worker = Agent(
        dashboard.url,
        "9",
        TOKEN,
        settings=Settings(private_ip="127.0.0.3", bandwidth_port=bandwidth_port, **FAST),
    )
    worker.serve_if_head(
        answer(node="node-2", private_ip="127.0.0.3", measure_peer=None)[1]["data"]
    )
    assert worker.sink is not None and worker.sink.bound.wait(5)
    # Without `measure_peer` (a dashboard from before the rounds), a worker serves nothing.
    old = new_agent(dashboard, private_ip="127.0.0.4", bandwidth_port=free_port())
    old.serve_if_head(answer(node="node-3", private_ip="127.0.0.4")[1]["data"])
    assert old.sink is None

    dashboard.answers = [
        answer(
            node="node-0",
            private_ip="127.0.0.1",
            step="network",
            peers_ready=True,
            peers={"node-2": "127.0.0.3"},
            measure_turn=True,
            measure_peer={"name": "node-2", "private_ip": "127.0.0.3"},
        )
    ]
    head = new_agent(dashboard, bandwidth_port=bandwidth_port, probe_port=bandwidth_port)
    try:
        head.run_once()
    finally:
        worker.sink.stop()

    acceptance = dashboard.sent[1].body["acceptance"]
    assert acceptance["method"] == "tcp-stream" and acceptance["bandwidth_mbit"] > 0
    assert acceptance["error"] is None and "shared" not in acceptance  # the head mounts nothing


def test_it_does_not_test_the_network_before_every_peer_has_checked_in(dashboard):
    dashboard.answers = [answer(step="network", peers_ready=False)]

    new_agent(dashboard).run_once()

    assert [s.path.rsplit("/", 1)[1] for s in dashboard.sent] == ["check-in"]


def test_the_sink_serves_several_clients_and_drops_one_that_stalls(sink):
    with socket.create_connection(("127.0.0.1", sink.port), timeout=5) as stalled:
        mbit = runcrate_agent.stream_bandwidth("127.0.0.1", sink.port, seconds=0.1)
        assert mbit > 0
        assert stalled.recv(1) == b""  # closed by the sink once it stalled for 0.3 s


def test_a_measurement_waits_for_a_peer_s_sink_that_listens_late(bin_dir):
    """A peer's sink binds once its WireGuard address exists, which may come a moment after the
    dashboard let this node measure to it (seen on the lab: "Connection refused", the cluster
    failed): the measurement waits for the port, bounded, instead of failing at once."""
    port = free_port()
    settings = Settings(bandwidth_port=port, stream_seconds=0.1, sink_wait_seconds=0)
    with pytest.raises(ConnectionRefusedError):  # not waited for: refused, as on the lab
        runcrate_agent.measure_bandwidth("127.0.0.1", settings)

    sinks: list[Sink] = []
    late = threading.Timer(0.5, lambda: sinks.append(Sink("127.0.0.1", port).start()))
    late.start()
    try:
        mbit, how = runcrate_agent.measure_bandwidth(
            "127.0.0.1", replace(settings, sink_wait_seconds=10)
        )
    finally:
        late.join()
        for started in sinks:
            started.stop()
    assert mbit > 0 and how == "tcp-stream"


def test_the_sink_binds_once_its_address_is_free():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        taken.listen()
        late = Sink("127.0.0.1", port, retry_seconds=0.05).start()
        assert not late.bound.wait(0.2)
    try:
        assert late.bound.wait(5)
    finally:
        late.stop()


# --- stopping and retrying ---------------------------------------------------------------------


@pytest.fixture
def environment(dashboard, monkeypatch, tmp_path):
    for key in runcrate_agent.CONFIG_KEYS:
        monkeypatch.delenv(key.upper(), raising=False)
    monkeypatch.setattr(runcrate_agent, "CONFIG_FILE", tmp_path / "absent.json")
    monkeypatch.setenv("RUNCRATE_URL", dashboard.url)
    monkeypatch.setenv("RUNCRATE_NODE_ID", "7")
    monkeypatch.setenv("RUNCRATE_NODE_TOKEN", TOKEN)


def test_it_stops_when_the_node_was_released(dashboard, environment, bin_dir, caplog):
    dashboard.answers = [refusal(410, "node_released", "This node was released; stop the agent.")]

    assert runcrate_agent.main([]) == 1

    [line] = [r.getMessage() for r in caplog.records if r.name == "runcrate-agent"]
    assert "410" in line and "released" in line
    assert TOKEN not in caplog.text


def test_it_retries_after_a_5xx_and_a_422_and_stops_on_403(dashboard, bin_dir, caplog):
    caplog.set_level(logging.INFO, logger="runcrate-agent")
    dashboard.answers = [
        (503, {"error": {"code": "unavailable", "message": "Down for a moment."}}),
        refusal(422, "invalid_report", "GPU line 1 has 3 fields, not 4"),
        refusal(403, "bad_token", "The node token does not match this node."),
    ]

    assert new_agent(dashboard).run() == 1

    assert len(dashboard.sent) == 3
    assert "GPU line 1 has 3 fields, not 4" in caplog.text
    assert TOKEN not in caplog.text


def test_it_does_one_check_in_with_once(dashboard, environment, bin_dir):
    assert runcrate_agent.main(["--once"]) == 0
    assert len(dashboard.sent) == 1


# --- configuration -----------------------------------------------------------------------------


def test_it_reads_the_configuration_file_and_lets_the_environment_win(tmp_path):
    path = tmp_path / "agent.json"
    path.write_text(
        json.dumps(
            {
                "runcrate_url": "https://file.example",
                "runcrate_node_id": 3,
                "runcrate_node_token": TOKEN,
                "probe_port": 2222,
                "private_ip": "10.77.0.1",
                "is_head": True,
            }
        )
    )
    environ = {
        "RUNCRATE_URL": "https://env.example",
        "RUNCRATE_AGENT_HEARTBEAT_SECONDS": "7.5",
        "RUNCRATE_AGENT_IS_HEAD": "no",
        # A host's own variables of the same bare names are not the agent's.
        "IS_HEAD": "yes",
        "INTERFACE": "eth9",
    }

    config = runcrate_agent.load_config(environ, path)

    assert (config.url, config.node_id, config.token) == ("https://env.example", "3", TOKEN)
    assert config.settings == Settings(
        interface="rc0",
        probe_port=2222,
        heartbeat_seconds=7.5,
        private_ip="10.77.0.1",
        is_head=False,
    )
    assert TOKEN not in repr(config)


@pytest.mark.parametrize(
    ("key", "value", "complaint"),
    [
        ("RUNCRATE_AGENT_PROBE_PORT", "ssh", "probe_port must be a number"),
        ("RUNCRATE_AGENT_IS_HEAD", "maybe", "true or false"),
    ],
)
def test_it_refuses_a_bad_value(tmp_path, key, value, complaint):
    environ = {
        "RUNCRATE_URL": "https://x",
        "RUNCRATE_NODE_ID": "1",
        "RUNCRATE_NODE_TOKEN": TOKEN,
        key: value,
    }
    with pytest.raises(SystemExit, match=complaint):
        runcrate_agent.load_config(environ, tmp_path / "absent.json")


# --- as a daemon -------------------------------------------------------------------------------


def test_it_runs_as_a_daemon_with_a_pidfile_and_refuses_a_second_one(dashboard, bin_dir, tmp_path):
    pidfile, log_file = tmp_path / "agent.pid", tmp_path / "agent.log"
    environ = {
        "PATH": str(bin_dir),
        "RUNCRATE_URL": dashboard.url,
        "RUNCRATE_NODE_ID": "7",
        "RUNCRATE_NODE_TOKEN": TOKEN,
    }
    command = [sys.executable, str(AGENT), "--daemon", "--pidfile", str(pidfile)]
    command += ["--log-file", str(log_file)]

    first = subprocess.run(command, env=environ, capture_output=True, text=True, timeout=10)
    pids = {int(pidfile.read_text())}  # written before the first command returned
    try:
        second = subprocess.run(command, env=environ, capture_output=True, text=True, timeout=10)
        pids.add(int(pidfile.read_text()))  # a second daemon would have written its own
        assert wait_for(lambda: dashboard.sent)
        assert wait_for(lambda: "node-1 is starting" in log_file.read_text())
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGTERM)
    assert wait_for(lambda: not pidfile.exists())

    [pid] = pids
    assert first.returncode == 0
    assert second.returncode == 0
    assert f"already running (pid {pid})" in second.stderr
    assert dashboard.sent[0].authorization == f"Bearer {TOKEN}"
    assert TOKEN not in log_file.read_text()
