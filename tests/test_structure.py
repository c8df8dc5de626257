"""The product stays small and mapped: module and function size limits, and the module map (docs/design/architecture.md) matches
the tree (a module added without a row, or a row for a module that is gone, fails here)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PKG = REPO / "python" / "trainbox"
MAX_MODULE_LINES = 700
MAX_FUNCTION_LINES = 80
# Known to be over the limit, each with the change that will split it (none now); only these may be, and a new
# one fails.
KNOWN_LONG: set[str] = set()
#: stage packages whose modules the module map lists one by one
STAGE_ROWS = ("specs", "supply", "image")


def _product_modules() -> list[Path]:
    return sorted(p for p in PKG.rglob("*.py") if "__pycache__" not in p.parts)


def test_no_module_over_the_limit():
    over = [f"{p.relative_to(PKG)} ({p.read_text().count(chr(10))} lines)" for p in _product_modules()
            if p.read_text().count("\n") > MAX_MODULE_LINES]
    assert not over, f"modules over {MAX_MODULE_LINES} lines: {over}; split them by what they do"


def test_no_function_over_the_limit():
    over, long = [], set()
    for p in _product_modules():
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                key = f"{p.relative_to(PKG)}:{node.name}"
                if n > MAX_FUNCTION_LINES:
                    long.add(key)
                    if key not in KNOWN_LONG:
                        over.append(f"{key} ({n} lines)")
    assert not over, f"functions over {MAX_FUNCTION_LINES} lines: {over}"
    # an entry whose function was split (or moved) must go, or it would let a new long one in under its name
    assert not KNOWN_LONG - long, f"KNOWN_LONG names functions no longer over the limit: {sorted(KNOWN_LONG - long)}"


def test_module_map_matches_the_tree():
    readme = (REPO / "docs/design/architecture.md").read_text()
    table = readme.split("## Module map", 1)[1].split("\n\n", 2)[1]
    named: set[str] = set()
    for row in table.splitlines()[2:]:
        cell = row.split("|")[1]
        for name in re.findall(r"`([^`]+)`", cell):
            named.add(name.rstrip("/").removesuffix("/*"))
    # the stage packages' modules each have a row (`specs/stack`), their subpackages too, the package and each of its
    # modules (`image/toolkits`, `image/toolkits/cann`); the other packages one row each (`launch/`)
    tree = {p.stem for p in PKG.glob("*.py") if p.stem != "__init__"} | \
        {p.name for p in PKG.iterdir() if p.is_dir() and (p / "__init__.py").exists() and p.name not in STAGE_ROWS} | \
        {p.relative_to(PKG).with_suffix("").as_posix() for d in STAGE_ROWS for p in (PKG / d).rglob("*.py")
         if p.stem != "__init__"} | \
        {p.parent.relative_to(PKG).as_posix() for d in STAGE_ROWS for p in (PKG / d).glob("*/__init__.py")}
    assert tree - named == set(), f"modules without a row in docs/design/architecture.md's module map: {sorted(tree - named)}"
    assert named - tree == set(), f"module map rows for modules that do not exist: {sorted(named - tree)}"
