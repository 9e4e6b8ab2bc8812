from decimal import Decimal

from django.conf import settings
from django.db import models
from django.db.models import Sum
from django.utils import timezone


class LedgerEntry(models.Model):
    """One line of a project's append-only ledger. The balance is the sum of the lines."""

    class Kind(models.TextChoices):
        TOPUP = "topup", "Top-up"
        USAGE = "usage", "Usage"
        ADJUSTMENT = "adjustment", "Adjustment"

    project = models.ForeignKey("accounts.Project", on_delete=models.PROTECT, related_name="ledger")
    kind = models.CharField(max_length=12, choices=Kind.choices)
    amount = models.DecimalField(
        max_digits=14, decimal_places=2, help_text="Positive credits, negative debits (USD)."
    )
    note = models.CharField(max_length=255, blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    cluster = models.ForeignKey(
        "clusters.Cluster", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )

    class Meta:
        ordering = ["-created_at", "-pk"]
        verbose_name_plural = "ledger entries"
        indexes = [models.Index(fields=["project", "created_at"], name="ledger_project_at")]

    def __str__(self) -> str:
        return f"{self.get_kind_display()} {self.amount} USD"


def balance_of(project_id: int) -> Decimal:
    total = LedgerEntry.objects.filter(project_id=project_id).aggregate(total=Sum("amount"))
    return total["total"] or Decimal("0.00")


class UsageRecord(models.Model):
    """A machine's billed time: from its cluster's (or the worker's) start to its end."""

    project = models.ForeignKey("accounts.Project", on_delete=models.PROTECT, related_name="usage")
    cluster = models.ForeignKey("clusters.Cluster", on_delete=models.PROTECT, related_name="usage")
    node = models.OneToOneField("clusters.Node", on_delete=models.PROTECT, related_name="usage")
    price_per_hour = models.DecimalField(max_digits=10, decimal_places=2)
    started_at = models.DateTimeField()
    ended_at = models.DateTimeField(null=True, blank=True)
    charged_until = models.DateTimeField(help_text="The meter has charged this record up to here.")
    charged_amount = models.DecimalField(max_digits=14, decimal_places=2, default=Decimal("0"))

    class Meta:
        ordering = ["cluster", "node__index"]
        indexes = [
            models.Index(fields=["ended_at"], name="usage_running"),
            models.Index(fields=["project", "started_at"], name="usage_project_start"),
        ]

    def __str__(self) -> str:
        return f"{self.node} from {self.started_at:%Y-%m-%d %H:%M}"
