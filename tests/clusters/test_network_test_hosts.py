"""The network test on real hosts' side, without the lab: the agent's `--network-test` mode run
as the ssh driver runs it (the program on stdin) against the agent's own sink on 127.0.0.1, and
the ssh driver's choice between all_reduce_perf and the agents, with stand-in SSH sessions."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest
from django.utils import timezone

from clusters.lifecycle import install_plan
from clusters.machines import runcrate_agent, ssh
from clusters.machines.base import DriverError
from clusters.machines.runcrate_agent import Sink
from clusters.machines.software import network_test
from clusters.models import Cluster, Node
from tests.factories import ClusterFactory

AGENT = Path(runcrate_agent.__file__)
DATA = Path(__file__).parent / "data" / "nccl"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def sink():
    started = Sink("127.0.0.1", free_port(), stall_seconds=2, retry_seconds=0.05).start()
    assert started.bound.wait(5)
    yield started
    started.stop()


@pytest.fixture
def listening_port():
    """Stands in for sshd on the head: the latency is measured to it."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        yield listener.getsockname()[1]


def network_test_program(*arguments: str, path: Path) -> subprocess.CompletedProcess:
    """The agent's --network-test, its program on stdin, as `network_test.agent_command` runs
    it on a host; PATH holds no iperf3, so it streams to the sink."""
    return subprocess.run(
        [sys.executable, "-", "--network-test", *arguments],
        input=AGENT.read_text(),
        env={"PATH": str(path)},
        capture_output=True,
        text=True,
        timeout=30,
    )


# --- the agent's --network-test -------------------------------------------------------------


def test_the_agent_measures_the_way_to_the_heads_sink_and_prints_one_json_line(
    sink, listening_port, tmp_path
):
    done = network_test_program(
        "--head",
        "127.0.0.1",
        "--port",
        str(sink.port),
        "--probe-port",
        str(listening_port),
        "--seconds",
        "0.3",
        path=tmp_path,
    )

    assert done.returncode == 0, done.stderr
    [line] = done.stdout.splitlines()
    report = json.loads(line)
    assert report["head"] == "127.0.0.1" and report["method"] == "tcp-stream"
    assert report["bandwidth_mbit"] > 0 and report["latency_ms"] >= 0 and report["error"] is None
    pair = network_test.read_agent_pair(done.stdout, node="node-1", head="node-0")
    assert pair["gbit_s"] == round(report["bandwidth_mbit"] / 1000, 3) and pair["gbit_s"] > 0


def test_the_agent_says_why_when_the_head_has_no_sink_and_exits_1(listening_port, tmp_path):
    port = free_port()

    done = network_test_program(
        "--head",
        "127.0.0.1",
        "--port",
        str(port),
        "--probe-port",
        str(listening_port),
        path=tmp_path,
    )

    assert done.returncode == 1
    pair = network_test.read_agent_pair(done.stdout, node="node-1", head="node-0")
    assert pair["gbit_s"] is None and pair["latency_ms"] is not None
    assert f"bandwidth to 127.0.0.1:{port}" in pair["error"]


@pytest.mark.parametrize(
    ("arguments", "complaint"),
    [((), "--network-test needs --head"), (("--head", "x", "--seconds", "0"), "between 0 and 60")],
)
def test_the_agent_refuses_a_network_test_it_cannot_run(arguments, complaint, tmp_path):
    done = network_test_program(*arguments, path=tmp_path)

    assert done.returncode == 2
    assert complaint in done.stderr


# --- the ssh driver ---------------------------------------------------------------------------


class Hosts:
    """Stand-in SSH sessions: what each command answers, and what was run where."""

    def __init__(self, answers) -> None:
        self.answers = answers  # (host name, command) -> (status, output) | DriverError
        self.ran: list[tuple[str, str, str | None, float | None]] = []

    @contextmanager
    def session(self, host):
        hosts = self

        class Session:
            def run(self, command, *, stdin=None, timeout=None):
                hosts.ran.append((host.name, command, stdin, timeout))
                answer = hosts.answers(host.name, command)
                if isinstance(answer, Exception):
                    raise answer
                return answer

        yield Session()


def ready_cluster(size: int = 3) -> tuple[Cluster, list[Node]]:
    now = timezone.now()
    cluster = ClusterFactory(
        size=size,
        status=Cluster.Status.READY,
        joined_at=now,
        ready_at=now,
        machines=True,
        machines__status=Node.Status.JOINED,
    )
    nodes = list(cluster.nodes.select_related("host").order_by("index"))
    return cluster, nodes


def measure(monkeypatch, hosts: Hosts, cluster: Cluster, nodes: list[Node]):
    monkeypatch.setattr(ssh, "host_session", hosts.session)
    return ssh.SshDriver().network_test(cluster, nodes=nodes, plan=install_plan(cluster, nodes))


def test_the_ssh_driver_runs_all_reduce_perf_from_node_0_where_nccl_tests_is(db, monkeypatch):
    cluster, nodes = ready_cluster(3)
    head = nodes[0].host.name
    table = (DATA / "all_reduce_perf-2x8-h100-ethernet.txt").read_text()

    def answers(host, command):
        if command == network_test.FIND_NCCL:
            return 0, "nccl=/opt/nccl-tests/build/all_reduce_perf\nmpirun=yes\n"
        return 0, table

    hosts = Hosts(answers)
    result = measure(monkeypatch, hosts, cluster, nodes)

    assert result.ok and result.method == "nccl"
    assert len(result.results["sizes"]) == 25
    assert [host for host, *_ in hosts.ran] == [head, head]  # nothing on the workers
    _, command, stdin, timeout = hosts.ran[1]
    assert (
        "mpirun --allow-run-as-root -np 3 --hostfile /var/lib/runcrate/network-test/hostfile"
        in (command)
    )
    assert command.endswith("-g 8 2>&1")
    assert stdin == "node-0 slots=8\nnode-1 slots=8\nnode-2 slots=8\n"
    assert timeout == network_test.NCCL_SECONDS + 30
    assert result.results["command"] in command


def test_the_ssh_driver_keeps_what_all_reduce_perf_said_when_it_fails(db, monkeypatch):
    cluster, nodes = ready_cluster(2)
    failure = (DATA / "mpirun-executable-missing-on-node-1.txt").read_text()

    def answers(host, command):
        if command == network_test.FIND_NCCL:
            return 0, "nccl=/opt/nccl-tests/build/all_reduce_perf\nmpirun=yes\n"
        return 1, failure

    result = measure(monkeypatch, Hosts(answers), cluster, nodes)

    assert not result.ok and "2 total processes failed to start" in result.error
    assert result.output == failure


def test_the_ssh_driver_has_each_worker_measure_to_node_0_without_nccl_tests(db, monkeypatch):
    cluster, nodes = ready_cluster(3)
    workers = {nodes[1].host.name: "node-1", nodes[2].host.name: "node-2"}
    measured = {
        "node-1": {"latency_ms": 0.3, "bandwidth_mbit": 1712.4, "method": "iperf3", "error": None},
        "node-2": {
            "latency_ms": 0.4,
            "bandwidth_mbit": 941.0,
            "method": "tcp-stream",
            "error": None,
        },
    }

    def answers(host, command):
        if command == network_test.FIND_NCCL:
            return 0, ""  # neither all_reduce_perf nor mpirun
        return 0, json.dumps({"head": "10.77.0.1", **measured[workers[host]]}) + "\n"

    hosts = Hosts(answers)
    result = measure(monkeypatch, hosts, cluster, nodes)

    assert result.ok and result.method == "agent"
    assert [(p["node"], p["to"], p["gbit_s"], p["tool"]) for p in result.results["pairs"]] == [
        ("node-1", "node-0", 1.712, "iperf3"),
        ("node-2", "node-0", 0.941, "tcp-stream"),
    ]
    on_workers = hosts.ran[1:]
    assert [workers[host] for host, *_ in on_workers] == ["node-1", "node-2"]  # one at a time
    for _, command, stdin, timeout in on_workers:
        assert command == "timeout -k 5 63 python3 - --network-test --head 10.77.0.1 --seconds 3"
        assert stdin == AGENT.read_text()  # the dashboard's own agent program
        assert timeout is not None and timeout > 63


def test_the_ssh_driver_names_a_worker_it_could_not_reach(db, monkeypatch):
    cluster, nodes = ready_cluster(3)
    unreachable = nodes[2].host.name

    def answers(host, command):
        if command == network_test.FIND_NCCL:
            return 0, ""
        if host == unreachable:
            raise DriverError("could not connect to 203.0.113.9:22: timed out")
        return 0, json.dumps({"latency_ms": 0.3, "bandwidth_mbit": 1600, "method": "iperf3"})

    result = measure(monkeypatch, Hosts(answers), cluster, nodes)

    assert not result.ok
    assert result.error == "node-2 → node-0: could not connect to 203.0.113.9:22: timed out"
    assert result.results["pairs"][0]["gbit_s"] == 1.6
