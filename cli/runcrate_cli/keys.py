"""`runcrate ssh-keys`: your project's SSH keys (a placeholder until its commands land)."""

from __future__ import annotations

import typer

keys_app = typer.Typer(help="Your project's SSH keys.", no_args_is_help=True)
