"""Issue 40: no test's verdict depends on how fast the machine is. An AST scan of tests/ for wall-clock limits
tighter than a hang guard (hangguard.FLOOR_S):
  - a `timeout=` keyword (subprocess.run, Popen.wait/communicate, a helper's) or a `timeout` parameter's default;
  - a deadline, `time.monotonic() + N` (or time.time, time.perf_counter);
  - an elapsed time compared with a number: `time.monotonic() - t0 < N`, or a name assigned from such a
    difference or from a helper that returns one (`took = time.monotonic() - t0; assert took < N`);
  - a bench measurement (bench/'s `measure()` or `main()`) run by a test, whose figures are wall time.
What a test hands the product as its own input (`base_available(..., timeout=3)`, the limit whose effect the test
checks) is not a wait of the test's and is listed in PRODUCT_INPUTS; what else is no wait (a retry's per-try
timeout inside a poll that is itself bounded by a hang guard, a stand-in's copy of a product signature) carries
`# not a wait: why` on its line. Speed figures belong in bench/, which is not
scanned. The scan is shown to catch each kind on a planted example.
"""

from __future__ import annotations

import ast
import re
import textwrap
from pathlib import Path

import pytest

from hangguard import FLOOR_S

TESTS = Path(__file__).resolve().parent
CLOCKS = {"monotonic", "time", "perf_counter", "monotonic_ns", "perf_counter_ns"}
# callees whose `timeout=` is the product's input under test, not a wait of the test's
PRODUCT_INPUTS = {"base_available", "registry_reachable", "init_distributed", "bootstrap", "set_timeout"}
TIMEOUT_PARAMS = {"timeout", "timeout_s", "wait_s", "within"}
# bench/'s modules, which tests may import for their pure helpers (bench/build.py's verdict), never to measure
BENCH_MODULES = {p.stem for p in (TESTS.parent / "bench").glob("*.py")}
MEASURES = {"measure", "main"}


def _is_clock(node: ast.AST) -> bool:
    """time.monotonic() and friends (any module alias), or a bare monotonic() imported by name."""
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    if isinstance(f, ast.Attribute):
        return f.attr in CLOCKS and isinstance(f.value, ast.Name) and f.value.id in ("time", "_time")
    return isinstance(f, ast.Name) and f.id in CLOCKS - {"time"}


def _has_clock(node: ast.AST) -> bool:
    return any(_is_clock(n) for n in ast.walk(node))


def _number(node: ast.AST) -> float | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return float(node.value)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult, ast.Sub)):
        a, b = _number(node.left), _number(node.right)
        if a is not None and b is not None:
            return a + b if isinstance(node.op, ast.Add) else a * b if isinstance(node.op, ast.Mult) else a - b
    return None


def _callee(node: ast.Call) -> str:
    """The called function's name; for hangguard.finishes(fn, ...), fn's (its keywords go to fn)."""
    f = node.func
    name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
    if name == "finishes" and node.args:
        inner = node.args[0]
        return inner.attr if isinstance(inner, ast.Attribute) else inner.id if isinstance(inner, ast.Name) else name
    return name


def scan(source: str, filename: str = "<test>") -> list[str]:
    """Each wall-clock limit tighter than FLOOR_S in `source`, as 'file:line: what'."""
    tree = ast.parse(source, filename)
    lines = source.splitlines()
    found: list[str] = []

    def flag(node: ast.AST, what: str, why: str = f"a hang guard is at least {FLOOR_S} s") -> None:
        line = f"{filename}:{node.lineno}: {what} ({why})"
        if "# not a wait" not in lines[node.lineno - 1] and line not in found:  # (nested scopes are walked twice)
            found.append(line)

    # helpers that return an elapsed time (`return time.monotonic() - t0`)
    timers = {fn.name for fn in ast.walk(tree) if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
              for r in ast.walk(fn) if isinstance(r, ast.Return) and r.value is not None and
              isinstance(r.value, ast.BinOp) and isinstance(r.value.op, ast.Sub) and _has_clock(r.value)}

    def clocked(node: ast.AST, names: set[str]) -> bool:
        return (_has_clock(node) and any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Sub) and _has_clock(n)
                                         for n in ast.walk(node))) or \
            any(isinstance(n, ast.Name) and n.id in names for n in ast.walk(node)) or \
            any(isinstance(n, ast.Call) and _callee(n) in timers for n in ast.walk(node))

    scopes = [n for n in ast.walk(tree) if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef))]
    for scope in scopes:
        # names holding an elapsed time in this scope
        elapsed: set[str] = set()
        for n in ast.walk(scope):
            if isinstance(n, ast.Assign) and clocked(n.value, elapsed | set()):
                value_is_elapsed = clocked(n.value, elapsed) and not (
                    _is_clock(n.value))  # `t0 = time.monotonic()` is a start, not an elapsed time
                if value_is_elapsed:
                    elapsed |= {t.id for t in n.targets if isinstance(t, ast.Name)}
        for n in ast.walk(scope):
            if isinstance(n, ast.Compare) and len(n.ops) == 1 and \
                    isinstance(n.ops[0], (ast.Lt, ast.LtE, ast.Gt, ast.GtE)):
                left, right = n.left, n.comparators[0]
                for side, other in ((left, right), (right, left)):
                    bound = _number(other)
                    if bound is not None and bound < FLOOR_S and clocked(side, elapsed) and \
                            not (isinstance(side, ast.Call) and _is_clock(side)):
                        flag(n, f"an elapsed time compared with {bound:g} s")
                        break

    # a bench measurement run by a test (its figures are wall time however the test compares them)
    bench = {(a.asname or a.name) for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
             if a.name in BENCH_MODULES}
    for n in ast.walk(tree):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in MEASURES and \
                isinstance(n.func.value, ast.Name) and n.func.value.id in bench:
            flag(n, f"bench/{n.func.value.id}'s {n.func.attr}()", "a speed figure belongs in bench/, not in a test")
    for n in ast.walk(tree):
        if isinstance(n, ast.Call) and _callee(n) not in PRODUCT_INPUTS:
            for kw in n.keywords:
                if kw.arg in TIMEOUT_PARAMS:
                    v = _number(kw.value)
                    if v is not None and v < FLOOR_S:
                        flag(kw.value, f"{_callee(n)}(..., {kw.arg}={v:g})")
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            args = n.args.args + n.args.kwonlyargs
            defaults = [None] * (len(n.args.args) - len(n.args.defaults)) + list(n.args.defaults) + \
                list(n.args.kw_defaults)
            for a, d in zip(args, defaults):
                v = _number(d) if d is not None else None
                if a.arg in TIMEOUT_PARAMS and v is not None and v < FLOOR_S and not isinstance(n, ast.Lambda):
                    flag(d, f"{n.name}({a.arg}={v:g})")
        if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Add) and \
                (_is_clock(n.left) or _is_clock(n.right)):
            v = _number(n.right if _is_clock(n.left) else n.left)
            if v is not None and v < FLOOR_S:
                flag(n, f"a deadline {v:g} s from now")
    return found


def test_no_test_limits_a_wait_tighter_than_a_hang_guard():
    found = []
    for path in sorted(TESTS.rglob("*.py")):
        if path.name == "test_hangguard.py":  # its planted examples are strings; its own code waits on nothing
            continue
        found += scan(path.read_text(), str(path.relative_to(TESTS.parent)))
    assert not found, ("wall-clock limits tighter than a hang guard (wait for the event with a hang guard, or "
                       "move the speed figure to bench/):\n  " + "\n  ".join(found))


PLANTED = {
    "a timed answer": """
        import time
        def test_x():
            t0 = time.monotonic()
            run()
            assert time.monotonic() - t0 < 5
        """,
    "a timed answer by name": """
        import time
        def test_x():
            t0 = time.perf_counter()
            run()
            took = time.perf_counter() - t0
            assert took < 30, took
        """,
    "a helper that times": """
        import time
        def stop_and_time(name):
            t0 = time.monotonic()
            stop(name)
            return time.monotonic() - t0
        def test_x():
            elapsed = stop_and_time("c")
            assert elapsed <= 5
        """,
    "a short subprocess wait": """
        import subprocess
        def test_x():
            subprocess.run(["trainbox", "run", "cpu-ddp"], timeout=30)
        """,
    "a short communicate": """
        def test_x(proc):
            out, _ = proc.communicate(timeout=10)
        """,
    "a short default": """
        def wait_for_log(name, text, timeout=30):
            pass
        """,
    "a short deadline": """
        import time
        def test_x():
            deadline = time.monotonic() + 20
        """,
}


@pytest.mark.parametrize("name", sorted(PLANTED))
def test_the_scan_catches_a_planted_limit(name):
    found = scan(textwrap.dedent(PLANTED[name]))
    assert len(found) == 1, found
    # and the same code with the limit raised to a hang guard is let through
    generous = re.sub(r"((?:<=?|\+) |timeout=)\d+", r"\g<1>600", textwrap.dedent(PLANTED[name]))
    assert generous != textwrap.dedent(PLANTED[name]) and scan(generous) == [], generous


def test_the_scan_catches_a_bench_measurement():
    """The startup-overhead test once ran bench/entrypoint_overhead.py's measurement and bounded the wall-time
    difference of two medians (0.3 s): it failed in a loaded CI, and no clock appeared in the test itself."""
    planted = textwrap.dedent("""
        import statistics
        import entrypoint_overhead as eo
        def test_x(image):
            res = eo.measure(image, runs=7)
            assert statistics.median(res["with"]) - statistics.median(res["without"]) < 0.3
        """)
    assert len(scan(planted)) == 1, scan(planted)
    helper = textwrap.dedent("""
        import build as bench
        def test_x():
            assert bench.verdict(130.0, 100.0, 1.3).endswith("within)")
        """)
    assert "build" in BENCH_MODULES and scan(helper) == [], scan(helper)


def test_the_scan_lets_through_what_is_no_wait_of_the_tests():
    ok = textwrap.dedent("""
        import subprocess, time
        def test_x():
            t0 = time.monotonic()
            assert base_available("registry.invalid/x:1", client, timeout=3)[0] is False   # the product's input
            r = urllib.request.urlopen(url, timeout=2)  # not a wait: per-try, the poll around it has a hang guard
            spans = (t0, time.monotonic())
            assert spans[0] < spans[1]          # an order of events, not a limit
            assert time.monotonic() > t0        # no number
            subprocess.run(["x"], timeout=600)
        """)
    assert scan(ok) == [], scan(ok)
