"""`runcrate mcp --http`: streamable HTTP on 127.0.0.1, each caller authenticated by the API key
it sends as a bearer header (or the server's own key when it sends none)."""

import contextlib
import json
import socket
import subprocess
import sys
import time

import anyio
import httpx2
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from tests.cli.kit import REPO, cli_env, funded_account
from tests.clusters.lifecycle_kit import create, inventory
from tests.mcp.aio import run_async

pytestmark = [pytest.mark.procs, pytest.mark.django_db(transaction=True)]  # its own server
START_SECONDS = 20


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def http_server(tmp_path, live_server):
    """`runcrate mcp --http` with no key of its own, listening once it accepts connections."""
    port = free_port()
    env = cli_env(tmp_path / "home", url=live_server.url, key=None)
    with (tmp_path / "mcp.err").open("w") as errlog:
        process = subprocess.Popen(
            [sys.executable, "-m", "runcrate_cli", "mcp", "--http", "--port", str(port)],
            cwd=REPO,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=errlog,
            stderr=errlog,
        )
        try:
            deadline = time.monotonic() + START_SECONDS
            while True:  # bounded: until it listens, or fail
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    assert time.monotonic() < deadline, "runcrate mcp --http did not listen"
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        process.wait(timeout=0.05)  # returns at once if it died
                    assert process.poll() is None, (tmp_path / "mcp.err").read_text()
            yield f"http://127.0.0.1:{port}/mcp"
        finally:
            process.terminate()
            process.wait(timeout=10)


def call(url: str, key: str | None, tool: str, arguments: dict):
    async def main():
        headers = {"authorization": f"Bearer {key}"} if key else {}
        with anyio.fail_after(30):
            async with (
                httpx2.AsyncClient(headers=headers, timeout=20) as http,
                streamable_http_client(url, http_client=http) as (read, write),
                ClientSession(read, write) as session,
            ):
                await session.initialize()
                return await session.call_tool(tool, arguments)

    return run_async(main)


def test_each_caller_sees_its_own_project_by_its_bearer_key(http_server, account):
    create(account.project, inventory(hosts=2), name="mine")
    stranger = funded_account()

    mine = call(http_server, account.key, "list_clusters", {})
    theirs = call(http_server, stranger.key, "list_clusters", {})

    assert [c["name"] for c in json.loads(mine.content[0].text)["clusters"]] == ["mine"]
    assert json.loads(theirs.content[0].text)["clusters"] == []


def test_a_caller_without_a_key_is_refused(http_server, account):
    result = call(http_server, None, "list_clusters", {})

    assert result.is_error
    assert result.structured_content["error"]["code"] == "no_api_key"
