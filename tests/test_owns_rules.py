"""Each derived rule has one home (issue 35; docs/billing.md and docs/clusters.md, "The rules
in one place"), and a copy written out elsewhere fails here. Read from the code:

- **running** (ready or degraded): a set, list or tuple of exactly those two statuses, in any
  spelling (`Status.READY`, `"ready"`), or a template's `== "ready" or … == "degraded"`, only
  as `Cluster.RUNNING` in clusters/models.py (asked through clusters/policy.py);
- **a role list** of exactly the owner and the manager, only in accounts/permissions.py (the
  permission table: others ask `roles_for`);
- **the low balance, the short runway and the budget warning**: their constants (an hour, a
  day, 80%: `LOW_BALANCE_HOURS`, `SHORT_RUNWAY_HOURS`, `…WARNING_SHARE`, `Decimal("0.8")`) and
  the runway's arithmetic (`balance * 3600 / …`), only in billing/policy.py;
- **durations for people**: minute or hour rounding (`… // 60`, `… // 3600`, `ceil(… / 60)`,
  `round(… / 60)`) only in runcrate/durations.py; in static/js/app.js no span worded
  (`${…} min`), no cents rounded (`Math.round(… * 100)`, `/ 7200`) and no minute or hour
  arithmetic (`Math.floor(… / 60)`) but the two kept on purpose below.

Migrations are left out (they run once, on historical models)."""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = [
    "accounts",
    "audit",
    "offers",
    "billing",
    "clusters",
    "notifications",
    "runcrate",
    "config",
    "cli/runcrate_cli",
]
SCRIPT = "static/js/app.js"

RUNNING_HOME = "clusters/models.py"
ROLES_HOME = "accounts/permissions.py"
BILLING_HOME = "billing/policy.py"
DURATIONS_HOME = "runcrate/durations.py"

RUNNING = {"ready", "degraded"}
ROLES = {"owner", "manager"}
BILLING_NAMES = re.compile(r"^(LOW_BALANCE_HOURS|SHORT_RUNWAY_HOURS|\w*WARNING_SHARE)$")
TIME_UNITS = {60, 3600, 86_400}

# The script's minute arithmetic kept on purpose, each for its reason:
SCRIPT_KEPT = {
    # The countdown fills the server's own shapes (runcrate/durations.py COUNTDOWN_FORMAT) with
    # the same rounding, whole units down, every second to a deadline up to 45 minutes away:
    # tests/clusters/test_countdown.py holds the two to the same words.
    "const h = Math.floor(seconds / 3600);",
    "const m = Math.floor((seconds % 3600) / 60);",
    # "3 minutes ago" is the browser's own language (Intl.RelativeTimeFormat), not ours.
    'if (seconds < 3600) return relative.format(-Math.floor(seconds / 60), "minute");',
    'return relative.format(-Math.floor(seconds / 3600), "hour");',
}
SCRIPT_PATTERNS = {
    "words a span": re.compile(r"\$\{[^}]*\}\s?(s|min|h|days?|hours?|minutes?)\b"),
    "rounds cents": re.compile(r"Math\.round\([^;]*\*\s*100\b|/\s*7200\b"),
    "rounds minutes or hours": re.compile(r"Math\.(floor|round|ceil)\([^;]*/\s*(60|3600)\b"),
}


def _word(node: ast.expr) -> str | None:
    """`Status.READY`, `Role.OWNER`, `OWNER` or `"ready"` as a lower-case word."""
    if isinstance(node, ast.Attribute):
        return node.attr.lower()
    if isinstance(node, ast.Name):
        return node.id.lower()
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value.lower()
    return None


def _words(node: ast.AST) -> set[str] | None:
    if isinstance(node, ast.Set | ast.List | ast.Tuple) and node.elts:
        words = [_word(element) for element in node.elts]
        if None not in words and len(words) == len(set(words)):
            return set(words)  # type: ignore[arg-type]  # None was ruled out above
    return None


def _divides_by_time(node: ast.AST, *, floor: bool) -> bool:
    operator = ast.FloorDiv if floor else ast.Div
    return (
        isinstance(node, ast.BinOp)
        and isinstance(node.op, operator)
        and isinstance(node.right, ast.Constant)
        and node.right.value in TIME_UNITS
    )


def _rounds_time(node: ast.AST) -> bool:
    """`… // 60` (or 3600, 86,400), or `ceil`, `round` or `floor` of `… / 60`."""
    return _divides_by_time(node, floor=True) or (
        isinstance(node, ast.Call)
        and _word(node.func) in {"ceil", "round", "floor"}
        and bool(node.args)
        and _divides_by_time(node.args[0], floor=False)
    )


def _assigned_names(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Assign):
        return [t.id for t in node.targets if isinstance(t, ast.Name)]
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return [node.target.id]
    return []


def _billing_copies(node: ast.AST) -> list[str]:
    """What `node` writes out of the billing policy's rules, outside its home."""
    found = []
    for assigned in _assigned_names(node):
        if BILLING_NAMES.search(assigned):
            found.append(f"sets {assigned}")
    if (
        isinstance(node, ast.Call)
        and _word(node.func) == "decimal"
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and str(node.args[0].value) in {"0.8", "0.80", ".8"}
    ):
        found.append("writes out the budget warning's share")
    if (
        isinstance(node, ast.BinOp)
        and isinstance(node.op, ast.Div)
        and isinstance(node.left, ast.BinOp)
        and isinstance(node.left.op, ast.Mult)
        and any(
            isinstance(side, ast.Constant) and side.value == 3600
            for side in (node.left.left, node.left.right)
        )
        and any("balance" in (_word(side) or "") for side in (node.left.left, node.left.right))
    ):
        found.append("works out a runway")
    return found


def violations(path: Path, root: Path = ROOT) -> list[str]:
    """Where the module at `path` writes out a rule outside its home (named from `root`)."""
    name = path.relative_to(root).as_posix()
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []

    def say(node: ast.AST, what: str) -> None:
        found.append(f"{name}:{getattr(node, 'lineno', 0)} {what}")

    running_home = set()
    if name == RUNNING_HOME:  # the one spelling: `RUNNING = frozenset({…})` on the model
        for node in ast.walk(tree):
            if "RUNNING" in _assigned_names(node):
                running_home |= {id(n) for n in ast.walk(node)}

    for node in ast.walk(tree):
        words = _words(node)
        if words == RUNNING and id(node) not in running_home:
            say(node, "writes out the running statuses (ready, degraded)")
        elif words == ROLES and name != ROLES_HOME:
            say(node, "writes out a role list (owner, manager)")
        if name != BILLING_HOME:
            for what in _billing_copies(node):
                say(node, what)
        if name != DURATIONS_HOME and _rounds_time(node):
            say(node, "rounds a duration to minutes or hours")
        if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or):
            compared = {
                _word(value.comparators[0])
                for value in node.values
                if isinstance(value, ast.Compare) and len(value.comparators) == 1
            }
            if compared >= RUNNING:
                say(node, "writes out the running statuses (ready, degraded)")
    return found


TEMPLATE_RUNNING = re.compile(r"""==\s*["']ready["'][^%]*==\s*["']degraded["']""")


def template_violations(path: Path, root: Path = ROOT) -> list[str]:
    name = path.relative_to(root).as_posix()
    return [
        f"{name}:{number} writes out the running statuses (ready, degraded)"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if TEMPLATE_RUNNING.search(line)
    ]


def script_violations(path: Path, root: Path = ROOT) -> list[str]:
    name = path.relative_to(root).as_posix()
    found = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip() in SCRIPT_KEPT or line.strip().startswith("//"):
            continue
        for what, pattern in SCRIPT_PATTERNS.items():
            if pattern.search(line):
                found.append(f"{name}:{number} {what}")
    return found


def product_modules() -> list[Path]:
    return sorted(
        path
        for package in PRODUCT
        if (ROOT / package).is_dir()
        for path in (ROOT / package).rglob("*.py")
        if "migrations" not in path.relative_to(ROOT).parts
    )


def test_each_rule_is_written_out_only_in_its_home():
    modules = product_modules()
    assert len(modules) > 100  # the walk found the product
    assert ROOT / "cli" / "runcrate_cli" / "client.py" in modules
    templates = sorted((ROOT / "templates").rglob("*.html"))
    assert len(templates) > 50

    offending = [found for path in modules for found in violations(path)]
    offending += [found for path in templates for found in template_violations(path)]
    offending += script_violations(ROOT / SCRIPT)

    assert offending == []


def test_the_homes_hold_what_they_are_the_home_of():
    """The rules are where this test lets them be (a home renamed would let copies pass)."""
    assert "RUNNING = frozenset({Status.READY, Status.DEGRADED})" in (
        (ROOT / RUNNING_HOME).read_text()
    )
    assert "MANAGERS = (OWNER, MANAGER)" in (ROOT / ROLES_HOME).read_text()
    policy = (ROOT / BILLING_HOME).read_text()
    assert 'LOW_BALANCE_HOURS = Decimal("1")' in policy
    assert 'BUDGET_WARNING_SHARE = Decimal("0.80")' in policy
    assert "MINUTE // 2) // MINUTE" in (ROOT / DURATIONS_HOME).read_text()
    script = (ROOT / SCRIPT).read_text()
    assert all(line in script for line in SCRIPT_KEPT)  # nothing kept that is gone


@pytest.mark.parametrize(
    ("source", "what"),
    [
        ("WATCHED = (Cluster.Status.READY, Cluster.Status.DEGRADED)\n", "running statuses"),
        ("def f(c):\n    return c.status in {'degraded', 'ready'}\n", "running statuses"),
        ("q = Node.objects.filter(cluster__status__in=['ready', 'degraded'])\n", "running"),
        ("def f(s):\n    return s == Status.READY or s == Status.DEGRADED\n", "running statuses"),
        ("RUNNING = frozenset({'ready', 'degraded'})\n", "running statuses"),
        ("q = M.objects.filter(role__in=[Role.OWNER, Role.MANAGER])\n", "role list"),
        ("ROLES = ('owner', 'manager')\n", "role list"),
        ("LOW_BALANCE_HOURS = Decimal('1')\n", "sets LOW_BALANCE_HOURS"),
        ("WARNING_SHARE = 1\n", "sets WARNING_SHARE"),
        ("def f(s, b):\n    return s >= b * Decimal('0.80')\n", "budget warning's share"),
        ("def f(balance, rate):\n    return balance * 3600 / rate\n", "works out a runway"),
        ("def f(s):\n    return (s + 30) // 60\n", "rounds a duration"),
        ("def f(t):\n    return f'{t.seconds // 60} minutes'\n", "rounds a duration"),
        ("import math\ndef f(s):\n    return math.ceil(s / 60)\n", "rounds a duration"),
        ("def f(s):\n    return round(s / 3600)\n", "rounds a duration"),
    ],
)
def test_it_finds_a_planted_copy(tmp_path, source, what):
    module = tmp_path / "planted.py"
    module.write_text(source)

    found = violations(module, tmp_path)

    assert any(what in line for line in found), found


def test_it_lets_the_homes_and_other_groups_pass(tmp_path):
    module = tmp_path / "fine.py"
    module.write_text(
        "from clusters import policy\n"
        "BILLED = {Status.INSTALLING, Status.READY, Status.DEGRADED}\n"  # another group
        "MANAGERS = roles_for('billing.manage')\n"
        "def f(c, s):\n"
        "    hours = Decimal(s) / 3600\n"  # a quantity of hours, not words
        "    return policy.is_running(c.status), s * 1000 // 1000, hours\n"
    )

    assert violations(module, tmp_path) == []


def test_it_finds_a_running_pair_in_a_template(tmp_path):
    page = tmp_path / "page.html"
    page.write_text(
        '{% if cluster.status == "ready" or cluster.status == "degraded" %}x{% endif %}'
    )

    assert template_violations(page, tmp_path) == [
        "page.html:1 writes out the running statuses (ready, degraded)"
    ]


@pytest.mark.parametrize(
    ("line", "what"),
    [
        ("    if (total < 3600) return `${Math.floor(total / 60)} min`;", "words a span"),
        ("  return hours ? `${days} days ${hours} h` : `${days} days`;", "words a span"),
        ("  const cents = Math.round(Number(element.dataset.cost) * 100);", "rounds cents"),
        ("  const more = Math.floor((2 * perHour * elapsed + 3600) / 7200);", "rounds cents"),
        ("  const minutes = Math.floor((total % 3600) / 60);", "rounds minutes or hours"),
    ],
)
def test_it_finds_a_planted_copy_in_the_script(tmp_path, line, what):
    script = tmp_path / "app.js"
    script.write_text(f"// a comment: Math.floor(x / 60)\n{line}\n")

    found = script_violations(script, tmp_path)

    assert f"app.js:2 {what}" in found
    assert all(line.startswith("app.js:2 ") for line in found)  # never the comment
