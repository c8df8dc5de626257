#!/usr/bin/env python3
"""A `stress`-style CPU hog on every core while a command runs: the way to see that no test's verdict depends on
how fast the machine is (issue 40; `make test-loaded`).

    python tests/cpuhog.py [--workers N] [--seconds S] -- COMMAND [ARG...]
    python tests/cpuhog.py --seconds S          # the hog alone, for S seconds

Starts N busy-loop processes (default: one per core, os.cpu_count()), then COMMAND; when COMMAND ends (or S
seconds pass, or Ctrl-C), every hog is killed, and each also ends by itself after S seconds should this process
die first. Exits with COMMAND's status. Standard library only; nothing to install.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time


def _spin(until: float) -> None:
    os.setpgrp() if hasattr(os, "setpgrp") else None  # Ctrl-C in the terminal reaches the wrapper, not each hog
    x = 0
    while time.monotonic() < until:  # bounded by itself: an orphaned hog still stops
        for _ in range(100_000):
            x = (x * 1103515245 + 12345) & 0x7FFFFFFF


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="busy processes (default: one per core)")
    p.add_argument("--seconds", type=float, default=4 * 3600, help="the hog's bound in time (default 4 h)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARG...]: run under load")
    args = p.parse_args(argv)
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if args.workers < 1 or args.seconds <= 0:
        p.error("--workers must be at least 1 and --seconds above 0")
    until = time.monotonic() + args.seconds
    ctx = mp.get_context("fork") if hasattr(os, "fork") else mp.get_context()
    hogs = [ctx.Process(target=_spin, args=(until,), daemon=True) for _ in range(args.workers)]
    for h in hogs:
        h.start()
    print(f"cpuhog: {len(hogs)} busy processes (pids {' '.join(str(h.pid) for h in hogs)}) for at most "
          f"{args.seconds:.0f} s", file=sys.stderr, flush=True)
    rc = 0
    try:
        if cmd:
            proc = subprocess.Popen(cmd)
            try:
                rc = proc.wait()
            except KeyboardInterrupt:
                proc.send_signal(signal.SIGINT)
                rc = proc.wait()
        else:
            for h in hogs:
                h.join(max(0.0, until - time.monotonic()))
    finally:
        for h in hogs:  # only the hogs this process started, by their own pid
            if h.is_alive():
                h.kill()
            h.join()
        print("cpuhog: stopped", file=sys.stderr, flush=True)
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
