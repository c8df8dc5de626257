"""`trainbox smoke`: every check a change to a pin, a patch, a template or a recipe must pass, for each stack,
on a runner without accelerators; one summary matrix, JUnit XML and a JSON report (host module).

Each step drives the public CLI in a child process (`python -m trainbox.cli ...`), exactly as a user would, so
a step whose command is missing or broken fails instead of passing. Steps, in order, for each stack:

  validate  `trainbox stack validate S --strict --json`
  lock      `trainbox stack lock S --no-deps --check --no-dependants`: every pin exists on its index with
            the hashes recorded
  render    `trainbox render S --check`: the committed generated files match the templates
  hadolint  the freshly rendered Dockerfile, with the repository's .hadolint.yaml
  patches   `trainbox patches verify S --json`: every series applies to its pinned upstream
  build     `trainbox image build S ...`, on the stack's substitute base when its own cannot be had
  doctor    `trainbox doctor --json` in the built image; findings a runner without accelerators (and a
            substitute base) must produce are marked expected, not failures
  recipes   every recipe on the stack: `trainbox launch render`, shellcheck, `trainbox run --dry-run`
  args      every recipe on the stack, in the built image: `trainbox launch check RECIPE --args` (the entry's
            import closure resolves, device-only modules aside; its command parses with the framework's own
            parser, device-only stand-ins named). Judged against the profile: expect_fail (recipe -> the failure
            it expects: a missing module or a pattern of the summary, and why) makes that failure an XFAIL, any
            other failure a FAIL and a pass an XPASS (a failure); `not checked` fails unless accept_not_checked
            names the recipe
  trial     the recipes on the stack the profile names under `trial:`, in the built image: `trainbox trial RECIPE
            --json` (the recipe's own job shrunk by its overlay, CPU mode, its first optimizer steps). `pass`: the
            trial must pass; {stop: TEXT, why: LINE}: it must stop with TEXT in its final line (where the framework
            stops on a CPU runner); passing there, or stopping elsewhere, fails the step

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
      "steps": ["validate", "lock", "render", "hadolint", "patches", "build", "doctor", "recipes", "args", "trial"],
      "options": {"stacks": [...], "keep_going": bool, "jobs": int, "substitute_base": "auto" | "never" | IMAGE,
                  "wheelhouse": str | null, "profile": str | null, "skip": [...], "workdir": str,
                  "build_cache": str | null, "expect_fail": {RECIPE: why},
                  "expect_fail_as": {RECIPE: {"missing": MODULE | null, "match": PATTERN | null}},
                  "accept_not_checked": [RECIPE],
                  "trial": {RECIPE: {"expect": "pass" | "stop", "at": TEXT, "why": LINE}}},
      "summary": {"pass": 10, "fail": 1, "skipped": 5,
                  "failed": ["npu-910b/patches"],            # STACK/STEP of every failed step
                  "xfail": [RECIPE], "xpass": [RECIPE],      # args step: failures the profile expects / that passed
                  "not_checked": [RECIPE]},                  # args step: not checked, accepted by the profile
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
the reason it is expected); recipes {"recipes": [{"name", "render", "shellcheck", "dry_run", "message"}]}; args {"recipes": [{"name", "result" ("pass" | "fail" | "xfail" | "xpass" |
"not checked"), "ok", "status" (launch check's: "ok" | "fail" | "not checked"), "summary", "why", "stubs",
"missing"}]}; trial {"recipes": [{"name", "result" ("passed" | "stopped" | "error"), "ok", "line" (trial's final
line), "why", "expect", "steps", "wall_s", "peak_mem_mb", "log"}]}. A recipe's `not checked` fails the step unless
the profile's accept_not_checked names it; a recipe in the profile's expect_fail that passes (XPASS), or fails
otherwise than the failure it names, fails it too.
"""

from __future__ import annotations

from .findings import classify_doctor
from .model import (
                    DEFAULT_TIMEOUTS,
                    EXPECTED_IN_SMOKE_CONTAINER,
                    EXPECTED_ON_SUBSTITUTE,
                    EXPECTED_WITHOUT_ACCELERATOR,
                    FAIL,
                    PASS,
                    SCHEMA,
                    SKIPPED,
                    STEPS,
                    Options,
                    Proc,
                    StackResult,
                    StepResult,
)
from .proc import cli_argv, failure_message, run_process
from .profile import build_options, load_profile, parse_set
from .report import format_matrix, junit_xml
from .runner import Smoke, main

__all__ = ["DEFAULT_TIMEOUTS", "EXPECTED_IN_SMOKE_CONTAINER", "EXPECTED_ON_SUBSTITUTE", "EXPECTED_WITHOUT_ACCELERATOR",
           "FAIL", "PASS", "SCHEMA", "SKIPPED", "STEPS", "Options", "Proc", "Smoke", "StackResult", "StepResult",
           "build_options", "classify_doctor", "cli_argv", "failure_message", "format_matrix", "junit_xml",
           "load_profile", "main", "parse_set", "run_process"]
