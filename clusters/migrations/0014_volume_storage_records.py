"""A volume's storage is metered by billing (billing.StorageRecord, billing 0010): each volume
gets its record, with what the volume's own columns said (its charged point and amount, its
creation and deletion as the record's start and end), and those columns go.

Reversible: going back adds the columns again and fills them from the records (before billing
0010 drops them), so no charge is lost either way."""

from django.db import migrations, models


def to_storage_records(apps, schema_editor):
    Volume = apps.get_model("clusters", "Volume")
    StorageRecord = apps.get_model("billing", "StorageRecord")
    have = set(StorageRecord.objects.values_list("volume_id", flat=True))
    StorageRecord.objects.bulk_create(
        [
            StorageRecord(
                project_id=volume.project_id,
                volume_id=volume.pk,
                size_gb=volume.size_gb,
                price_per_gb_month=volume.price_per_gb_month,
                started_at=volume.created_at,
                ended_at=volume.deleted_at,
                charged_until=volume.charged_until,
                charged_amount=volume.charged_amount,
            )
            for volume in Volume.objects.exclude(pk__in=have).iterator()
        ],
        batch_size=1000,
    )


def from_storage_records(apps, schema_editor):
    Volume = apps.get_model("clusters", "Volume")
    StorageRecord = apps.get_model("billing", "StorageRecord")
    for record in StorageRecord.objects.iterator():
        Volume.objects.filter(pk=record.volume_id).update(
            charged_until=record.charged_until, charged_amount=record.charged_amount
        )
    # A volume without a record (none after the forward step) was never charged.
    Volume.objects.filter(charged_until__isnull=True).update(charged_until=models.F("created_at"))


class Migration(migrations.Migration):
    dependencies = [
        ("billing", "0010_storage_records"),
        ("clusters", "0013_node_health"),
    ]

    operations = [
        # Nullable first, so that going back can add the column before the records fill it.
        migrations.AlterField(
            model_name="volume",
            name="charged_until",
            field=models.DateTimeField(null=True),
        ),
        migrations.RunPython(to_storage_records, from_storage_records),
        migrations.RemoveField(model_name="volume", name="charged_until"),
        migrations.RemoveField(model_name="volume", name="charged_amount"),
    ]
