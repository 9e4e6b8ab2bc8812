"""A small server-rendered SVG bar chart of spend per day (no JavaScript, no library).

`spend_chart` turns the days into geometry; `templates/billing/index.html#chart` draws it, so
the colours come from the stylesheet's variables and follow light and dark mode.
"""

from dataclasses import dataclass
from datetime import date
from decimal import Decimal

from runcrate.money import usd, usd_compact

WIDTH = 1080
HEIGHT = 180
LEFT = 56  # room for the amounts on the y axis
BOTTOM = 22  # room for the day numbers
TOP = 10
GAP = 0.25  # share of each day's slot left empty between bars


@dataclass(frozen=True)
class Bar:
    day: date
    amount: Decimal
    x: float
    y: float
    width: float
    height: float
    label: str  # the day number, on days that show one

    @property
    def center(self) -> float:
        return round(self.x + self.width / 2, 2)

    @property
    def title(self) -> str:
        return f"{self.day:%b} {self.day.day}: {usd(self.amount)}"


@dataclass(frozen=True)
class Tick:
    y: float
    label: str


@dataclass(frozen=True)
class Chart:
    width: int
    height: int
    left: int
    plot_right: int
    baseline: float
    bars: list[Bar]
    ticks: list[Tick]
    total: Decimal

    @property
    def empty(self) -> bool:
        return self.total == 0


def nice_ceiling(value: Decimal) -> Decimal:
    """The smallest 1, 2, 2.5 or 5 × 10ⁿ at or above `value` (an axis that reads well)."""
    if value <= 0:
        return Decimal("1")
    magnitude = Decimal(10) ** (value.adjusted())
    for step in (1, 2, Decimal("2.5"), 5, 10):
        if value <= step * magnitude:
            return step * magnitude
    return 10 * magnitude


def spend_chart(days: list[tuple[date, Decimal]]) -> Chart:
    top = nice_ceiling(max((amount for _, amount in days), default=Decimal("0")))
    plot_height = HEIGHT - TOP - BOTTOM
    plot_width = WIDTH - LEFT - 8
    slot = plot_width / max(1, len(days))
    baseline = TOP + plot_height
    bars = []
    for index, (day, amount) in enumerate(days):
        height = float(amount / top) * plot_height if amount > 0 else 0.0
        # A day with some spend is never drawn thinner than a hairline.
        height = max(height, 1.5) if amount > 0 else 0.0
        label = str(day.day) if day.day == 1 or day.day % 5 == 0 else ""
        bars.append(
            Bar(
                day=day,
                amount=amount,
                x=round(LEFT + index * slot + slot * GAP / 2, 2),
                y=round(baseline - height, 2),
                width=round(slot * (1 - GAP), 2),
                height=round(height, 2),
                label=label,
            )
        )
    ticks = [
        Tick(y=round(baseline - plot_height * share, 2), label=usd_compact(top * Decimal(share)))
        for share in (0, 0.5, 1)
    ]
    return Chart(
        width=WIDTH,
        height=HEIGHT,
        left=LEFT,
        plot_right=WIDTH - 8,
        baseline=baseline,
        bars=bars,
        ticks=ticks,
        total=sum((amount for _, amount in days), Decimal("0")),
    )
