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

# The one warning threshold of a balance: it covers less than this many hours of what runs
# (and stores) now. The low-balance email, the Billing page's warning colour, the top bar's
# colour and its runway banner all ask `is_low` (the banner only while a cluster runs).
LOW_BALANCE_HOURS = Decimal("1")
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


def runway_warns(balance: Decimal, per_hour: Decimal, *, running_per_hour: Decimal) -> bool:
    """The top bar's runway banner: a cluster runs (`running_per_hour`, its machines' price, is
    above zero) and the balance is low (`is_low`, the one threshold) at `per_hour`, everything
    that runs and is stored. Never on an account where nothing runs (an empty new one, or one
    that only keeps volumes: a stop for balance stops clusters, not volumes), and never once a
    top-up lifts the balance to the threshold or above."""
    return running_per_hour > 0 and is_low(balance, per_hour)


def budget_warns(*, spent: Decimal, budget: Decimal | None) -> bool:
    """A month's spend reached BUDGET_WARNING_SHARE of its budget (no budget never warns)."""
    return budget is not None and spent >= budget * BUDGET_WARNING_SHARE
