from django.core.management.base import BaseCommand, CommandError

from clusters.machines.hosts import record_baselines
from offers.inventory import InventoryError, load_inventory_file, waiting_for_baseline
from offers.models import Host

WAITING = (
    "offered to no one until it is recorded "
    "(manage.py record_baselines, or the host admin's Record baseline)"
)


class Command(BaseCommand):
    help = (
        "Create or update GPU models, locations, machine types and hosts from a JSON file "
        "(format: docs/inventory.md). A file with any problem is refused whole. Then record the "
        "baseline of every free ssh host that has none yet, as freshly imaged; a host that "
        "cannot be read is named with why, and is offered to no one until it is recorded."
    )

    def add_arguments(self, parser):
        parser.add_argument("file", help="the inventory JSON file")
        parser.add_argument(
            "--check",
            action="store_true",
            help="check the file and report what would change, without writing anything",
        )
        parser.add_argument(
            "--no-baselines",
            action="store_true",
            help="load the file only: the new ssh hosts wait for their baselines (record them "
            "later with manage.py record_baselines, once the hosts are imaged)",
        )

    def handle(self, *args, file: str, check: bool, no_baselines: bool, **options):
        try:
            report = load_inventory_file(file, dry_run=check)
        except InventoryError as error:
            raise CommandError(error.summary(source=file)) from None
        self.stdout.write(str(report))
        if check:
            return
        waiting = waiting_for_baseline()
        if not no_baselines:
            # The same hosts `record_baselines` takes without names: free, and none yet. An
            # offline or dirty host is staff's to reimage first (docs/inventory.md).
            outcome = record_baselines(
                waiting.filter(state=Host.State.FREE).values_list("pk", flat=True)
            )
            for name in outcome.done:
                self.stdout.write(f"{name}: baseline recorded")
            for name, why in outcome.refused.items():
                self.stdout.write(f"{name}: no baseline recorded: {why}; {WAITING}")
            waiting = waiting.exclude(name__in=outcome.refused)
        for name in waiting.order_by("name").values_list("name", flat=True):
            self.stdout.write(f"{name}: waiting for a baseline, {WAITING}")
