from django.conf import settings
from django.core.management.base import BaseCommand
from django.db import transaction

from accounts.models import User
from accounts.projects import create_project
from billing import ledger
from clusters.demo_history import seed_demo_history
from offers.inventory import DEMO_INVENTORY, load_inventory_file
from offers.models import GpuModel

DEMO_EMAIL = "demo@runcrate.localhost"
DEMO_PASSWORD = "demo-gpus-2026"
DEMO_PROJECT = "Demo project"
DEMO_CREDIT = "500.00"  # USD on the demo project's ledger, so it can create clusters


class Command(BaseCommand):
    help = (
        "Into an empty database only (no GPU models, no users), and only with DEBUG on: load the "
        f"demo inventory ({DEMO_INVENTORY.name}) and create the demo user. Anything else is "
        "left alone."
    )

    def handle(self, *args, **options):
        if not settings.DEBUG:
            # Its password is in the README: never an account on a deployment.
            self.stdout.write(
                "DEBUG is off: seed_demo made no demo account and loaded nothing (its password "
                "is published). Load your inventory with manage.py load_inventory FILE."
            )
            return
        if GpuModel.objects.exists() or User.objects.exists():
            self.stdout.write("The database already has data: seed_demo left it alone.")
            return
        with transaction.atomic():
            report = load_inventory_file(DEMO_INVENTORY)
            user = User.objects.create_user(DEMO_EMAIL, DEMO_PASSWORD, name="Demo user")
            project = create_project(owner=user, name=DEMO_PROJECT)
            ledger.credit(project=project, amount=DEMO_CREDIT, note="Demo credit")
            history = seed_demo_history()
        self.stdout.write(str(report))
        self.stdout.write(
            f"A made-up month of {history} ended clusters (project 'Demo history', no members) "
            "gives the offers their track record."
        )
        self.stdout.write(f"Demo login: {DEMO_EMAIL} / {DEMO_PASSWORD}")
        self.stdout.write("A staff account for /admin/: manage.py createsuperuser")
