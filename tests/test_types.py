"""Types without escapes (docs/architecture.md, "Types"): mypy reads every product package, and
the product holds at most MAX_IGNORES `type: ignore`, each with its error code and a comment
that names the library whose typing it works around. Code-reading tests, like the layers'."""

import importlib.metadata
import io
import re
import tokenize
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.test_layers import FOLDER, MAY_IMPORT, ROOT, modules_of

MAX_IGNORES = 3
IGNORE = re.compile(r"#\s*type:\s*ignore\b(?P<code>\[[\w-]+(?:,\s*[\w-]+)*\])?(?P<rest>.*)")


@dataclass(frozen=True)
class Ignore:
    where: str
    code: str  # "[override]", or "" for a bare ignore
    reason: str  # the comment beside it and the comment lines just above it


def ignores_in(source: str, where: str) -> list[Ignore]:
    """Every `type: ignore` comment of `source` (comments only: a string that mentions one is
    no ignore), with its reason."""
    lines = source.splitlines()
    found = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        match = token.type == tokenize.COMMENT and IGNORE.search(token.string)
        if not match:
            continue
        row = token.start[0]
        above = []
        for line in reversed(lines[: row - 1]):
            if not line.strip().startswith("#"):
                break
            above.insert(0, line.strip().lstrip("#").strip())
        beside = match["rest"].strip().lstrip("#").strip()
        found.append(Ignore(f"{where}:{row}", match["code"] or "", " ".join([*above, beside])))
    return found


def product_ignores() -> list[Ignore]:
    found = []
    for package in MAY_IMPORT:
        for path in modules_of(ROOT, package):
            if "migrations" not in path.parts:
                found += ignores_in(path.read_text(), str(path.relative_to(ROOT)))
    return found


def libraries() -> set[str]:
    """The names a reason may give a library by: every installed distribution and top-level
    module, ours left out."""
    names = set()
    for module, distributions in importlib.metadata.packages_distributions().items():
        names |= {module.lower(), *(d.lower() for d in distributions)}
    return names - set(MAY_IMPORT)


def unexplained(ignores: list[Ignore], known: set[str]) -> list[str]:
    """The ignores without an error code or without a library named in their reason."""
    return [
        ignore.where
        for ignore in ignores
        if not ignore.code or not set(re.findall(r"[\w.-]+", ignore.reason.lower())) & known
    ]


# --- the product -------------------------------------------------------------------------------


def test_the_product_holds_at_most_three_ignores():
    found = product_ignores()
    assert len(found) <= MAX_IGNORES, "\n".join(f"{i.where} {i.code}" for i in found)


def test_every_ignore_names_its_code_and_the_library_it_works_around():
    assert unexplained(product_ignores(), libraries()) == []


def test_mypy_reads_every_product_package():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    product = {str(FOLDER.get(package, Path(package))) for package in MAY_IMPORT}

    assert product <= set(config["files"])
    assert config["exclude"] == ["/migrations/"]  # nothing else of the product left out
    assert config["warn_unused_ignores"] is True


# --- the checks themselves ---------------------------------------------------------------------


def test_it_reads_the_reason_beside_and_above_and_no_string():
    source = (
        "x = 1\n"
        "# kombu's two bases name the argument differently:\n"
        "# an override matches one of them.\n"
        "def f(): ...  # type: ignore[override]\n"
        "y = f()  # type: ignore[attr-defined]  # django-stubs lack it\n"
        'z = "# type: ignore"\n'
        "w = 2  # type: ignore\n"
    )

    found = ignores_in(source, "m.py")

    assert [(i.where, i.code) for i in found] == [
        ("m.py:4", "[override]"),
        ("m.py:5", "[attr-defined]"),
        ("m.py:7", ""),
    ]
    assert found[0].reason.startswith("kombu's two bases")
    assert found[1].reason == "django-stubs lack it"
    assert unexplained(found, {"kombu", "django-stubs"}) == ["m.py:7"]


@pytest.mark.parametrize(
    "line",
    [
        "x = f()  # type: ignore[misc]  # ambiguous",  # no library named
        "x = f()  # type: ignore  # django-stubs",  # no code
        "x = f()  # type: ignore[misc]",  # nothing said
    ],
)
def test_an_ignore_without_its_code_or_library_is_caught(line):
    assert unexplained(ignores_in(line + "\n", "m.py"), {"django-stubs", "django"}) == ["m.py:1"]


def test_a_fourth_ignore_is_caught():
    source = "".join(f"x{n} = f()  # type: ignore[misc]  # django\n" for n in range(4))

    assert len(ignores_in(source, "m.py")) == MAX_IGNORES + 1
