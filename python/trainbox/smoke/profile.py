"""Smoke options: --set per stack, profiles (YAML), and the Options they make."""

from __future__ import annotations

import os
import re
from pathlib import Path

from ..paths import REPORTS_DIR, REPO_ROOT
from ..runtime.errors import TrainboxError
from .model import DEFAULT_TIMEOUTS, STEPS, Options


def parse_set(item: str, stacks: list[str]) -> tuple[str, str, str]:
    """`[STACK:]COMPONENT.FIELD=VALUE` -> (stack or "*", "COMPONENT.FIELD", VALUE): a stack's own --set
    grammar (stack.parse_sets) with an optional STACK: prefix."""
    from ..specs.stack import parse_sets

    key, sep, value = item.partition("=")
    stack, colon, rest = key.partition(":") if ":" in key else ("*", "", key)
    try:
        ((k, v),) = parse_sets([f"{rest}{sep}{value}"]).items()
    except TrainboxError:
        raise TrainboxError(f"--set {item}: expected [STACK:]COMPONENT.FIELD=VALUE, e.g. "
                            "npu-910b:torch.version=2.13.0+cpu") from None
    return stack.strip() or "*", k, v


def load_profile(path: str | Path) -> dict:
    """A smoke profile: defaults for one kind of runner (which stacks, pins it must move, a wheelhouse)."""
    from pydantic import BaseModel, ConfigDict, Field, ValidationError

    class ExpectedFailure(BaseModel):
        """The failure a recipe's args step is known to end in: a module it misses, or a pattern its summary
        line matches (one of them), and why, with where the fix is tracked."""
        model_config = ConfigDict(extra="forbid")
        why: str
        missing: str | None = None
        match: str | None = None

    class Profile(BaseModel):
        model_config = ConfigDict(extra="forbid")
        description: str | None = None
        stacks: list[str] | None = None
        keep_going: bool | None = None
        jobs: int | None = Field(None, ge=1, le=8)  # stacks built at once (the first always alone)
        substitute_base: str | None = None
        wheelhouse: str | None = None
        skip: list[str] = Field(default_factory=list)
        set: dict[str, dict[str, str]] = Field(default_factory=dict)
        # recipe -> the failure its args step is known to end in (XFAIL; another failure is a FAIL, and one that
        # passes is an XPASS, which fails the smoke)
        expect_fail: dict[str, ExpectedFailure] = Field(default_factory=dict)
        # recipes whose `not checked` (declared in the recipe's check.why) this runner accepts
        accept_not_checked: list[str] = Field(default_factory=list)
        # the trial step: recipe -> pass, or {stop: text of where its trial must stop, why: one line}
        trial: dict[str, str | dict[str, str]] = Field(default_factory=dict)

    from ..specs.documents import format_validation, read_yaml

    p = Path(path)
    if not p.is_file():
        raise TrainboxError(f"--profile {p}: no such file")
    data = read_yaml(p, TrainboxError, "smoke profile")
    for stack, sets in (data.get("set") or {}).items():
        for k, v in (sets.items() if isinstance(sets, dict) else ()):
            if isinstance(v, bool):
                sets[k] = "true" if v else "false"
            elif not isinstance(v, str):
                # YAML reads 2.10 as the number 2.1: a pin must be written as a string
                raise TrainboxError(f"--profile {p}: set.{stack}.{k}: {v!r} is a number to YAML; quote the "
                                    f"version, e.g. {k}: \"{v}\"")
    for name, v in (data.get("expect_fail") or {}).items() if isinstance(data.get("expect_fail"), dict) else ():
        if not isinstance(v, dict):
            raise TrainboxError(f"--profile {p}: expect_fail.{name}: state the failure it expects, as "
                                "{missing: MODULE, why: ...} or {match: PATTERN, why: ...} (a bare reason let any "
                                "failure, a killed check included, count as the expected one)")
    try:
        prof = Profile.model_validate(data)
    except ValidationError as exc:
        raise TrainboxError(format_validation(p, exc, unknown="profile keys: description, stacks, keep_going, "
                                              "jobs, substitute_base, wheelhouse, skip, set, expect_fail, "
                                              "accept_not_checked, trial")) from None
    for stack, sets in prof.set.items():
        for k in sets:
            if "." not in k:
                raise TrainboxError(f"--profile {p}: set.{stack}.{k}: expected COMPONENT.FIELD, e.g. torch.version")
    _check_recipe_names(p, prof.expect_fail, prof.accept_not_checked)
    out = prof.model_dump()
    out["trial"] = _trial_entries(p, prof.trial)
    if out.get("wheelhouse") and not os.path.isabs(out["wheelhouse"]):
        out["wheelhouse"] = str((REPO_ROOT / out["wheelhouse"]).resolve())
    return out


def _check_recipe_names(p: Path, expect_fail: dict, accept: list[str]) -> None:
    """expect_fail and accept_not_checked name real recipes, each expected failure with the failure it expects
    and a reason, and no recipe in both."""
    from ..launch.recipe import list_recipes

    known = set(list_recipes())
    for key, names in (("expect_fail", list(expect_fail)), ("accept_not_checked", accept)):
        for name in names:
            if name not in known:
                raise TrainboxError(f"--profile {p}: {key}: {name}: no such recipe (launchers/recipes/*.yaml; "
                                    "`trainbox launch list`)")
    for name, exp in expect_fail.items():
        if not exp.why.strip():
            raise TrainboxError(f"--profile {p}: expect_fail.{name}.why: say in one line why it fails (and where "
                                "the fix is tracked)")
        if (exp.missing is None) == (exp.match is None):
            raise TrainboxError(f"--profile {p}: expect_fail.{name}: name the failure it expects, either missing "
                                "(the module, e.g. torchvision) or match (a pattern of the args step's summary), "
                                "one of them")
        if exp.missing is not None and not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", exp.missing):
            raise TrainboxError(f"--profile {p}: expect_fail.{name}.missing: {exp.missing!r} is not a module name "
                                "(e.g. torchvision or transformer_engine.pytorch)")
        if exp.match is not None:
            try:
                re.compile(exp.match)
            except re.error as exc:
                raise TrainboxError(f"--profile {p}: expect_fail.{name}.match: not a regular expression "
                                    f"({exc})") from None
        if name in accept:
            raise TrainboxError(f"--profile {p}: {name} is in both expect_fail and accept_not_checked: choose one")


def _trial_entries(p: Path, entries: dict) -> dict[str, dict]:
    """trial: RECIPE: pass | {stop: TEXT, why: LINE}: recipes with an overlay, each with what its trial must do."""
    from ..launch.recipe import list_recipes

    known, out = set(list_recipes()), {}
    for name, want in entries.items():
        if name not in known:
            raise TrainboxError(f"--profile {p}: trial: {name}: no such recipe (`trainbox trial --list`)")
        if want == "pass":
            out[name] = {"expect": "pass"}
        elif isinstance(want, dict) and set(want) == {"stop", "why"} and all(str(v).strip() for v in want.values()):
            out[name] = {"expect": "stop", "at": str(want["stop"]), "why": " ".join(str(want["why"]).split())}
        else:
            raise TrainboxError(f"--profile {p}: trial.{name}: expected `pass`, or {{stop: TEXT its final line "
                                "holds, why: one line}}")
    return out


def build_options(stacks: list[str] | None, sets: list[str] | None, profile: str | None, wheelhouse: str | None,
                  substitute_base: str | None, keep_going: bool, skip: list[str] | None, workdir: str | None,
                  pull_timeout: float | None, verbose: bool, build_cache: str | None = None,
                  jobs: int | None = None) -> Options:
    from ..specs.stack import list_stacks

    prof = load_profile(profile) if profile else {}
    known = list_stacks()
    chosen = list(stacks or prof.get("stacks") or known)
    unknown = [s for s in chosen if s not in known]
    if unknown:
        raise TrainboxError(f"stack {', '.join(unknown)}: no such stack in {REPO_ROOT / 'build' / 'stacks'} "
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
    if jobs is not None and not 1 <= jobs <= 8:
        raise TrainboxError(f"--jobs {jobs}: expected 1 to 8 (stacks checked at once)")
    return Options(stacks=chosen, sets=merged, wheelhouse=wh, substitute_base=mode, jobs=jobs or prof.get("jobs") or 1,
                   keep_going=keep_going or bool(prof.get("keep_going")), skip=skips,
                   workdir=Path(workdir).resolve() if workdir else REPORTS_DIR / "smoke",
                   profile=str(profile) if profile else None,
                   pull_timeout=pull_timeout if pull_timeout is not None else 20.0, verbose=verbose,
                   build_cache=Path(build_cache).resolve() if build_cache else None, timeouts=timeouts,
                   expect_fail=dict(prof.get("expect_fail") or {}),
                   accept_not_checked=list(prof.get("accept_not_checked") or []),
                   trial=dict(prof.get("trial") or {}))


