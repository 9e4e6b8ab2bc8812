from django.core.management.base import BaseCommand, CommandError

from runcrate import bench


class Command(BaseCommand):
    help = (
        "Measure the offers API, the cluster status fragment and provisioning against a bare "
        "Django view, on a throwaway database (your own data is not touched). See "
        "docs/benchmarks.md."
    )

    def add_arguments(self, parser):
        parser.add_argument("--hosts", type=int, default=20_000, help="hosts in the inventory")
        parser.add_argument("--locations", type=int, default=40, help="locations they span")
        parser.add_argument(
            "--requests", type=int, default=200, help="timed requests per measured path"
        )
        parser.add_argument(
            "--profile", action="store_true", help="also profile the offers API (cProfile)"
        )

    def handle(self, *args, hosts, locations, requests, profile, **options):
        if hosts < 100 or locations < 1 or hosts < locations * bench.TYPES_PER_LOCATION:
            raise CommandError(
                "--hosts must be at least 100 and leave every machine type of every location "
                f"a host ({bench.TYPES_PER_LOCATION} types per location); "
                f"--locations at least 1. Got --hosts {hosts} --locations {locations}."
            )
        if requests < 10:
            raise CommandError(f"--requests must be at least 10, not {requests}.")

        def progress(message: str) -> None:
            self.stderr.write(message)

        def emit(text: str) -> None:
            self.stdout.write(text)
            self.stdout.flush()

        succeeded = bench.run(
            hosts=hosts,
            locations=locations,
            requests=requests,
            profile=profile,
            emit=emit,
            progress=progress,
        )
        if not succeeded:
            raise CommandError("A benchmark failed: see its line above.")
