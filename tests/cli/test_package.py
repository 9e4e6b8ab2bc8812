"""The client is its own light package: `pip install ./cli` into a fresh virtualenv gives a
`runcrate` that carries nothing of the server, and that console script, as a real process of
that virtualenv, does the client's work against a live server.

The package is built from a copy of cli/ (its pyproject.toml and runcrate_cli, without build
leftovers), so a run never writes build/ into the checkout nor packs a stale file left there.
pip may use its cache and the package index; its time is bounded. The virtualenv is built once
for the module.

What is proved here is the package, not the CLI's logic (tests/cli and tests/mcp cover that in
the same run, with the checkout's client): it installs none of the server's distributions; its
`runcrate` says its version and every module of it imports (the MCP server's among them); and
the virtualenv's own `runcrate` script, run as a process, is enough for each kind of work the
client does: a create that waits until the cluster is ready (httpx, the JSON output, exit 0), a
table drawn by rich on a pseudo-terminal, an SSH key read from a file and sent, an API that is
not there (its sentence and exit 6, no traceback), and `runcrate mcp` over stdio with nothing
but JSON-RPC on stdout (the mcp SDK). Until issue 34 a nested pytest ran half of tests/cli
again with the virtualenv's Python for that proof (51 s on a quiet two-core machine, with a
budget of 480 s; these smoke tests take a few seconds each).
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from accounts.models import SshKey
from clusters.models import Cluster
from tests.cli.kit import REPO, assert_no_traceback, cli_env, ready_cluster, run_cli, run_cli_tty
from tests.clusters.lifecycle_kit import inventory
from tests.mcp.kit import converse, the_tool_answer

PIP_SECONDS = 300
# What the server needs and the client must never pull in (distribution names, normalised).
SERVER_ONLY = {"django", "celery", "psycopg", "psycopg2", "psycopg-binary", "stripe", "paramiko"}
# Every module of the package but __main__ (which would run the CLI), each printed once loaded.
IMPORT_EVERY_MODULE = """
import importlib, pkgutil, runcrate_cli
for module in pkgutil.iter_modules(runcrate_cli.__path__, "runcrate_cli."):
    if module.name.endswith(".__main__"):
        continue
    importlib.import_module(module.name)
    print(module.name)
"""


def normalised(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


@pytest.fixture(scope="module")
def client_venv(tmp_path_factory) -> Path:
    """A virtualenv with only the client installed, as `pip install ./cli` gives it."""
    root = tmp_path_factory.mktemp("package")
    source = root / "cli"
    shutil.copytree(
        REPO / "cli",
        source,
        ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", "*.pyc"),
    )
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    try:
        installed = subprocess.run(
            [venv / "bin" / "pip", "install", "--disable-pip-version-check", str(source)],
            capture_output=True,
            text=True,
            timeout=PIP_SECONDS,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"pip install ./cli took more than {PIP_SECONDS} s")
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
    return venv


@pytest.fixture
def venv_runcrate(client_venv) -> list[str]:
    """The virtualenv's `runcrate` console script, as `program` for run_cli and run_cli_tty."""
    return [str(client_venv / "bin" / "runcrate")]


def test_it_installs_none_of_the_servers_packages(client_venv):
    listed = subprocess.run(
        [client_venv / "bin" / "pip", "list", "--format=json", "--disable-pip-version-check"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    names = {normalised(package["name"]) for package in json.loads(listed.stdout)}

    assert "runcrate-clusters-cli" in names
    assert {"typer", "rich", "httpx", "mcp"} <= names
    assert not names & SERVER_ONLY, sorted(names & SERVER_ONLY)
    assert not any(name.startswith(("django", "celery", "psycopg")) for name in names), names


def test_its_runcrate_runs_from_the_virtualenv_imports_whole_and_says_its_version(client_venv):
    pyproject = tomllib.loads((REPO / "cli" / "pyproject.toml").read_text())
    # Run from the checkout, as the CLI tests do: the package must still come from the
    # virtualenv's site-packages, not from a folder of the checkout.
    where = subprocess.run(
        [client_venv / "bin" / "python", "-c", "import runcrate_cli; print(runcrate_cli.__file__)"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    version = subprocess.run(
        [client_venv / "bin" / "runcrate", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": os.environ.get("PATH", ""), "HOME": str(client_venv)},
    )

    modules = subprocess.run(
        [client_venv / "bin" / "python", "-c", IMPORT_EVERY_MODULE],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert Path(where.stdout.strip()).is_relative_to(client_venv)
    assert modules.returncode == 0, modules.stderr
    assert "runcrate_cli.mcp_server" in modules.stdout.split()
    assert version.returncode == 0, version.stderr
    assert version.stdout.strip() == f"runcrate {pyproject['project']['version']}"


@pytest.mark.django_db(transaction=True)
def test_its_runcrate_creates_a_cluster_and_waits_until_it_is_ready(
    venv_runcrate, env, tmp_path, account, ticker
):
    offer = inventory(hosts=3, price="20.00")

    result = run_cli(
        "clusters", "create", "--offer", offer.slug, "--nodes", "2", "--name", "train", "--wait",
        "--yes", "--json", env=env, tmp_path=tmp_path, drive=ticker, program=venv_runcrate,
    )  # fmt: skip

    assert result.code == 0, result.stderr
    cluster = Cluster.objects.get(project=account.project)
    assert cluster.status == Cluster.Status.READY and cluster.name == "train"
    printed = result.json()
    assert printed["id"] == cluster.pk and printed["status"] == "ready"
    assert [m["status"] for m in printed["machines"]] == ["joined", "joined"]
    assert "is ready" in result.stderr
    assert ticker.ticks > 1  # it waited through the machines' steps, not a single answer
    assert_no_traceback(result)


@pytest.mark.django_db(transaction=True)
def test_its_runcrate_draws_a_table_on_a_terminal(venv_runcrate, env, tmp_path, account, ticker):
    cluster = ready_cluster(account, ticker, name="seen")

    listed = run_cli_tty("clusters", "list", env=env, tmp_path=tmp_path, program=venv_runcrate)

    assert listed.code == 0, listed.stderr
    row = next(line for line in listed.stdout.splitlines() if " seen " in line)
    assert [cell.strip() for cell in row.strip("│").split("│")][:3] == [
        str(cluster.pk),
        "seen",
        "ready",
    ]
    assert_no_traceback(listed)


@pytest.mark.django_db(transaction=True)
def test_its_runcrate_adds_an_ssh_key_read_from_a_file(venv_runcrate, env, tmp_path, account):
    public = (
        Ed25519PrivateKey.generate()
        .public_key()
        .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    )
    path = tmp_path / "deploy.pub"
    path.write_text(public.decode() + " deploy@ci\n")

    added = run_cli("ssh-keys", "add", str(path), env=env, tmp_path=tmp_path, program=venv_runcrate)

    assert added.code == 0, added.stderr
    key = SshKey.objects.get(project=account.project, name="deploy@ci")
    assert key.public_key.split()[:2] == public.decode().split()
    assert added.json()["id"] == key.pk and added.json()["fingerprint"] == key.fingerprint


def test_its_runcrate_names_an_api_that_is_not_there_and_exits_6(venv_runcrate, tmp_path):
    with socket.socket() as probe:  # a port nothing listens on once the probe is closed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = cli_env(tmp_path / "home", url=f"http://127.0.0.1:{port}", key="rc_live_x")

    result = run_cli("gpus", env=env, tmp_path=tmp_path, program=venv_runcrate)

    assert result.code == 6
    assert f"Cannot reach the Runcrate API at http://127.0.0.1:{port}" in result.stderr
    assert result.json()["error"]["code"] == "unreachable"
    assert_no_traceback(result)


@pytest.mark.django_db(transaction=True)
def test_its_runcrate_mcp_writes_only_json_rpc_to_stdout(venv_runcrate, env, account, ticker):
    ready_cluster(account, ticker, name="seen")

    received, stderr = converse([*venv_runcrate, "mcp"], env)

    assert [m.get("id") for m in received] == [1, 2]  # every stdout line was JSON-RPC
    answer = the_tool_answer(received)
    assert answer.get("isError") is not True, answer
    assert [c["name"] for c in answer["structuredContent"]["clusters"]] == ["seen"]
    assert "Traceback" not in stderr, stderr
