from django.core.management.base import BaseCommand

from clusters.track_record import refresh_track_records


class Command(BaseCommand):
    help = (
        "Recompute every machine type's track record (time to ready, share started, failures "
        "by step, bandwidth) from the last 30 days of cluster events, as the beat does every "
        "five minutes."
    )

    def handle(self, *args, **options):
        written = refresh_track_records()
        self.stdout.write(f"Track records written for {written} machine type(s).")
