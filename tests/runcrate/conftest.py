import importlib.util
import os
from pathlib import Path
from types import ModuleType

import pytest

SETTINGS_FILE = Path(__file__).resolve().parents[2] / "config" / "settings.py"
# What a deployment might have set; each test starts from none of it.
SETTINGS_VARIABLES = {
    "DATABASE_URL",
    "REDIS_URL",
    "REDIS_CACHE_URL",
    "SENTRY_DSN",
    "SENTRY_ENVIRONMENT",
    "SECRET_KEY",
    "SECRET_KEY_FALLBACKS",
    "DEBUG",
    "ALLOWED_HOSTS",
    "CSRF_TRUSTED_ORIGINS",
    "SITE_URL",
    "PORT",
    "EMAIL_BACKEND",
    "DEFAULT_FROM_EMAIL",
    "LOG_LEVEL",
    "SECURE_SSL_REDIRECT",
    "SECURE_HSTS_SECONDS",
}


@pytest.fixture
def load_settings(monkeypatch, tmp_path):
    """Execute config/settings.py afresh, as a new process would, with the given environment
    and RUNCRATE_VAR_DIR in a temporary folder. The running Django's settings are untouched."""

    def load(**environment: str) -> ModuleType:
        for name in list(os.environ):
            if name in SETTINGS_VARIABLES or name.startswith(("RUNCRATE_", "ANYMAIL_", "STRIPE_")):
                monkeypatch.delenv(name)
        monkeypatch.setenv("RUNCRATE_VAR_DIR", str(tmp_path / "var"))
        for name, value in environment.items():
            monkeypatch.setenv(name, value)
        spec = importlib.util.spec_from_file_location("settings_under_test", SETTINGS_FILE)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    return load
