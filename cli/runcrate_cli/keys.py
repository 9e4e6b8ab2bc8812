"""`runcrate ssh-keys`: the project's SSH keys, which every machine of a new cluster trusts.

`add` reads a public key from a file, from stdin (`-`), or by default from
~/.ssh/id_ed25519.pub, and sends it to `POST /api/v1/ssh-keys`; the server validates it and its
refusals reach the user as every refusal does (cli.py's `RuncrateGroup`). A private key given by
mistake is refused here, before any request, and its text is never printed.

cli.py imports this module to mount `keys_app`, so this module does not import cli.py: its
small session and confirmation helpers are its own.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from runcrate_cli.client import ApiClient, ApiError, configured_client
from runcrate_cli.output import Column, Output, fit_table

EXIT_USAGE = 2
DEFAULT_KEY = Path("~/.ssh/id_ed25519.pub")
# The files a private key starts with: PEM ("-----BEGIN OPENSSH PRIVATE KEY-----", "RSA
# PRIVATE KEY", …) and PuTTY's .ppk.
PRIVATE_MARKERS = ("PRIVATE KEY", "PuTTY-User-Key-File")

keys_app = typer.Typer(
    no_args_is_help=True,
    help="Your project's SSH keys: every machine of a new cluster trusts them.",
)

Json = Annotated[
    bool, typer.Option("--json", help="Print JSON (the default when stdout is not a terminal).")
]


def _session(json_flag: bool) -> tuple[Output, ApiClient]:
    return Output(json_flag=json_flag), configured_client()


def _show_keys(console: Console, rows: list[dict]) -> None:
    if not rows:
        console.print(
            "No SSH keys yet: `runcrate ssh-keys add` adds ~/.ssh/id_ed25519.pub.", markup=False
        )
        return
    # An id, a name and a fingerprint are copied whole; on a narrow terminal (an Ed25519
    # fingerprint alone is 50 characters) each key becomes a block of lines instead.
    columns = [Column("id", whole=True), Column("name", whole=True)]
    columns += [Column("fingerprint", whole=True), Column("added")]
    cells = [
        [str(key["id"]), key["name"], key["fingerprint"], _added(key["created_at"])] for key in rows
    ]
    console.print(fit_table(console.width, columns, cells))


def _added(created_at: str) -> str:
    return str(created_at)[:16].replace("T", " ")


@keys_app.command("list")
def keys_list(json_flag: Json = False) -> None:
    """The project's SSH keys: id, name, fingerprint and when each was added."""
    out, client = _session(json_flag)
    with client:
        out.emit(client.ssh_keys(), _show_keys)


def _read_key(file: str | None) -> tuple[str, Path | None]:
    """The public key's text and the file it came from (None for stdin). A missing or
    unreadable file, or a private key, is refused here: nothing is sent."""
    if file == "-":
        return sys.stdin.read(), None
    path = (Path(file) if file else DEFAULT_KEY).expanduser()
    if file is None and not path.exists():
        others = sorted(path.parent.glob("id_*.pub")) if path.parent.is_dir() else []
        hint = (
            f"give the one you have, `runcrate ssh-keys add {others[0]}`"
            if others
            else "make one with `ssh-keygen -t ed25519`"
        )
        raise ApiError(
            "no_public_key",
            f"There is no {DEFAULT_KEY}, the key added by default: {hint}, or give a public "
            "key's file, `runcrate ssh-keys add PATH.pub` (`-` reads it from stdin).",
        )
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ApiError("no_public_key", f"There is no file {path}.") from None
    except IsADirectoryError:
        raise ApiError("no_public_key", f"{path} is a directory, not a key's file.") from None
    except UnicodeDecodeError:
        raise ApiError(
            "invalid_ssh_key", f"{path} is not a text file: give the key's .pub file."
        ) from None
    except OSError as error:
        raise ApiError("no_public_key", f"Cannot read {path}: {error.strerror}.") from None
    return text, path


def _refuse_private_key(text: str, path: Path | None) -> None:
    if not any(marker in text for marker in PRIVATE_MARKERS):
        return
    where = f"{path} holds" if path else "This is"
    public = f" ({path}.pub)" if path and path.suffix != ".pub" else ""
    raise ApiError(
        "private_key",
        f"{where} a private key: it stays on this computer and nothing was sent. Give its "
        f"public half instead, the one-line .pub file beside it{public}.",
    )


@keys_app.command("add")
def keys_add(
    file: Annotated[
        str | None,
        typer.Argument(
            help="The public key's file, or - to read it from stdin; "
            "default ~/.ssh/id_ed25519.pub.",
            show_default=False,
        ),
    ] = None,
    name: Annotated[
        str | None,
        typer.Option(help="What to call it; default the key's comment, else the file's name."),
    ] = None,
    json_flag: Json = False,
) -> None:
    """Add a public key to the project: clusters created from now on trust it.

    `runcrate clusters create` installs every key of the project unless --ssh-key picks some.
    """
    text, path = _read_key(file)
    _refuse_private_key(text, path)
    line = text.strip()
    if not name and len(line.split()) < 3:  # a key without a comment
        if path is None:
            raise ApiError(
                "invalid_name", "This key has no comment to name it after: give --name NAME."
            )
        name = path.name
    out, client = _session(json_flag)
    with client:
        created = client.data("POST", "/ssh-keys", json={"name": name or "", "public_key": line})
    out.emit(
        created,
        lambda console, key: console.print(
            f"Added SSH key {key['name']} (id {key['id']}, {key['fingerprint']}): new clusters "
            "trust it on every machine.",
            markup=False,
        ),
    )


def _find_key(keys: list[dict], ref: str) -> dict:
    """The key `ref` names: its id, its fingerprint, or a name only one key has."""
    text = ref.strip()
    for key in keys:
        if text in (str(key["id"]), key["fingerprint"]):
            return key
    named = [key for key in keys if key["name"] == text]
    if len(named) > 1:
        ids = ", ".join(str(key["id"]) for key in named)
        raise ApiError(
            "ambiguous_ssh_key",
            f"Several SSH keys are named {text!r} (ids {ids}): give the id or the fingerprint.",
        )
    if not named:
        raise ApiError("not_found", f"Your project has no SSH key {text!r}.", 404)
    return named[0]


def _confirm(question: str, *, yes: bool) -> None:
    """Ask on a terminal; without one, refuse (exit 2) unless --yes was given."""
    if yes:
        return
    if not sys.stdin.isatty():
        sys.stderr.write(
            f"runcrate: {question} Not asked without a terminal: nothing was removed; pass --yes.\n"
        )
        raise typer.Exit(EXIT_USAGE)
    if not typer.confirm(question, default=False):
        sys.stderr.write("runcrate: Nothing was removed.\n")
        raise typer.Exit(EXIT_USAGE)


@keys_app.command("remove")
def keys_remove(
    key: Annotated[
        str, typer.Argument(help="The key's id, name or fingerprint.", show_default=False)
    ],
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask to confirm.")] = False,
    json_flag: Json = False,
) -> None:
    """Remove a key from the project. Asks to confirm; --yes skips it.

    Clusters already running keep it on their machines until they end; new ones do not get it.
    """
    out, client = _session(json_flag)
    with client:
        keys = client.ssh_keys()
        found = _find_key(keys, key)
        _confirm(
            f"Remove SSH key {found['name']} (id {found['id']}, {found['fingerprint']})? "
            "Clusters already running keep it until they end.",
            yes=yes,
        )
        client.data("DELETE", f"/ssh-keys/{found['id']}")
    result: dict[str, Any] = {"id": found["id"], "removed": True}
    out.emit(
        result,
        lambda console, r: console.print(
            f"Removed SSH key {found['name']} (id {r['id']}).", markup=False
        ),
    )
    if len(keys) == 1:
        out.note(
            "Your project has no SSH key left: a new cluster needs one (`runcrate ssh-keys add`)."
        )
