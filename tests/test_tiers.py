"""The tiers plugin (tests/tiers.py): a test's tier from its markers and fixtures, the time of
each tier summed from its tests' setup, call and teardown, and the table a run ends with."""

from types import SimpleNamespace

import pytest

from tests import tiers
from tests.cli.kit import REPO

pytest_plugins = ["pytester"]


@pytest.mark.parametrize(
    ("markers", "tier"),
    [
        ((), "fast"),
        (("postgres", "django_db", "parametrize"), "fast"),
        (("procs",), "procs"),
        (("fuzz",), "fuzz"),
        (("procs", "fuzz"), "procs"),
        (("django_db", "procs", "browser"), "browser"),
        (("browser", "lab", "procs"), "lab"),
    ],
)
def test_a_test_is_of_the_first_tier_it_is_marked_with(markers, tier):
    assert tiers.tier_of(markers) == tier


def report(tier: str, when: str, duration: float):
    return SimpleNamespace(user_properties=[("tier", tier)], when=when, duration=duration)


def test_a_tier_sums_setup_call_and_teardown_and_counts_each_test_once():
    clock = tiers.TierClock()
    for when, seconds in (("setup", 2.0), ("call", 8.5), ("teardown", 0.5)):
        clock.pytest_runtest_logreport(report("procs", when, seconds))
    clock.pytest_runtest_logreport(report("procs", "setup", 1.0))  # skipped in its setup
    for when, seconds in (("setup", 0.25), ("call", 0.5), ("teardown", 0.25)):
        clock.pytest_runtest_logreport(report("fast", when, seconds))
    # A report without a tier (none was collected here) counts as fast.
    clock.pytest_runtest_logreport(SimpleNamespace(user_properties=[], when="setup", duration=1))

    assert clock.totals == {"procs": [2, 12.0], "fast": [2, 2.0]}
    assert tiers.table(clock.totals) == [
        "tier      tests   seconds  minutes",
        "fast          2       2.0      0.0",
        "procs         2      12.0      0.2",
        "total         4      14.0      0.2",
    ]


SAMPLE = """
import pytest

@pytest.fixture
def lab():
    return "hosts"

@pytest.fixture
def browser():
    return "chromium"

@pytest.fixture
def page(browser):
    return "a page"

def test_plain():
    pass

@pytest.mark.skip(reason="counted all the same")
def test_skipped():
    pass

@pytest.mark.procs
def test_a_worker():
    pass

@pytest.mark.procs
@pytest.mark.fuzz
def test_a_fuzzed_worker():
    pass

def test_on_the_lab(lab):
    pass

def test_in_a_page(page):
    pass
"""


MARKERS = ("lab", "browser", "procs", "fuzz", "postgres")


def run_sample(pytester, *args: str):
    pytester.makeini("[pytest]\nmarkers =\n" + "".join(f"    {m}\n" for m in MARKERS))
    pytester.makepyfile(test_sample=SAMPLE)
    env = {"PYTHONPATH": str(REPO), "DJANGO_SETTINGS_MODULE": ""}
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        return pytester.runpytest_subprocess(
            "-p", "tests.tiers", "-p", "no:django", "-p", "no:cacheprovider", "--strict-markers",
            *args,
        )  # fmt: skip


def table_rows(result) -> dict[str, int]:
    """The table's rows (after its heading, up to the next rule): each tier's test count."""
    lines = result.outlines
    first = next(i for i, line in enumerate(lines) if "time per tier" in line) + 2
    rows = {}
    for line in lines[first:]:
        if line.startswith("="):
            break
        tier, count, _seconds, _minutes = line.split()
        rows[tier] = int(count)
    return rows


def test_a_run_ends_with_each_tiers_count_the_lab_and_browser_fixtures_marking_their_tests(
    pytester,
):
    result = run_sample(pytester)

    result.assert_outcomes(passed=5, skipped=1)
    assert table_rows(result) == {"fast": 2, "lab": 1, "browser": 1, "procs": 2, "total": 6}


def test_a_marker_the_plugin_adds_deselects_like_one_written_on_the_test(pytester):
    result = run_sample(pytester, "-m", "not lab and not browser and not procs and not fuzz")

    result.assert_outcomes(passed=1, skipped=1, deselected=4)
    assert table_rows(result) == {"fast": 2, "total": 2}


def test_the_suite_loads_the_plugin_once(pytestconfig):
    assert pytestconfig.pluginmanager.is_registered(tiers)


PLAIN_MODULE = """
def test_one():
    pass

def test_two():
    pass
"""

LAB_MODULE = """
import pytest

@pytest.fixture
def lab():
    return "hosts"

def test_on_the_lab(lab):
    pass

def test_beside_it():
    pass

def test_also_beside_it():
    pass
"""


SLOW_MODULE = """
import pytest

def test_plain_beside_it():
    pass

@pytest.mark.procs
def test_a_worker():
    pass
"""

# Orders the tests after tests.tiers' tryfirst hook has marked them, as pytest-django's does in
# the suite.
ORDERS_LIKE_PYTEST_DJANGO = """
def pytest_collection_modifyitems(items):
    items.sort(key=lambda item: "lab" in item.nodeid)
"""


def run_under_xdist(pytester, modules: dict[str, str]):
    """`modules` (path: source) run as make test runs the suite: two workers, tests.workers'
    scheduler, --dist loadfile --no-loadscope-reorder."""
    pytester.makeini("[pytest]\nmarkers =\n" + "".join(f"    {m}\n" for m in MARKERS))
    for path, source in modules.items():
        (pytester.path / path).parent.mkdir(parents=True, exist_ok=True)
        (pytester.path / path).write_text(source)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYTHONPATH", str(REPO))
        patch.setenv("DJANGO_SETTINGS_MODULE", "")
        patch.delenv("REDIS_URL", raising=False)
        patch.setenv("RUNCRATE_VAR_DIR", str(pytester.path / "var"))
        return pytester.runpytest_subprocess(
            "-p", "tests.workers", "-p", "tests.tiers", "-p", "no:django",
            "-p", "no:cacheprovider", "-v", "-n", "2", "--dist", "loadfile",
            "--no-loadscope-reorder",
        )  # fmt: skip


def test_under_xdist_the_workers_take_the_labs_modules_first_each_whole(pytester):
    """make test's xdist: the lab's modules (each whole, a test that needs no lab included) are
    the first the workers take, shared between them, before any other module; every module runs
    whole on one worker. So even after a plugin that orders tests, as pytest-django puts the
    transactional ones (every lab test) last."""
    result = run_under_xdist(
        pytester,
        {
            "conftest.py": ORDERS_LIKE_PYTEST_DJANGO,
            "test_a_plain.py": PLAIN_MODULE,
            "test_b_plain.py": PLAIN_MODULE,
            "lab/test_c_hosts.py": LAB_MODULE,
            "test_ssh_lab_d.py": LAB_MODULE,
            "test_e_slow.py": SLOW_MODULE,
        },
    )

    result.assert_outcomes(passed=12)
    ran: dict[str, list[str]] = {}  # worker: the modules of its tests, in the order it ran them
    for line in result.outlines:
        if line.startswith("[gw") and "PASSED" in line:
            worker, node = line.split()[0], line.split()[-1]
            ran.setdefault(worker, []).append(node.split("::")[0])
    lab_modules = {"lab/test_c_hosts.py", "test_ssh_lab_d.py"}
    # Two workers, two lab modules: each worker's first module is one of the lab's; the module
    # with a slow tier's test comes next, before the plain ones.
    assert {modules[0] for modules in ran.values()} == lab_modules, ran
    slow_worker = next(modules for modules in ran.values() if "test_e_slow.py" in modules)
    assert list(dict.fromkeys(slow_worker))[1] == "test_e_slow.py", ran
    for module in ("test_a_plain.py", "test_b_plain.py", "test_e_slow.py", *lab_modules):
        assert len([w for w, modules in ran.items() if module in modules]) == 1, ran


def test_under_xdist_a_lab_test_outside_the_labs_modules_stops_the_run(pytester):
    result = run_under_xdist(pytester, {"test_a_plain.py": PLAIN_MODULE, "test_e.py": LAB_MODULE})

    assert result.ret != 0
    result.stdout.fnmatch_lines(["*test_e.py::test_on_the_lab needs the lab: it belongs in*"])
