"""The smoke run: each stack through every step, in order, with the dependencies between steps."""

from __future__ import annotations

import datetime as _dt
import json
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

from .. import __version__
from ..runtime.errors import TrainboxError
from ..runtime.redact import redact_data
from .checks import CheckSteps
from .imagesteps import ImageSteps
from .trialstep import TrialStep
from .model import (
    FAIL,
    NOT_CHECKED,
    PASS,
    SCHEMA,
    SKIPPED,
    STEPS,
    Options,
    Proc,
    StackResult,
    StepResult,
    XFAIL,
    XPASS,
)
from .proc import cli_argv, kill_running, printed_json, run_process
from .report import format_matrix, junit_xml

Runner = Callable[..., Proc]


class Smoke(CheckSteps, ImageSteps, TrialStep):
    def __init__(self, opts: Options, run: Runner = run_process, say: Callable[[str], None] | None = None):
        self.opts = opts
        self.run = run
        self.say = say or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self._cancelled = threading.Event()  # a parallel run was cancelled: running stacks stop at their next step

    def _stack_info(self, stack: str, log: Path) -> tuple[dict | None, Proc]:
        proc = self.run(cli_argv("stack", "show", stack, "--json"), self.opts.timeouts["validate"], log=log)
        data = printed_json(proc.out) if proc.ok else None
        return (data if isinstance(data, dict) else None), proc

    # -- one stack, all stacks

    def _announce(self, sr: StackResult, res: StepResult) -> None:
        mark = {PASS: "pass", FAIL: "FAIL", SKIPPED: "skip"}[res.status]
        why = f": {res.reason.splitlines()[0][:160]}" if res.reason and res.status != PASS else ""
        self.say(f"smoke {sr.stack:<12} {res.step:<9} {mark} ({res.duration_s:.1f}s){why}")

    def run_stack(self, stack: str, not_run: str | None = None) -> StackResult:
        sr = StackResult(stack, overrides=self.opts.sets_for(stack))
        if not_run:
            sr.steps = [StepResult(s, SKIPPED, not_run) for s in STEPS]
            return sr
        info, info_proc = self._stack_info(stack, self._log(stack, "stack-show"))
        if info:
            sr.device = info.get("device")
            sr.base["image"] = (info.get("base") or {}).get("image")
        unloadable = None if info else "the stack does not load (see validate)"

        def add(res: StepResult) -> StepResult:
            sr.steps.append(res)
            self._announce(sr, res)
            return res

        for name in STEPS:
            if self._cancelled.is_set():
                break
            prior = {s.step: s for s in sr.steps}
            if name in self.opts.skip:
                add(StepResult(name, SKIPPED, f"--skip {name}"))
                continue
            if unloadable and name != "validate":
                add(StepResult(name, SKIPPED, unloadable))
                continue
            if name == "build":
                failed = [s for s in ("validate", "lock", "patches") if prior[s].status == FAIL]
                if failed:
                    add(StepResult(name, SKIPPED, f"not built: {', '.join(failed)} failed (fix that first)"))
                    continue
            if name in ("doctor", "args", "trial") and prior["build"].status != PASS:
                why = "--skip build" if "build" in self.opts.skip else "no image (build " + prior["build"].status + ")"
                add(StepResult(name, SKIPPED, why))
                continue
            fn = getattr(self, f"step_{name}")
            try:
                res = fn(sr, info) if name == "build" else fn(sr)
            except TrainboxError as exc:
                res = StepResult(name, FAIL, str(exc))
            add(res)
        return sr

    def run_all(self) -> dict:
        started = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        t0 = time.monotonic()
        stacks = self.opts.stacks
        results: dict[str, StackResult] = {}
        failed: list[str] = []
        lock = threading.Lock()

        def one(stack: str) -> None:
            with lock:
                not_run = None
                if failed and not self.opts.keep_going:
                    not_run = f"not run: stack {failed[0]} failed (--keep-going runs every stack)"
            sr = self.run_stack(stack, not_run)
            with lock:
                results[stack] = sr
                if not sr.ok and not failed:
                    failed.append(stack)

        if stacks:
            one(stacks[0])  # alone: it makes the substitute base present (two builds would bootstrap it at once)
        # the rest start in the given order as others finish (a pool of one: one after the other)
        pool = ThreadPoolExecutor(max_workers=max(1, self.opts.jobs), thread_name_prefix="smoke")
        try:
            for future in [pool.submit(one, stack) for stack in stacks[1:]]:
                future.result()
        except BaseException:
            self._cancelled.set()
            kill_running()
            pool.shutdown(wait=True, cancel_futures=True)
            raise
        pool.shutdown(wait=True)
        return self.report([results[s] for s in stacks], started, time.monotonic() - t0)

    def report(self, results: list[StackResult], started: str, duration: float) -> dict:
        all_steps = [s for r in results for s in r.steps]
        ok = all(r.ok for r in results)
        return {
            "schema": SCHEMA,
            "trainbox_version": __version__,
            "ok": ok,
            "exit_code": 0 if ok else 1,
            "started_at": started,
            "duration_s": round(duration, 2),
            "steps": list(STEPS),
            "options": {"stacks": self.opts.stacks, "keep_going": self.opts.keep_going, "jobs": self.opts.jobs,
                        "substitute_base": self.opts.substitute_base, "wheelhouse": self.opts.wheelhouse,
                        "profile": self.opts.profile, "skip": self.opts.skip, "workdir": str(self.opts.workdir),
                        "build_cache": str(self.opts.build_cache) if self.opts.build_cache else None,
                        "expect_fail": {k: v["why"] for k, v in self.opts.expect_fail.items()},
                        "expect_fail_as": {k: {"missing": v.get("missing"), "match": v.get("match")}
                                           for k, v in self.opts.expect_fail.items()},
                        "accept_not_checked": self.opts.accept_not_checked, "trial": self.opts.trial},
            "summary": {"pass": sum(s.status == PASS for s in all_steps),
                        "fail": sum(s.status == FAIL for s in all_steps),
                        "skipped": sum(s.status == SKIPPED for s in all_steps),
                        "failed": [f"{r.stack}/{s.step}" for r in results for s in r.steps if s.status == FAIL],
                        # recipes of the args step by result: known gaps (XFAIL), stale ones (XPASS), not checked
                        **{key: [row["name"] for r in results for s in r.steps if s.step == "args"
                                 for row in (s.details or {}).get("recipes", []) if row.get("result") == result]
                           for key, result in (("xfail", XFAIL), ("xpass", XPASS), ("not_checked", NOT_CHECKED))}},
            "stacks": [r.as_dict() for r in results],
        }




def main(opts: Options, as_json: bool = False, junit: str | None = None) -> int:
    say = (lambda msg: print(msg, file=sys.stderr, flush=True))
    say(f"trainbox smoke: {', '.join(opts.stacks)}; steps {', '.join(s for s in STEPS if s not in opts.skip)}"
        + (f"; overrides {json.dumps(opts.sets, sort_keys=True)}" if opts.sets else ""))
    opts.workdir.mkdir(parents=True, exist_ok=True)

    def cancelled(signum, frame):
        raise KeyboardInterrupt  # unwinds through run_process, which kills the running step's process group

    previous = signal.signal(signal.SIGTERM, cancelled)
    try:
        report = Smoke(opts, say=say).run_all()
    finally:
        signal.signal(signal.SIGTERM, previous)
    report = redact_data(report)  # no URL's credentials in a report CI keeps and shares
    path = opts.workdir / "report.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    if junit:
        Path(junit).parent.mkdir(parents=True, exist_ok=True)
        Path(junit).write_bytes(junit_xml(report))
    matrix = format_matrix(report)
    if as_json:
        print(matrix, file=sys.stderr)
        print(json.dumps(report, indent=2))
    else:
        print(matrix)
        print(f"report: {path}" + (f"; JUnit: {junit}" if junit else ""))
    return report["exit_code"]
