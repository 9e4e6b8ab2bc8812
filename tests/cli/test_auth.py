"""`runcrate auth status` and `auth logout`, `--version`, and typer's shell completion."""

import importlib.metadata
import tomllib
from pathlib import Path

import pytest

from accounts import keys
from tests.cli.kit import assert_no_traceback, cli_env, run_cli, run_cli_tty

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def logged_in(tmp_path, live_server, account):
    """A home whose key was saved by `runcrate login` (none in the environment)."""
    env = cli_env(tmp_path / "home", url=live_server.url, key=None)
    saved = run_cli("login", "--key", account.key, env=env, tmp_path=tmp_path)
    assert saved.code == 0, saved.stderr
    return env


def config_file(env) -> Path:
    return Path(env["XDG_CONFIG_HOME"]) / "runcrate" / "config.toml"


def test_status_says_who_the_key_is(logged_in, tmp_path, account, live_server):
    _, narrowed = keys.issue_api_key(
        user=account.user, project=account.project, name="agent", scopes=["read"]
    )

    saved = run_cli("auth", "status", env=logged_in, tmp_path=tmp_path)
    agent = run_cli(
        "auth", "status", env={**logged_in, "RUNCRATE_API_KEY": narrowed}, tmp_path=tmp_path
    )
    shown = run_cli_tty("auth", "status", env=logged_in, tmp_path=tmp_path)

    assert saved.code == agent.code == shown.code == 0, saved.stderr
    me = saved.json()
    assert me["email"] == account.user.email
    assert me["project"]["name"] == account.project.name
    assert me["api_key"]["prefix"] == account.key[: len(me["api_key"]["prefix"])]
    assert me["api_url"] == live_server.url
    assert me["key_source"] == str(config_file(logged_in))
    assert agent.json()["api_key"]["scopes"] == ["read"]
    assert agent.json()["key_source"] == "RUNCRATE_API_KEY"
    screen = " ".join(shown.stdout.split())
    assert f"user {account.user.email}" in screen
    assert f"key {me['api_key']['name']} ({me['api_key']['prefix']}…)" in screen
    assert f"API {live_server.url}" in screen


def test_status_exits_5_when_not_logged_in_or_the_key_is_refused(tmp_path, live_server, account):
    bare = cli_env(tmp_path / "home", url=live_server.url, key=None)

    nobody = run_cli("auth", "status", env=bare, tmp_path=tmp_path)
    refused = run_cli(
        "auth", "status", env={**bare, "RUNCRATE_API_KEY": "rc_live_nope"}, tmp_path=tmp_path
    )

    assert nobody.code == refused.code == 5
    assert "Not logged in: run `runcrate login`" in nobody.stderr
    assert refused.json()["error"]["code"] == "unauthenticated"
    assert "`runcrate login`" in refused.stderr
    assert_no_traceback(refused)


def test_logout_removes_the_saved_key_and_keeps_the_url(logged_in, tmp_path, live_server):
    out = run_cli("auth", "logout", env=logged_in, tmp_path=tmp_path)
    again = run_cli("auth", "logout", env=logged_in, tmp_path=tmp_path)
    status = run_cli("auth", "status", env=logged_in, tmp_path=tmp_path)

    assert out.code == again.code == 0, out.stderr
    assert out.json() == {"config_file": str(config_file(logged_in)), "removed": True}
    assert again.json()["removed"] is False
    assert tomllib.loads(config_file(logged_in).read_text()) == {"api_url": live_server.url}
    assert status.code == 5


def test_login_works_under_auth_too(tmp_path, live_server, account):
    env = cli_env(tmp_path / "home", url=live_server.url, key=None)

    result = run_cli("auth", "login", "--key", account.key, env=env, tmp_path=tmp_path)

    assert result.code == 0, result.stderr
    assert tomllib.loads(config_file(env).read_text())["api_key"] == account.key


def test_version_and_shell_completion(tmp_path):
    env = cli_env(tmp_path / "home", url="http://127.0.0.1:9", key=None)
    # Typer finds the shell among the process's parents (shellingham), so the outcome hung on
    # how the suite was started: under CI's bash it found one, started in the background it
    # found none ("Shell  not supported."). Typer's own switch makes --show-completion take
    # the shell named instead.
    env["_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION"] = "1"

    version = run_cli("--version", env=env, tmp_path=tmp_path)
    completion = run_cli("--show-completion", "bash", env=env, tmp_path=tmp_path)

    assert version.code == 0
    assert version.stdout == f"runcrate {importlib.metadata.version('runcrate-clusters-cli')}\n"
    assert completion.code == 0, completion.stderr
    assert "COMPREPLY" in completion.stdout and "complete -o default -F" in completion.stdout
