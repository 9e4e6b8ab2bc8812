from decimal import Decimal

from django.conf import settings
from django.db import models, transaction
from django.db.models import F, Q
from django.utils import timezone

from accounts.models import Project
from runcrate.money import signed_usd, usd


class LedgerEntry(models.Model):
    """One line of a project's append-only ledger. The balance is the sum of the lines, kept as
    a running total on the project (billing/balances.py)."""

    class Kind(models.TextChoices):
        TOPUP = "topup", "Top-up"
        USAGE = "usage", "Usage"
        ADJUSTMENT = "adjustment", "Adjustment"
        STORAGE = "storage", "Volume storage"

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
    # Usage lines only (billing/meter.py): one line per cluster per clock hour (UTC), which the
    # meter adds to while that hour runs; docs/billing.md.
    period_start = models.DateTimeField(
        null=True, blank=True, help_text="Usage: the start of the clock hour (UTC) it charges."
    )
    machine_seconds = models.PositiveBigIntegerField(
        default=0, help_text="Usage: the machine-seconds this line charges."
    )
    # Storage lines only (billing/meter.py `charge_storage`): one line per volume per day (UTC),
    # `period_start` its midnight, `machine_seconds` the volume-seconds it charges.
    volume = models.ForeignKey(
        "clusters.Volume", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    # Card top-ups only (billing/payments.py): the payment this line credits. One-to-one, so the
    # database itself keeps a payment from being credited twice.
    payment = models.OneToOneField(
        "billing.Payment",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="ledger_entry",
    )

    class Meta:
        ordering = ["-created_at", "-pk"]
        verbose_name_plural = "ledger entries"
        indexes = [
            models.Index(fields=["project", "created_at"], name="ledger_project_at"),
            models.Index(fields=["project", "period_start"], name="ledger_project_period"),
            # A month's top-ups and adjustments, among hundreds of thousands of usage lines.
            models.Index(fields=["project", "kind", "created_at"], name="ledger_project_kind_at"),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["cluster", "period_start"],
                condition=Q(kind="usage"),
                name="ledger_usage_one_per_cluster_hour",
            ),
            models.UniqueConstraint(
                fields=["volume", "period_start"],
                condition=Q(kind="storage"),
                name="ledger_storage_one_per_volume_day",
            ),
            models.CheckConstraint(
                condition=Q(payment__isnull=True) | Q(kind="topup"),
                name="ledger_payment_only_on_topups",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.get_kind_display()} {signed_usd(self.amount)}"

    def save(self, *args, **kwargs) -> None:
        """A new line moves its project's running balance by its amount, in one transaction
        (billing/balances.py). Lines are only added: a saved line's amount never changes here;
        the meter adds to usage lines with its own set-based writes, which move the balance
        the same way."""
        if not self._state.adding:
            super().save(*args, **kwargs)
            return
        with transaction.atomic():
            super().save(*args, **kwargs)
            if self.amount:
                Project.objects.filter(pk=self.project_id).update(
                    balance=F("balance") + self.amount
                )


def balance_of(project_id: "int | models.Model") -> Decimal:
    """The project's (or the project id's) running balance: one row, however long its ledger."""
    pk = project_id.pk if isinstance(project_id, models.Model) else project_id
    found = Project.objects.filter(pk=pk).values_list("balance", flat=True).first()
    return found if found is not None else Decimal("0.00")


class UsageRecord(models.Model):
    """A machine's billed time: from its cluster's (or the worker's) start to its end."""

    project = models.ForeignKey("accounts.Project", on_delete=models.PROTECT, related_name="usage")
    cluster = models.ForeignKey("clusters.Cluster", on_delete=models.PROTECT, related_name="usage")
    node = models.OneToOneField("clusters.Node", on_delete=models.PROTECT, related_name="usage")
    price_per_hour = models.DecimalField(max_digits=10, decimal_places=2)
    started_at = models.DateTimeField()
    ended_at = models.DateTimeField(null=True, blank=True)
    # Written when the meter first charges the machine, when it crosses a clock hour and when
    # it ends, not every minute: it is charged at least up to here, and up to its cluster's
    # MeterMark (or its end) once charged at all (billing/meter.py `charged_until`).
    charged_until = models.DateTimeField(help_text="The meter has charged this record up to here.")
    charged_amount = models.DecimalField(max_digits=14, decimal_places=2, default=Decimal("0"))

    class Meta:
        ordering = ["cluster", "node__index"]
        indexes = [
            models.Index(fields=["ended_at"], name="usage_running"),
            models.Index(fields=["project", "started_at"], name="usage_project_start"),
            # The burn rate of every page's top bar: what runs summed from the index alone.
            models.Index(
                fields=["project", "price_per_hour"],
                condition=models.Q(ended_at__isnull=True),
                name="usage_running_price",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.node} from {self.started_at:%Y-%m-%d %H:%M}"


class StorageRecord(models.Model):
    """A volume's billed storage: its size at its price per GB-month, from its creation to its
    deletion (billing/metering.py opens and closes it; billing/meter.py charges it)."""

    project = models.ForeignKey(
        "accounts.Project", on_delete=models.PROTECT, related_name="storage"
    )
    volume = models.OneToOneField(
        "clusters.Volume", on_delete=models.PROTECT, related_name="storage"
    )
    size_gb = models.PositiveIntegerField()
    price_per_gb_month = models.DecimalField(max_digits=8, decimal_places=4)
    started_at = models.DateTimeField()
    ended_at = models.DateTimeField(null=True, blank=True)
    # Written at every charge (volumes are few): the meter has charged it up to here, for this
    # much in all, rounded once over its whole span (billing/meter.py `charge_storage`).
    charged_until = models.DateTimeField(help_text="The meter has charged this record up to here.")
    charged_amount = models.DecimalField(max_digits=14, decimal_places=2, default=Decimal("0"))

    class Meta:
        ordering = ["pk"]
        indexes = [models.Index(fields=["ended_at"], name="storage_running")]

    def __str__(self) -> str:
        return f"{self.size_gb} GB of volume {self.volume_id} from {self.started_at:%Y-%m-%d %H:%M}"


class MeterMark(models.Model):
    """The meter's mark on one cluster: every machine of it is charged up to `charged_until`
    (one that ended, up to its end if that came first), so a running machine's own row need
    not be written every minute (billing/meter.py). It is also the row the meter locks while
    it charges the cluster: two meters, or a meter and a terminate, never charge it at once."""

    cluster = models.OneToOneField(
        "clusters.Cluster", on_delete=models.CASCADE, related_name="+", primary_key=True
    )
    charged_until = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.cluster_id} charged until {self.charged_until}"


class Payment(models.Model):
    """A card top-up through Stripe Checkout (billing/payments.py).

    The row, with its Idempotency-Key, is stored before Stripe is called, so a retry reuses
    the key; the balance is credited only by the verified webhook, once: its ledger line is
    unique per payment (`credited_at` records when).
    """

    class Status(models.TextChoices):
        CREATED = "created", "Created"  # stored; Stripe not (yet) answered
        OPEN = "open", "Awaiting payment"  # the Checkout Session exists
        PROCESSING = "processing", "Processing"  # completed, the payment not settled yet
        PAID = "paid", "Paid"  # credited to the balance
        FAILED = "failed", "Failed"
        EXPIRED = "expired", "Expired"

    FINAL = {Status.PAID, Status.FAILED, Status.EXPIRED}

    project = models.ForeignKey(
        "accounts.Project", on_delete=models.PROTECT, related_name="payments"
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    amount = models.DecimalField(max_digits=12, decimal_places=2, help_text="USD asked for.")
    status = models.CharField(max_length=12, choices=Status.choices, default=Status.CREATED)
    idempotency_key = models.CharField(max_length=64, unique=True)
    stripe_session_id = models.CharField(max_length=255, null=True, blank=True, unique=True)
    checkout_url = models.TextField(blank=True, default="")
    amount_paid = models.DecimalField(
        max_digits=12, decimal_places=2, null=True, blank=True, help_text="USD Stripe collected."
    )
    last_error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)
    credited_at = models.DateTimeField(null=True, blank=True)
    # Its top-up line, once credited: `ledger_entry` (LedgerEntry.payment, unique).

    class Meta:
        ordering = ["-created_at", "-pk"]

    def __str__(self) -> str:
        return f"{usd(self.amount)} ({self.get_status_display()})"


class Notice(models.Model):
    """A billing email that was sent, so each is sent once (billing/limits.py)."""

    class Kind(models.TextChoices):
        LOW_BALANCE = "low_balance", "Low balance"
        BUDGET_WARNING = "budget_warning", "80% of a budget"
        INVOICE = "invoice", "Invoice ready"

    project = models.ForeignKey("accounts.Project", on_delete=models.CASCADE, related_name="+")
    environment = models.ForeignKey(
        "accounts.Environment", null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    kind = models.CharField(max_length=16, choices=Kind.choices)
    key = models.CharField(max_length=100, help_text="What this notice is about, e.g. a month.")
    sent_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-sent_at", "-pk"]
        constraints = [
            models.UniqueConstraint(fields=["project", "kind", "key"], name="notice_once")
        ]

    def __str__(self) -> str:
        return f"{self.get_kind_display()} ({self.key})"


class UsageDay(models.Model):
    """One cluster's usage on one day (UTC): the sum of its hourly usage lines that day.

    What the Billing page, the chart and budgets read, so that a month of a thousand clusters
    is some thousands of rows rather than 720,000 hourly lines. The meter writes it in the
    transaction that writes the lines, so the ledger explains every row (billing/meter.py).
    """

    project = models.ForeignKey("accounts.Project", on_delete=models.CASCADE, related_name="+")
    cluster = models.ForeignKey("clusters.Cluster", on_delete=models.CASCADE, related_name="+")
    day = models.DateField()
    amount = models.DecimalField(
        max_digits=14, decimal_places=2, help_text="Signed like the ledger: negative."
    )
    machine_seconds = models.PositiveBigIntegerField(default=0)
    last_hour = models.DateTimeField(help_text="The latest hour charged this day.")

    class Meta:
        ordering = ["day", "cluster"]
        constraints = [
            models.UniqueConstraint(fields=["cluster", "day"], name="usage_day_one_per_cluster")
        ]
        # The statement's order (billing/usage.py `_cluster_lines`): a page reads a page.
        indexes = [models.Index(fields=["project", "day", "id"], name="usage_day_project")]

    def __str__(self) -> str:
        return f"{self.cluster_id} on {self.day}: {self.amount}"


class BillingDetails(models.Model):
    """Who the project's invoices are made out to, as its owner or a manager entered them on
    the invoices page (billing/invoices.py); a project without them gets invoices made out to
    its name alone."""

    project = models.OneToOneField(
        "accounts.Project", on_delete=models.CASCADE, related_name="billing_details"
    )
    company_name = models.CharField(max_length=200)
    address = models.TextField(max_length=1000)
    tax_id = models.CharField(
        "VAT or tax ID",
        max_length=40,
        blank=True,
        default="",
        help_text="Printed on every invoice, in capitals.",
    )
    invoice_email = models.EmailField(
        "Email for invoices",
        blank=True,
        default="",
        help_text="Where the monthly invoice email goes; empty: the owners and managers.",
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name_plural = "billing details"

    def __str__(self) -> str:
        return self.company_name
