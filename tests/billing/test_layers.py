"""Billing is the lower layer: no billing module imports clusters, at module level or inside a
function (docs/architecture.md). Clusters ask billing what is over and stop their own
(clusters/stops.py); billing reads clusters' rows only through its own relations."""

import ast
from pathlib import Path

import billing

BILLING = Path(billing.__file__).parent
# The benchmarks build whole clusters, nodes and machines as their data (no lifecycle): they
# are the bench's harness, run by `manage.py bench`, not a part of billing anything imports.
HARNESS = {BILLING / "benchmarks.py"}


def imported_modules(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
    return found


def test_no_billing_module_imports_clusters():
    modules = sorted(set(BILLING.rglob("*.py")) - HARNESS)
    assert len(modules) > 20  # the walk found billing, migrations and commands included

    offending = [
        f"{path.relative_to(BILLING.parent)}:{line} imports {name}"
        for path in modules
        for line, name in imported_modules(path)
        if name == "clusters" or name.startswith("clusters.")
    ]

    assert offending == []


def test_the_walk_sees_imports_inside_functions(tmp_path):
    module = tmp_path / "sample.py"
    module.write_text("def f():\n    from clusters import lifecycle\n    import clusters.models\n")

    assert imported_modules(module) == [(2, "clusters"), (3, "clusters.models")]
