"""runcrate/durations.py: spans of time beside an amount (uptime, what a balance covers)."""

from datetime import timedelta
from decimal import Decimal

import pytest

from runcrate import durations


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0 s"),
        (59.9, "59 s"),
        (60, "1 min"),
        (3599, "59 min"),
        (3600, "1 h"),
        (9310, "2 h 35 min"),
        (47 * 3600 + 59 * 60 + 59, "47 h 59 min"),
        (2 * 86400, "2 days"),
        (222_210, "2 days 13 h"),
        (-5, "0 s"),
        (timedelta(minutes=45), "45 min"),
        (Decimal("86399.9"), "23 h 59 min"),
        (None, "—"),
    ],
)
def test_it_writes_a_span_in_its_two_largest_units_rounded_down(seconds, text):
    assert durations.span(seconds) == text


def test_an_estimate_rounds_to_the_nearest_minute():
    assert durations.about(timedelta(seconds=269)) == "4 min"
    assert durations.about(timedelta(seconds=270)) == "5 min"
    assert durations.about(timedelta(seconds=281)) == "5 min"
    assert durations.about(45) == "45 s"
    assert durations.about(3570) == "1 h"


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0:00:00"),
        (55, "0:00:55"),
        (220, "0:03:40"),
        (43_449, "12:04:09"),
        (4_500_000, "1,250:00:00"),
        (timedelta(minutes=90), "1:30:00"),
        (None, "—"),
    ],
)
def test_clock_writes_machine_time_exactly(seconds, text):
    assert durations.clock(seconds) == text
