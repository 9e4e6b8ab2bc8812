"""Billing owns metering: no module of the product outside billing/ writes usage, storage,
meter or ledger rows (docs/billing.md). Clusters open, close, refund and charge what is metered
through billing/metering.py, and read billing through its functions (billing.usage, ledger).

Read from the code: a module outside billing may not name billing's metered models at all
(importing, constructing, querying or writing them), look them up by name (`apps.get_model`),
or write them through a relation (`cluster.usage.update(…)`, `project.ledger.create(…)`,
`volume.storage.delete()`).

Migrations are left out: a data migration works on the historical models Django gives it
(`apps.get_model`), as clusters 0014 moved the volumes' charged points into billing's storage
records, and runs once, not as the product."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# The product's packages, billing aside (bench/ and lab/ are tools, tests/ the tests).
PRODUCT = ["accounts", "offers", "clusters", "runcrate", "config", "cli/runcrate_cli"]
METERED = {"UsageRecord", "StorageRecord", "MeterMark", "UsageDay", "LedgerEntry"}
# The reverse relations of those models on the product's rows: Project.usage/.ledger/.storage,
# Cluster.usage, Node.usage, Volume.storage.
RELATIONS = {"usage", "ledger", "storage"}
WRITES = {
    "create",
    "bulk_create",
    "bulk_update",
    "update",
    "delete",
    "get_or_create",
    "update_or_create",
    "save",
}


def _chain(node: ast.expr) -> list[str]:
    """The attribute names of `a.b.c(…).d`, outermost last: ['b', 'c', 'd']."""
    names = []
    while True:
        if isinstance(node, ast.Attribute):
            names.append(node.attr)
            node = node.value
        elif isinstance(node, ast.Call):
            node = node.func
        elif isinstance(node, ast.Subscript):
            node = node.value
        else:
            return names[::-1]


def violations(path: Path, root: Path = ROOT) -> list[str]:
    """Where the module at `path` touches billing's metered rows (named from `root`)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []

    def say(node: ast.AST, what: str) -> None:
        found.append(f"{path.relative_to(root)}:{node.lineno} {what}")

    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("billing"):
            for alias in node.names:
                if alias.name in METERED or (node.module == "billing" and alias.name == "models"):
                    say(node, f"imports {alias.name} from {node.module}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "billing.models":
                    say(node, "imports billing.models")
        elif isinstance(node, ast.Name) and node.id in METERED:
            say(node, f"names {node.id}")
        elif isinstance(node, ast.Attribute) and node.attr in METERED:
            say(node, f"names {node.attr}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.value in METERED or node.value in {f"billing.{m}" for m in METERED}:
                say(node, f"names {node.value!r}")
        elif isinstance(node, ast.Call):
            chain = _chain(node.func)
            if chain and chain[-1] in WRITES and RELATIONS & set(chain[:-1]):
                say(node, f"writes through .{'.'.join(chain)}(…)")
    return found


def product_modules() -> list[Path]:
    return sorted(
        path
        for package in PRODUCT
        if (ROOT / package).is_dir()
        for path in (ROOT / package).rglob("*.py")
        if "migrations" not in path.relative_to(ROOT).parts
    )


def test_no_module_outside_billing_writes_usage_or_ledger_rows():
    modules = product_modules()
    assert len(modules) > 100  # the walk found the product (clusters alone is dozens)
    assert ROOT / "clusters" / "volumes.py" in modules
    assert ROOT / "cli" / "runcrate_cli" / "client.py" in modules

    offending = [found for path in modules for found in violations(path)]

    assert offending == []


@pytest.mark.parametrize(
    ("source", "what"),
    [
        ("from billing.models import UsageRecord\n", "imports UsageRecord from billing.models"),
        ("from billing import models\n", "imports models from billing"),
        ("import billing.models\n", "imports billing.models"),
        ("def f(m):\n    m.LedgerEntry.objects.create(amount=1)\n", "names LedgerEntry"),
        ("def f(M):\n    M(cluster_id=1)\nM = 0\nUsageDay = M\n", "names UsageDay"),
        (
            'def f(apps):\n    apps.get_model("billing", "StorageRecord")\n',
            "names 'StorageRecord'",
        ),
        (
            "def f(c, t):\n    c.usage.filter(ended_at=None).update(ended_at=t)\n",
            "writes through .usage.filter.update(…)",
        ),
        ("def f(p):\n    p.ledger.create(amount=1)\n", "writes through .ledger.create(…)"),
        ("def f(v):\n    v.storage.delete()\n", "writes through .storage.delete(…)"),
    ],
)
def test_it_finds_a_planted_write(tmp_path, source, what):
    module = tmp_path / "planted.py"
    module.write_text(source)

    found = violations(module, tmp_path)

    assert any(what in line for line in found), found


def test_it_lets_reads_through_billings_functions_pass(tmp_path):
    module = tmp_path / "reads.py"
    module.write_text(
        "from billing import ledger, metering\n"
        "from billing.usage import cluster_costs\n"
        "def f(project, volume, storage):\n"
        "    metering.close_storage(volume_id=volume.pk, at=None)\n"
        "    storage.delete('file')\n"  # a file storage, not a relation
        "    return ledger.balance(project=project), cluster_costs([])\n"
    )

    assert violations(module, tmp_path) == []
