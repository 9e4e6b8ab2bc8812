"""runcrate/money.py's formatters: every amount a person reads is written by these."""

from decimal import Decimal

import pytest
from django.template import Context, Template

from runcrate import money


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (Decimal("1234.5"), "$1,234.50"),
        (1234.5, "$1,234.50"),
        ("1234.5", "$1,234.50"),
        (0, "$0.00"),
        (Decimal("-12.34"), "\u2212$12.34"),
        (Decimal("0.005"), "$0.01"),  # half up, as the meter rounds
        (Decimal("0.0049"), "$0.00"),
        (Decimal("-0.001"), "$0.00"),  # no minus on what rounds to nothing
        (Decimal("1234567.891"), "$1,234,567.89"),
        (0.1, "$0.10"),
        (None, "—"),
    ],
)
def test_it_writes_usd_with_grouping_cents_and_a_real_minus(value, text):
    assert money.usd(value) == text


def test_it_signs_ledger_amounts():
    assert money.signed_usd(Decimal("500")) == "+$500.00"
    assert money.signed_usd(Decimal("-12.34")) == "\u2212$12.34"
    assert money.signed_usd(Decimal("0")) == "$0.00"
    assert money.signed_usd(None) == "—"


def test_it_writes_rates_per_hour_and_per_unit():
    assert money.usd_per_hour(Decimal("1530.8")) == "$1,530.80/h"
    assert money.usd_rate(Decimal("0.0700")) == "$0.07"
    assert money.usd_rate(Decimal("0.0125")) == "$0.0125"
    assert money.usd_rate(Decimal("0.1")) == "$0.10"
    assert money.usd_rate(Decimal("1250.5")) == "$1,250.50"


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (Decimal("0"), "$0"),
        (Decimal("50"), "$50"),
        (Decimal("2.5"), "$2.50"),
        (Decimal("2500"), "$2.5k"),
        (Decimal("12000"), "$12k"),
        (Decimal("1250000"), "$1,250k"),
    ],
)
def test_it_writes_compact_chart_labels(value, text):
    assert money.usd_compact(value) == text


def test_it_writes_plain_decimals_for_data():
    assert money.plain(Decimal("1234.5")) == "1234.50"
    assert money.plain(Decimal("-12.345")) == "-12.35"
    assert money.plain(None) is None


def test_the_template_filters_are_the_module_itself():
    template = Template(
        "{% load money %}{{ a|usd }} {{ b|signed_usd }} {{ a|usd_per_hour }} {{ r|usd_rate }}"
    )
    text = template.render(Context({"a": Decimal("1234.5"), "b": Decimal("-3"), "r": "0.0125"}))

    assert text == "$1,234.50 \u2212$3.00 $1,234.50/h $0.0125"
