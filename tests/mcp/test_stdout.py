"""Over stdio, stdout is the protocol's channel: nothing but JSON-RPC messages reaches it,
whatever the config file holds. A config file that cannot be read is said on stderr and
answered by every tool (`bad_config`); RUNCRATE_API_KEY still works beside it."""

from pathlib import Path

import pytest

from tests.cli.kit import CLI_PYTHON
from tests.mcp.kit import converse, the_tool_answer

pytestmark = pytest.mark.django_db(transaction=True)


def damage_config(env) -> None:
    path = Path(env["XDG_CONFIG_HOME"]) / "runcrate" / "config.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('api_key = "rc_live_unterminated\n[[[\n')


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
