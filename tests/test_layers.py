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
        "def mount():\n    from clusters.web.api import router\n"
    )
    (tmp_path / "offers" / "admin.py").write_text("import billing.admin\n")
    (tmp_path / "billing" / "benchmarks.py").write_text("from bench.harness import timed\n")
    (tmp_path / "clusters" / "views.py").write_text("from config import urls\n")
    (tmp_path / "accounts" / "keys.py").write_text("from offers.models import Host\n")
    (tmp_path / "config" / "urls.py").write_text("from clusters.web.api import router\n")  # allowed

    assert violations(tmp_path) == [
        "runcrate/api.py:2 imports clusters.web.api",
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


# --- inside the packages: clusters/ in parts, every module, and imports inside functions ----------

# clusters/ is four packages over a core (docs/architecture.md, "Inside clusters"), lowest first,
# each with the parts of clusters it may import. The core is the app's models and the rules of
# record beside them (connect, volumes, secrets, notifications...); the entry modules are those
# Django and Celery look for at the app's root (the admin, the tasks, the app config, template
# tags, management commands): they stand on top, beside the web.
CLUSTERS_MAY_IMPORT: dict[str, set[str]] = {
    "clusters": set(),
    "clusters.machines": {"clusters"},
    "clusters.lifecycle": {"clusters", "clusters.machines"},
    "clusters.telemetry": {"clusters", "clusters.machines", "clusters.lifecycle"},
    "clusters.web": {"clusters", "clusters.machines", "clusters.lifecycle", "clusters.telemetry"},
    "clusters.entry": {
        "clusters",
        "clusters.machines",
        "clusters.lifecycle",
        "clusters.telemetry",
        "clusters.web",
    },
}
CLUSTERS_ENTRY = ("admin", "apps", "tasks", "templatetags", "management")

# The only imports made inside a function, each with why it cannot be at the top of its module.
IMPORTS_IN_FUNCTIONS: dict[tuple[str, str], str] = {
    ("accounts/apps.py", "ready"): "Django's app loading: the signal receivers connect once the "
    "models are ready",
    ("clusters/apps.py", "ready"): "Django's app loading: the Celery tasks register with the "
    "lifecycle's dispatcher",
    ("audit/__init__.py", "record"): "every app imports the audit log's entry points while "
    "Django's apps are loading; its models load after them",
    ("audit/__init__.py", "system"): "as record",
    ("audit/__init__.py", "note"): "as record",
    ("audit/__init__.py", "change"): "as record: accounts.history.change is the one home",
    ("audit/apps.py", "ready"): "Django's app loading: the receivers connect once the models "
    "are ready",
    ("cli/runcrate_cli/cli.py", "mcp"): "the MCP SDK loads only for `runcrate mcp`, not on every "
    "command",
}


def module_name(root: Path, path: Path) -> str:
    relative = path.relative_to(root)
    if relative.parts[0] == "cli":
        relative = relative.relative_to("cli")
    parts = list(relative.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def product_modules(root: Path) -> dict[str, Path]:
    """Every product module (migrations aside: they import only Django and their app) by name."""
    return {
        module_name(root, path): path
        for package in MAY_IMPORT
        for path in modules_of(root, package)
        if "migrations" not in path.parts
    }


def module_imports(path: Path, modules: dict[str, Path]) -> list[tuple[int, str, str | None]]:
    """Each of our modules `path` imports: (line, module, the function the import is in or
    None). `from package import module` is the module; `from module import name` the module."""
    package = _package_of(path)
    found: list[tuple[int, str, str | None]] = []

    def ours(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    def visit(node: ast.AST, function: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            inside = function
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                inside = function or child.name
            targets: list[str | None] = []
            if isinstance(child, ast.Import):
                targets = [ours(alias.name) for alias in child.names]
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    above = package[: len(package) - (child.level - 1)]
                    base = ".".join([*above, *([child.module] if child.module else [])])
                targets = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else ours(base)
                    for alias in child.names
                ]
            found.extend((child.lineno, target, inside) for target in targets if target)
            visit(child, inside)

    visit(ast.parse(path.read_text(), filename=str(path)), None)
    return found


def clusters_part(module: str) -> str | None:
    """Which part of clusters/ a module is in (CLUSTERS_MAY_IMPORT); None outside clusters."""
    parts = module.split(".")
    if parts[0] != "clusters":
        return None
    if len(parts) > 1 and parts[1] in CLUSTERS_ENTRY:
        return "clusters.entry"
    if len(parts) > 1 and f"clusters.{parts[1]}" in CLUSTERS_MAY_IMPORT:
        return f"clusters.{parts[1]}"
    return "clusters"


def part_violations(root: Path) -> list[str]:
    """`path:line imports module` for each import of one part of clusters/ by a part below it."""
    modules = product_modules(root)
    found = []
    for name, path in modules.items():
        part = clusters_part(name)
        for line, target, _ in module_imports(path, modules):
            imported = clusters_part(target)
            if part and imported and imported != part and imported not in CLUSTERS_MAY_IMPORT[part]:
                found.append(f"{path.relative_to(root)}:{line} imports {target}")
    return found


def module_circles(root: Path) -> list[list[str]]:
    """Every set of two or more product modules that import each other round (Tarjan's
    strongly connected components of the module graph), each sorted."""
    modules = product_modules(root)
    graph = {
        name: {target for _, target, _ in module_imports(path, modules) if target != name}
        for name, path in modules.items()
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def connect(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for imported in sorted(graph[module]):
            if imported not in index:
                connect(imported)
                low[module] = min(low[module], low[imported])
            elif imported in stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            connect(module)
    return circles


def imports_in_functions(root: Path) -> list[tuple[str, str, int, str]]:
    """(path, function, line, module) for each import of ours made inside a function."""
    modules = product_modules(root)
    return [
        (str(path.relative_to(root)), function, line, target)
        for path in modules.values()
        for line, target, function in module_imports(path, modules)
        if function is not None
    ]


def package_lines(root: Path) -> dict[str, int]:
    """Lines of each product package, clusters/ counted by its parts (migrations aside)."""
    lines: dict[str, int] = {}
    for name, path in product_modules(root).items():
        package = clusters_part(name) or name.split(".")[0]
        lines[package] = lines.get(package, 0) + len(path.read_text().splitlines())
    return lines


def test_each_part_of_clusters_imports_only_the_parts_below_it():
    modules = product_modules(ROOT)
    parts = {clusters_part(name) for name in modules} - {None}
    assert parts == set(CLUSTERS_MAY_IMPORT)  # every part has modules, and every module a part

    assert part_violations(ROOT) == []


def test_no_module_of_the_product_imports_itself_round_a_circle():
    assert len(product_modules(ROOT)) > 200

    assert module_circles(ROOT) == []


def test_imports_inside_functions_are_only_the_listed_ones():
    found = {(path, function) for path, function, _, _ in imports_in_functions(ROOT)}

    assert found == set(IMPORTS_IN_FUNCTIONS)


def test_no_package_holds_more_than_35_percent_of_the_product():
    lines = package_lines(ROOT)
    total = sum(lines.values())

    largest = max(lines, key=lambda package: lines[package])
    assert lines[largest] <= 0.35 * total, (largest, lines[largest], total)


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for package in MAY_IMPORT:
        (tmp_path / FOLDER.get(package, Path(package))).mkdir(parents=True, exist_ok=True)
        (tmp_path / FOLDER.get(package, Path(package)) / "__init__.py").write_text("")
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        for folder in path.relative_to(tmp_path).parents:
            if str(folder) != "." and not (tmp_path / folder / "__init__.py").exists():
                (tmp_path / folder / "__init__.py").write_text("")
        path.write_text(text)
    return tmp_path


def test_it_finds_a_part_of_clusters_importing_one_above_it(tmp_path):
    root = _tree(
        tmp_path,
        {
            "clusters/models.py": "",
            "clusters/machines/ssh.py": "from clusters.lifecycle import work\n",
            "clusters/lifecycle/work.py": "from clusters.machines import ssh\n",  # allowed
            "clusters/telemetry/metrics.py": "",
            "clusters/lifecycle/reserve.py": (
                "def f():\n    from clusters.telemetry import metrics\n"
            ),
            "clusters/tasks.py": "from clusters.web import views\n",  # allowed: an entry module
            "clusters/web/views.py": "from clusters.lifecycle import work\n",
        },
    )

    assert sorted(part_violations(root)) == [
        "clusters/lifecycle/reserve.py:2 imports clusters.telemetry.metrics",
        "clusters/machines/ssh.py:1 imports clusters.lifecycle.work",
    ]


def test_it_finds_a_circle_of_modules_and_imports_inside_functions(tmp_path):
    root = _tree(
        tmp_path,
        {
            "clusters/a.py": "from clusters import b\n",
            "clusters/b.py": "def f():\n    from clusters.c import thing\n",
            "clusters/c.py": "import clusters.a\n",
            "clusters/d.py": "from clusters import a\n",  # into the circle, not part of it
            "billing/x.py": "from billing import y\n",
            "billing/y.py": "from billing.x import z\n",
        },
    )

    assert module_circles(root) == [
        ["billing.x", "billing.y"],
        ["clusters.a", "clusters.b", "clusters.c"],
    ]
    assert imports_in_functions(root) == [("clusters/b.py", "f", 2, "clusters.c")]
