"""RUNCRATE_DEMO: the demo that `make run` starts (docs/settings.md), never a deployment."""

import importlib.util
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

RUN_PY = Path(__file__).resolve().parents[2] / "bin" / "run.py"


def run_module():
    spec = importlib.util.spec_from_file_location("run", RUN_PY)
    run = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run)
    return run


def test_it_is_off_by_default_with_a_support_address(load_settings):
    defaults = load_settings()

    assert defaults.RUNCRATE_DEMO is False
    assert defaults.RUNCRATE_SUPPORT_EMAIL == "support@runcrate.localhost"
    assert load_settings(RUNCRATE_SUPPORT_EMAIL="help@op.test").RUNCRATE_SUPPORT_EMAIL == (
        "help@op.test"
    )


def test_it_refuses_to_start_the_demo_with_debug_off(load_settings):
    assert load_settings(RUNCRATE_DEMO="true").RUNCRATE_DEMO is True

    with pytest.raises(ImproperlyConfigured, match="RUNCRATE_DEMO is for the demo"):
        load_settings(RUNCRATE_DEMO="true", DEBUG="false", SECRET_KEY="x" * 50)


def test_make_run_turns_the_demo_on_only_with_debug_on(monkeypatch):
    run = run_module()
    laptop: dict[str, str] = {}
    deployed: dict[str, str] = {}
    chosen = {"RUNCRATE_DEMO": "false"}

    monkeypatch.setenv("DEBUG", "true")
    run.the_demo(laptop)
    run.the_demo(chosen)
    monkeypatch.setenv("DEBUG", "false")
    run.the_demo(deployed)

    # The demo's webhooks may go to a receiver on the laptop (docs/notifications.md).
    assert laptop == {"RUNCRATE_DEMO": "true", "RUNCRATE_WEBHOOKS_ALLOW_PRIVATE": "true"}
    # What the environment sets wins.
    assert chosen == {"RUNCRATE_DEMO": "false", "RUNCRATE_WEBHOOKS_ALLOW_PRIVATE": "true"}
    assert deployed == {}
