"""Billing's derived rules, each in one place (docs/billing.md, "The rules in one place"): how
long a balance lasts at a rate (its runway), when a balance is low or runs short, and when a
budget warns. Every caller asks here: the Billing page and the top bar (billing.usage.Summary),
the low-balance and budget emails (billing.limits), a create's plan and price card
(clusters.web.plans, clusters.web.views) and the API, which carries the answers so the CLI, the MCP
server and the page's script display them instead of deciding.

Plain functions of amounts: no query, no import of the product's apps.
"""

from decimal import Decimal

ZERO = Decimal("0")
SECONDS_PER_HOUR = 3600

# The low-balance email and the Billing page's warning: the balance covers less than this
# many hours of what runs (and stores) now.
LOW_BALANCE_HOURS = Decimal("1")
# The top bar's banner: the balance covers less than this many hours (a day) of what runs.
SHORT_RUNWAY_HOURS = Decimal("24")
# The budget warning: one email when the month-to-date spend reaches this share of the budget.
BUDGET_WARNING_SHARE = Decimal("0.80")


def runway_hours(balance: Decimal, per_hour: Decimal) -> Decimal | None:
    """The hours `balance` pays for at `per_hour`, unrounded, never below zero; None while
    nothing is paid for (`per_hour` zero): the balance lasts indefinitely."""
    if per_hour <= 0:
        return None
    return max(ZERO, balance / per_hour)


def runway_seconds(balance: Decimal, per_hour: Decimal) -> Decimal | None:
    """`runway_hours` in seconds (computed as seconds, so a whole number of seconds stays
    whole: $1 at $3/h is 1,200 s, not 1,199.99…)."""
    if per_hour <= 0:
        return None
    return max(ZERO, balance * SECONDS_PER_HOUR / per_hour)


def is_low(balance: Decimal, per_hour: Decimal) -> bool:
    """The balance covers less than LOW_BALANCE_HOURS of `per_hour` (a balance at or below
    zero included: whoever asks says "out" first where it matters)."""
    return per_hour > 0 and balance < per_hour * LOW_BALANCE_HOURS


def runs_short(balance: Decimal, per_hour: Decimal) -> bool:
    """The balance covers less than SHORT_RUNWAY_HOURS of `per_hour`: the top bar's banner."""
    return per_hour > 0 and balance < per_hour * SHORT_RUNWAY_HOURS


def budget_warns(*, spent: Decimal, budget: Decimal | None) -> bool:
    """A month's spend reached BUDGET_WARNING_SHARE of its budget (no budget never warns)."""
    return budget is not None and spent >= budget * BUDGET_WARNING_SHARE
