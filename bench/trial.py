#!/usr/bin/env python3
"""Wall time and peak memory of `trainbox trial` per recipe (goal: each under 3 minutes on the project's 2-core
machine), the tiny artifacts made once and then reused.

    python bench/trial.py RECIPE=IMAGE [RECIPE=IMAGE ...] [--runs 2] [--json]

Each recipe's trial runs `--runs` times in a fresh cache of its own: the first run makes the artifacts (the tiny
model, tokenizer and data, in the image), later runs find them by content hash. Reported per run: the whole wall
time (`trainbox trial` as a user waits for it), the job's own wall time, whether the artifacts were made, the result
line, and the peak memory of the job's container (the cgroup's high-water mark, as the step monitor read it at the
last step; none when no step ran). Exits 1 when a trial takes over the goal.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GOAL_S = 180.0


def one(recipe: str, image: str, cache: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO / "python"), "TRAINBOX_CACHE": cache}
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "trainbox.cli", "trial", recipe, "--image", image, "--json"],
                          capture_output=True, text=True, env=env, timeout=3600)
    wall = time.monotonic() - t0
    try:
        doc = json.loads(proc.stdout)
    except ValueError:
        doc = {"line": (proc.stderr.strip().splitlines() or ["no output"])[-1]}
    return {"recipe": recipe, "image": image, "wall_s": round(wall, 1), "job_wall_s": doc.get("job_wall_s"),
            "artifacts_made": doc.get("artifacts_made_now"), "peak_mem_mb": doc.get("peak_mem_mb"),
            "steps": len(doc.get("steps") or []), "result": doc.get("result"), "line": doc.get("line")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trials", nargs="+", metavar="RECIPE=IMAGE")
    ap.add_argument("--runs", type=int, default=2, help="runs per recipe (the first makes the artifacts)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    rows = []
    for item in args.trials:
        recipe, _, image = item.partition("=")
        if not image:
            ap.error(f"{item}: expected RECIPE=IMAGE")
        with tempfile.TemporaryDirectory(prefix="trainbox-bench-trial-") as cache:
            for run in range(args.runs):
                row = one(recipe, image, cache)
                row["run"] = run + 1
                rows.append(row)
                print(f"{recipe} run {run + 1}: {row['wall_s']:.0f}s (job {row['job_wall_s']}s, artifacts "
                      f"{'made' if row['artifacts_made'] else 'reused'}), peak {row['peak_mem_mb']} MB: {row['line']}",
                      file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps({"goal_s": GOAL_S, "rows": rows}, indent=2))
    else:
        print(f"{'recipe':<36} {'run':>3} {'wall s':>7} {'job s':>6} {'artifacts':>9} {'peak MB':>8}  result")
        for r in rows:
            print(f"{r['recipe']:<36} {r['run']:>3} {r['wall_s']:>7.0f} {r['job_wall_s'] or 0:>6.0f} "
                  f"{'made' if r['artifacts_made'] else 'reused':>9} {r['peak_mem_mb'] or '-':>8}  {r['line']}")
    return 1 if any(r["wall_s"] > GOAL_S for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
