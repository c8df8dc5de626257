"""Check a command line against the framework's own argument parser, without running the job (stdlib only).

    python3 -m trainbox.runtime.argcheck [--json] [--stub MOD]... [--stub-missing] [--path DIR]... [--strict] \
        [--imports] (--script FILE | --module MOD) -- ARG...

The script (or module) runs as `__main__` with `sys.argv` set to the arguments, exactly as the launcher would
start it, until it first asks argparse to parse them: that call is the framework's own parser, built by the
framework's own code. trainbox lets argparse parse, records the outcome, and stops the program there, before
any training, device or network code runs. Flags the parser does not define fail with argparse's own message.

Some frameworks import, at module level, what cannot load without the device (torch_npu without CANN):
`--stub MOD` replaces such a module (and its submodules) with an inert stand-in, and only a module of the one
device-only list (trainbox.runtime.deviceonly) may be named. `--stub-missing` stands in for every module that
is not installed: for a plain image without the workload's packages (`launch check --code`), whose report says the
imports were not checked. The report names every stand-in, since a parser option whose `choices` or `type`
come from a stubbed module is accepted unchecked.

`--imports` runs nothing of the entry and imports nothing: it follows the entry's import closure
(trainbox.runtime.importclosure: every module reached through imports that run at load, through the
framework's tree and the packages it imports) and names each module that is missing, the file that imports it
and the distribution that provides it; the device-only modules are neither required nor followed.

A framework that parses with `parse_known_args` may use the leftovers (Megatron's extra args) or reject them
itself after the parse (ms-swift: `ValueError: remaining_argv`); `--strict` makes leftovers fail here too.

Exit status: 0 the arguments parse (or the import closure resolves); 1 the parser rejects them (or the program
ended before parsing, or a module of the closure is missing); 2 usage error. `--json` prints one object, schema 1: {"schema", "ok", "parser", "error", "unknown",
"stubbed", "namespace"}; with --imports, schema 2: {"schema", "ok", "target", "modules" (how many reached),
"missing" [{"module", "imported_by", "chain", "distribution", "error"}], "optional_missing", "device_only",
"unreadable", "error"}.
"""

from __future__ import annotations

import argparse
import importlib.abc
import importlib.machinery
import io
import json
import os
import runpy
import sys
import types

from .deviceonly import DEVICE_ONLY, device_only


class _Parsed(BaseException):
    """Raised at the framework's first parse to stop its program (BaseException: `except Exception` in the
    framework's code must not swallow it)."""

    def __init__(self, parser, namespace, unknown, error=None):
        super().__init__()
        self.parser, self.namespace, self.unknown, self.error = parser, namespace, unknown, error


# -- inert stand-ins for modules that cannot be imported here -------------------------------------------------

class _StubBase:
    """What a framework class that subclasses a stand-in really derives from: accepts any arguments."""

    def __init__(self, *args, **kwargs):
        pass

    def __init_subclass__(cls, **kwargs):
        pass

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _Stub(name)


class _Stub:
    """An inert stand-in for anything a stubbed module holds: attributes, calls, decorators, base classes."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _Stub(f"{self._name}.{name}")

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and not kwargs and callable(args[0]):
            return args[0]  # used as a decorator: keep the decorated function
        return _Stub(f"{self._name}()")

    def __mro_entries__(self, bases):  # `class Foo(stub.Base)`: no metaclass to conflict with
        return (_StubBase,)

    def __contains__(self, item):  # `choices=stub.X`: accepted; the report says stand-ins were used
        return True

    def __iter__(self):
        return iter(())

    def __getitem__(self, item):
        return self

    def __or__(self, other):
        return self

    __ror__ = __or__

    def __bool__(self):
        return False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def __repr__(self):
        return f"<stand-in {self._name}>"


class _StubModule(types.ModuleType):
    # a version that sorts below every release: frameworks log or compare `mod.__version__` at import
    __version__ = "0+stand.in"

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _Stub(f"{self.__name__}.{name}")


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Stands in for the modules in `forced` (always) and, with missing=True, for a module that is not installed
    when the framework's own code (a file under `roots`) imports it. Optional imports inside installed
    libraries and the standard library (`try: import pynvml except ImportError`) are left alone."""

    def __init__(self, forced: list[str], missing: bool, roots: list[str]):
        self.forced, self.missing, self.used = forced, missing, []
        self.roots = [os.path.abspath(r) + os.sep for r in roots]
        self._probing = False

    def _forced(self, name: str) -> bool:
        return any(name == f or name.startswith(f + ".") for f in self.forced + self.used)

    def _from_framework(self) -> bool:
        f = sys._getframe(2)
        while f is not None and (f.f_code.co_filename.startswith("<frozen") or f.f_code.co_filename == __file__):
            f = f.f_back
        return f is not None and os.path.abspath(f.f_code.co_filename).startswith(tuple(self.roots))

    def find_spec(self, name, path=None, target=None):
        if self._probing:
            return None
        if not self._forced(name):
            top = name.split(".")[0]
            if not self.missing or top in sys.stdlib_module_names or "." in name or not self._from_framework():
                return None
            self._probing = True
            try:  # is it really installed? ask the other finders
                for finder in sys.meta_path:
                    if finder is not self and getattr(finder, "find_spec", None):
                        spec = finder.find_spec(name, path, target)
                        # a bare folder (a namespace package, e.g. a checkout's datasets/ dir) is not the library
                        if spec is not None and (spec.origin or spec.loader is not None and not
                                                 spec.submodule_search_locations or spec.has_location):
                            return None
            finally:
                self._probing = False
        return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec):
        mod = _StubModule(spec.name)
        mod.__path__ = []
        return mod

    def exec_module(self, module):
        top = module.__name__.split(".")[0]
        if top not in self.used and top not in self.forced:
            self.used.append(top)
        elif top in self.forced and top not in self.used:
            self.used.append(top)


# -- the interception ------------------------------------------------------------------------------------------

def _intercept(strict_known: bool = False):
    """Make the first top-level parse stop the program with its outcome. Nested parses (subcommands) pass.
    strict_known: arguments parse_known_args leaves over are an error too."""
    orig_known = argparse.ArgumentParser.parse_known_args
    depth = [0]

    def parse(parser, args, namespace, strict: bool):
        if depth[0]:
            return orig_known(parser, args, namespace)
        depth[0] += 1
        err = io.StringIO()
        real_stderr, sys.stderr = sys.stderr, err
        try:
            ns, unknown = orig_known(parser, args, namespace)
        except SystemExit:  # argparse's error(): its message is on stderr
            sys.stderr = real_stderr
            raise _Parsed(parser, None, [], err.getvalue().strip().splitlines()[-1:] or ["parser exited"]) from None
        finally:
            sys.stderr = real_stderr
            depth[0] -= 1
        error = [f"unrecognized arguments: {' '.join(unknown)}"] if (strict and unknown) else None
        raise _Parsed(parser, ns, unknown, error)

    argparse.ArgumentParser.parse_args = lambda self, args=None, namespace=None: parse(self, args, namespace, True)
    argparse.ArgumentParser.parse_known_args = (
        lambda self, args=None, namespace=None: parse(self, args, namespace, strict_known))
    # parse_intermixed_args and HfArgumentParser's dataclass parsing go through parse_known_args.


def _stand_ins(script: str | None, stubs: list[str], missing: bool, paths: list[str]) -> _StubFinder:
    """The stand-in finder, first on sys.meta_path (a forced stand-in wins over an installed torch_npu), and
    sys.path as the launched entry sees it: the script's directory first, then the --path directories."""
    script_dir = [os.path.dirname(os.path.abspath(script))] if script else []
    finder = _StubFinder(list(stubs), missing, list(paths) + script_dir)
    sys.meta_path.insert(0, finder)
    sys.path[:0] = script_dir + list(paths)
    return finder


def check(argv: list[str], script: str | None = None, module: str | None = None, stubs: list[str] = (),
          stub_missing: bool = False, paths: list[str] = (), strict: bool = False) -> dict:
    finder = _stand_ins(script, stubs, stub_missing, paths)
    target = script or module
    sys.argv = [target, *argv]
    _intercept(strict)
    out = {"schema": 1, "ok": False, "parser": None, "error": None, "unknown": [], "stubbed": finder.used,
           "namespace": None, "target": target, "argv": argv}
    try:
        if script:
            runpy.run_path(script, run_name="__main__")
        else:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        out["error"] = "the program ended without parsing its arguments (is this its entry point?)"
    except _Parsed as p:
        out["parser"] = p.parser.prog
        out["unknown"] = list(p.unknown)
        if p.error:
            out["error"] = p.error[0]
        else:
            out["ok"] = True
            out["namespace"] = {k: repr(v) for k, v in sorted(vars(p.namespace).items())}
    except SystemExit as exc:
        out["error"] = f"the program exited ({exc.code}) before parsing its arguments"
    except BaseException as exc:  # noqa: BLE001 - any failure before the parse is reported, not raised
        out["error"] = f"the program failed before parsing its arguments: {type(exc).__name__}: {exc}"
    return out


def check_imports(script: str | None = None, module: str | None = None, paths: list[str] = ()) -> dict:
    """The entry's import closure resolves in this image, without running or importing any of it
    (trainbox.runtime.importclosure); modules in the device-only list are the only ones let pass unseen."""
    from .importclosure import walk

    _stand_ins(script, [], False, paths)
    sys.meta_path.remove(sys.meta_path[0])  # sys.path as the entry sees it; no stand-in finder
    out = {"schema": 2, "ok": False, "target": script or module, "modules": 0, "missing": [],
           "optional_missing": [], "device_only": [], "unreadable": [], "error": None}
    if script and not os.path.isfile(script):
        out["error"] = f"cannot read the entry: {script}: no such file"
        return out
    closure = walk(script, module)
    out.update(modules=len(closure.modules), missing=closure.missing, optional_missing=closure.optional_missing,
               device_only=closure.device_only, unreadable=closure.unreadable, ok=closure.ok)
    if closure.missing:
        first = closure.missing[0]
        dist = f" (distribution: {first['distribution']})" if first.get("distribution") else ""
        out["error"] = (f"{len(closure.missing)} module(s) missing, first {first['module']}{dist}, imported by "
                        f"{first['imported_by'][0]} (via {' -> '.join(first['chain'])})")
    elif closure.unreadable:
        bad = closure.unreadable[0]
        out["error"] = f"{bad['file']} cannot be read: {bad['error']}"
    return out


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        argv.append("--")
    own, rest = argv[: argv.index("--")], argv[argv.index("--") + 1:]
    p = argparse.ArgumentParser(prog="python3 -m trainbox.runtime.argcheck",
                                description=__doc__.split("\n\n")[1].strip())
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--script", help="the entry script, as the launcher runs it")
    what.add_argument("--module", help="the entry module (python -m MODULE)")
    p.add_argument("--stub", action="append", default=[], metavar="MOD",
                   help="stand in for this device-only module and its submodules (e.g. torch_npu; only "
                        "trainbox.runtime.deviceonly's list); repeatable")
    p.add_argument("--stub-missing", action="store_true", help="stand in for every module that is not installed")
    p.add_argument("--path", action="append", default=[], metavar="DIR", help="prepend to sys.path; repeatable")
    p.add_argument("--imports", action="store_true",
                   help="do not run the entry: check that its import closure resolves in this Python")
    p.add_argument("--strict", action="store_true",
                   help="arguments a parse_known_args call leaves over fail too (for frameworks that reject "
                        "them after parsing, e.g. ms-swift)")
    p.add_argument("--json", action="store_true", help="print the result as JSON (schema 1)")
    args = p.parse_args(own)
    outside = [m for m in args.stub if not device_only(m)]
    if outside:
        p.error(f"--stub {outside[0]}: not a device-only module; stand-ins come only from "
                f"trainbox.runtime.deviceonly.DEVICE_ONLY ({', '.join(DEVICE_ONLY)}): a module the image lacks "
                "must be installed, not stood in for")
    if args.script and not args.imports and not os.path.isfile(args.script):
        p.error(f"--script {args.script}: no such file")
    real_stdout = sys.stdout
    sys.stdout = io.StringIO()  # what the framework prints while importing is not our report
    try:
        if args.imports:
            result = check_imports(args.script, args.module, args.path)
        else:
            result = check(rest, args.script, args.module, args.stub, args.stub_missing, args.path, args.strict)
    finally:
        sys.stdout = real_stdout
    if args.json:
        print(json.dumps(result, indent=2))
    elif result["ok"] and args.imports:
        print(f"ok: {result['target']}: {result['modules']} module(s) of its import closure resolve"
              + (f" (device-only, not followed: {', '.join(result['device_only'])})" if result["device_only"] else ""))
    elif result["ok"]:
        print(f"ok: {result['target']}: {len(rest)} argument(s) parse"
              + (f" (stand-ins: {', '.join(result['stubbed'])})" if result["stubbed"] else ""))
    else:
        print(f"error: {result['target']}: {result['error']}", file=sys.stderr)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
