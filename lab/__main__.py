"""python -m lab up|down|status|exec|reimage: the host lab from the command line (docs/lab.md)."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path

from lab import hostlab


def _up(args: argparse.Namespace) -> int:
    key_file = Path(args.authorized_key_file)
    lines = [line for line in key_file.read_text().splitlines() if line.strip()]
    if not lines:
        print(f"lab: {key_file} holds no public key", file=sys.stderr)
        return 2
    started = time.monotonic()
    lab = hostlab.up(args.hosts, authorized_key=lines[-1], gateway=not args.no_gateway)
    print(f"lab: up in {time.monotonic() - started:.1f} s")
    _print_lab(lab)
    if args.inventory:
        document = lab.inventory(gateway_hosts=args.gateway_hosts)
        out = Path(args.inventory)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(document, indent=2) + "\n")
        print(f"lab: wrote the inventory of these hosts to {out}")
    return 0


def _print_lab(lab: hostlab.Lab) -> None:
    roles = {lab.storage: "storage", lab.gateway: "ssh gateway"}
    hosts = [host for host in (lab.storage, lab.gateway) if host] + lab.hosts
    for host in hosts:
        role = roles.get(host, "gpu host")
        print(f"  {host.name:8} {host.address:14} {role:12} {host.user}@ port {host.port}")
        print(f"  {'':8} host key {host.host_key}")
    print(f"  mirror   {hostlab.APT_MIRROR}  (pip: {hostlab.PIP_INDEX_URL})")


def _status(_args: argparse.Namespace) -> int:
    lab = hostlab.current()
    if lab is None:
        print("lab: down")
        return 1
    print("lab: up")
    _print_lab(lab)
    print(f"  state    {lab.lab_dir / 'state.json'}")
    return 0


def _down(_args: argparse.Namespace) -> int:
    hostlab.down()
    print("lab: down (the image cache and the hosts' keys are kept)")
    return 0


def _exec(args: argparse.Namespace) -> int:
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        print("lab: exec HOST -- COMMAND...", file=sys.stderr)
        return 2
    line = command[0] if len(command) == 1 else shlex.join(command)
    lab = hostlab.current()
    if lab is None:
        print("lab: the lab is down (python -m lab up ...)", file=sys.stderr)
        return 1
    result = lab.exec(args.host, line, check=False, timeout=args.timeout)
    sys.stdout.write(result.stdout)
    sys.stderr.write(result.stderr)
    return result.returncode


def _reimage(args: argparse.Namespace) -> int:
    """The lab's reimage (the inventory's `reimage`, docs/inventory.md): the host's pristine
    overlay back, same address and host key; exit 0 once its sshd answers."""
    lab = hostlab.current()
    if lab is None:
        print("lab: the lab is down (python -m lab up ...)", file=sys.stderr)
        return 1
    if not args.host:
        print("lab: reimage HOST (or RUNCRATE_HOST_NAME in the environment)", file=sys.stderr)
        return 2
    started = time.monotonic()
    lab.reset(args.host)
    print(f"lab: {args.host} reimaged in {time.monotonic() - started:.1f} s")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab", description=__doc__)
    commands = parser.add_subparsers(dest="verb", required=True)
    up = commands.add_parser("up", help="bring the lab up (idempotent)")
    up.add_argument("--hosts", type=int, default=3, help="GPU hosts lab-1..lab-N (default 3)")
    up.add_argument("--no-gateway", action="store_true", help="no lab-gw host")
    up.add_argument("--authorized-key-file", required=True, help="the operator's public key")
    up.add_argument("--inventory", metavar="OUT.json", help="write these hosts' inventory")
    up.add_argument(
        "--gateway-hosts", type=int, default=0, help="in the inventory, the last N behind lab-gw"
    )
    up.set_defaults(run=_up)
    commands.add_parser("down", help="remove everything but the cache").set_defaults(run=_down)
    commands.add_parser("status", help="what is up").set_defaults(run=_status)
    run = commands.add_parser("exec", help="run a command inside a host, as root")
    run.add_argument("host")
    run.add_argument("--timeout", type=float, default=600)
    run.add_argument("command", nargs=argparse.REMAINDER)
    run.set_defaults(run=_exec)
    reimage = commands.add_parser("reimage", help="a host back to pristine (the reimage)")
    reimage.add_argument("host", nargs="?", default=os.environ.get("RUNCRATE_HOST_NAME", ""))
    reimage.set_defaults(run=_reimage)
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except BrokenPipeError:  # `python -m lab status | head`
        return 0
    except (hostlab.LabError, ValueError, OSError) as error:
        print(f"lab: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
