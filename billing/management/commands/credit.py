from django.core.management.base import BaseCommand, CommandError

from accounts.models import User
from accounts.projects import project_for
from billing import ledger
from runcrate.money import usd


class Command(BaseCommand):
    help = (
        "Credit the project of the user with this email by AMOUNT USD (a staff adjustment on "
        "the ledger). A negative amount debits it."
    )

    def add_arguments(self, parser):
        parser.add_argument("email", help="the email of a user of the project")
        parser.add_argument("amount", help="USD with at most 2 decimals, e.g. 250 or -12.50")
        parser.add_argument("--note", default="", help="why, shown on the ledger line")

    def handle(self, *args, email: str, amount: str, note: str, **options):
        try:
            value = ledger.parse_amount(amount)
        except ledger.InvalidAmount as error:
            raise CommandError(str(error)) from None
        user = User.objects.filter(email__iexact=email.strip()).first()
        if user is None:
            raise CommandError(f"No user has the email {email!r}; nothing was credited.")
        project = project_for(user)
        if project is None:
            raise CommandError(f"{user.email} belongs to no project; nothing was credited.")
        entry = ledger.credit(project=project, amount=value, note=note)
        verb = "Credited" if value > 0 else "Debited"
        self.stdout.write(
            f"{verb} {usd(abs(entry.amount))} {'to' if value > 0 else 'from'} "
            f"{project.name} ({user.email}). Balance: {usd(ledger.balance(project=project))}."
        )
