from django.core.management.base import BaseCommand, CommandError

from offers.inventory import InventoryError, load_inventory_file, waiting_for_baseline


class Command(BaseCommand):
    help = (
        "Create or update GPU models, locations, machine types and hosts from a JSON file "
        "(format: docs/inventory.md). A file with any problem is refused whole."
    )

    def add_arguments(self, parser):
        parser.add_argument("file", help="the inventory JSON file")
        parser.add_argument(
            "--check",
            action="store_true",
            help="check the file and report what would change, without writing anything",
        )

    def handle(self, *args, file: str, check: bool, **options):
        try:
            report = load_inventory_file(file, dry_run=check)
        except InventoryError as error:
            raise CommandError(error.summary(source=file)) from None
        self.stdout.write(str(report))
        if check:
            return
        for name in waiting_for_baseline().order_by("name").values_list("name", flat=True):
            self.stdout.write(
                f"{name}: waiting for a baseline, offered to no one until it is recorded "
                "(manage.py record_baselines, or the host admin's Record baseline)"
            )
