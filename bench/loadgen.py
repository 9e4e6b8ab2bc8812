"""The load generator of `make bench`'s load run (bench/harness.py, docs/benchmarks.md).

Standard library only, and run as a script of its own (`python bench/loadgen.py`), so it is
a process apart from the server it loads and from the bench that starts it. It reads its plan
as JSON on stdin and writes what it measured as JSON on stdout.

`connections` worker processes each hold one HTTP/1.1 connection to 127.0.0.1, kept alive for
as long as the server keeps it (gunicorn's sync workers close it after every answer: then the
next request connects again, and its time includes the connect). A phase sends one target's
`requests` requests, shared among the workers, and ends early at `cap_seconds`; every round
runs every target's phase in turn, so the targets take turns as the machine's load moves.
Before the rounds, `warmup` untimed requests of each target.
"""

from __future__ import annotations

import http.client
import json
import multiprocessing
import socket
import sys
import time
from collections import Counter

HOST = "127.0.0.1"  # the only address it sends to


def _connect(port: int) -> http.client.HTTPConnection:
    connection = http.client.HTTPConnection(HOST, port, timeout=30)
    connection.connect()
    connection.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return connection


def _phase(port: int, target: dict, count: int, deadline: float, connection) -> dict:
    """`count` requests of `target` one after another, or fewer at `deadline`."""
    latencies: list[float] = []
    statuses: Counter = Counter()
    errors = 0
    started = time.monotonic()
    for _ in range(count):
        if time.monotonic() >= deadline:
            break
        sent = time.perf_counter()
        try:
            if connection is None:
                connection = _connect(port)
            connection.request("GET", target["path"], headers=target["headers"])
            response = connection.getresponse()
            response.read()
            if response.will_close:
                connection.close()
                connection = None
        except (OSError, http.client.HTTPException):
            errors += 1
            if connection is not None:
                connection.close()
            connection = None
            continue
        latencies.append(time.perf_counter() - sent)
        statuses[str(response.status)] += 1
    return {
        "started": started,
        "ended": time.monotonic(),
        "latencies": latencies,
        "statuses": dict(statuses),
        "errors": errors,
        "connection": connection,
    }


def _worker(port: int, commands, results) -> None:
    connection = None
    while True:
        command = commands.recv()
        if command is None:
            break
        target, count, deadline = command
        result = _phase(port, target, count, deadline, connection)
        connection = result.pop("connection")
        results.send(result)
    if connection is not None:
        connection.close()


def run(plan: dict) -> dict:
    port, workers_count = plan["port"], plan["connections"]
    context = multiprocessing.get_context("spawn")
    workers = []
    for _ in range(workers_count):
        command_in, command_out = context.Pipe(duplex=False)
        result_in, result_out = context.Pipe(duplex=False)
        process = context.Process(target=_worker, args=(port, command_in, result_out))
        process.start()
        workers.append((process, command_out, result_in))
    totals: dict[str, dict] = {
        target["name"]: {"done": 0, "seconds": 0.0, "latencies": [], "statuses": Counter()}
        | {"errors": 0, "capped": False}
        for target in plan["targets"]
    }

    def phase(target: dict, requests: int) -> list[dict]:
        share, extra = divmod(requests, workers_count)
        deadline = time.monotonic() + plan["cap_seconds"]
        for index, (_, commands, _) in enumerate(workers):
            commands.send((target, share + (index < extra), deadline))
        return [results.recv() for _, _, results in workers]

    try:
        # Untimed first: every server worker loads its code and opens its database connection.
        for target in plan["targets"]:
            phase(target, plan.get("warmup", 0))
        for _ in range(plan["rounds"]):
            for target in plan["targets"]:
                parts = phase(target, plan["requests"])
                total = totals[target["name"]]
                done = sum(len(part["latencies"]) for part in parts)
                total["done"] += done
                total["seconds"] += max(p["ended"] for p in parts) - min(
                    p["started"] for p in parts
                )
                total["errors"] += sum(part["errors"] for part in parts)
                total["capped"] |= done + total["errors"] < plan["requests"]
                for part in parts:
                    total["latencies"].extend(part["latencies"])
                    total["statuses"].update(part["statuses"])
    finally:
        for _, commands, _ in workers:
            commands.send(None)
        for process, _, _ in workers:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
    return {name: {**total, "statuses": dict(total["statuses"])} for name, total in totals.items()}


if __name__ == "__main__":
    json.dump(run(json.load(sys.stdin)), sys.stdout)
