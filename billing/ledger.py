"""The ledger: a project's balance is the sum of its lines, and nothing else (SPEC §4).

Lines are only ever added. Staff credit (or debit) an account with `credit`, from
`manage.py credit` or the admin; usage charges come from the meter (billing/meter.py).
"""

from decimal import ROUND_HALF_UP, Decimal

from accounts.models import Project, User
from billing.models import LedgerEntry, balance_of
from runcrate.errors import Refused

CENT = Decimal("0.01")


class InvalidAmount(Refused, ValueError):
    """An amount the ledger cannot take, with a sentence saying why."""

    def __init__(self, message: str) -> None:
        super().__init__("invalid_amount", message, field="amount")


def balance(*, project: Project) -> Decimal:
    return balance_of(project.pk)


def parse_amount(raw: str | Decimal | int) -> Decimal:
    """A USD amount with at most 2 decimals, not zero; raises InvalidAmount otherwise."""
    try:
        amount = Decimal(str(raw).strip())
    except ArithmeticError:
        raise InvalidAmount(
            f"{raw!r} is not an amount in USD (for example 250 or 12.50)."
        ) from None
    if not amount.is_finite():
        raise InvalidAmount(f"{raw!r} is not an amount in USD (for example 250 or 12.50).")
    if amount != amount.quantize(CENT):
        raise InvalidAmount(f"{raw} has more than 2 decimals; amounts are in whole cents.")
    if amount == 0:
        raise InvalidAmount("The amount is zero; a ledger line must move money.")
    if abs(amount) >= Decimal("1e12"):
        raise InvalidAmount(f"{raw} is too large for one ledger line.")
    return amount.quantize(CENT, rounding=ROUND_HALF_UP)


def credit(
    *, project: Project, amount: Decimal | str, note: str = "", user: User | None = None
) -> LedgerEntry:
    """A staff adjustment: a positive amount credits the account, a negative one debits it."""
    value = parse_amount(amount)
    return LedgerEntry.objects.create(
        project=project,
        kind=LedgerEntry.Kind.ADJUSTMENT,
        amount=value,
        note=note.strip()[:255] or ("Credit by staff" if value > 0 else "Debit by staff"),
        created_by=user,
    )
