"""`runcrate login` and the config file: checked against the API before it is saved, mode 0600
under $XDG_CONFIG_HOME, and RUNCRATE_API_URL/RUNCRATE_API_KEY over it."""

import stat
import tomllib
from pathlib import Path

import pytest
from django.test import Client

from tests.cli.kit import assert_no_traceback, cli_env, run_cli

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def bare_env(tmp_path, live_server):
    """A home with no saved key and no key in the environment."""
    env = cli_env(tmp_path / "home", url=live_server.url, key=None)
    del env["RUNCRATE_API_URL"]
    return env


def config_file(env):
    return Path(env["XDG_CONFIG_HOME"]) / "runcrate" / "config.toml"


def test_it_saves_the_url_and_key_in_a_private_file(bare_env, tmp_path, account, live_server):
    result = run_cli(
        "login",
        "--url",
        f"{live_server.url}/api/v1/",
        "--key",
        account.key,
        env=bare_env,
        tmp_path=tmp_path,
    )

    assert result.code == 0, result.stderr
    path = config_file(bare_env)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert tomllib.loads(path.read_text()) == {"api_url": live_server.url, "api_key": account.key}
    assert result.json()["email"] == account.user.email

    # The next command needs neither the URL nor the key: they come from the file.
    me = run_cli("clusters", "list", env=bare_env, tmp_path=tmp_path)
    assert me.code == 0, me.stderr
    assert me.json() == []


def test_it_reads_the_key_from_stdin_without_a_terminal(bare_env, tmp_path, account, live_server):
    result = run_cli(
        "login",
        "--url",
        live_server.url,
        env=bare_env,
        tmp_path=tmp_path,
        stdin=account.key + "\n",
    )

    assert result.code == 0, result.stderr
    assert tomllib.loads(config_file(bare_env).read_text())["api_key"] == account.key


def test_it_saves_nothing_for_a_key_the_api_refuses(bare_env, tmp_path, account, live_server):
    result = run_cli(
        "login",
        "--url",
        live_server.url,
        "--key",
        "rc_live_not-a-key",
        env=bare_env,
        tmp_path=tmp_path,
    )

    api = Client(headers={"authorization": "Bearer rc_live_not-a-key"}).get("/api/v1/me")
    assert result.code == 5  # authentication
    assert api.json()["error"]["message"] in result.stderr
    assert not config_file(bare_env).exists()
    assert_no_traceback(result)


def test_the_environment_overrides_the_saved_key(bare_env, tmp_path, account, live_server):
    run_cli(
        "login", "--url", live_server.url, "--key", account.key, env=bare_env, tmp_path=tmp_path
    )

    overridden = run_cli(
        "clusters",
        "list",
        env={**bare_env, "RUNCRATE_API_KEY": "rc_live_revoked-or-wrong"},
        tmp_path=tmp_path,
    )

    assert overridden.code == 5
    assert overridden.json()["error"]["code"] == "unauthenticated"


def test_it_keeps_the_file_private_when_it_is_rewritten(bare_env, tmp_path, account, live_server):
    path = config_file(bare_env)
    path.parent.mkdir(parents=True)
    path.write_text('api_url = "http://old"\n')
    path.chmod(0o644)

    run_cli(
        "login", "--url", live_server.url, "--key", account.key, env=bare_env, tmp_path=tmp_path
    )

    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert tomllib.loads(path.read_text())["api_url"] == live_server.url
