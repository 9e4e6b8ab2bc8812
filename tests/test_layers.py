"""The packages form layers, read from their imports alone (docs/architecture.md, "Layers"):
the kernel `runcrate` imports no app; `accounts`, then `offers`, then `billing`, then
`clusters` each import only what is below them; the project package `config` on top is the
only one that imports every app (it mounts them). No product package imports the bench or the
lab. Every module is read, migrations and management commands included, and every import in
it, at module level or inside a function: there is no exemption list.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Each product package and the packages it may import (itself aside), lowest first.
MAY_IMPORT: dict[str, set[str]] = {
    "runcrate": set(),
    "accounts": {"runcrate"},
    # The audit log sits just above accounts, so every app may record in it (docs/audit.md).
    "audit": {"runcrate", "accounts"},
    "offers": {"runcrate", "accounts", "audit"},
    "billing": {"runcrate", "accounts", "audit", "offers"},
    "clusters": {"runcrate", "accounts", "audit", "offers", "billing"},
    "notifications": {"runcrate", "accounts", "audit", "offers", "billing", "clusters"},
    "config": {"runcrate", "accounts", "audit", "offers", "billing", "clusters", "notifications"},
    # The client distribution: a client of the API over HTTP, no Django, none of the server.
    "runcrate_cli": set(),
}
PRODUCT = set(MAY_IMPORT)
# Where a package lives when not at the root: the client is its own distribution in cli/.
FOLDER = {"runcrate_cli": Path("cli") / "runcrate_cli"}
# Ours but never the product's: an import of one of these from a product package is a violation.
TOOLS = {"bench", "lab", "tests"}


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """Every module `path` imports, with its line: at module level, inside a function, under
    TYPE_CHECKING alike. A relative import is resolved against the module's own package."""
    package = _package_of(path)
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                if node.module:
                    found.append((node.lineno, node.module))
                continue
            base = package[: len(package) - (node.level - 1)] if node.level > 1 else package
            found.append((node.lineno, ".".join([*base, *([node.module] if node.module else [])])))
    return found


def _package_of(path: Path) -> list[str]:
    """The dotted package a module sits in, from the folders above it that are packages."""
    parts: list[str] = []
    folder = path.parent
    while (folder / "__init__.py").exists():
        parts.insert(0, folder.name)
        folder = folder.parent
    return parts


def modules_of(root: Path, package: str) -> list[Path]:
    return sorted((root / FOLDER.get(package, Path(package))).rglob("*.py"))


def violations(root: Path) -> list[str]:
    """`path:line imports name` for each import a product package may not make."""
    found = []
    for package, allowed in MAY_IMPORT.items():
        for path in modules_of(root, package):
            for line, name in imported_modules(path):
                top = name.split(".")[0]
                if top == package:
                    continue
                if top in TOOLS or (top in PRODUCT and top not in allowed):
                    found.append(f"{path.relative_to(root)}:{line} imports {name}")
    return found


def package_graph(root: Path) -> dict[str, set[str]]:
    """Which of our packages each product package imports."""
    ours = PRODUCT | TOOLS
    return {
        package: {
            name.split(".")[0]
            for path in modules_of(root, package)
            for _, name in imported_modules(path)
            if name.split(".")[0] in ours and name.split(".")[0] != package
        }
        for package in MAY_IMPORT
    }


def find_circle(graph: dict[str, set[str]]) -> list[str] | None:
    """A circle of imports between packages (its packages, the first repeated at the end), or
    None when the graph is acyclic."""
    done: set[str] = set()

    def walk(package: str, path: list[str]) -> list[str] | None:
        if package in path:
            return path[path.index(package) :] + [package]
        if package in done:
            return None
        for imported in sorted(graph.get(package, ())):
            circle = walk(imported, [*path, package])
            if circle:
                return circle
        done.add(package)
        return None

    for package in sorted(graph):
        circle = walk(package, [])
        if circle:
            return circle
    return None


def test_every_package_imports_only_the_layers_below_it():
    modules = sum(len(modules_of(ROOT, package)) for package in MAY_IMPORT)
    assert modules > 200  # the walk found every package, migrations and commands included
    assert any(p.parent.name == "migrations" for p in modules_of(ROOT, "clusters"))
    assert ROOT / "cli" / "runcrate_cli" / "mcp_server.py" in modules_of(ROOT, "runcrate_cli")

    assert violations(ROOT) == []


def test_there_is_no_import_circle_between_packages():
    graph = package_graph(ROOT)
    assert graph["config"] >= {"accounts", "offers", "billing", "clusters"}  # the graph is read

    assert find_circle(graph) is None


def test_the_walk_sees_imports_inside_functions(tmp_path):
    module = tmp_path / "sample.py"
    module.write_text("def f():\n    from clusters import lifecycle\n    import clusters.models\n")

    assert imported_modules(module) == [(2, "clusters"), (3, "clusters.models")]


def test_the_walk_resolves_relative_imports(tmp_path):
    (tmp_path / "billing" / "sub").mkdir(parents=True)
    (tmp_path / "billing" / "__init__.py").write_text("")
    (tmp_path / "billing" / "sub" / "__init__.py").write_text("")
    module = tmp_path / "billing" / "sub" / "meter.py"
    module.write_text("from . import rates\nfrom ..ledger import credit\nfrom .. import models\n")

    assert imported_modules(module) == [
        (1, "billing.sub"),
        (2, "billing.ledger"),
        (3, "billing"),
    ]


def test_it_fails_on_an_import_up_the_layers_even_inside_a_function(tmp_path):
    for package in MAY_IMPORT:
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "runcrate" / "api.py").write_text(
        "def mount():\n    from clusters.api import router\n"
    )
    (tmp_path / "offers" / "admin.py").write_text("import billing.admin\n")
    (tmp_path / "billing" / "benchmarks.py").write_text("from bench.harness import timed\n")
    (tmp_path / "clusters" / "views.py").write_text("from config import urls\n")
    (tmp_path / "accounts" / "keys.py").write_text("from offers.models import Host\n")
    (tmp_path / "config" / "urls.py").write_text("from clusters.api import router\n")  # allowed

    assert violations(tmp_path) == [
        "runcrate/api.py:2 imports clusters.api",
        "accounts/keys.py:1 imports offers.models",
        "offers/admin.py:1 imports billing.admin",
        "billing/benchmarks.py:1 imports bench.harness",
        "clusters/views.py:1 imports config",
    ]


def test_it_finds_a_circle_between_packages():
    assert find_circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_circle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_circle({"config": {"clusters"}, "clusters": {"config"}}) == [
        "clusters",
        "config",
        "clusters",
    ]
