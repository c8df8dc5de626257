"""What trainbox smoke runs and records: steps, statuses, expected doctor findings, options, results."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..image.toolkits import TOOLKITS
from ..paths import REPORTS_DIR

STEPS = ("validate", "lock", "render", "hadolint", "patches", "build", "doctor", "recipes", "args", "trial")
PASS, FAIL, SKIPPED = "pass", "fail", "skipped"
# a recipe's result in the args step: besides PASS and FAIL, a failure the profile expects (XFAIL), an expected
# failure that passed (XPASS: a failure, so the list cannot go stale), and a recipe that could not be checked
XFAIL, XPASS, NOT_CHECKED = "xfail", "xpass", "not checked"
SCHEMA = 1

# Doctor findings a smoke container must produce, by device type, so they are reported as expected rather than
# failures. The smoke container gets no accelerator (CI runners have none): no device nodes, no driver mounts,
# and on NPU `import torch` fails because torch auto-loads torch_npu, which needs the driver's libascend_hal.so.
# Each toolkit says which of its doctor checks fail there (trainbox.image.toolkits).
EXPECTED_WITHOUT_ACCELERATOR: dict[str, tuple[str, ...]] = {
    **{d: t.DOCTOR_FAILS_WITHOUT_CARDS for d, t in TOOLKITS.items()}, "cpu": ()}
# ... and, on a substitute base (a plain Debian instead of the toolkit's image), no toolkit either.
EXPECTED_ON_SUBSTITUTE: dict[str, tuple[str, ...]] = {
    **{d: t.DOCTOR_FAILS_ON_SUBSTITUTE for d, t in TOOLKITS.items()}, "cpu": ()}

# ... and, whatever the device, what comes from how the smoke container is started rather than from the image.
EXPECTED_IN_SMOKE_CONTAINER: tuple[str, ...] = ("system.memlock",)

# Placeholders for a recipe's required inputs in `trainbox run --dry-run` (nothing runs, nothing is mounted).
DRY_RUN_PLACEHOLDERS = {"path": "/trainbox-smoke/{name}", "int": "1", "port": "29500", "host": "127.0.0.1",
                "string": "smoke"}

DEFAULT_TIMEOUTS = {"validate": 300, "lock": 600, "render": 300, "hadolint": 120, "patches": 1800,
                    "build": 5400, "doctor": 600, "recipes": 300, "args": 600, "bootstrap": 1800,
                    "trial": 1800}


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
    jobs: int = 1  # stacks checked at once; the first runs alone (it makes the substitute base present)
    skip: list[str] = field(default_factory=list)
    workdir: Path = REPORTS_DIR / "smoke"
    profile: str | None = None
    pull_timeout: float = 20.0
    build_cache: Path | None = None  # BuildKit cache directory kept between CI runs
    verbose: bool = False
    timeouts: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_TIMEOUTS))
    # recipe -> the failure its args step is known to end in (profile): {"why", and "missing" (a module) or "match"
    # (a pattern of the step's summary line)}; a failure that is not that one stays a failure (expected_failure)
    expect_fail: dict[str, dict] = field(default_factory=dict)
    accept_not_checked: list[str] = field(default_factory=list)  # recipes whose `not checked` is accepted
    # recipe -> {"expect": "pass"} or {"expect": "stop", "at": text its final line must hold, "why": ...}
    trial: dict[str, dict] = field(default_factory=dict)

    def sets_for(self, stack: str) -> dict[str, str]:
        return {**self.sets.get("*", {}), **self.sets.get(stack, {})}


# ------------------------------------------------------------------------------------- child processes




def expected_failure(expected: dict, summary: str, missing: list[str]) -> bool:
    """Whether an args step's failure is the one the profile expects: the module it names is missing (among the
    import closure's missing modules, or a ModuleNotFoundError of the program itself), or the summary line matches
    the pattern. Anything else (another module, a timeout, a SIGKILL) is not the expected failure."""
    import re

    module = expected.get("missing")
    if module:
        if any(m == module or m.startswith(module + ".") for m in missing):
            return True
        return re.search(rf"No module named '{re.escape(module)}(\.[\w.]+)?'", summary) is not None
    return bool(expected.get("match")) and re.search(expected["match"], summary) is not None


def describe_expected(expected: dict) -> str:
    return (f"the missing module {expected['missing']}" if expected.get("missing")
            else f"a summary matching {expected.get('match')!r}")
