# Each project's balance becomes a running total on the project (billing/balances.py): it
# starts as the sum of the ledger lines written so far.

from decimal import Decimal

from django.db import migrations
from django.db.models import Sum


def fill_balances(apps, schema_editor):
    Project = apps.get_model("accounts", "Project")
    LedgerEntry = apps.get_model("billing", "LedgerEntry")
    totals = LedgerEntry.objects.values("project_id").annotate(total=Sum("amount"))
    for row in totals.values_list("project_id", "total"):
        # SQLite sums decimals as floats; the lines are whole cents.
        Project.objects.filter(pk=row[0]).update(balance=row[1].quantize(Decimal("0.01")))


class Migration(migrations.Migration):
    dependencies = [
        ("accounts", "0003_project_balance"),
        ("billing", "0007_topup_line_per_payment"),
    ]

    operations = [migrations.RunPython(fill_balances, migrations.RunPython.noop)]
