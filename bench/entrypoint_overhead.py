#!/usr/bin/env python3
"""Startup overhead of the image entrypoint (tini + trainbox-entrypoint) against none.

Runs `docker run --rm --network none IMAGE true` and `docker run --rm --network none --entrypoint true
IMAGE` alternately, N times each, and prints the medians and their difference. Goal: < 100 ms.

    python bench/entrypoint_overhead.py IMAGE [--runs 21] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time


def _time(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=120)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.decode()[-500:]}")
    return elapsed


def measure(image: str, runs: int = 21, docker: str | None = None) -> dict:
    docker = docker or os.environ.get("TRAINBOX_DOCKER") or shutil.which("docker") or "/usr/bin/docker"
    base = [docker, "run", "--rm", "--network", "none", "--label", "trainbox.test=1"]
    with_ep = [*base, image, "true"]
    without = [*base, "--entrypoint", "true", image]
    _time(with_ep), _time(without)  # warm up: page cache, image layers
    res: dict = {"with": [], "without": []}
    for _ in range(runs):  # alternate, so drift in machine load hits both sides alike
        res["with"].append(_time(with_ep))
        res["without"].append(_time(without))
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("image")
    ap.add_argument("--runs", type=int, default=21)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    res = measure(args.image, args.runs)
    w, wo = statistics.median(res["with"]), statistics.median(res["without"])
    diff_ms = (w - wo) * 1000
    if args.json:
        print(json.dumps({"image": args.image, "runs": args.runs, "median_with_s": w, "median_without_s": wo,
                          "overhead_ms": diff_ms, "goal_ms": 100, "met": diff_ms < 100}))
    else:
        print(f"image {args.image}, {args.runs} runs each")
        print(f"  docker run IMAGE true                  median {w * 1000:7.1f} ms")
        print(f"  docker run --entrypoint true IMAGE     median {wo * 1000:7.1f} ms")
        print(f"  entrypoint overhead                    {diff_ms:7.1f} ms (goal < 100 ms: "
              f"{'met' if diff_ms < 100 else 'NOT met'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
