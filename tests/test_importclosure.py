"""trainbox.runtime.importclosure: the static import closure of an entry, on synthetic trees (no Docker)."""

from __future__ import annotations

import ast
import importlib
import sys
import textwrap

import pytest

from trainbox.runtime.deviceonly import DEVICE_ONLY, device_only
from trainbox.runtime.importclosure import distribution, module_edges, walk


def edges(src: str, package: str | None = None, is_main: bool = False) -> dict[str, bool]:
    """module -> optional, for each import the module runs at load."""
    return {e.module: e.optional for e in module_edges(ast.parse(textwrap.dedent(src)), package, is_main)}


def test_required_and_optional_imports_are_told_apart():
    got = edges("""
        import a
        from b import c
        try:
            import opt_a
        except ImportError:
            import opt_fallback
        try:
            import req_in_try
        except ValueError:
            pass
        try:
            import opt_broad
        except (OSError, Exception):
            pass
        if x:
            import opt_if
        else:
            import opt_else
        if TYPE_CHECKING:
            import never_at_run_time
        def f():
            import lazy
        class K:
            import in_class_body
        with ctx():
            import in_with
        with suppress(ImportError):
            import opt_suppressed
        with contextlib.suppress(ValueError):
            import req_suppress_other
        for _ in y:
            import in_loop
        if __name__ == "__main__":
            import main_only
    """)
    assert got == {"a": False, "b": False, "opt_a": True, "opt_fallback": True, "req_in_try": False,
                   "opt_broad": True, "opt_if": True, "opt_else": True, "in_class_body": False, "in_with": False,
                   "opt_suppressed": True, "req_suppress_other": False, "in_loop": True}
    assert edges("if __name__ == '__main__':\n    import main_only\n", is_main=True) == {"main_only": False}


def test_relative_imports_resolve_against_the_package():
    assert set(edges("from . import x\nfrom .y import z\nfrom ..w import v\n", package="p.q")) == \
        {"p.q", "p.q.y", "p.w"}
    assert set(edges("from .mod import a\n", package=None)) == set()  # a script: not ours to judge


@pytest.fixture
def tree(tmp_path, monkeypatch):
    def write(rel: str, text: str = "") -> None:
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))

    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    write.root = tmp_path
    return write


def test_a_module_missing_deep_in_the_closure_is_named_with_its_importer_and_chain(tree):
    tree("fw/__init__.py", "from fw.train import main\n")
    tree("fw/train.py", "import os\nfrom fw import data\n")
    tree("fw/data/__init__.py", "from .loader import load\n")
    tree("fw/data/loader.py", "import json\n\nimport zz_missing_pkg.sub\n")
    tree("entry.py", "from fw import train\ntrain.main()\n")
    c = walk(script=str(tree.root / "entry.py"))
    assert not c.ok
    assert [m["module"] for m in c.missing] == ["zz_missing_pkg"]  # the shortest missing prefix
    m = c.missing[0]
    assert m["imported_by"] == [f"{tree.root / 'fw' / 'data' / 'loader.py'}:3"]
    assert m["chain"] == ["__main__", "fw.train", "fw.data", "fw.data.loader"]  # first reached through these
    assert set(c.modules) == {"__main__", "fw", "fw.train", "fw.data", "fw.data.loader"}


def test_names_that_are_not_submodules_and_run_time_modules_are_not_judged(tree):
    tree("lib/__init__.py", "VALUE = 1\n")
    tree("plain.py", "class moves: pass\n")
    tree("entry.py", "from lib import VALUE\nfrom plain import moves\nimport plain.moves.urllib\n")
    c = walk(script=str(tree.root / "entry.py"))
    assert c.ok, c.missing


def test_a_bare_folder_is_not_the_package(tree):
    """A checkout's data folder named like a library (no __init__.py) imports as a namespace package and has no
    names: `from datasets import load_dataset` would fail at run time."""
    tree("zzdatasets/readme.txt", "data, not code\n")
    tree("entry.py", "from zzdatasets import load_dataset\n")
    c = walk(script=str(tree.root / "entry.py"))
    assert [m["module"] for m in c.missing] == ["zzdatasets.load_dataset"]
    assert "folder without __init__.py" in c.missing[0]["error"]


def test_device_only_modules_are_neither_required_nor_followed(tree):
    tree("torch_npu/__init__.py", "import zz_needs_cann_runtime\n")  # what a real torch_npu would do
    tree("entry.py", "import torch_npu\nimport acl\nfrom torch_npu.contrib import x\n")
    c = walk(script=str(tree.root / "entry.py"))
    assert c.ok and c.device_only == ["torch_npu", "acl"] and "torch_npu" not in c.modules


def test_module_entry_runs_parents_and_main(tree):
    tree("app/__init__.py", "")
    tree("app/cli/__init__.py", "import zz_missing_in_parent\n")
    tree("app/cli/run.py", "if __name__ == '__main__':\n    import zz_missing_in_main\n")
    c = walk(module="app.cli.run")
    assert [m["module"] for m in c.missing] == ["zz_missing_in_parent", "zz_missing_in_main"]
    assert [m["module"] for m in walk(module="zz_not_there.x").missing] == ["zz_not_there"]


def test_a_source_that_does_not_parse_fails(tree):
    tree("broken.py", "def f(:\n")
    tree("entry.py", "import broken\n")
    c = walk(script=str(tree.root / "entry.py"))
    assert not c.ok and c.unreadable[0]["module"] == "broken" and "SyntaxError" in c.unreadable[0]["error"]


def test_standard_library_is_not_walked_and_real_packages_resolve():
    c = walk(module="trainbox.runtime.argcheck")
    assert c.ok and "json" not in c.modules and "trainbox.runtime.deviceonly" in c.modules


def test_the_device_only_list_is_short_and_covers_submodules():
    assert len(DEVICE_ONLY) <= 25 and all(why.strip() for why in DEVICE_ONLY.values())
    assert device_only("torch_npu._C") == "torch_npu" and device_only("torch") is None
    assert device_only("sglang") is None and device_only("torch_npu_x") is None
    assert distribution("yaml") == "PyYAML" and distribution("ray.serve.api") == "ray[serve]"
    assert distribution("zz_unknown_module") is None
    assert sys.modules.get("acl") is None


def test_namespace_packages_nest_without_being_imported(tree):
    """megatron/ is a namespace package (megatron-core's megatron.core beside a tree's megatron.training): a
    namespace inside a namespace resolves though nothing is imported (the import system's own finder wants the
    parent in sys.modules)."""
    tree("zzmeg/inner/mod.py", "import json\n")
    tree("entry.py", "import zzmeg.inner.mod\nfrom zzmeg.inner import mod\n")
    c = walk(script=str(tree.root / "entry.py"))
    assert c.ok, c.missing
    assert {"zzmeg", "zzmeg.inner", "zzmeg.inner.mod"} <= set(c.modules) and "zzmeg" not in sys.modules


def test_what_ray_puts_on_sys_path_at_import_resolves_once_ray_is_reached(tree):
    # ray/__init__.py inserts ray/thirdparty_files into sys.path (its vendored colorama, psutil, ...): a stand-in
    # ray of that shape; the same module outside such a package stays missing
    tree("ray/__init__.py", "from ray import worker\n")
    tree("ray/worker.py", "import zz_vendored\n")
    tree("ray/thirdparty_files/zz_vendored.py", "")
    tree("entry.py", "import ray\n")
    c = walk(script=str(tree.root / "entry.py"))
    assert c.ok, c.missing
    assert "zz_vendored" in c.modules
    tree("other.py", "import zz_vendored\n")
    c = walk(script=str(tree.root / "other.py"))
    assert [m["module"] for m in c.missing] == ["zz_vendored"]


def test_what_setuptools_puts_on_sys_path_at_import_resolves_once_setuptools_is_reached(tree):
    # setuptools/__init__.py appends setuptools/_vendor (jaraco, more_itertools, ...) to sys.path; megatron.core
    # reaches it through torch.utils.cpp_extension (the relax image's closure showed both as missing without this)
    tree("setuptools/__init__.py", "from setuptools import dist\n")
    tree("setuptools/dist.py", "import zz_more_itertools\nfrom zz_jaraco.functools import pass_none\n")
    tree("setuptools/_vendor/zz_more_itertools/__init__.py", "")
    tree("setuptools/_vendor/zz_jaraco/functools/__init__.py", "")
    tree("entry.py", "import setuptools\n")
    c = walk(script=str(tree.root / "entry.py"))
    assert c.ok, c.missing
    assert {"zz_more_itertools", "zz_jaraco.functools"} <= set(c.modules)
