"""Over stdio, stdout is the protocol's channel: nothing but JSON-RPC messages reaches it,
whatever the config file holds. A config file that cannot be read is said on stderr and
answered by every tool (`bad_config`); RUNCRATE_API_KEY still works beside it."""

import json
import subprocess
from pathlib import Path

import pytest

from tests.cli.kit import CLI_PYTHON, REPO

pytestmark = pytest.mark.django_db(transaction=True)

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


def damage_config(env) -> None:
    path = Path(env["XDG_CONFIG_HOME"]) / "runcrate" / "config.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('api_key = "rc_live_unterminated\n[[[\n')


def converse(command: list[str], env) -> tuple[list[dict], str]:
    """Send the three messages, wait for the tool's answer, end the session; every stdout line
    parsed as JSON-RPC (a line that is not fails the test), and stderr."""
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


@pytest.mark.parametrize(
    "command",
    [
        pytest.param(["-m", "runcrate_cli", "mcp"], id="runcrate mcp"),
        pytest.param(
            [
                "-c",
                "from runcrate_cli import mcp_server; mcp_server.main(http=False, "
                "host='127.0.0.1', port=0)",
            ],
            id="mcp_server.main",
        ),
    ],
)
def test_a_damaged_config_file_never_reaches_stdout(env, tmp_path, command):
    env = {k: v for k, v in env.items() if k != "RUNCRATE_API_KEY"}
    damage_config(env)

    received, stderr = converse([CLI_PYTHON, *command], env)

    answer = the_tool_answer(received)
    assert answer["isError"] is True
    assert answer["structuredContent"]["error"]["code"] == "bad_config"
    assert "config.toml" in answer["structuredContent"]["error"]["message"]
    assert "config.toml" in stderr


def test_the_environments_key_still_works_beside_a_damaged_config_file(env, tmp_path, account):
    damage_config(env)
    command = [
        "-c",
        "from runcrate_cli import mcp_server; mcp_server.main(http=False, host='127.0.0.1', "
        "port=0)",
    ]

    received, stderr = converse([CLI_PYTHON, *command], env)

    answer = the_tool_answer(received)
    assert answer.get("isError") is not True, answer
    assert answer["structuredContent"] == {"clusters": []}
    assert "config.toml" in stderr
