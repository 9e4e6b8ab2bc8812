from django.core.management.base import BaseCommand, CommandError

from clusters.machines.hosts import record_baselines
from offers.models import Host


class Command(BaseCommand):
    help = (
        "Record the baseline of freshly imaged ssh hosts: what every later verification "
        "compares a reimaged host with (docs/inventory.md, 'Reimage before reuse'). Without "
        "names: every free ssh host that has none yet."
    )

    def add_arguments(self, parser):
        parser.add_argument("hosts", nargs="*", metavar="HOST", help="host names")
        parser.add_argument(
            "--again",
            action="store_true",
            help="record it anew for hosts that have one (after an operator changed the image)",
        )

    def handle(self, *args, hosts: list[str], again: bool, **options):
        chosen = Host.objects.filter(driver=Host.Driver.SSH)
        if hosts:
            chosen = chosen.filter(name__in=hosts)
            unknown = sorted(set(hosts) - set(chosen.values_list("name", flat=True)))
            if unknown:
                raise CommandError(f"no ssh host named {', '.join(unknown)} in the inventory")
        else:
            chosen = chosen.filter(state=Host.State.FREE)
        if not again:
            chosen = chosen.filter(baseline_at=None)
        outcome = record_baselines(chosen.values_list("pk", flat=True))
        for name in outcome.done:
            self.stdout.write(f"{name}: baseline recorded")
        for name, why in outcome.refused.items():
            self.stderr.write(f"{name}: not recorded: {why}")
        self.stdout.write(f"{len(outcome.done)} baselines recorded.")
        if outcome.refused:
            raise CommandError(f"{len(outcome.refused)} hosts could not be recorded")
