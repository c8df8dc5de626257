"""The package is split by where code runs (DESIGN.md): `trainbox.runtime` ships into images and imports only the
standard library and itself at import time (torch and friends only lazily, inside functions); the host side
imports runtime, never the reverse; the image holds the runtime half plus the thin CLI and no host module.
Imports flow one way: no circle among the package's modules, imports inside functions counted too; and the host
side's stages in order (specs <- supply <- image <- launch <- smoke <- commands <- cli), none importing a later one."""

from __future__ import annotations

import ast
import functools
import re
import subprocess
import sys
from pathlib import Path

import pytest

from trainbox.paths import REPO_ROOT

PKG = REPO_ROOT / "python" / "trainbox"
RUNTIME = PKG / "runtime"
# What a workload's environment brings and runtime code may import lazily, inside a function.
# transformers and tokenizers: trainbox.runtime.trialkit makes a trial's tiny model and tokenizer with the image's own.
LAZY_OK = {"torch", "torch_npu", "ray", "mindspeed", "megatron", "numpy", "triton", "transformers", "tokenizers"}
#: The host side's stages, in the order the pipeline runs them: a module may import its own stage and the ones
#: before it, never a later one. `ground` is what every stage stands on; `runtime` is apart (any stage may import
#: it, and it imports only itself: the test above).
STAGES = ("ground", "specs", "supply", "image", "launch", "smoke", "commands", "cli")
GROUND = {"trainbox", "trainbox.paths", "trainbox.yamlfile", "trainbox.templating"}
#: Every host module, dotted (what an image must not hold).
HOST_MODULES = sorted(".".join(p.relative_to(PKG.parent).with_suffix("").parts) for p in PKG.rglob("*.py")
                      if "runtime" not in p.relative_to(PKG).parts and p.name != "__init__.py"
                      and p.relative_to(PKG).as_posix() not in ("cli.py", "commands/_args.py", "commands/doctor.py"))


def _imports(path: Path, root: Path = PKG) -> tuple[tuple[str, bool], ...]:
    """(module, top_level) for every import in a file of the package at `root`, relative imports resolved to
    absolute names. Read once per file version: several tests here walk the whole package."""
    return _imports_of(path, root, path.stat().st_mtime_ns)


@functools.cache
def _imports_of(path: Path, root: Path, _mtime_ns: int) -> tuple[tuple[str, bool], ...]:
    return tuple(_walk_imports(path, root))


def _walk_imports(path: Path, root: Path):
    rel = path.relative_to(root.parent).with_suffix("")
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
            else:
                mod = node.module
            for a in node.names:  # `from P import x`: x is a submodule of P, or a name P itself defines
                sub = root.parent.joinpath(*mod.split("."), a.name)
                is_mod = sub.is_dir() or sub.with_suffix(".py").is_file()
                yield (f"{mod}.{a.name}" if is_mod else mod), id(node) in top


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the package's modules it imports, at module level or inside functions alike.

    `root` is a package directory; names are dotted from its parent (`trainbox.image.build`). Importing `a.b.c` also runs
    `a/__init__` and `a/b/__init__`, so those count too, except the importer's own enclosing packages, which are
    already being imported when it runs (an explicit `from . import NAME` of a package-level name still counts)."""
    base = root.parent
    mods = {}
    for p in sorted(root.rglob("*.py")):
        rel = p.relative_to(base).with_suffix("").parts
        mods[".".join(rel[:-1] if rel[-1] == "__init__" else rel)] = p
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        own_pkgs = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
        if path.name == "__init__.py":
            own_pkgs.add(name)
        edges = graph.setdefault(name, set())
        for target, _ in _imports(path, root):
            parts = target.split(".")
            for i in range(1, len(parts) + 1):
                mod = ".".join(parts[:i])
                explicit = i == len(parts)
                if mod in mods and mod != name and (explicit or mod not in own_pkgs):
                    edges.add(mod)
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of two or more modules (Tarjan), each sorted; the groups sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def _runtime_files():
    return sorted(RUNTIME.rglob("*.py"))


def runtime_import_problems(path: Path, root: Path = PKG) -> list[str]:
    """What a runtime file of the package at `root` imports that it must not: the rule the test below applies."""
    bad = []
    for mod, top_level in _imports(path, root):
        top = mod.split(".")[0]
        if mod == "trainbox" or mod.startswith("trainbox.runtime"):
            continue
        if top == "trainbox":
            bad.append(f"{mod} (a host module: runtime must not import the host side)")
        elif top in sys.stdlib_module_names or top == "__future__":
            continue
        elif top in LAZY_OK and not top_level:
            continue
        else:
            bad.append(f"{mod} ({'at import time' if top_level else 'not a workload package'})")
    return bad


@pytest.mark.parametrize("path", _runtime_files(), ids=lambda p: str(p.relative_to(PKG)))
def test_runtime_imports_only_stdlib_and_itself(path):
    bad = runtime_import_problems(path)
    assert not bad, f"{path.relative_to(REPO_ROOT)} imports {', '.join(bad)}"


def test_host_modules_reach_runtime_only_through_trainbox_runtime():
    """No host module re-exports a runtime one under its old flat name (one home per module)."""
    runtime_names = {p.stem for p in RUNTIME.glob("*.py")} | {p.name for p in RUNTIME.iterdir() if p.is_dir()}
    clash = runtime_names & {m.rsplit(".", 1)[1] for m in HOST_MODULES} - {"__init__"}
    assert not clash, f"host modules shadow runtime modules: {sorted(clash)}"


def test_import_rule_catches_a_host_import(tmp_path):
    """The rule above can fail: in a copy of the package (never the source tree), a runtime file importing a host
    module (relatively, absolutely, inside a function), a third-party package at import time, or a workload package
    at import time is reported; the copy's own runtime files pass as the real ones do."""
    import shutil

    copy = tmp_path / "trainbox"
    shutil.copytree(PKG, copy, ignore=shutil.ignore_patterns("__pycache__"))
    probe = copy / "runtime" / "_layout_probe.py"
    probe.write_text("import os\nimport json\nfrom ..image.render import render_stack\nfrom ..image import render\n"
                     "import yaml\nimport torch\n\n\ndef later():\n    import torch\n    from trainbox.image import build\n"
                     "    from . import device\n    return torch, build, device\n")
    bad = runtime_import_problems(probe, copy)
    assert bad == ["trainbox.image.render (a host module: runtime must not import the host side)",
                   "trainbox.image.render (a host module: runtime must not import the host side)",
                   "yaml (at import time)", "torch (at import time)",
                   "trainbox.image.build (a host module: runtime must not import the host side)"], bad
    assert runtime_import_problems(copy / "runtime" / "device.py", copy) == []
    assert not (RUNTIME / "_layout_probe.py").exists()


def test_no_import_circle():
    """One direction of flow: no module reaches itself through imports, those inside functions included (a lazy
    import that dodges a circle at import time is still a circle in the design)."""
    circles = import_circles(import_graph(PKG))
    assert not circles, "import circles in python/trainbox: " + "; ".join(" <-> ".join(c) for c in circles)


def stage_of(module: str) -> str | None:
    """The stage a module of the package belongs to (None: runtime, apart from the stages)."""
    parts = module.split(".")
    if module in GROUND:
        return "ground"
    if parts[1] == "runtime":
        return None
    if parts[1] in ("cli", "cli_reference"):
        return "cli"
    if parts[1] not in STAGES:
        raise AssertionError(f"{module}: in no stage; put it in a stage package, or name it in GROUND")
    return parts[1]


def stage_problems(graph: dict[str, set[str]]) -> list[str]:
    """Every import against the stages' direction: `a -> b` where b's stage comes after a's."""
    bad = []
    for a, targets in sorted(graph.items()):
        sa = stage_of(a)
        for b in sorted(targets):
            sb = stage_of(b)
            if sa is not None and sb is not None and STAGES.index(sb) > STAGES.index(sa):
                bad.append(f"{a} ({sa}) imports {b} ({sb})")
    return bad


def test_imports_follow_the_stages():
    """specs <- supply <- image <- launch <- smoke <- commands <- cli: no stage imports a later one (the model
    never reaches the network, the image build never the launchers), imports inside functions counted too."""
    bad = stage_problems(import_graph(PKG))
    assert not bad, "imports against the stages: " + "; ".join(bad)


def test_stage_rule_catches_an_import_against_the_direction(tmp_path):
    """The rule can fail: in a copy of the package, a spec module that imports supply inside a function, and an
    image module that imports launch, are both reported; the copy's own imports pass as the real ones do."""
    import shutil

    copy = tmp_path / "trainbox"
    shutil.copytree(PKG, copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert stage_problems(import_graph(copy)) == []
    with (copy / "specs" / "kinds.py").open("a") as f:
        f.write("\n\ndef _probe():\n    from ..supply import sources\n    return sources\n")
    with (copy / "image" / "plan.py").open("a") as f:
        f.write("\nfrom trainbox.launch import job  # noqa\n")
    assert stage_problems(import_graph(copy)) == [
        "trainbox.image.plan (image) imports trainbox.launch (launch)",
        "trainbox.image.plan (image) imports trainbox.launch.job (launch)",
        "trainbox.specs.kinds (specs) imports trainbox.supply (supply)",
        "trainbox.specs.kinds (specs) imports trainbox.supply.sources (supply)"]


def _write_tree(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_circle_detector_reports_a_circle_made_on_purpose(tmp_path):
    """The detector can fail: relative, absolute, `from . import sub` and function-level imports all count, and
    the circle is reported with its members; the same package without the closing import has none."""
    files = {
        "pkg/__init__.py": "",
        "pkg/ground.py": "import os\n",
        "pkg/low.py": "from .ground import os\n\ndef f():\n    from pkg.sub import high\n    return high\n",
        "pkg/sub/__init__.py": "",
        "pkg/sub/high.py": "from .. import low\nfrom ..ground import os\n",
        "pkg/side.py": "from pkg import ground\n",
    }
    _write_tree(tmp_path, files)
    graph = import_graph(tmp_path / "pkg")
    assert graph["pkg.low"] == {"pkg.ground", "pkg.sub", "pkg.sub.high"}
    assert graph["pkg.side"] == {"pkg.ground"}
    assert import_circles(graph) == [["pkg.low", "pkg.sub.high"]]

    (tmp_path / "pkg" / "low.py").write_text("from .ground import os\n")  # the closing (lazy) import gone
    assert import_circles(import_graph(tmp_path / "pkg")) == []


def test_circle_detector_counts_a_package_init_it_runs(tmp_path):
    """Importing `pkg.sub.x` runs `pkg/sub/__init__`: a circle through a package's __init__ is reported too,
    while a submodule's own enclosing packages (already importing when it runs) add no edge."""
    _write_tree(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "from pkg.sub.x import thing\n",
        "pkg/sub/__init__.py": "from ..a import other\n",
        "pkg/sub/x.py": "from . import y\nthing = 1\n",
        "pkg/sub/y.py": "",
    })
    graph = import_graph(tmp_path / "pkg")
    assert graph["pkg.sub.x"] == {"pkg.sub.y"}
    assert import_circles(graph) == [["pkg.a", "pkg.sub"]]


def _shipped_tree(tmp_path: Path) -> Path:
    """The package files the rendered Dockerfile copies into an image, laid out as in the image."""
    text = (REPO_ROOT / "build" / "generated" / "cpu" / "Dockerfile").read_text()
    root = tmp_path / "image"
    # the files stage's RUN that assembles the package: python/trainbox mounted at /tmp/ctx, copied to ${pkg}
    run = text[text.index("--mount=type=bind,source=python/trainbox,target=/tmp/ctx"):]
    run = run[:run.index("\n\n")]
    for m in re.finditer(r'cp (?:-R )?((?:/tmp/ctx/\S+ )+)"\$\{pkg\}/(\S*)"', run):
        srcs, dest = m.group(1).split(), root / "trainbox" / m.group(2)
        for src in srcs:
            s = REPO_ROOT / "python" / "trainbox" / src.removeprefix("/tmp/ctx/")
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
    host = [f"{m.replace('.', '/')}.py" for m in HOST_MODULES if f"{m.replace('.', '/')}.py" in shipped]
    assert not host, f"host modules shipped into the image: {host}"
    code = (
        "import importlib, pkgutil, sys\n"
        "import trainbox.runtime as r\n"
        "for m in pkgutil.walk_packages(r.__path__, 'trainbox.runtime.'):\n"
        "    if not m.name.endswith('__main__'): importlib.import_module(m.name)\n"
        "try:\n    import trainbox.image.render\nexcept ImportError:\n    pass\n"
        "else:\n    sys.exit('trainbox.image.render imported')\n"
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


def private_imports(root: Path) -> list[str]:
    """`path:line imports _name from module` for every import, in the package at `root`, of a name another module
    keeps to itself (one `_` in front; dunders are Python's)."""
    bad = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith(root.name)):
                for a in node.names:
                    if a.name.startswith("_") and not a.name.startswith("__"):
                        bad.append(f"{path.relative_to(root)}:{node.lineno} imports {a.name} from "
                                   f"{'.' * node.level}{node.module or ''}")
    return bad


def test_no_import_of_another_modules_private_name():
    """A name that starts with `_` is its module's own: another module importing it reaches past the module's face
    (make it public where two modules need it)."""
    bad = private_imports(PKG)
    assert not bad, "; ".join(bad)


def test_private_import_rule_catches_one_made_on_purpose(tmp_path):
    root = tmp_path / "pkg"
    _write_tree(root, {"__init__.py": "", "a.py": "_secret = 1\n__all__ = []\n",
                       "b.py": "from .a import _secret\nfrom .a import __all__\n",
                       "c.py": "from pkg.a import _secret as s\n", "d.py": "from os import _exit\n"})
    assert private_imports(root) == ["b.py:1 imports _secret from .a", "c.py:1 imports _secret from pkg.a"]
