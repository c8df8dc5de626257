"""The smoke's trial step: `trainbox trial RECIPE --image IMAGE --json` in the image just built, for the recipes on
the stack that the profile names under `trial:`, each judged against what the profile expects: `pass` (its steps
run, finite loss, the overlay's verify checks hold), or a stop whose final line holds the profile's text (where the
framework stops on a CPU runner, with why). A trial that passes where a stop is expected fails too (the entry is
stale), as does one that stops anywhere else."""

from __future__ import annotations

import time

from .model import FAIL, PASS, SKIPPED, StackResult, StepResult
from .proc import cli_argv, failure_message, printed_json


class TrialStep:
    """Mixin of Smoke (opts, run, say, _log, _rel, _recipe_list come from it)."""

    def _trial_row(self, name: str, want: dict, doc: dict | None, proc) -> dict:
        line = (doc or {}).get("line") or failure_message(proc, "trainbox trial")
        result = (doc or {}).get("result") or "error"
        if want["expect"] == "pass":
            ok, why = result == "passed", None
        else:
            ok = result == "stopped" and want["at"] in line
            why = want["why"] if ok else (f"expected to stop at {want['at']!r} ({want['why']})" +
                                         ("; it passes now: change the profile's entry to `pass`"
                                          if result == "passed" else ""))
        return {"name": name, "result": result, "ok": ok, "line": line, "why": why, "expect": want["expect"],
                "steps": len((doc or {}).get("steps") or []), "wall_s": (doc or {}).get("wall_s"),
                "peak_mem_mb": (doc or {}).get("peak_mem_mb"), "log": (doc or {}).get("log")}

    def step_trial(self, sr: StackResult) -> StepResult:
        log = self._log(sr.stack, "trial")
        t0 = time.monotonic()
        recipes, problem, argv = self._recipe_list(log)
        res = StepResult("trial", PASS, commands=[argv], log=self._rel(log))
        if problem:
            res.status, res.reason = FAIL, problem
            return res
        mine = [r["name"] for r in recipes if r.get("stack") == sr.stack and r["name"] in self.opts.trial]
        rows = []
        for name in mine:
            p = self.run(cli_argv("trial", name, "--image", sr.image, "--json"), self.opts.timeouts["trial"], log=log)
            res.commands.append(p.argv)
            doc = printed_json(p.out)
            rows.append(self._trial_row(name, self.opts.trial[name], doc if isinstance(doc, dict) else None, p))
        res.duration_s = time.monotonic() - t0
        res.details = {"recipes": rows}
        if not rows:
            res.status, res.reason = SKIPPED, "the profile names no trial for a recipe on this stack (profile `trial:`)"
            return res
        bad = [r for r in rows if not r["ok"]]
        text = "; ".join(f"{r['name']}: {r['line']}" + (f" [{r['why']}]" if r["why"] else "") for r in bad or rows)
        res.status, res.reason = (FAIL if bad else PASS), text
        return res
