"""Where the API is and which key to send: `~/.config/runcrate/config.toml` (under
`$XDG_CONFIG_HOME` when set), overridden by `RUNCRATE_API_URL` and `RUNCRATE_API_KEY`.

The file holds a secret, so it is written with mode 0600 in a 0700 directory, and replaced
atomically: a reader never sees half a file, and the key never sits in a file others can read,
not even for an instant.
"""

from __future__ import annotations

import json
import os
import tomllib
from dataclasses import dataclass
from pathlib import Path

DEFAULT_API_URL = "http://127.0.0.1:8000"  # where `make run` serves


class ConfigError(Exception):
    """The config file cannot be read; the message says which file and why."""


@dataclass(frozen=True)
class Settings:
    api_url: str
    api_key: str | None
    source: str  # where the key came from: the environment, the file, or nowhere


def config_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "runcrate"


def config_path() -> Path:
    return config_dir() / "config.toml"


def normalise_url(url: str) -> str:
    """The site's root: people paste the dashboard's address or the API's, with or without a
    trailing slash; both mean the same server."""
    url = url.strip().rstrip("/")
    if url.endswith("/api/v1"):
        url = url[: -len("/api/v1")]
    return url


def read_file() -> dict[str, str]:
    path = config_path()
    try:
        with path.open("rb") as handle:
            data = tomllib.load(handle)
    except FileNotFoundError:
        return {}
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise ConfigError(f"Cannot read {path}: {error}. Run `runcrate login` again.") from None
    return {key: value for key, value in data.items() if isinstance(value, str)}


def load() -> Settings:
    stored = read_file()
    env_url, env_key = os.environ.get("RUNCRATE_API_URL"), os.environ.get("RUNCRATE_API_KEY")
    url = normalise_url(env_url or stored.get("api_url") or DEFAULT_API_URL)
    if env_key:
        return Settings(api_url=url, api_key=env_key.strip(), source="RUNCRATE_API_KEY")
    if stored.get("api_key"):
        return Settings(api_url=url, api_key=stored["api_key"], source=str(config_path()))
    return Settings(api_url=url, api_key=None, source="none")


def _toml_string(value: str) -> str:
    # JSON's string escapes (\" \\ \n \uXXXX) are all valid in a TOML basic string.
    return json.dumps(value)


def save(*, api_url: str, api_key: str | None) -> Path:
    """Write the config file (mode 0600, its directory 0700) and return its path; without
    `api_key`, only the URL."""
    directory = config_dir()
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    path = config_path()
    body = (
        "# Written by `runcrate login`. RUNCRATE_API_URL and RUNCRATE_API_KEY override it.\n"
        f"api_url = {_toml_string(normalise_url(api_url))}\n"
    )
    if api_key is not None:
        body += f"api_key = {_toml_string(api_key)}\n"
    partial = path.with_suffix(".toml.partial")
    # Created 0600 from the first byte: a chmod after writing would leave a window.
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        handle.write(body)
    os.chmod(partial, 0o600)  # O_CREAT's mode does not apply to a file that already existed
    os.replace(partial, path)
    return path


def forget_key() -> tuple[Path, bool]:
    """For `runcrate auth logout`: rewrite the config file without its key, keeping the URL
    for the next login; return its path and whether a key was there. A file that cannot be
    read is removed: it is no use to anything, and may hold the key."""
    path = config_path()
    try:
        stored = read_file()
    except ConfigError:
        path.unlink()
        return path, True
    if "api_key" not in stored:
        return path, False
    save(api_url=stored.get("api_url") or DEFAULT_API_URL, api_key=None)
    return path, True
