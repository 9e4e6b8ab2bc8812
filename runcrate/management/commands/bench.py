from django.core.management.base import BaseCommand, CommandError

from runcrate import bench


def _sizes(raw: str) -> tuple[int, ...]:
    try:
        values = tuple(int(part.replace("_", "")) for part in str(raw).split(",") if part.strip())
    except ValueError:
        raise CommandError(f"Not a list of numbers: {raw!r} (e.g. 2000,20000)") from None
    if not values or values != tuple(sorted(set(values))):
        raise CommandError(f"Give sizes in increasing order, each once: {raw!r}")
    return values


class Command(BaseCommand):
    help = (
        "Measure the poll, the offers API, the tick, the meter, the Billing page, the ledger "
        "and provisioning, each beside its own baseline, and the poll and the API under "
        "gunicorn with a load generator, on a throwaway database (your own data is not "
        "touched). See docs/benchmarks.md."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--quick", action="store_true", help="small sizes and few samples (tests, trying)"
        )
        parser.add_argument(
            "--only",
            help=f"comma-separated sections to run, of {','.join(bench.SECTIONS)} (default all)",
        )
        parser.add_argument("--hosts", help="offers inventory sizes, e.g. 2000,20000,100000")
        parser.add_argument("--locations", type=int, help="locations the hosts span (40)")
        parser.add_argument("--poll-nodes", help="polled clusters' sizes, e.g. 8,64")
        parser.add_argument("--requests", type=int, help="timed requests per kind (300)")
        parser.add_argument(
            "--load-requests", type=int, help="requests per target and round under gunicorn"
        )
        parser.add_argument("--load-rounds", type=int, help="rounds of the load run (3)")
        parser.add_argument(
            "--load-connections", type=int, help="the load generator's connections (8)"
        )
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

    def handle(self, *args, **options):
        sizes = self._sizes(options)

        def progress(message: str) -> None:
            self.stderr.write(message)

        def emit(text: str) -> None:
            self.stdout.write(text)
            self.stdout.flush()

        succeeded = bench.run(sizes=sizes, profile=options["profile"], emit=emit, progress=progress)
        if not succeeded:
            raise CommandError("A benchmark failed: see its line above.")

    def _sizes(self, options: dict) -> bench.Sizes:
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
                raise CommandError(f"--provisioning is CLUSTERSxNODES, e.g. 100x8, not {clusters}")
            provisioning = (int(clusters), int(nodes))
        sections = None
        if options["only"]:
            sections = tuple(part.strip() for part in options["only"].split(",") if part.strip())
            unknown = set(sections) - set(bench.SECTIONS)
            if unknown:
                raise CommandError(
                    f"--only: no section {', '.join(sorted(unknown))}; "
                    f"the sections are {', '.join(bench.SECTIONS)}"
                )
        sizes = bench.sizes_from(
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
        per_location = bench.TYPES_PER_LOCATION
        if sizes.locations < 1 or min(sizes.offers_hosts) < max(
            100, sizes.locations * per_location
        ):
            raise CommandError(
                "--hosts must be at least 100 and leave every machine type of every location "
                f"a host ({per_location} types per location); --locations at least 1. Got "
                f"--hosts {','.join(map(str, sizes.offers_hosts))} --locations {sizes.locations}."
            )
        if sizes.requests < 10:
            raise CommandError(f"--requests must be at least 10, not {sizes.requests}.")
        if max(sizes.poll_nodes) > 64:
            raise CommandError("--poll-nodes: a cluster has at most 64 nodes.")
        for name in ("load_requests", "load_rounds", "load_connections", "meter_runs"):
            if getattr(sizes, name) < 1:
                raise CommandError(f"--{name.replace('_', '-')} must be at least 1.")
        return sizes
