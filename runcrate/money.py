"""Amounts as the product reads them: one parser behind every form, API call, command, setting
and file that takes an amount of money (top-ups, budgets, staff credits, key limits, prices).

Each caller judges the sign and its own range, and words the refusal for its own place; what
no amount may be (no number, NaN, Infinity, too precise, too large) is judged here, once.
"""

from decimal import Decimal, InvalidOperation, localcontext

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
