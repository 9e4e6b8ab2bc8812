"""The drivers sit below the lifecycle: they are given what they need (plans, the agent's
token) and return what they found; the lifecycle records it. Read from the code, no module
under clusters/machines/ imports the lifecycle, telemetry or the web, not even inside a function
(tests/test_layers.py holds the same for every part of clusters/)."""

import ast
from pathlib import Path

import clusters.machines

DRIVERS = Path(clusters.machines.__file__).parent
ABOVE = ("clusters.lifecycle", "clusters.telemetry", "clusters.web")


def imported(source: str) -> set[str]:
    """Every module an `import` or `from ... import` anywhere in `source` names (`from
    clusters import lifecycle` names clusters.lifecycle too)."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def reaches_up(names: set[str]) -> list[str]:
    return sorted(n for n in names if any(n == a or n.startswith(a + ".") for a in ABOVE))


def test_it_finds_an_import_of_the_lifecycle_however_it_is_written():
    source = (
        "import clusters.telemetry.agent_service\n"
        "def start():\n"
        "    from clusters.lifecycle import agent_token\n"
        "    from clusters import lifecycle\n"
        "from clusters import connect\n"
        "from clusters.lifecycles import x\n"
    )
    assert reaches_up(imported(source)) == [
        "clusters.lifecycle",
        "clusters.lifecycle.agent_token",
        "clusters.telemetry.agent_service",
    ]


def test_it_reads_every_driver_module():
    modules = {p.name for p in DRIVERS.glob("*.py")}
    assert {"__init__.py", "base.py", "simulated.py", "ssh.py", "registry.py"} <= modules


def test_no_driver_imports_the_lifecycle_telemetry_or_the_web():
    found = {
        path.name: reaches_up(imported(path.read_text())) for path in sorted(DRIVERS.rglob("*.py"))
    }
    assert {name: names for name, names in found.items() if names} == {}
