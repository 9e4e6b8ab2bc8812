"""The network test reads what its commands really print: nccl-tests' all_reduce_perf table
(tests/clusters/data/nccl/, real-shaped outputs of 2 machines × 8 H100 on Ethernet) and the
agent's one JSON line; anything else fails with a sentence saying what it saw."""

import json
from pathlib import Path

import pytest

from clusters.machines.software import network_test
from clusters.machines.software import simulated as outputs

DATA = Path(__file__).parent / "data" / "nccl"


def output(name: str) -> str:
    return (DATA / name).read_text()


def read(name: str, status: int = 0):
    return network_test.read_all_reduce_perf(output(name), status=status, command="mpirun …")


# --- all_reduce_perf ---------------------------------------------------------------------------


def test_it_reads_every_size_and_the_average_bus_bandwidth():
    result = read("all_reduce_perf-2x8-h100-ethernet.txt")

    assert result.ok and result.method == "nccl" and not result.simulated
    sizes = result.results["sizes"]
    assert [row["bytes"] for row in sizes] == [8 * 2**i for i in range(25)]
    assert sizes[-1] == {
        "bytes": 134217728,
        "count": 33554432,
        "type": "float",
        "redop": "sum",
        "time_us": 1324730.0,
        "algbw_gbs": 0.10,
        "busbw_gbs": 0.19,
        "in_place_busbw_gbs": 0.19,
        "wrong": 0,
    }
    assert sizes[0]["time_us"] == 212.6
    assert result.results["avg_busbw_gbs"] == 0.0982918
    assert result.results["gpus_seen"] == 16
    assert result.results["command"] == "mpirun …"


def test_it_reads_output_tagged_by_mpirun_with_nccls_own_lines_mixed_in():
    result = read("all_reduce_perf-tagged-output.txt")

    assert result.ok, result.error
    assert len(result.results["sizes"]) == 25
    assert result.results["gpus_seen"] == 16


def test_it_reads_the_table_of_releases_without_the_root_column():
    old = (
        "#                                                     out-of-place"
        "                    in-place\n"
        "#       size         count    type   redop     time   algbw   busbw  error"
        "     time   algbw   busbw  error\n"
        "#        (B)    (elements)                     (us)  (GB/s)  (GB/s)"
        "            (us)  (GB/s)  (GB/s)\n"
        "    33554432       8388608   float     sum   314411    0.11    0.20  0e+00"
        "   309874    0.11    0.20  0e+00\n"
        "# Out of bounds values : 0 OK\n"
        "# Avg bus bandwidth    : 0.2 \n"
    )
    result = network_test.read_all_reduce_perf(old, status=0, command="x")

    assert result.ok, result.error
    assert result.results["sizes"][0]["busbw_gbs"] == 0.20
    assert result.results["sizes"][0]["wrong"] == 0


def test_it_fails_with_nccls_own_words_when_there_is_no_table():
    result = read("all_reduce_perf-nccl-failure.txt", status=3)

    assert not result.ok and result.method == "nccl"
    assert result.error.startswith("all_reduce_perf printed no results table")
    assert "Test NCCL failure common.cu:961 'unhandled system error" in result.error
    assert "(exit status 3)" in result.error
    assert "Process name" in result.output  # the whole output, for the event


def test_it_says_what_mpirun_said_when_it_could_not_start_the_program():
    result = read("mpirun-executable-missing-on-node-1.txt", status=1)

    assert not result.ok
    assert "no results table" in result.error
    assert "2 total processes failed to start" in result.error


def test_it_fails_a_run_killed_in_the_middle_of_its_table():
    result = read("all_reduce_perf-killed-mid-table.txt", status=124)

    assert not result.ok
    assert "stopped after 19 sizes, before its summary" in result.error


def test_it_fails_a_run_that_found_wrong_values_and_keeps_its_table():
    result = read("all_reduce_perf-wrong-values.txt", status=1)

    assert not result.ok
    assert result.error.startswith("all_reduce_perf found 3,024 wrong values")
    assert len(result.results["sizes"]) == 25


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "no results table; it printed nothing"),
        ("bash: mpirun: command not found\n", "it said: bash: mpirun: command not found"),
        (
            "#       size         count      type   redop    root     time   algbw   busbw #wrong"
            "     time   algbw   busbw #wrong\n"
            "           8             2     float     sum      -1    28.6    0.00\n",
            "row has 7 fields, not 13",
        ),
        (
            "#       size         count      type   redop    root     time   algbw   busbw #wrong"
            "     time   algbw   busbw #wrong\n"
            "           8             2     float     sum      -1    fast    0.00    0.00      0"
            "    28.43    0.00    0.00      0\n",
            "printed 'fast' where a number belongs",
        ),
        (
            "#       size         count      type   redop    root     time   algbw   busbw #wrong"
            "     time   algbw   busbw #wrong\n# Avg bus bandwidth    : 0 \n",
            "header but no row",
        ),
    ],
)
def test_it_refuses_output_it_cannot_read_with_a_clear_sentence(text, why):
    result = network_test.read_all_reduce_perf(text, status=0, command="x")

    assert not result.ok
    assert why in result.error


def test_it_finds_nccl_tests_only_where_mpirun_can_start_it():
    assert network_test.found_nccl("nccl=/usr/bin/all_reduce_perf\nmpirun=yes\n") == (
        "/usr/bin/all_reduce_perf"
    )
    assert network_test.found_nccl("nccl=/opt/nccl-tests/build/all_reduce_perf\n") is None
    assert network_test.found_nccl("mpirun=yes\n") is None


def test_the_command_runs_one_rank_per_machine_with_every_gpu_as_root_on_the_private_network():
    command = network_test.all_reduce_perf_command(path="/usr/bin/all_reduce_perf", ranks=3, gpus=8)

    assert command.startswith("timeout -k 10 300 mpirun --allow-run-as-root -np 3 ")
    assert "--hostfile /var/lib/runcrate/network-test/hostfile --map-by ppr:1:node" in command
    assert "-x NCCL_SOCKET_IFNAME=rc0" in command
    assert command.endswith("/usr/bin/all_reduce_perf -b 8 -e 128M -f 2 -g 8")
    assert network_test.hostfile(["node-0", "node-2"], gpus=8) == (
        "node-0 slots=8\nnode-2 slots=8\n"
    )


def test_the_simulated_output_goes_through_the_same_parser():
    text = outputs.all_reduce_perf(nodes=["node-0", "node-1"], gpus=8, gpu_name="NVIDIA H100")

    result = network_test.read_all_reduce_perf(text, status=0, command="x", simulated=True)

    assert result.ok and result.simulated
    assert result.results["sizes"][-1]["busbw_gbs"] == 0.20  # the simulated 1.6 Gbit/s link
    assert result.results["gpus_seen"] == 16
    # Deterministic: the same cluster prints the same figures.
    assert text == outputs.all_reduce_perf(
        nodes=["node-0", "node-1"], gpus=8, gpu_name="NVIDIA H100"
    )


# --- the agent's own test ----------------------------------------------------------------------


def test_it_reads_the_agents_json_line_as_gbit_per_second():
    line = (
        '{"head": "10.77.0.1", "latency_ms": 0.412, "bandwidth_mbit": 1712.4, '
        '"method": "tcp-stream", "error": null}\n'
    )

    pair = network_test.read_agent_pair(line, node="node-1", head="node-0")

    assert pair == {
        "node": "node-1",
        "to": "node-0",
        "gbit_s": 1.712,
        "latency_ms": 0.412,
        "tool": "tcp-stream",
        "error": None,
    }


def agent_line(mbit, error=None) -> str:
    report = {"head": "10.77.0.1", "latency_ms": 0.3 if mbit else None, "bandwidth_mbit": mbit}
    return json.dumps({**report, "method": "tcp-stream" if mbit else None, "error": error})


def test_it_keeps_the_agents_reason_when_it_measured_no_bandwidth():
    refused = "bandwidth to 10.77.0.1:7077: [Errno 111] Connection refused"
    pairs = [
        network_test.read_agent_pair(agent_line(1600.0), node="node-1", head="node-0"),
        network_test.read_agent_pair(agent_line(None, refused), node="node-2", head="node-0"),
    ]

    result = network_test.agent_result(pairs)

    assert not result.ok and result.method == "agent"
    assert result.error == f"node-2 → node-0: {refused}"
    assert [p["gbit_s"] for p in result.results["pairs"]] == [1.6, None]


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("", "it said: nothing"),
        ("python3: can't open file\n", "it said: python3: can't open file"),
        ('{"bandwidth_mbit": "fast", "latency_ms": null}', "bandwidth_mbit"),
    ],
)
def test_it_fails_a_pair_whose_agent_printed_no_measurement(text, said):
    pair = network_test.read_agent_pair(text, node="node-1", head="node-0")

    assert pair["gbit_s"] is None
    assert pair["error"].startswith("the agent printed no measurement")
    assert said in pair["error"]
