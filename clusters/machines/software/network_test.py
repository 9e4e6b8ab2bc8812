"""The network test's commands, and the parsers of what they really print (docs/lifecycle.md,
"The network test").

- Where nccl-tests is installed, `all_reduce_perf` runs once from node-0 with mpirun, one rank
  per machine and every GPU of it (`-g G`). Its table gives, per message size, the time and the
  algorithm and bus bandwidth (GB/s), out of place and in place, and the `#wrong` values; then
  `# Avg bus bandwidth : X`. `read_all_reduce_perf` reads nccl-tests 2.x's table (with or
  without the `root` column of older releases; lines tagged `[1,0]<stdout>:` by mpirun's
  `--tag-output` too) and refuses anything else with a sentence saying what it saw.
- Otherwise every other node runs the agent's own measurement to node-0
  (`runcrate_agent.py --network-test`, one JSON line); `read_agent_pair` reads it.

A result is a `NetworkTestResult` (clusters/machines/base.py): `ok`, the `method` (`nccl` or
`agent`), the `results` to keep on the cluster, and an `error` sentence when it failed.
"""

from __future__ import annotations

import json
import re
import shlex

from clusters.machines.base import NetworkTestResult

NCCL_TESTS_PATHS = ("all_reduce_perf", "/opt/nccl-tests/build/all_reduce_perf")
# Messages from 8 bytes to 128 MiB, doubling: enough to reach the link's plateau on Ethernet
# without running for minutes.
MIN_BYTES = "8"
MAX_BYTES = "128M"
# Bounds on the hosts themselves (coreutils `timeout`), so nothing outlives the test.
NCCL_SECONDS = 300
AGENT_SECONDS = 3.0
AGENT_SLACK_SECONDS = 60
NETWORK_INTERFACE = "rc0"
# Where node-0 keeps the test's hostfile; the wipe removes it with the rest of /var/lib/runcrate.
HOSTFILE = "/var/lib/runcrate/network-test/hostfile"

# Prints `nccl=<path>` for the first all_reduce_perf found, and `mpirun=yes` where it is.
FIND_NCCL = (
    'for p in "$(command -v all_reduce_perf 2>/dev/null)" /opt/nccl-tests/build/all_reduce_perf;'
    ' do if [ -n "$p" ] && [ -x "$p" ]; then echo "nccl=$p"; break; fi; done;'
    " command -v mpirun >/dev/null 2>&1 && echo mpirun=yes; true"
)

_TAG = re.compile(r"^\[\d+,\d+\]<std(?:out|err)>:")
_NUMBER = re.compile(r"^-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?$")
_AVG = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*(\S+)")
_FAILURE = re.compile(r"(Test NCCL failure|Test CUDA failure|Test failure|NCCL WARN|NCCL error)")


class UnreadableOutput(ValueError):
    """Output that is not what the command prints when it works; the message says what it saw."""


def found_nccl(output: str) -> str | None:
    """The all_reduce_perf path that FIND_NCCL printed, where mpirun is there to start it."""
    lines = {line.partition("=")[0]: line.partition("=")[2] for line in output.splitlines()}
    if lines.get("mpirun") != "yes":
        return None
    return lines.get("nccl") or None


def hostfile(nodes: list[str], *, gpus: int) -> str:
    """The machines under test, as the cluster's hostfile writes them: only those, so a worker
    still joining or a machine lost is never given a rank."""
    return "".join(f"{name} slots={gpus}\n" for name in nodes)


def all_reduce_perf_command(*, path: str, ranks: int, gpus: int, hostfile: str = HOSTFILE) -> str:
    """mpirun of all_reduce_perf, one rank per machine with its `gpus` GPUs; as root (OpenMPI
    refuses otherwise), NCCL on the private network's interface, bounded by `timeout`."""
    return (
        f"timeout -k 10 {NCCL_SECONDS} mpirun --allow-run-as-root -np {ranks} "
        f"--hostfile {shlex.quote(hostfile)} --map-by ppr:1:node "
        f"-x NCCL_DEBUG=WARN -x NCCL_SOCKET_IFNAME={NETWORK_INTERFACE} "
        f"{shlex.quote(path)} -b {MIN_BYTES} -e {MAX_BYTES} -f 2 -g {gpus}"
    )


def _lines(output: str) -> list[str]:
    return [_TAG.sub("", line).strip() for line in output.splitlines()]


def _number(token: str, line: str) -> float:
    if not _NUMBER.match(token):
        raise UnreadableOutput(f"all_reduce_perf printed {token!r} where a number belongs: {line}")
    return float(token)


def _wrong(token: str, line: str) -> int | None:
    """The `#wrong` count; None where validation was off (`N/A`)."""
    if token.upper() == "N/A":
        return None
    return int(_number(token.rstrip("*"), line))


def parse_all_reduce_perf(output: str) -> dict:
    """The table and the average bus bandwidth of all_reduce_perf's output; UnreadableOutput
    when there is no table, a row cannot be read, or the run stopped before its summary."""
    lines = _lines(output)
    header_at = next(
        (
            i
            for i, line in enumerate(lines)
            if line.startswith("#") and {"size", "count", "busbw"} <= set(line[1:].split())
        ),
        None,
    )
    if header_at is None:
        raise UnreadableOutput(f"all_reduce_perf printed no results table{_why(lines)}")
    columns = lines[header_at][1:].split()
    # Two groups of time/algbw/busbw/wrong: out of place, then in place.
    times = [i for i, name in enumerate(columns) if name == "time"]
    if columns[:2] != ["size", "count"] or len(times) != 2:
        raise UnreadableOutput(f"all_reduce_perf's table has columns it does not print: {columns}")
    sizes, average = [], None
    for line in lines[header_at + 1 :]:
        if not line:
            continue
        if line.startswith("#"):
            match = _AVG.match(line)
            if match:
                average = _number(match.group(1), line)
            continue
        tokens = line.split()
        if not tokens[0].isdigit():
            continue  # NCCL's own lines (INFO, WARN) are mixed into the output
        if len(tokens) != len(columns):
            raise UnreadableOutput(
                f"all_reduce_perf's row has {len(tokens)} fields, not {len(columns)}: {line}"
            )
        out, into = times
        wrong_out, wrong_in = _wrong(tokens[out + 3], line), _wrong(tokens[into + 3], line)
        sizes.append(
            {
                "bytes": int(tokens[0]),
                "count": int(_number(tokens[1], line)),
                "type": tokens[2],
                "redop": tokens[3],
                "time_us": _number(tokens[out], line),
                "algbw_gbs": _number(tokens[out + 1], line),
                "busbw_gbs": _number(tokens[out + 2], line),
                "in_place_busbw_gbs": _number(tokens[into + 2], line),
                "wrong": None if wrong_out is None or wrong_in is None else wrong_out + wrong_in,
            }
        )
    if not sizes:
        raise UnreadableOutput(
            f"all_reduce_perf printed its table's header but no row{_why(lines)}"
        )
    if average is None:
        raise UnreadableOutput(
            f"all_reduce_perf stopped after {len(sizes)} sizes, before its summary{_why(lines)}"
        )
    ranks = sum(1 for line in lines if re.match(r"^#\s+Rank\s+\d+", line))
    return {"sizes": sizes, "avg_busbw_gbs": average, "gpus_seen": ranks}


def _why(lines: list[str]) -> str:
    """What the output said instead: its first failure line, else its last line."""
    failure = next((line for line in lines if _FAILURE.search(line)), None)
    last = next((line for line in reversed(lines) if line and line != "#"), None)
    said = failure or last
    return f"; it said: {said[:300]}" if said else "; it printed nothing"


def read_all_reduce_perf(
    output: str, *, status: int, command: str, simulated: bool = False
) -> NetworkTestResult:
    """The verdict on one all_reduce_perf run: its table, or why there is none."""
    try:
        parsed = parse_all_reduce_perf(output)
    except UnreadableOutput as error:
        exited = f" (exit status {status})" if status else ""
        return NetworkTestResult(
            ok=False, method="nccl", error=f"{error}{exited}", output=output[-20_000:]
        )
    results = {**parsed, "command": command}
    wrong = sum(row["wrong"] or 0 for row in parsed["sizes"])
    if wrong:
        return NetworkTestResult(
            ok=False,
            method="nccl",
            results=results,
            error=f"all_reduce_perf found {wrong:,} wrong values: data was corrupted on the way.",
            output=output[-20_000:],
            simulated=simulated,
        )
    if status != 0:
        return NetworkTestResult(
            ok=False,
            method="nccl",
            results=results,
            error=f"all_reduce_perf printed its table but exited with status {status}"
            f"{_why(_lines(output))}",
            output=output[-20_000:],
            simulated=simulated,
        )
    return NetworkTestResult(ok=True, method="nccl", results=results, simulated=simulated)


# --- the agent's own measurement ---------------------------------------------------------------


def agent_command(*, head_ip: str, seconds: float = AGENT_SECONDS) -> str:
    """The agent's --network-test, its program read from stdin (the dashboard's own copy, so a
    host bootstrapped by an older release measures the same way), bounded by `timeout`."""
    bound = int(seconds) + AGENT_SLACK_SECONDS
    return (
        f"timeout -k 5 {bound} python3 - --network-test --head {shlex.quote(head_ip)} "
        f"--seconds {seconds:g}"
    )


def unmeasured_pair(node: str, head: str, error: str) -> dict:
    return {
        "node": node,
        "to": head,
        "gbit_s": None,
        "latency_ms": None,
        "tool": None,
        "error": error,
    }


def read_agent_pair(output: str, *, node: str, head: str) -> dict:
    """One worker's measurement to the head from the agent's JSON line: Gbit/s, latency, the
    tool (iperf3 or tcp-stream), or the reason it has no figure."""
    pair = unmeasured_pair(node, head, "")
    line = next(
        (x for x in reversed(output.strip().splitlines()) if x.strip().startswith("{")), None
    )
    try:
        report = json.loads(line or "")
        mbit = report["bandwidth_mbit"]
        latency = report["latency_ms"]
        if not (mbit is None or isinstance(mbit, int | float)) or isinstance(mbit, bool):
            raise TypeError(f"bandwidth_mbit is {mbit!r}")
    except (ValueError, KeyError, TypeError):
        said = output.strip().splitlines()[-1][:300] if output.strip() else "nothing"
        return {**pair, "error": f"the agent printed no measurement; it said: {said}"}
    return {
        **pair,
        "gbit_s": round(mbit / 1000, 3) if mbit is not None else None,
        "latency_ms": latency if isinstance(latency, int | float) else None,
        "tool": report.get("method"),
        "error": report.get("error") or (None if mbit is not None else "no bandwidth measured"),
    }


def agent_result(pairs: list[dict], *, seconds: float = AGENT_SECONDS) -> NetworkTestResult:
    """Every worker's pair; failed when any pair has no figure, naming them."""
    missing = [p for p in pairs if p["gbit_s"] is None]
    results = {"pairs": pairs, "seconds": seconds}
    if missing:
        why = "; ".join(f"{p['node']} → {p['to']}: {p['error']}" for p in missing)
        return NetworkTestResult(ok=False, method="agent", results=results, error=why[:1000])
    return NetworkTestResult(ok=True, method="agent", results=results)
