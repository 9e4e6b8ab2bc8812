"""Driving `runcrate mcp`'s server with the MCP SDK's own client, from the synchronous tests,
against pytest-django's live server (which runs in the test's process: its clock is the test's,
frozen by time_machine, and its requests can be counted).

`talk` serves the server `runcrate mcp` builds (`mcp_server.configured_server`) in this process
over the SDK's in-memory transport: the same JSON-RPC session, the same handshake, no process.
`talk(..., process=True)` starts `runcrate mcp` as a real process over stdio instead. What only
a process shows, nothing but JSON-RPC on its stdout, is read from real ones below (`converse`)."""

from __future__ import annotations

import io
import json
import re
import subprocess
import threading
from concurrent import futures
from concurrent.futures import ThreadPoolExecutor

import anyio
import pytest
from django.core.signals import request_started
from mcp import Client, ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from tests.cli import in_process
from tests.cli.kit import CLI_PYTHON, REPO, drive_until
from tests.mcp.aio import run_async

SESSION_SECONDS = 60


def talk(env, tmp_path, conversation, *, name: str = "mcp", process: bool = False):
    """Serve `runcrate mcp`'s server in this process with exactly `env` as its environment
    (tests/cli/in_process.py), connect the SDK's client to it in memory, run
    `conversation(session)` and return its result. The server's stderr goes to
    tmp_path/NAME.err, its stdout (which the protocol does not use here) to NAME.out.
    `process=True` starts `runcrate mcp` as a real process over stdio instead."""
    from runcrate_cli import mcp_server

    async def main():
        with (
            anyio.fail_after(SESSION_SECONDS),
            (tmp_path / f"{name}.err").open("w", buffering=1) as stderr,
            (tmp_path / f"{name}.out").open("w", buffering=1) as stdout,
        ):
            if process:
                server = StdioServerParameters(
                    command=CLI_PYTHON, args=["-m", "runcrate_cli", "mcp"], env=env, cwd=REPO
                )
                async with (
                    stdio_client(server, errlog=stderr) as (read, write),
                    ClientSession(read, write) as session,
                ):
                    await session.initialize()
                    return await conversation(session)
            # The event loop's tasks and the tools' worker threads copy this context.
            with in_process.routed(in_process.Route(dict(env), io.StringIO(), stdout, stderr)):
                # legacy: the initialize handshake and JSON-RPC messages, as over stdio.
                async with Client(mcp_server.configured_server(), mode="legacy") as client:
                    return await conversation(client.session)

    return run_async(main)


def talk_while(env, tmp_path, drive, conversation):
    """`talk`, in a thread, while this thread calls `drive` (the simulated data center's
    beat) until the conversation ends."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        future = pool.submit(talk, env, tmp_path, conversation)
        drive_until(
            lambda seconds: bool(futures.wait([future], timeout=seconds).done),
            drive=drive,
            timeout=SESSION_SECONDS + 5,
        )
        return future.result()


def payload(result) -> dict:
    """A tool's answer: its structured content, which its text carries as compact JSON."""
    assert not result.is_error, result.content[0].text
    # Compact: no indentation, no spaces after separators.
    compact = json.dumps(result.structured_content, separators=(",", ":"), ensure_ascii=False)
    assert result.content[0].text == compact
    return result.structured_content


def error_code(result) -> str:
    assert result.is_error, result.content
    return result.structured_content["error"]["code"]


class ApiCalls:
    """The API requests the live server received, by path, as they arrive."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        self._lock = threading.Lock()

    def __call__(self, sender, environ=None, **kwargs) -> None:
        with self._lock:
            self.paths.append((environ or {}).get("PATH_INFO", ""))

    def count(self, pattern: str) -> int:
        with self._lock:
            return sum(1 for path in self.paths if re.fullmatch(pattern, path))


@pytest.fixture
def api_calls():
    calls = ApiCalls()
    request_started.connect(calls, weak=False)
    try:
        yield calls
    finally:
        request_started.disconnect(calls)


# --- the stdio channel read raw (tests/mcp/test_stdout.py, tests/cli/test_package.py) -----------

MESSAGES = [
    {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "test", "version": "1"},
        },
    },
    {"jsonrpc": "2.0", "method": "notifications/initialized"},
    {
        "jsonrpc": "2.0",
        "id": 2,
        "method": "tools/call",
        "params": {"name": "list_clusters", "arguments": {}},
    },
]


def converse(command: list[str], env) -> tuple[list[dict], str]:
    """Run `command` (a `runcrate mcp`) on plain pipes, no SDK between: send the three
    messages, wait for the tool's answer, end the session; every stdout line parsed as JSON-RPC
    (a line that is not fails the test), and stderr."""
    process = subprocess.Popen(
        command,
        cwd=REPO,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines = []
    try:
        for message in MESSAGES:
            process.stdin.write(json.dumps(message) + "\n")
            process.stdin.flush()
            if "id" in message:
                line = process.stdout.readline()  # bounded: the process answers or ends
                if not line:
                    break
                lines.append(line)
        rest, stderr = process.communicate(timeout=20)  # closes stdin: the server ends
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    lines += rest.splitlines()
    received = []
    for line in lines:
        message = json.loads(line)  # anything but JSON-RPC on stdout fails here
        assert message.get("jsonrpc") == "2.0", line
        received.append(message)
    return received, stderr


def the_tool_answer(received: list[dict]) -> dict:
    (answer,) = [m for m in received if m.get("id") == 2]
    return answer["result"]
