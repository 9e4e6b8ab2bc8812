"""The ledger: a project's balance is the sum of its lines, and nothing else (SPEC §4).

Lines are only ever added. Staff credit (or debit) an account with `credit`, from
`manage.py credit` or the admin; usage charges come from the meter (billing/meter.py).
"""

from decimal import Decimal

from accounts.models import Project, User
from billing.models import LedgerEntry, balance_of
from runcrate.errors import Refused
from runcrate.money import TOO_LARGE, TOO_PRECISE, TOO_SMALL, NotAnAmount, read_amount

# One ledger line moves less than a trillion USD either way (12 digits before the point).
MAX_LINE = Decimal("999999999999.99")


class InvalidAmount(Refused, ValueError):
    """An amount the ledger cannot take, with a sentence saying why."""

    def __init__(self, message: str) -> None:
        super().__init__("invalid_amount", message, field="amount")


def balance(*, project: Project) -> Decimal:
    return balance_of(project.pk)


def has_credit(*, project: Project) -> bool:
    """Whether credit was ever added to the project (a top-up, or a staff credit), in one query."""
    credits = (LedgerEntry.Kind.TOPUP, LedgerEntry.Kind.ADJUSTMENT)
    return LedgerEntry.objects.filter(project=project, kind__in=credits, amount__gt=0).exists()


def parse_amount(raw: str | Decimal | int) -> Decimal:
    """A USD amount with at most 2 decimals, not zero; raises InvalidAmount otherwise."""
    try:
        amount = read_amount(raw, minimum=-MAX_LINE, maximum=MAX_LINE)
    except NotAnAmount as error:
        if error.reason == TOO_PRECISE:
            raise InvalidAmount(
                f"{raw} has more than 2 decimals; amounts are in whole cents."
            ) from None
        if error.reason in (TOO_SMALL, TOO_LARGE):
            raise InvalidAmount(f"{raw} is too large for one ledger line.") from None
        raise InvalidAmount(
            f"{raw!r} is not an amount in USD (for example 250 or 12.50)."
        ) from None
    if amount == 0:
        raise InvalidAmount("The amount is zero; a ledger line must move money.")
    return amount


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
