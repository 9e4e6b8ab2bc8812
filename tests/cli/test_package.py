"""The client is its own light package: `pip install ./cli` into a fresh virtualenv gives a
`runcrate` that carries nothing of the server and passes the CLI tests.

The package is built from a copy of cli/ (its pyproject.toml and runcrate_cli, without build
leftovers), so a run never writes build/ into the checkout nor packs a stale file left there.
pip may use its cache and the package index; its time is bounded.

The CLI tests then run again in a pytest of their own, with RUNCRATE_CLI_PYTHON set to the
virtualenv's Python (tests/cli/kit.py runs the CLI with it) and a database, var folder and
Django test database of their own. All of tests/cli takes over five minutes on a busy
two-core machine, so a representative part runs (CLI_TESTS, under half of it): clusters
(create, --wait and its exit codes), ssh_keys (files, stdin, refusals), errors (refused and
unreachable APIs), terminal (rich tables and the live display on a pseudo-terminal), plan (the
plan and its question) and connect (ssh, ssh-config, hostfile, kubeconfig). The others go
through the same client and output modules; every module of the package is imported in the
virtualenv besides (the MCP server's among them, which no CLI test imports).
"""

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.cli.kit import REPO

PIP_SECONDS = 300
CLI_TESTS_SECONDS = 480
# The part of tests/cli run with the package's runcrate (the module's docstring says why).
CLI_TESTS = ("clusters", "ssh_keys", "errors", "terminal", "plan", "connect")
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


def inner_database_url() -> str | None:
    """DATABASE_URL with `_pkg` after its database's name: the inner pytest-django then makes
    test_<name>_pkg, never the database this run's tests use."""
    url = os.environ.get("DATABASE_URL")
    if not url:
        return None  # SQLite: its file lies in the inner run's own var folder
    parts = urlsplit(url)
    return parts._replace(path=parts.path.rstrip("/") + "_pkg").geturl()


def test_its_runcrate_passes_the_cli_tests(client_venv, tmp_path):
    env = {
        **os.environ,
        "RUNCRATE_CLI_PYTHON": str(client_venv / "bin" / "python"),
        "RUNCRATE_VAR_DIR": str(tmp_path / "var"),
    }
    database_url = inner_database_url()
    if database_url:
        env["DATABASE_URL"] = database_url
    try:
        run = subprocess.run(
            [
                sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--create-db",
                *(f"tests/cli/test_{name}.py" for name in CLI_TESTS),
            ],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=CLI_TESTS_SECONDS,
        )  # fmt: skip
    except subprocess.TimeoutExpired as expired:
        tail = (expired.stdout or b"")[-3000:]
        pytest.fail(f"the CLI tests ran past {CLI_TESTS_SECONDS} s: {tail!r}")

    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    assert " passed" in run.stdout.splitlines()[-1]
