#!/usr/bin/env python3
"""Import time of the runtime modules training code imports (goal: under 20 ms, and no torch).

    python bench/import_time.py [--runs 15] [--json]

For each module, runs `python -X importtime -c "import <module>"` in fresh interpreters and reports the
median cumulative import time from Python's own importtime report:
  warm: bytecode cached (as in an image, where pip compiles .pyc files at install)
  cold: every module compiled from source (PYTHONDONTWRITEBYTECODE=1, empty cache)
and the median extra wall time of the whole interpreter run over a bare `python -c pass` run next to it
(noisy on a busy machine; the importtime figures are the ones to compare).
Exits 1 when an import pulls in torch (or torch_npu / numpy), or when the warm median misses the goal.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODULES = ("trainbox.runtime.device", "trainbox.runtime.dist", "trainbox.runtime.markers")
GOAL_MS = 20.0
HEAVY = ("torch", "torch_npu", "numpy")


def _env(dont_write: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")}
    env["PYTHONPATH"] = str(REPO / "python")
    if dont_write:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _one(module: str, cache: str, dont_write: bool) -> tuple[float, list[str], float]:
    code = f"import {module}, sys; print(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r}))"
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-X", "importtime", "-X", f"pycache_prefix={cache}", "-c", code],
                          capture_output=True, text=True, env=_env(dont_write), timeout=60, check=True)
    wall = time.perf_counter() - start
    cumulative = None
    for line in proc.stderr.splitlines():
        if line.startswith("import time:") and line.rsplit("|", 1)[-1].strip() == module:
            cumulative = int(line.split("|")[1]) / 1000.0
    if cumulative is None:
        raise RuntimeError(f"no importtime line for {module}:\n{proc.stderr[-2000:]}")
    return cumulative, json.loads(proc.stdout.replace("'", '"')), wall * 1000.0


def _bare_ms() -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], env=_env(False), check=True, timeout=60)
    return (time.perf_counter() - start) * 1000.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = parser.parse_args()

    report = {"python": sys.version.split()[0], "runs": args.runs, "goal_ms": GOAL_MS, "modules": {}}
    bares = []
    failed = False
    with tempfile.TemporaryDirectory(prefix="trainbox-bench-") as tmp:
        warm_cache = os.path.join(tmp, "warm")
        for module in MODULES:
            _one(module, warm_cache, dont_write=False)  # fill the bytecode cache once
            warm, extra = [], []
            for _ in range(args.runs):  # interleaved with bare runs, so machine load hits both alike
                bares.append(_bare_ms())
                warm.append(_one(module, warm_cache, dont_write=False))
                extra.append(warm[-1][2] - bares[-1])
            cold = [_one(module, os.path.join(tmp, f"cold-{module}-{i}"), dont_write=True)
                    for i in range(args.runs)]
            heavy = sorted({m for _, found, _ in warm + cold for m in found})
            warm_ms = statistics.median(c for c, _, _ in warm)
            entry = {
                "warm_ms": round(warm_ms, 2),
                "cold_ms": round(statistics.median(c for c, _, _ in cold), 2),
                "warm_wall_over_bare_ms": round(statistics.median(extra), 2),
                "heavy_modules_imported": heavy,
                "goal_met": warm_ms < GOAL_MS and not heavy,
            }
            failed |= not entry["goal_met"]
            report["modules"][module] = entry

    bare = statistics.median(bares)
    report["bare_interpreter_ms"] = round(bare, 2)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"Python {report['python']}, median of {args.runs} runs; bare interpreter {bare:.1f} ms wall")
        print(f"{'module':<20} {'warm ms':>8} {'cold ms':>8} {'wall-bare ms':>13}  torch imported  goal <{GOAL_MS:g} ms")
        for module, e in report["modules"].items():
            print(f"{module:<20} {e['warm_ms']:>8.2f} {e['cold_ms']:>8.2f} {e['warm_wall_over_bare_ms']:>13.2f}  "
                  f"{'YES ' + ','.join(e['heavy_modules_imported']) if e['heavy_modules_imported'] else 'no':<14}  "
                  f"{'met' if e['goal_met'] else 'MISSED'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
