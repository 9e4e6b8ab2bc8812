"""The cluster's SSH config and known_hosts (from GET /api/v1/clusters/{id}/connect) as files
that OpenSSH reads: a private copy for `runcrate ssh`, or `~/.ssh/config.d/runcrate-NAME` for
the user's own `ssh`.

The API's config names each machine's key by its `HostKeyAlias`; pointing every `Host` entry
at the cluster's known_hosts (beside the config) means `ssh` checks the pinned keys without the
user merging anything into `~/.ssh/known_hosts`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from runcrate_cli import config


@dataclass(frozen=True)
class Written:
    config: Path
    known_hosts: Path | None


def _quote(path: Path) -> str:
    text = str(path)
    return f'"{text}"' if " " in text else text


def with_known_hosts(ssh_config: str, known_hosts: Path | None) -> str:
    """The config with `UserKnownHostsFile` in each `Host` entry, when there are pinned keys."""
    if known_hosts is None:
        return ssh_config
    lines = []
    for line in ssh_config.splitlines():
        lines.append(line)
        if line.startswith("Host "):
            lines.append(f"    UserKnownHostsFile {_quote(known_hosts)} ~/.ssh/known_hosts")
    return "\n".join(lines) + "\n"


def _write_private(path: Path, text: str) -> None:
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.chmod(path, 0o600)


def _private_dir(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o700)


def write(*, directory: Path, stem: str, connect: dict) -> Written:
    """Write `stem` (the config) and, with pinned keys, `stem.known_hosts` into `directory`."""
    _private_dir(directory)
    known = None
    if connect.get("known_hosts"):
        known = directory / f"{stem}.known_hosts"
        _write_private(known, connect["known_hosts"])
    path = directory / stem
    _write_private(path, with_known_hosts(connect["ssh_config"], known))
    return Written(config=path, known_hosts=known)


def private_copy(cluster_id: int, connect: dict) -> Written:
    """For `runcrate ssh`: one copy per cluster under the config directory, rewritten on every
    call (the machines' addresses can change while it boots), so nothing piles up in /tmp."""
    directory = config.config_dir() / "ssh" / str(cluster_id)
    _private_dir(config.config_dir())
    _private_dir(directory.parent)
    return write(directory=directory, stem="config", connect=connect)


def user_config(name: str, connect: dict) -> tuple[Written, str, bool]:
    """For `runcrate ssh-config`: `~/.ssh/config.d/runcrate-NAME`, the `Include` line to add at
    the top of ~/.ssh/config, and whether ~/.ssh/config already has it (or `config.d/*`)."""
    ssh_dir = Path.home() / ".ssh"
    _private_dir(ssh_dir)
    written = write(directory=ssh_dir / "config.d", stem=f"runcrate-{name}", connect=connect)
    include = f"Include config.d/runcrate-{name}"
    try:
        current = (ssh_dir / "config").read_text(encoding="utf-8")
    except OSError:
        current = ""
    included = any(
        line.strip() in (include, "Include config.d/*", "Include ~/.ssh/config.d/*")
        for line in current.splitlines()
    )
    return written, include, included
