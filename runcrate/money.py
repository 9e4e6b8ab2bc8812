"""Amounts as the product reads and writes them: one parser behind every form, API call,
command, setting and file that takes an amount of money (top-ups, budgets, staff credits, key
limits, prices), and the formatters behind every amount it prints.

Each caller judges the sign and its own range, and words the refusal for its own place; what
no amount may be (no number, NaN, Infinity, too precise, too large) is judged here, once.
"""

from decimal import ROUND_HALF_UP, Decimal, InvalidOperation, localcontext
from typing import overload

NOT_A_NUMBER = "not_a_number"
TOO_PRECISE = "too_precise"
TOO_SMALL = "too_small"
TOO_LARGE = "too_large"


class NotAnAmount(ValueError):
    """`reason` is NOT_A_NUMBER, TOO_SMALL, TOO_LARGE or TOO_PRECISE; the caller turns it into
    its own refusal."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def read_amount(raw: object, *, minimum: Decimal, maximum: Decimal, places: int = 2) -> Decimal:
    """`raw` (text, an int or a Decimal) as a decimal from `minimum` to `maximum` with at most
    `places` decimals, quantized to `places`. Raises NotAnAmount.

    The range is judged before the places, and without arithmetic: Decimal reads "1e30" and
    "9e999999999" happily, but quantizing 1e30 to cents needs 33 digits, more than decimal's
    context holds, and even abs() of the other overflows (both were 500s)."""
    if isinstance(raw, bool) or not isinstance(raw, str | int | float | Decimal):
        raise NotAnAmount(NOT_A_NUMBER)
    try:
        amount = Decimal(raw if isinstance(raw, Decimal | int) else str(raw).strip())
    except (InvalidOperation, ValueError):
        raise NotAnAmount(NOT_A_NUMBER) from None
    if not amount.is_finite():
        raise NotAnAmount(NOT_A_NUMBER)
    if amount < minimum:
        raise NotAnAmount(TOO_SMALL)
    if amount > maximum:
        raise NotAnAmount(TOO_LARGE)
    step = Decimal(1).scaleb(-places)
    with localcontext() as context:
        digits = max(minimum.copy_abs(), maximum.copy_abs()).adjusted() + 1 + places
        context.prec = max(context.prec, digits + 1)
        exact = amount.quantize(step)
    if exact != amount:
        raise NotAnAmount(TOO_PRECISE)
    return exact


# ---- formatting --------------------------------------------------------------------------------
# Every amount a person reads (pages, emails, CSV notes, charts, admin, refusals) goes through
# these, so $1,234.50 reads the same everywhere (docs/billing.md, "How amounts are written").
# The API and the CSV's number columns carry `plain` decimal strings instead: data, not prose.

MINUS = "\u2212"  # a real minus sign: −$12.34, not -$12.34
CENT = Decimal("0.01")
NONE = "—"
# A price per unit (a GB-month) may have up to 4 decimals (offers.models.Location).
RATE_PLACES = 4

Amount = Decimal | int | float | str | None


def _decimal(value: Decimal | int | float | str) -> Decimal:
    # A float goes through its shortest repr, so 0.1 is 0.1, not 0.1000000000000000055…
    return value if isinstance(value, Decimal) else Decimal(str(value))


def _cents(value: Decimal | int | float | str) -> Decimal:
    return _decimal(value).quantize(CENT, ROUND_HALF_UP)


def usd(value: Amount) -> str:
    """`$1,234.50`; `−$12.34` below zero; `—` for no amount. Rounded half up to the cent, as
    the meter rounds (billing/meter.py)."""
    if value is None:
        return NONE
    amount = _cents(value)
    sign = MINUS if amount < 0 else ""
    return f"{sign}${abs(amount):,.2f}"


def signed_usd(value: Amount) -> str:
    """A ledger amount with its sign: `+$500.00` for a credit, `−$12.34` for a debit."""
    if value is None:
        return NONE
    amount = _cents(value)
    return ("+" if amount > 0 else "") + usd(amount)


def usd_per_hour(value: Amount) -> str:
    """A price or a burn rate: `$12.50/h`."""
    return NONE if value is None else f"{usd(value)}/h"


def usd_rate(value: Amount) -> str:
    """A price per unit that may be finer than a cent (a GB-month at $0.0125): 2 decimals, or
    up to 4 where the price has them. `$0.07`, `$0.0125`."""
    if value is None:
        return NONE
    amount = _decimal(value).quantize(Decimal(1).scaleb(-RATE_PLACES), ROUND_HALF_UP)
    if amount == amount.quantize(CENT):
        return usd(amount)
    sign = MINUS if amount < 0 else ""
    return f"{sign}${abs(amount).normalize():,f}"


def usd_compact(value: Amount) -> str:
    """A chart axis label: `$0`, `$50`, `$2.50`, `$2.5k`, `$12k`."""
    if value is None:
        return NONE
    amount = _decimal(value)
    if abs(amount) >= 1000:
        thousands = (amount / 1000).quantize(Decimal("0.1"), ROUND_HALF_UP)
        text = f"{abs(thousands):,f}".removesuffix(".0")
        return f"{MINUS if amount < 0 else ''}${text}k"
    if amount == amount.to_integral_value():
        return f"{MINUS if amount < 0 else ''}${abs(amount):,.0f}"
    return usd(amount)


@overload
def plain(value: Decimal | int | float | str) -> str: ...
@overload
def plain(value: None) -> None: ...
@overload
def plain(value: Amount) -> str | None: ...
def plain(value: Amount) -> str | None:
    """An amount as data: `1234.50`, `-12.34` (the API's money strings, the CSV's columns)."""
    return None if value is None else f"{_cents(value):.2f}"
