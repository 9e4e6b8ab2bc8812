# The link between a card top-up and its ledger line moves onto the line, as a one-to-one: the
# database then refuses a second top-up line for one payment, whatever the code above it does.

import django.db.models.deletion
from django.db import migrations, models


def link_lines_to_payments(apps, schema_editor):
    Payment = apps.get_model("billing", "Payment")
    LedgerEntry = apps.get_model("billing", "LedgerEntry")
    for payment_id, entry_id in Payment.objects.filter(ledger_entry__isnull=False).values_list(
        "pk", "ledger_entry_id"
    ):
        LedgerEntry.objects.filter(pk=entry_id).update(payment_id=payment_id)


def link_payments_to_lines(apps, schema_editor):
    Payment = apps.get_model("billing", "Payment")
    LedgerEntry = apps.get_model("billing", "LedgerEntry")
    for entry_id, payment_id in LedgerEntry.objects.filter(payment__isnull=False).values_list(
        "pk", "payment_id"
    ):
        Payment.objects.filter(pk=payment_id).update(ledger_entry_id=entry_id)


class Migration(migrations.Migration):
    dependencies = [
        ("billing", "0006_volume_storage"),
    ]

    operations = [
        # Without a reverse accessor while the old field (named like it) still exists.
        migrations.AddField(
            model_name="ledgerentry",
            name="payment",
            field=models.OneToOneField(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="+",
                to="billing.payment",
            ),
        ),
        migrations.RunPython(link_lines_to_payments, link_payments_to_lines),
        migrations.RemoveField(model_name="payment", name="ledger_entry"),
        migrations.AlterField(
            model_name="ledgerentry",
            name="payment",
            field=models.OneToOneField(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="ledger_entry",
                to="billing.payment",
            ),
        ),
        migrations.AddConstraint(
            model_name="ledgerentry",
            constraint=models.CheckConstraint(
                condition=models.Q(("payment__isnull", True), ("kind", "topup"), _connector="OR"),
                name="ledger_payment_only_on_topups",
            ),
        ),
    ]
