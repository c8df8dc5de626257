"""What Relax's training entry imports from outside Relax (tests/data/relax-entry-imports.yaml, listed from Relax's
files at the commit the relax recipes run) resolves in the relax image, with everything those modules import in
turn: the import closure from the list's frontier, as trainbox.runtime.importclosure follows it, stand-ins only from
the device-only list. The list is made again from a checkout of the listed commit (../shared/upstream's Relax.git, or
TRAINBOX_RELAX_TREE=DIR) and must be the same. Relax itself is in the relax image now (tests/test_relax_image.py
imports its entry there); this list is what a mounted checkout of that commit needs from the image."""

from __future__ import annotations

import ast
import json
import os
import sys
from pathlib import Path

import pytest
import yaml

DATA = Path(__file__).parent / "data" / "relax-entry-imports.yaml"
LISTED = yaml.safe_load(DATA.read_text())
SEED = yaml.safe_load((Path(__file__).parent / "data" / "relax-pr52-seed.yaml").read_text())
# listed imports the relax stack does not hold yet, each with where it comes from; one that resolves fails the
# test (the list is then stale: move the module out of it)
# the relax image's git sources (../shared/upstream): Relax, its TransferQueue fork, MindSpeed and Megatron-LM
RELAX_REPOS = ("Relax", "TransferQueue", "MindSpeed", "Megatron-LM")
PENDING: dict[str, str] = {}
# missing on this runner only, with why; one that resolves fails the test (drop it here and from the smoke's
# expect_fail)
RUNNER_GAPS = {"torchvision": "sglang 0.5.10's sglang.srt.utils.common imports it; no CPU torchvision here "
                              "(PyPI's x86_64 build is CUDA's: it fails beside a CPU torch)"}  # sglang (0.5.10 for NPU) and sglang_router (0.3.2) are in the stack since issue 35


def external_imports(tree: Path) -> tuple[dict[str, dict], int]:
    """Relax's required imports of modules outside Relax, over the Relax modules its entry reaches, read from
    `tree` (a checkout: its relax/ package) with only the standard library and trainbox on sys.path."""
    from trainbox.runtime import importclosure as ic

    saved = sys.path[:]
    sys.path[:] = [str(tree)] + [p for p in saved if "-packages" not in p and p not in ("", ".")]
    try:
        closure = ic.walk(module=LISTED["entry"])
    finally:
        sys.path[:] = saved
    own = {m: f for m, f in closure.modules.items() if f and (m == "relax" or m.startswith("relax."))}
    found: dict[str, dict] = {}
    for mod, file in sorted(own.items()):
        package = mod if file.endswith("__init__.py") else mod.rpartition(".")[0]
        for e in ic.module_edges(ast.parse(Path(file).read_bytes(), file), package, mod == LISTED["entry"]):
            if e.optional or ic._is_stdlib(e.module) or e.module == "relax" or e.module.startswith("relax."):
                continue
            row = found.setdefault(e.module, {"at": f"{os.path.relpath(file, tree)}:{e.line}", "names": []})
            row["names"] = sorted(set(row["names"]) | set(e.names))
    return {m: {k: v for k, v in row.items() if v} for m, row in found.items()}, len(own)


def test_the_list_is_of_the_commit_the_recipes_follow():
    assert LISTED["commit"] == SEED["commit"] and LISTED["repo"] == SEED["repo"]
    assert LISTED["entry"] == "relax.entrypoints.train"
    names = set(LISTED["imports"])
    # what the entry itself takes: Ray with Serve (ray[serve]), yaml; Relax's own services: fastapi, pydantic
    assert {"ray", "yaml", "fastapi", "pydantic", "transformers", "megatron.core"} <= names
    assert "serve" in LISTED["imports"]["ray"]["names"]
    assert {p for p in PENDING if any(n == p or n.startswith(p + ".") for n in names)} == set(PENDING)


def test_the_list_is_what_the_tree_imports(tmp_path):
    from upstream_helpers import checkout, find_shared_upstream

    if os.environ.get("TRAINBOX_RELAX_TREE"):
        tree = Path(os.environ["TRAINBOX_RELAX_TREE"])
    elif find_shared_upstream() is not None:
        tree = checkout("Relax", tmp_path)
    else:
        pytest.skip("no Relax checkout: ../shared/upstream is missing and TRAINBOX_RELAX_TREE is not set")
    found, reached = external_imports(tree)
    assert reached == LISTED["relax_modules"]
    assert found == LISTED["imports"]


# -- in the image ---------------------------------------------------------------------------------------------

PROBE = r"""
import json, sys
from trainbox.runtime import importclosure as ic
listed = json.loads(sys.argv[1])
r = ic.Resolver()
missing = {}
for mod, row in listed.items():
    gone = r.first_missing(mod)
    if gone:
        missing.setdefault(gone, mod)
        continue
    for sub in [mod] + [f"{mod}.{n}" for n in row.get("names", []) if r.find(f"{mod}.{n}") is not None]:
        c = ic.walk(module=sub)  # the module's own closure: what loading it needs
        for m in c.missing:
            missing.setdefault(m["module"], f"{sub} (via {' -> '.join(m['chain'][-3:])}, {m['imported_by'][0]})")
print(json.dumps(missing))
"""


@pytest.mark.docker
@pytest.mark.slow
def test_relax_s_entry_imports_resolve_in_the_relax_image(tmp_path_factory):
    from test_cpu_mode_docker import _image, python_in
    from upstream_helpers import find_shared_upstream

    if find_shared_upstream() is None:
        pytest.skip("../shared/upstream is missing")
    images = _image("relax", RELAX_REPOS, tmp_path_factory)
    tag = next(images)
    try:
        proc = python_in(tag, PROBE, json.dumps(LISTED["imports"]), env={"TRAINBOX_DEVICE": "cpu"}, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        missing = json.loads(proc.stdout.strip().splitlines()[-1])
        pending = {m: why for m, why in missing.items() if m.split(".")[0] in PENDING}
        assert set(pending) == set(PENDING), f"resolve now, drop them from PENDING: {set(PENDING) - set(pending)}"
        gaps = {m for m in missing if m.split(".")[0] in RUNNER_GAPS}
        assert gaps == set(RUNNER_GAPS), f"resolves now, drop it from RUNNER_GAPS: {set(RUNNER_GAPS) - gaps}"
        rest = {m: why for m, why in missing.items() if m not in pending and m not in gaps}
        assert not rest, "missing in the relax image:\n  " + "\n  ".join(f"{m}: {w}" for m, w in rest.items())
    finally:
        next(images, None)
