"""Twinkle's SP fix (PR #208, f3c953de) and the MindSpeed it runs on.

The PR keeps MindSpeed's Triton chunk_gated_delta_rule under sequence parallelism: Twinkle's
src/twinkle/kernel/chunk_gated_delta_rule.py imports seven modules of mindspeed.lite.ops.triton. It does so inside a
try block of monkey_patch_npu.apply_npu_patch, so a MindSpeed without them does not fail: Twinkle silently keeps
FLA's kernel, the bug the PR fixes, and no import check would see it. core_r0.15.3 (d0d5809) lacks two of the
modules; patches/mindspeed adds them. This checks, on the real trees from ../shared/upstream, that every name the PR
imports from MindSpeed is defined by the patched tree, and is not by the pristine one (so the check can fail).
"""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

import pytest

from trainbox.paths import REPO_ROOT
from trainbox.runtime.apply_patches import apply_series, load_series
from upstream_helpers import checkout

TWINKLE_SP = "f3c953de2073fc1713f1ba917f73449d636e5a36"
KERNEL = "src/twinkle/kernel/chunk_gated_delta_rule.py"
PREFIX = "mindspeed.lite.ops.triton"


def _imports(kernel: Path) -> dict[str, set[str]]:
    """{module: names} for every `from mindspeed.lite.ops.triton.X import ...` of the kernel module."""
    out: dict[str, set[str]] = {}
    for node in ast.walk(ast.parse(kernel.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(PREFIX):
            out.setdefault(node.module, set()).update(a.name for a in node.names)
    return out


def _top_level(body: list[ast.stmt]):
    """Statements that run at import: the module body and the branches of its if / try / with blocks."""
    for node in body:
        yield node
        if isinstance(node, (ast.If, ast.Try, ast.With)):
            yield from _top_level(node.body)
            yield from _top_level(getattr(node, "orelse", []))
            yield from _top_level(getattr(node, "finalbody", []))
            for h in getattr(node, "handlers", []):
                yield from _top_level(h.body)


def _defined(module_file: Path) -> set[str]:
    """Names a module defines at import (functions, classes, assignments, its own imports)."""
    names: set[str] = set()
    for node in _top_level(ast.parse(module_file.read_text()).body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def _missing(mindspeed: Path, wanted: dict[str, set[str]]) -> list[str]:
    missing = []
    for module, names in sorted(wanted.items()):
        parts = module.split(".")
        pkg = mindspeed.joinpath(*parts[:-1])
        f = pkg / f"{parts[-1]}.py"
        if not (pkg / "__init__.py").is_file():
            missing.append(f"{'.'.join(parts[:-1])}: not a package (no __init__.py)")
        if not f.is_file():
            missing.append(f"{module}: no such module")
            continue
        missing += [f"{module}.{n}" for n in sorted(names - _defined(f))]
    return missing


@pytest.fixture(scope="module")
def trees(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sp")
    twinkle = checkout("twinkle", tmp)
    subprocess.run(["git", "-C", str(twinkle), "checkout", "-q", TWINKLE_SP], check=True, capture_output=True)
    return twinkle, checkout("MindSpeed", tmp)


@pytest.mark.slow
def test_patched_mindspeed_defines_every_name_the_sp_fix_imports(trees):
    twinkle, mindspeed = trees
    wanted = _imports(twinkle / KERNEL)
    assert len(wanted) == 7, wanted  # chunk_delta_h, chunk_o, chunk_scaled_dot_kkt, cumsum, solve_tril, utils, wy_fast
    pristine = _missing(mindspeed, wanted)
    # core_r0.15.3 as published: the two modules the PR needs are absent and the folder is no package
    assert f"{PREFIX}.chunk_delta_h: no such module" in pristine
    assert f"{PREFIX}.chunk_scaled_dot_kkt: no such module" in pristine
    assert f"{PREFIX}: not a package (no __init__.py)" in pristine
    results = apply_series(load_series(REPO_ROOT / "patches" / "mindspeed"), mindspeed, strict=True)
    assert all(r.status == "clean" for r in results), [(r.name, r.status, r.detail) for r in results]
    assert _missing(mindspeed, wanted) == []


def test_sp_recipe_runs_the_image_tree_at_the_pr_merge():
    """twinkle-a3 pins Twinkle at the PR's merge, and the recipe's default is that tree's script, with the
    script's own layout (4 ranks: DeviceGroup ranks 0-3, torchrun --nproc_per_node=4)."""
    from trainbox.launch.recipe import load_recipe
    from trainbox.specs.stack import load_stack

    stack = load_stack("twinkle-a3")
    assert stack.components["twinkle"].commit == TWINKLE_SP
    r = load_recipe("twinkle-fsdp-ulysses-qwen35-4b-4a3")
    assert r.stack == "twinkle-a3" and r.devices_per_node == 4 and r.code.component == "twinkle"
    assert r.command == ["sp_fsdp_dense.py"]
    assert "2f01c452" not in r.model_dump_json()  # no leftover of the pre-PR tree
