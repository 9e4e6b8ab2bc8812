"""How `runcrate` fails: the API's message and an exit code that says which kind of failure
(1 refused, 2 usage, 5 authentication, 6 no API), never a traceback."""

import socket

import pytest

from accounts import keys
from accounts.models import ApiKey
from tests.cli.kit import assert_no_traceback, cli_env, run_cli

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_revoked_key_prints_the_apis_message_and_exits_5(env, tmp_path, account):
    keys.revoke_api_key(key=ApiKey.objects.get(project=account.project))
    api = account.api().get("/api/v1/clusters")

    result = run_cli("clusters", "list", env=env, tmp_path=tmp_path)

    assert api.status_code == 401
    message = api.json()["error"]["message"]
    assert result.code == 5
    assert message in result.stderr
    assert "`runcrate login`" in result.stderr
    assert result.json() == {"error": {**api.json()["error"], "status": 401}}
    assert_no_traceback(result)


def test_a_server_that_is_not_there_is_one_sentence_naming_the_url(tmp_path):
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = cli_env(tmp_path / "home", url=f"http://127.0.0.1:{port}", key="rc_live_x")

    result = run_cli("gpus", env=env, tmp_path=tmp_path)

    assert result.code == 6
    assert f"Cannot reach the Runcrate API at http://127.0.0.1:{port}" in result.stderr
    assert result.json()["error"]["code"] == "unreachable"
    assert_no_traceback(result)


def test_no_key_at_all_says_how_to_log_in(tmp_path, live_server):
    env = cli_env(tmp_path / "home", url=live_server.url, key=None)

    result = run_cli("balance", env=env, tmp_path=tmp_path)

    assert result.code == 5
    assert "runcrate login" in result.stderr
    assert_no_traceback(result)


def test_a_usage_error_exits_2(env, tmp_path):
    result = run_cli("offers", "--nodes", "2", env=env, tmp_path=tmp_path)

    assert result.code == 2
    assert "--gpu" in result.stderr
    assert_no_traceback(result)


def test_a_damaged_config_file_is_named(tmp_path, live_server):
    env = cli_env(tmp_path / "home", url=live_server.url, key=None)
    path = tmp_path / "home" / ".config" / "runcrate" / "config.toml"
    path.parent.mkdir(parents=True)
    path.write_text("api_key = \n")

    result = run_cli("gpus", env=env, tmp_path=tmp_path)

    assert result.code == 1
    assert f"Cannot read {path}" in result.stderr
    assert_no_traceback(result)
