"""The suite's tiers (docs/testing.md): what a test needs, said by its markers, and at the end of
a run a table of each tier's test count and time.

A test's tier is the first of TIERS whose marker it carries, else `fast`: `lab` (the host lab's
real hosts, root), `browser` (Chromium through Playwright), `procs` (processes of its own: Celery
workers, gunicorn, the supervisor, redis-server, PostgreSQL backends killed), `fuzz` (the bounded
schemathesis run). A test that uses the `lab` or `browser` fixture (or one built on them:
`fleet`, `page`) carries that marker whatever its module says, and a test under `postgres_only`
carries `postgres` (a marker that is no tier: such a test runs in `fast` on PostgreSQL).

A tier's time is the sum of setup, call and teardown of its tests as pytest measured them
(module-scoped fixtures count in the setup of the first test that needs them). The tier rides on
each report (its user_properties), so the table is right under pytest-xdist too, where the tests
run in workers and the reports come back to the controller.

tests/conftest.py loads this plugin; `-p tests.tiers` loads it alone (tests/test_tiers.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import PurePosixPath

import pytest

TIERS = ("lab", "browser", "procs", "fuzz")
FAST = "fast"
# A fixture whose use puts a test in a tier, wherever it lives.
TIER_FIXTURES = {"lab": "lab", "browser": "browser"}
# postgres_only's reason (tests/conftest.py): a test skipped with it needs PostgreSQL.
POSTGRES_REASON = "needs PostgreSQL row locks (SELECT … FOR UPDATE SKIP LOCKED); set DATABASE_URL"


def tier_of(markers: Iterable[str]) -> str:
    """The tier of a test carrying `markers` (their names): the first of TIERS, else fast."""
    names = set(markers)
    return next((tier for tier in TIERS if tier in names), FAST)


def add(totals: dict[str, list[float]], tier: str, when: str | None, seconds: float) -> None:
    """Count one report: its seconds to its tier, and the test itself once (at its setup,
    which every test that ran has, skipped or not)."""
    count, total = totals.get(tier, [0, 0.0])
    totals[tier] = [count + (when == "setup"), total + seconds]


def table(totals: dict[str, list[float]]) -> list[str]:
    """The lines of the summary: a row a tier (in TIERS' order, fast first), then the total."""
    order = [tier for tier in (FAST, *TIERS) if tier in totals]
    rows = [(tier, int(totals[tier][0]), totals[tier][1]) for tier in order]
    rows.append(("total", sum(r[1] for r in rows), sum(r[2] for r in rows)))
    lines = [f"{'tier':<8}{'tests':>7}{'seconds':>10}{'minutes':>9}"]
    for tier, count, seconds in rows:
        lines.append(f"{tier:<8}{count:>7}{seconds:>10.1f}{seconds / 60:>9.1f}")
    return lines


class TierClock:
    """Adds up each report's seconds by its tier and prints the table at the end."""

    def __init__(self) -> None:
        self.totals: dict[str, list[float]] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        tier = dict(report.user_properties).get("tier", FAST)
        add(self.totals, tier, report.when, report.duration)

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.totals:
            return
        terminalreporter.write_sep("=", "time per tier (setup + call + teardown)")
        for line in table(self.totals):
            terminalreporter.write_line(line)


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(TierClock(), "runcrate-tier-clock")
    if hasattr(config, "workerinput"):
        config.pluginmanager.register(LabFirst(), "runcrate-lab-first")


@pytest.hookimpl(tryfirst=True)  # before -m deselects by the markers added here
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        for fixture, marker in TIER_FIXTURES.items():
            if fixture in fixtures and item.get_closest_marker(marker) is None:
                item.add_marker(marker)
        if item.get_closest_marker("postgres") is None and any(
            mark.kwargs.get("reason") == POSTGRES_REASON for mark in item.iter_markers("skipif")
        ):
            item.add_marker("postgres")
        tier = tier_of(mark.name for mark in item.iter_markers())
        item.user_properties.append(("tier", tier))


class LabFirst:
    """In a pytest-xdist worker: the lab's modules to the front, then the other slow ones
    (lab_first), after pytest-django has ordered the tests by their use of the database (it puts
    transactional ones, every lab test among them, after the rest)."""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        lab_first(items)


def in_lab_module(nodeid: str) -> bool:
    """Whether a test's module is one of the lab's: under a folder named lab (tests/lab/) or
    named test_ssh_lab*.py. Under pytest-xdist they are the first modules the workers take
    (each whole on one worker, on GPU hosts of that worker's own: tests/workers.py); a test
    that needs the lab must live in one (lab_first says so at collection)."""
    path = PurePosixPath(nodeid.split("::", 1)[0])
    return "lab" in path.parts[:-1] or path.name.startswith("test_ssh_lab")


def lab_first(items: list[pytest.Item]) -> None:
    """In a pytest-xdist worker: the lab's modules first, then every module with a test of a
    slow tier (browser, procs, fuzz), then the rest, each group in its order. With
    --no-loadscope-reorder the workers take modules in this order, so the longest go first and
    the many short ones fill the end, where a long one would leave the other workers idle. A lab
    test outside the lab's modules fails at its setup, before its fixtures touch the lab: it
    would start late, where the rest no longer covers its time."""
    slow_modules = set()
    for item in items:
        if dict(item.user_properties).get("tier", FAST) != FAST:
            slow_modules.add(item.path)
        if item.get_closest_marker("lab") and not in_lab_module(item.nodeid):
            item.stash[MISPLACED] = (
                f"{item.nodeid} needs the lab: it belongs in tests/lab/ or a module named "
                "tests/clusters/test_ssh_lab*.py, which run first (docs/testing.md)"
            )

    def rank(item: pytest.Item) -> int:
        if in_lab_module(item.nodeid):
            return 0
        return 1 if item.path in slow_modules else 2

    items.sort(key=rank)


MISPLACED = pytest.StashKey[str]()


@pytest.hookimpl(tryfirst=True)  # before any fixture is set up
def pytest_runtest_setup(item: pytest.Item) -> None:
    if MISPLACED in item.stash:
        pytest.fail(item.stash[MISPLACED], pytrace=False)
