"""The package is split by where code runs (DESIGN.md): `trainbox.runtime` ships into images and imports only the
standard library and itself at import time (torch and friends only lazily, inside functions); the host side
imports runtime, never the reverse; the image holds the runtime half plus the thin CLI and no host module."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from trainbox.paths import REPO_ROOT

PKG = REPO_ROOT / "python" / "trainbox"
RUNTIME = PKG / "runtime"
# What a workload's environment brings and runtime code may import lazily, inside a function.
LAZY_OK = {"torch", "torch_npu", "ray", "mindspeed", "megatron", "numpy", "triton"}
HOST_MODULES = sorted(p.stem for p in PKG.glob("*.py") if p.stem not in ("__init__", "cli"))


def _imports(path: Path):
    """(module, top_level) for every import in a file, relative imports resolved to absolute names."""
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    pkg = parts[:-1]  # the package a relative import starts from (for __init__.py, its own package)
    tree = ast.parse(path.read_text(), str(path))
    top = set(id(n) for n in tree.body)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, id(node) in top
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg[: len(pkg) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
                if not node.module:  # `from .. import x`: x is a submodule, or a name of the package itself
                    for a in node.names:
                        sub = PKG.parent.joinpath(*mod.split("."), a.name)
                        is_mod = sub.is_dir() or sub.with_suffix(".py").is_file()
                        yield (f"{mod}.{a.name}" if is_mod else mod), id(node) in top
                    continue
            else:
                mod = node.module
            yield mod, id(node) in top


def _runtime_files():
    return sorted(RUNTIME.rglob("*.py"))


@pytest.mark.parametrize("path", _runtime_files(), ids=lambda p: str(p.relative_to(PKG)))
def test_runtime_imports_only_stdlib_and_itself(path):
    bad = []
    for mod, top_level in _imports(path):
        root = mod.split(".")[0]
        if mod == "trainbox" or mod.startswith("trainbox.runtime"):
            continue
        if root == "trainbox":
            bad.append(f"{mod} (a host module: runtime must not import the host side)")
        elif root in sys.stdlib_module_names or root == "__future__":
            continue
        elif root in LAZY_OK and not top_level:
            continue
        else:
            bad.append(f"{mod} ({'at import time' if top_level else 'not a workload package'})")
    assert not bad, f"{path.relative_to(REPO_ROOT)} imports {', '.join(bad)}"


def test_host_modules_reach_runtime_only_through_trainbox_runtime():
    """No host module re-exports a runtime one under its old flat name (one home per module)."""
    runtime_names = {p.stem for p in RUNTIME.glob("*.py")} | {p.name for p in RUNTIME.iterdir() if p.is_dir()}
    clash = runtime_names & set(HOST_MODULES) - {"__init__"}
    assert not clash, f"host modules shadow runtime modules: {sorted(clash)}"


def test_import_rule_catches_a_host_import(tmp_path, monkeypatch):
    """The rule above can fail: a runtime file importing trainbox.render is reported."""
    bad = RUNTIME / "_layout_probe.py"
    bad.write_text("from ..render import render_stack\nfrom .. import render\n")
    try:
        mods = [m for m, _ in _imports(bad)]
        assert mods == ["trainbox.render", "trainbox.render"]
    finally:
        bad.unlink()


def _shipped_tree(tmp_path: Path) -> Path:
    """The package files the rendered Dockerfile copies into an image, laid out as in the image."""
    text = (REPO_ROOT / "build" / "generated" / "cpu" / "Dockerfile").read_text()
    root = tmp_path / "image"
    for m in re.finditer(r"^COPY (python/trainbox\S*(?: python/trainbox\S*)*) /opt/trainbox/python/(\S+)$", text, re.M):
        srcs, dest = m.group(1).split(), root / m.group(2)
        for src in srcs:
            s = REPO_ROOT / src
            if s.is_dir():
                subprocess.run(["cp", "-r", str(s), str(dest)], check=True)
            else:
                dest.mkdir(parents=True, exist_ok=True)
                subprocess.run(["cp", str(s), str(dest)], check=True)
    assert (root / "trainbox" / "runtime" / "doctor" / "core.py").is_file(), "Dockerfile no longer ships runtime"
    return root


def test_image_tree_holds_runtime_and_thin_cli_but_no_host_module(tmp_path):
    root = _shipped_tree(tmp_path)
    shipped = {p.relative_to(root).as_posix() for p in root.rglob("*.py")}
    host = [f"trainbox/{m}.py" for m in HOST_MODULES if f"trainbox/{m}.py" in shipped]
    assert not host, f"host modules shipped into the image: {host}"
    code = (
        "import importlib, pkgutil, sys\n"
        "import trainbox.runtime as r\n"
        "for m in pkgutil.walk_packages(r.__path__, 'trainbox.runtime.'):\n"
        "    if not m.name.endswith('__main__'): importlib.import_module(m.name)\n"
        "try:\n    import trainbox.render\nexcept ImportError:\n    pass\n"
        "else:\n    sys.exit('trainbox.render imported')\n"
        "from trainbox.cli import main\n"
        "sys.exit(main(['doctor', '--quick', '--json']))\n"
    )
    # -S and -I: no site-packages, so jinja2/pydantic/yaml could not be imported even if something tried.
    proc = subprocess.run([sys.executable, "-S", "-I", "-c", f"import sys; sys.path.insert(0, {str(root)!r})\n" + code],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode in (0, 1), proc.stderr  # 1: a check failed on this host, which is fine
    assert '"schema": 1' in proc.stdout


def test_runtime_doctor_runs_as_a_module():
    proc = subprocess.run([sys.executable, "-m", "trainbox.runtime.doctor", "--quick", "--json"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode in (0, 1), proc.stderr
    assert '"schema": 1' in proc.stdout
    bad = subprocess.run([sys.executable, "-m", "trainbox.runtime.doctor", "--bogus"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "unrecognized arguments" in bad.stderr
