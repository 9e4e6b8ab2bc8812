"""Durations for people live in runcrate/durations.py: the countdown's words, the list's ages
and the lifecycle's limits in a sentence; the cluster page hands the countdown's shapes to its
script, which fills them with the same rounding (static/js/app.js)."""

import html
import json
from pathlib import Path

import pytest

from runcrate import durations
from tests.factories import ClusterFactory

APP_JS = Path(__file__).resolve().parents[2] / "static" / "js" / "app.js"


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(-5, "0s"), (0, "0s"), (45, "45s"), (60, "1m 00s"), (130, "2m 10s"), (3900, "1h 5m")],
)
def test_it_words_a_countdown(seconds, text):
    assert durations.countdown(seconds) == text


def test_it_words_a_limit_in_a_sentence_for_the_lifecycle():
    assert [durations.in_words(s) for s in (90, 360, 450)] == [
        "90 seconds",
        "6 minutes",
        "7.5 minutes",
    ]


def test_the_script_takes_its_words_from_the_server_not_its_own():
    script = APP_JS.read_text()

    assert "countdownFormat" in script
    for shape in durations.COUNTDOWN_FORMAT.values():
        assert shape.replace("{", "${") not in script  # no copy of a shape in the script


def test_the_cluster_page_hands_the_script_the_countdown_format(owner):
    cluster = ClusterFactory(project=owner.project)
    page = owner.browser_client().get(f"/clusters/{cluster.pk}/").content.decode()

    marker = 'data-countdown-format="'
    start = page.index(marker) + len(marker)
    handed = html.unescape(page[start : page.index('"', start)])
    assert json.loads(handed) == durations.COUNTDOWN_FORMAT
