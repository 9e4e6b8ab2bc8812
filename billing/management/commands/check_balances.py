from django.core.management.base import BaseCommand, CommandError

from billing import balances, meter
from runcrate.money import usd


class Command(BaseCommand):
    help = (
        "Recompute every project's balance from its ledger lines and report each one that "
        "differs from the running total (billing/balances.py), and every machine the ledger "
        "charged past its end or past the database's now (billing/meter.py `charged_past`). "
        "--repair sets the balances to the ledger and refunds what was charged past an end."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--repair",
            action="store_true",
            help="set each differing balance to its ledger's sum; refund charges past an end",
        )

    def handle(self, *args, repair: bool, **options):
        problems = self._balances(repair) + self._usage(repair)
        if problems:
            raise CommandError(" ".join(problems))

    def _balances(self, repair: bool) -> list[str]:
        differences = balances.check()
        for difference in differences:
            self.stdout.write(
                f"project {difference.project_id}: balance {usd(difference.stored)}, "
                f"ledger {usd(difference.ledger)}"
            )
        if not differences:
            self.stdout.write("Every balance is the sum of its ledger.")
            return []
        if repair:
            balances.repair(differences)
            self.stdout.write(f"Repaired {len(differences)} balance(s) from the ledger.")
            return []
        return [f"{len(differences)} balance(s) differ from the ledger."]

    def _usage(self, repair: bool) -> list[str]:
        past = meter.charged_past()
        for charge in past:
            where = (
                f"past its end {charge.ended_at.isoformat()}"
                if charge.past_end and charge.ended_at is not None
                else "past the database's now"
            )
            self.stdout.write(
                f"usage record {charge.record_id} (cluster {charge.cluster_id}, project "
                f"{charge.project_id}): charged until {charge.charged_until.isoformat()}, {where}"
            )
        if not past:
            self.stdout.write("No usage is charged past its end or past now.")
            return []
        if repair:
            # The meter refunds what it charged past an end (billing/meter.py); a charge past
            # now is the meter's fault, which it never makes: that one is for a person.
            refunded = meter.refund_past_end({c.cluster_id for c in past if c.past_end})
            self.stdout.write(f"Refunded {usd(refunded)} charged past the end of machines.")
            past = [charge for charge in past if not charge.past_end]
            if not past:
                return []
        return [f"{len(past)} usage record(s) charged past their end or past now."]
