"""No function of the product is longer than 60 lines (docs/architecture.md, "Functions"): a
longer one is split into named decisions, helpers whose names say what they decide. Read from
the code: every function and method of every product package, nested ones on their own, from
its `def` line to its last line (decorators aside); migrations are left out (Django writes
them). How tangled a function may be (McCabe 15) is ruff's C901, which `make lint` runs.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = [
    "runcrate",
    "accounts",
    "audit",
    "offers",
    "billing",
    "clusters",
    "notifications",
    "config",
    "cli/runcrate_cli",
]
MAX_LINES = 60


def long_functions(path: Path, *, root: Path) -> list[str]:
    """`path:line name (N lines)` for each function in `path` longer than MAX_LINES."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return [
        f"{path.relative_to(root)}:{node.lineno} {node.name} ({length} lines)"
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and (length := node.end_lineno - node.lineno + 1) > MAX_LINES
    ]


def product_modules(root: Path) -> list[Path]:
    return sorted(
        path
        for package in PRODUCT
        for path in (root / package).rglob("*.py")
        if "migrations" not in path.relative_to(root).parts
    )


def test_no_product_function_is_longer_than_60_lines():
    modules = product_modules(ROOT)
    assert len(modules) > 200  # the walk found every package
    assert ROOT / "cli" / "runcrate_cli" / "mcp_server.py" in modules

    found = [found for path in modules for found in long_functions(path, root=ROOT)]
    assert not found, "split into named decisions:\n" + "\n".join(found)


def _function(name: str, lines: int, *, indent: str = "", keyword: str = "def") -> str:
    """A function of exactly `lines` lines, from its def line to its return."""
    body = "".join(f"{indent}    x{i} = {i}\n" for i in range(lines - 2))
    return f"{indent}{keyword} {name}():\n{body}{indent}    return 0\n"


def test_it_names_each_function_over_60_lines_nested_and_async_ones_too(tmp_path):
    module = tmp_path / "sample.py"
    module.write_text(
        _function("just_60", 60)  # lines 1-60
        + "class Tool:\n"  # line 61
        + _function("method", 61, indent="    ", keyword="async def")  # lines 62-122
        + "def outer():\n"  # line 123
        + _function("inner", 61, indent="    ")  # lines 124-184
        + "    return inner\n"
    )

    assert long_functions(module, root=tmp_path) == [
        "sample.py:123 outer (63 lines)",
        "sample.py:62 method (61 lines)",
        "sample.py:124 inner (61 lines)",
    ]


def test_migrations_are_left_out(tmp_path):
    (tmp_path / "clusters" / "migrations").mkdir(parents=True)
    (tmp_path / "clusters" / "models.py").write_text("")
    (tmp_path / "clusters" / "migrations" / "0001_initial.py").write_text("")

    assert product_modules(tmp_path) == [tmp_path / "clusters" / "models.py"]
