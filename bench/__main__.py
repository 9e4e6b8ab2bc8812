"""`python -m bench` (`make bench`): measure the product's hot paths on a throwaway database.

It sets Django up itself (the product's settings unless DJANGO_SETTINGS_MODULE names others),
so it needs no management command inside a product package. docs/benchmarks.md says what it
measures; bench/harness.py runs the sections.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bench.harness import Sizes

DESCRIPTION = (
    "Measure the poll, the offers API, the tick, the meter, the Billing page, the ledger "
    "and provisioning, each beside its own baseline, and the poll and the API under "
    "gunicorn with a load generator, on a throwaway database (your own data is not "
    "touched). See docs/benchmarks.md."
)


class UsageError(Exception):
    """Sizes or sections the bench cannot run; the message says which and why."""


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    from bench import harness

    parser = build_parser()
    options = parser.parse_args(argv)
    try:
        sizes = sizes_from_options(vars(options))
    except UsageError as error:
        parser.error(str(error))

    def progress(message: str) -> None:
        sys.stderr.write(message + "\n")

    def emit(text: str) -> None:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        sys.stdout.flush()

    if not harness.run(sizes=sizes, profile=options.profile, emit=emit, progress=progress):
        sys.stderr.write("A benchmark failed: see its line above.\n")
        return 1
    return 0


def build_parser() -> argparse.ArgumentParser:
    from bench import harness

    parser = argparse.ArgumentParser(prog="python -m bench", description=DESCRIPTION)
    parser.add_argument(
        "--quick", action="store_true", help="small sizes and few samples (tests, trying)"
    )
    parser.add_argument(
        "--only",
        help=f"comma-separated sections to run, of {','.join(harness.SECTIONS)} (default all)",
    )
    parser.add_argument("--hosts", help="offers inventory sizes, e.g. 2000,20000,100000")
    parser.add_argument("--locations", type=int, help="locations the hosts span (40)")
    parser.add_argument("--poll-nodes", help="polled clusters' sizes, e.g. 8,64")
    parser.add_argument("--requests", type=int, help="timed requests per kind (300)")
    parser.add_argument(
        "--load-requests", type=int, help="requests per target and round under gunicorn"
    )
    parser.add_argument("--load-rounds", type=int, help="rounds of the load run (3)")
    parser.add_argument("--load-connections", type=int, help="the load generator's connections (8)")
    parser.add_argument("--tick-clusters", help="ready clusters for the tick, e.g. 2000,20000")
    parser.add_argument("--meter-machines", help="running machines, e.g. 1000,10000,50000")
    parser.add_argument("--meter-runs", type=int, help="timed meter runs per size (10)")
    parser.add_argument("--billing-clusters", help="Billing page sizes, e.g. 100,1000,5000")
    parser.add_argument("--ledger-lines", help="ledger sizes, e.g. 20000,1000000")
    parser.add_argument(
        "--provisioning", help="clusters x nodes to provision, e.g. 100x8 (the default)"
    )
    parser.add_argument(
        "--profile", action="store_true", help="also profile the offers API (cProfile)"
    )
    return parser


def parse_sizes(argv: Sequence[str]) -> Sizes:
    """The sizes `argv` asks for; UsageError when the bench cannot build them."""
    return sizes_from_options(vars(build_parser().parse_args(argv)))


def sizes_from_options(options: dict) -> Sizes:
    from bench import harness

    lists = {
        "offers_hosts": options["hosts"],
        "poll_nodes": options["poll_nodes"],
        "tick_clusters": options["tick_clusters"],
        "meter_machines": options["meter_machines"],
        "billing_clusters": options["billing_clusters"],
        "ledger_lines": options["ledger_lines"],
    }
    provisioning = None
    if options["provisioning"]:
        clusters, _, nodes = options["provisioning"].partition("x")
        if not (clusters.isdigit() and nodes.isdigit()) or not int(clusters) or not int(nodes):
            raise UsageError(f"--provisioning is CLUSTERSxNODES, e.g. 100x8, not {clusters}")
        provisioning = (int(clusters), int(nodes))
    sections = None
    if options["only"]:
        sections = tuple(part.strip() for part in options["only"].split(",") if part.strip())
        unknown = set(sections) - set(harness.SECTIONS)
        if unknown:
            raise UsageError(
                f"--only: no section {', '.join(sorted(unknown))}; "
                f"the sections are {', '.join(harness.SECTIONS)}"
            )
    sizes = harness.sizes_from(
        quick=options["quick"],
        **{name: _sizes(raw) if raw else None for name, raw in lists.items()},
        locations=options["locations"],
        requests=options["requests"],
        load_requests=options["load_requests"],
        load_rounds=options["load_rounds"],
        load_connections=options["load_connections"],
        meter_runs=options["meter_runs"],
        provisioning=provisioning,
        sections=sections,
    )
    per_location = harness.TYPES_PER_LOCATION
    if sizes.locations < 1 or min(sizes.offers_hosts) < max(100, sizes.locations * per_location):
        raise UsageError(
            "--hosts must be at least 100 and leave every machine type of every location "
            f"a host ({per_location} types per location); --locations at least 1. Got "
            f"--hosts {','.join(map(str, sizes.offers_hosts))} --locations {sizes.locations}."
        )
    if sizes.requests < 10:
        raise UsageError(f"--requests must be at least 10, not {sizes.requests}.")
    if max(sizes.poll_nodes) > 64:
        raise UsageError("--poll-nodes: a cluster has at most 64 nodes.")
    for name in ("load_requests", "load_rounds", "load_connections", "meter_runs"):
        if getattr(sizes, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1.")
    return sizes


def _sizes(raw: str) -> tuple[int, ...]:
    try:
        values = tuple(int(part.replace("_", "")) for part in str(raw).split(",") if part.strip())
    except ValueError:
        raise UsageError(f"Not a list of numbers: {raw!r} (e.g. 2000,20000)") from None
    if not values or values != tuple(sorted(set(values))):
        raise UsageError(f"Give sizes in increasing order, each once: {raw!r}")
    return values


if __name__ == "__main__":
    sys.exit(main())
