"""Settings that keep a deployment safe: no made-up secret key with DEBUG off, rotation through
SECRET_KEY_FALLBACKS, and no test host among the hosts served."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

ROOT = Path(__file__).resolve().parents[2]


def test_it_refuses_to_start_with_debug_off_and_no_secret_key(load_settings):
    with pytest.raises(ImproperlyConfigured, match="SECRET_KEY must be set when DEBUG is off"):
        load_settings(DEBUG="false")
    with pytest.raises(ImproperlyConfigured, match="SECRET_KEY must be set"):
        load_settings(DEBUG="false", SECRET_KEY="")

    assert load_settings(DEBUG="false", SECRET_KEY="s" * 50).SECRET_KEY == "s" * 50
    assert load_settings().SECRET_KEY  # on a laptop, one is made under RUNCRATE_VAR_DIR


def test_a_process_with_debug_off_and_no_secret_key_stops_before_doing_anything(tmp_path):
    environment = {
        name: value
        for name, value in os.environ.items()
        if name not in {"SECRET_KEY", "DJANGO_SETTINGS_MODULE"}
    }
    environment.update(DEBUG="false", RUNCRATE_VAR_DIR=str(tmp_path))

    done = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert done.returncode != 0
    assert "SECRET_KEY must be set when DEBUG is off" in done.stderr
    assert not (tmp_path / "secret_key").exists()


def test_it_reads_the_former_keys_of_a_rotation(load_settings):
    rotated = load_settings(SECRET_KEY="new" * 20, SECRET_KEY_FALLBACKS="old-1 , old-2")

    assert rotated.SECRET_KEY_FALLBACKS == ["old-1", "old-2"]
    assert load_settings().SECRET_KEY_FALLBACKS == []


def test_it_serves_no_test_host_by_default(load_settings, settings):
    assert load_settings().ALLOWED_HOSTS == ["localhost", "127.0.0.1", "[::1]"]
    assert "testserver" not in load_settings(DEBUG="false", SECRET_KEY="s" * 50).ALLOWED_HOSTS
    # The test runner adds it for Django's test client, in tests only.
    assert "testserver" in settings.ALLOWED_HOSTS
