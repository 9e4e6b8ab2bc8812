"""Money as the Billing pages print it: `$1,234.56`, and signed for ledger lines."""

from decimal import Decimal

from django import template

register = template.Library()

MINUS = "\u2212"


@register.filter
def usd(value: Decimal | int | None) -> str:
    if value is None:
        return "—"
    amount = Decimal(value).quantize(Decimal("0.01"))
    sign = MINUS if amount < 0 else ""
    return f"{sign}${abs(amount):,.2f}"


@register.filter
def signed_usd(value: Decimal | int | None) -> str:
    """A ledger amount with its sign: +$500.00 for a credit, −$12.34 for a debit."""
    if value is None:
        return "—"
    amount = Decimal(value).quantize(Decimal("0.01"))
    return ("+" if amount > 0 else "") + usd(amount)
