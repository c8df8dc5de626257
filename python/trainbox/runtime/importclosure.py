"""The import closure of an entry, found without running it (stdlib only).

Every module the entry reaches through imports that run when it is loaded: its own top-level imports, then the
same of each module they name, through the framework's own tree and the packages it imports, including the
parent packages of a dotted name and `from pkg import sub` submodules. Nothing is imported: module names are
resolved with the import system's own finders (a parent's search path from its spec, not from importing it),
and sources are read with `ast`.

What counts as required (decided here, and what the report says):
  required  an import statement that runs whenever the module loads: at module level, in a class body, in a
            `with` block, in a `try` whose handlers do not catch ImportError (or a base of it); in the entry
            script, also under `if __name__ == "__main__"`. A missing one fails the check, naming the module,
            the file and line that import it, the chain from the entry and, where known, the distribution.
  optional  an import under `if`/`else`, a loop, or a `try` that catches ImportError: the author's choice of
            an optional dependency. It is resolved, and a missing one is listed (not a failure); its own
            imports are not followed.
  not read  imports inside functions (late, by the author's choice; the args check runs the real parse path),
            under `if TYPE_CHECKING`, and the standard library.
Modules in trainbox.runtime.deviceonly.DEVICE_ONLY are neither required nor followed (they need the device).
"""

from __future__ import annotations

import ast
import importlib.machinery
import os
import sys
from dataclasses import dataclass, field

from .deviceonly import device_only

# the PyPI distribution for import names whose distribution is named otherwise, or that a missing package
# cannot tell (importlib.metadata knows only what is installed)
DISTRIBUTIONS = {
    "yaml": "PyYAML", "PIL": "pillow", "cv2": "opencv-python", "sklearn": "scikit-learn", "google.protobuf":
    "protobuf", "attr": "attrs", "dateutil": "python-dateutil", "zmq": "pyzmq", "sglang_router": "sglang-router",
    "megatron.bridge": "megatron-bridge", "megatron.core": "megatron-core", "mcore_bridge": "mcore-bridge",
    "ray.serve": "ray[serve]", "modelscope": "modelscope", "addict": "addict", "sglang": "sglang",
    "transformer_engine": "transformer-engine", "flash_attn": "flash-attn", "fla": "flash-linear-attention",
    "mindspeed": "mindspeed (git: Ascend/MindSpeed)", "swift": "ms-swift", "torch_npu": "torch-npu",
    "torchvision": "torchvision",
}
_CATCHES_IMPORT_ERROR = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}


@dataclass
class Edge:
    module: str  # absolute module name
    names: tuple[str, ...]  # `from module import names` (empty for `import module`)
    line: int
    optional: bool


@dataclass
class Closure:
    entry: str
    modules: dict[str, str | None] = field(default_factory=dict)  # reached module -> its source file (None: none)
    via: dict[str, str] = field(default_factory=dict)  # module -> the module that first imported it
    missing: list[dict] = field(default_factory=list)
    optional_missing: list[dict] = field(default_factory=list)
    device_only: list[str] = field(default_factory=list)
    unreadable: list[dict] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.missing and not self.unreadable

    def chain(self, module: str) -> list[str]:
        out = [module]
        while out[-1] in self.via and len(out) < 50:
            out.append(self.via[out[-1]])
        return out[::-1]


# -- reading one module's imports ---------------------------------------------------------------------------

def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _is_main_guard(test: ast.expr) -> bool:
    return isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and test.left.id == "__name__" and \
        any(isinstance(c, ast.Constant) and c.value == "__main__" for c in test.comparators)


def _catches_import_error(handlers: list[ast.ExceptHandler]) -> bool:
    for h in handlers:
        types = h.type.elts if isinstance(h.type, ast.Tuple) else [h.type]
        for t in types:
            if t is None or (isinstance(t, ast.Name) and t.id in _CATCHES_IMPORT_ERROR) or \
                    (isinstance(t, ast.Attribute) and t.attr in _CATCHES_IMPORT_ERROR):
                return True
    return False


def _suppresses_import_error(items: list[ast.withitem]) -> bool:
    """`with suppress(ImportError):` (contextlib's): the import under it is optional, as under try/except."""
    for item in items:
        call = item.context_expr
        func = getattr(call, "func", None)
        name = getattr(func, "id", None) or getattr(func, "attr", None)
        if name == "suppress" and _catches_import_error([ast.ExceptHandler(type=ast.Tuple(elts=call.args))]):
            return True
    return False


def _absolute(node: ast.ImportFrom, package: str | None) -> str | None:
    if not node.level:
        return node.module
    if not package:
        return None  # a relative import in a script: fails at run time, not ours to judge here
    parts = package.split(".")
    if node.level - 1 >= len(parts):
        return None
    base = ".".join(parts[: len(parts) - node.level + 1])
    return f"{base}.{node.module}" if node.module else base


def module_edges(tree: ast.Module, package: str | None, is_main: bool = False) -> list[Edge]:
    """The imports of one module that run when it loads, each marked required or optional (see the module doc)."""
    out: list[Edge] = []

    def visit(body: list[ast.stmt], optional: bool) -> None:
        for node in body:
            if isinstance(node, ast.Import):
                out.extend(Edge(a.name, (), node.lineno, optional) for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(node, package)
                if base:
                    out.append(Edge(base, tuple(a.name for a in node.names if a.name != "*"), node.lineno,
                                    optional))
            elif isinstance(node, ast.If):
                if _is_type_checking(node.test):
                    visit(node.orelse, optional)
                elif _is_main_guard(node.test):
                    if is_main:
                        visit(node.body, optional)
                    visit(node.orelse, True)
                else:
                    visit(node.body, True)
                    visit(node.orelse, True)
            elif isinstance(node, ast.Try) or type(node).__name__ == "TryStar":
                guarded = optional or _catches_import_error(node.handlers)
                visit(node.body, guarded)
                visit(node.orelse, guarded)
                for h in node.handlers:
                    visit(h.body, True)
                visit(node.finalbody, optional)
            elif isinstance(node, (ast.With, ast.AsyncWith)):
                visit(node.body, optional or _suppresses_import_error(node.items))
            elif isinstance(node, ast.ClassDef):
                visit(node.body, optional)
            elif isinstance(node, (ast.For, ast.AsyncFor, ast.While)):
                visit(node.body, True)
                visit(node.orelse, True)
            elif type(node).__name__ == "Match":
                for case in node.cases:
                    visit(case.body, True)

    visit(tree.body, False)
    return out


# -- resolving names without importing -----------------------------------------------------------------------

# Packages that put a directory of their own on sys.path when imported: ray/__init__.py inserts
# ray/thirdparty_files (colorama, psutil, setproctitle, ...), setuptools/__init__.py appends setuptools/_vendor
# (jaraco, more_itertools, ...: torch.utils.cpp_extension imports setuptools), so what is there resolves once the
# package is reached.
PATH_EXTENDERS = {"ray": ("thirdparty_files",), "setuptools": ("_vendor",)}


class Resolver:
    """Module name -> spec, through sys.meta_path's finders, a submodule searched in its parent's locations
    (which come from the parent's spec: nothing is imported)."""

    def __init__(self):
        self.specs: dict[str, object] = {}
        self.extra_path: list[str] = []  # the PATH_EXTENDERS directories of the packages reached so far

    def extend_path(self, dirs: list[str]) -> None:
        new = [d for d in dirs if os.path.isdir(d) and d not in self.extra_path]
        if new:
            self.extra_path.extend(new)
            self.specs = {k: v for k, v in self.specs.items() if v is not None}  # look again where it failed

    def find(self, name: str):
        if name in self.specs:
            return self.specs[name]
        parent, _, _ = name.rpartition(".")
        path = None
        if parent:
            pspec = self.find(parent)
            path = getattr(pspec, "submodule_search_locations", None) if pspec else None
            if path is None:
                self.specs[name] = None
                return None
            path = list(path)
        spec = None
        for finder in sys.meta_path:
            fs = getattr(finder, "find_spec", None)
            if fs is None:
                continue
            try:
                spec = fs(name, path)
            except KeyError:
                # PathFinder builds a namespace package's path from its parent's module in sys.modules, which a
                # walk that imports nothing never has (megatron/ is a namespace package: megatron-core's
                # megatron.core beside a tree's megatron.training): the same portions, found without it
                spec = _namespace_spec(name, path)
            except (ImportError, ValueError, AttributeError):
                spec = None
            if spec is not None:
                break
        if spec is None and not parent and self.extra_path:
            spec = importlib.machinery.PathFinder.find_spec(name, self.extra_path)
        self.specs[name] = spec
        return spec

    def first_missing(self, name: str) -> str | None:
        """The shortest prefix of `name` that cannot be found; None when all resolve. A submodule of a plain
        module (six.moves) or of an extension is made at run time: not judged."""
        parts = name.split(".")
        for i in range(1, len(parts) + 1):
            prefix = ".".join(parts[:i])
            spec = self.find(prefix)
            if spec is None:
                parent = self.find(".".join(parts[: i - 1])) if i > 1 else True
                if i > 1 and parent is not None and getattr(parent, "submodule_search_locations", None) is None:
                    return None
                return prefix
        return None


def _namespace_spec(name: str, path: list[str] | None):
    """A namespace package's spec: the directories named like it under the search path (no __init__.py)."""
    import os

    last = name.rpartition(".")[2]
    dirs = [os.path.join(p, last) for p in (path or sys.path) if os.path.isdir(os.path.join(p or ".", last))]
    if not dirs:
        return None
    spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
    spec.submodule_search_locations = dirs
    return spec


def _is_stdlib(name: str) -> bool:
    top = name.split(".")[0]
    return top in sys.stdlib_module_names or top in sys.builtin_module_names or top in ("__future__", "__main__")


_INSTALLED: list[dict] = []  # packages_distributions(), read once (it reads every distribution's metadata)


def distribution(module: str) -> str | None:
    """The distribution that provides `module`, where known (a small table, then the installed metadata)."""
    parts = module.split(".")
    for i in range(len(parts), 0, -1):
        if ".".join(parts[:i]) in DISTRIBUTIONS:
            return DISTRIBUTIONS[".".join(parts[:i])]
    if not _INSTALLED:
        try:
            from importlib.metadata import packages_distributions

            _INSTALLED.append(packages_distributions())
        except Exception:  # noqa: BLE001 - broken metadata must not break the check
            _INSTALLED.append({})
    dists = _INSTALLED[0].get(parts[0])
    return ", ".join(sorted(set(dists))) if dists else None


# -- the walk -----------------------------------------------------------------------------------------------

class _Walk:
    def __init__(self, closure: Closure):
        self.c, self.r = closure, Resolver()
        self.queue: list[tuple[str, str, str | None, bool]] = []  # (module, file, package, is_main)

    def add(self, name: str, by: str | None, is_main: bool = False) -> None:
        """Reach `name` and its parent packages (importing a.b.c runs a and a.b first)."""
        parts = name.split(".")
        for i in range(1, len(parts) + 1):
            mod = ".".join(parts[:i])
            if mod in self.c.modules or _is_stdlib(mod) or device_only(mod):
                continue
            spec = self.r.find(mod)
            origin = getattr(spec, "origin", None) if spec else None
            if i == 1 and mod in PATH_EXTENDERS and spec is not None and spec.submodule_search_locations:
                self.r.extend_path([os.path.join(loc, d) for loc in spec.submodule_search_locations
                                    for d in PATH_EXTENDERS[mod]])
            self.c.modules[mod] = origin
            if by:
                self.c.via[mod] = by
            if origin and origin.endswith(".py"):
                package = mod if spec.submodule_search_locations is not None else mod.rpartition(".")[0]
                self.queue.append((mod, origin, package or None, is_main and i == len(parts)))

    def note_missing(self, into: list[dict], module: str, by: str, file: str, line: int, why: str) -> None:
        for row in into:
            if row["module"] == module:
                if len(row["imported_by"]) < 3:
                    row["imported_by"].append(f"{file}:{line}")
                return
        into.append({"module": module, "imported_by": [f"{file}:{line}"], "chain": self.c.chain(by),
                     "distribution": distribution(module), "error": why})

    def edge(self, e: Edge, by: str, file: str) -> None:
        if _is_stdlib(e.module):
            return
        dev = device_only(e.module)
        if dev:
            if dev not in self.c.device_only:
                self.c.device_only.append(dev)
            return
        into = self.c.optional_missing if e.optional else self.c.missing
        gone = self.r.first_missing(e.module)
        if gone:
            self.note_missing(into, gone, by, file, e.line, f"No module named {gone!r}")
            return
        spec = self.r.find(e.module)
        if not e.optional:
            self.add(e.module, by)
        if spec is None or spec.submodule_search_locations is None:
            return  # `from module import name`: a name, not a submodule
        bare = spec.origin is None  # a folder without __init__.py: it holds submodules and nothing else
        for n in e.names:
            sub = f"{e.module}.{n}"
            if device_only(sub):
                continue
            if self.r.find(sub) is not None:
                if not e.optional:
                    self.add(sub, by)
            elif bare:
                where = ", ".join(dict.fromkeys(spec.submodule_search_locations))
                self.note_missing(into, sub, by, file, e.line, f"{e.module} is a folder without __init__.py "
                                  f"({where}), so it has no {n!r}: is the real package installed?")

    def run(self) -> None:
        while self.queue:
            mod, file, package, is_main = self.queue.pop(0)
            try:
                with open(file, "rb") as fh:
                    tree = ast.parse(fh.read(), file)
            except (OSError, SyntaxError, ValueError) as exc:
                self.c.unreadable.append({"module": mod, "file": file, "error": f"{type(exc).__name__}: {exc}"})
                continue
            for e in module_edges(tree, package, is_main):
                self.edge(e, mod, file)


def walk(script: str | None = None, module: str | None = None) -> Closure:
    """The closure of a script (run as __main__) or a module (`python -m`), with sys.path as it is now."""
    closure = Closure(script or module)
    w = _Walk(closure)
    if script:
        closure.modules["__main__"] = script
        w.queue.append(("__main__", script, None, True))
    else:
        gone = w.r.first_missing(module)
        if gone:
            closure.missing.append({"module": gone, "imported_by": ["(the entry: -m)"], "chain": [],
                                    "distribution": distribution(gone), "error": f"No module named {gone!r}"})
            return closure
        w.add(module, None, is_main=True)
        spec = w.r.find(module)
        if spec is not None and spec.submodule_search_locations is not None:
            w.add(f"{module}.__main__", module, is_main=True)  # `python -m pkg` runs pkg.__main__
    w.run()
    return closure


__all__ = ["Closure", "DISTRIBUTIONS", "Edge", "Resolver", "distribution", "module_edges", "walk"]


if __name__ == "__main__":  # `python3 -m` on a library module must fail loudly, not pass silently
    from trainbox.runtime.errors import not_a_command

    raise SystemExit(not_a_command(__spec__.name))
