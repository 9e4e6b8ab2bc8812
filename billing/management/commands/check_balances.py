from django.core.management.base import BaseCommand, CommandError

from billing import balances
from runcrate.money import usd


class Command(BaseCommand):
    help = (
        "Recompute every project's balance from its ledger lines and report each one that "
        "differs from the running total (billing/balances.py). --repair sets them to the ledger."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--repair", action="store_true", help="set each differing balance to its ledger's sum"
        )

    def handle(self, *args, repair: bool, **options):
        differences = balances.check()
        for difference in differences:
            self.stdout.write(
                f"project {difference.project_id}: balance {usd(difference.stored)}, "
                f"ledger {usd(difference.ledger)}"
            )
        if not differences:
            self.stdout.write("Every balance is the sum of its ledger.")
            return
        if repair:
            balances.repair(differences)
            self.stdout.write(f"Repaired {len(differences)} balance(s) from the ledger.")
            return
        raise CommandError(f"{len(differences)} balance(s) differ from the ledger.")
