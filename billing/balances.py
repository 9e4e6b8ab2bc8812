"""The balance: a running total per project, kept beside the ledger that explains it.

Every ledger line moves its project's `balance` (accounts.Project) by its amount, in the
transaction that writes the line: one `UPDATE … SET balance = balance + amount` for a line
(`LedgerEntry.save`), one set-based UPDATE for all the projects a meter run charged. So reading
a balance is one row, however long the ledger grows. The ledger stays the truth: `check`
recomputes every balance from the lines and reports each difference (`manage.py
check_balances`, which can also repair them).
"""

from dataclasses import dataclass
from decimal import Decimal

from django.conf import settings
from django.db import transaction
from django.db.models import F, Sum

from accounts.models import Project
from billing.models import LedgerEntry, balance_of
from runcrate.money import usd
from runcrate.sql import update_from_values

ZERO = Decimal("0.00")
__all__ = [
    "balance_needed",
    "balance_of",
    "balances",
    "check",
    "minimum_balance",
    "move",
    "repair",
    "short_of_balance",
]


def minimum_balance() -> Decimal:
    """The least a balance must hold to create a cluster, however cheap (RUNCRATE_MIN_BALANCE)."""
    return settings.RUNCRATE_MIN_BALANCE


def balance_needed(price_per_hour: Decimal) -> Decimal:
    """What the balance must hold to create, or grow to, a cluster costing `price_per_hour`
    (the whole cluster): one hour of it, never less than `minimum_balance`. The create's
    refusal, the create page's price card and the API's balance answer all read this."""
    return max(minimum_balance(), price_per_hour)


def short_of_balance(*, balance: Decimal, needed: Decimal, doing: str, staff: bool = False) -> str:
    """Why `doing` (a create, a larger cluster) is refused: the balance is below `needed`
    (`balance_needed`). Worded for who reads it: the customer ("Your balance …"), or staff
    acting for the project in the admin ("The project's balance …")."""
    whose = "The project's balance" if staff else "Your balance"
    return (
        f"{whose} is {usd(balance)}; {doing} needs at least {usd(needed)} (one hour of the "
        f"whole cluster; never less than {usd(minimum_balance())})."
    )


def move(deltas: dict[int, Decimal]) -> None:
    """Add each amount to its project's balance; the caller holds the transaction that writes
    the ledger lines. The rows are locked in one order (by pk), so two writers never deadlock."""
    deltas = {project_id: delta for project_id, delta in deltas.items() if delta}
    if not deltas:
        return
    if len(deltas) == 1:
        [(project_id, delta)] = deltas.items()
        Project.objects.filter(pk=project_id).update(balance=F("balance") + delta)
        return
    list(
        Project.objects.select_for_update()
        .filter(pk__in=deltas)
        .order_by("pk")
        .values_list("pk", flat=True)
    )
    update_from_values(
        Project,
        {"balance": "balance + v.c1"},
        ("numeric",),
        sorted(deltas.items()),
    )


def balances(project_ids: set[int]) -> dict[int, Decimal]:
    """Each project's balance: one query."""
    result = dict.fromkeys(project_ids, ZERO)
    result.update(Project.objects.filter(pk__in=project_ids).values_list("pk", "balance"))
    return result


@dataclass(frozen=True)
class Difference:
    project_id: int
    stored: Decimal
    ledger: Decimal


def check(project_ids: set[int] | None = None) -> list[Difference]:
    """Every project whose stored balance is not the sum of its ledger lines (two queries)."""
    projects = Project.objects.all()
    lines = LedgerEntry.objects.all()
    if project_ids is not None:
        projects = projects.filter(pk__in=project_ids)
        lines = lines.filter(project_id__in=project_ids)
    sums = {
        project_id: _cents(total)
        for project_id, total in lines.values("project_id")
        .annotate(total=Sum("amount"))
        .values_list("project_id", "total")
    }
    return [
        Difference(project_id=pk, stored=stored, ledger=sums.get(pk, ZERO))
        for pk, stored in projects.order_by("pk").values_list("pk", "balance")
        if stored != sums.get(pk, ZERO)
    ]


def _cents(total: Decimal | None) -> Decimal:
    # SQLite sums decimals as floats: the ledger's lines are whole cents, so is their sum.
    return (total or ZERO).quantize(ZERO)


def repair(differences: list[Difference]) -> None:
    """Set each balance to what its ledger says, under the row lock, recomputed then."""
    for difference in differences:
        with transaction.atomic():
            Project.objects.select_for_update().filter(pk=difference.project_id).first()
            total = LedgerEntry.objects.filter(project_id=difference.project_id).aggregate(
                total=Sum("amount")
            )["total"]
            Project.objects.filter(pk=difference.project_id).update(balance=_cents(total))
