"""`stack lock` over several stacks as a library (host module): the plan (parents first, the stacks that extend
them locked with them), a stack with an error finding refused, each other one locked and its lock written (with
`check`: only compared). `lock_stacks` returns a `LockRun`, one `StackLock` per stack; the command prints it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from . import lock as lockmod
from ..specs.findings import LOCK_RULES, Reported, Review
from ..specs.stack import Stack


@dataclass
class StackLock:
    """One stack's outcome: what its lock changes, what could not be locked, the file written; or, when `refused`
    holds error findings, nothing locked."""

    stack: str
    changes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # a pin that could not be locked (or, refused, the findings)
    unreachable: list[str] = field(default_factory=list)
    incomplete: list[str] = field(default_factory=list)
    written: str | None = None
    refused: list[Reported] = field(default_factory=list)  # the error findings that refused it
    said_first: list[Reported] = field(default_factory=list)  # those not already refusing a stack before it

    @property
    def failed(self) -> bool:
        return bool(self.problems) and not self.refused

    def as_dict(self) -> dict:
        return {"stack": self.stack, "changes": self.changes, "problems": self.problems,
                "unreachable": self.unreachable, "incomplete": self.incomplete, "written": self.written,
                "findings": [r.as_dict() for r in self.refused]}


@dataclass
class LockRun:
    check: bool
    stacks: list[StackLock]
    named: list[tuple[str, str]]  # (stack, parent): dependants left unlocked (dependants=False), their locks stale

    @property
    def refused(self) -> bool:
        return any(s.refused for s in self.stacks)

    @property
    def failed(self) -> bool:
        """A pin could not be locked, or with `check` a lock would change."""
        return any(s.failed or (self.check and s.changes) for s in self.stacks)

    def as_dict(self) -> dict:
        return {"ok": not (self.failed or self.refused), "check": self.check,
                "stacks": [s.as_dict() for s in self.stacks],
                "not_locked_dependants": [{"stack": n, "extends": p} for n, p in self.named]}


def lock_stacks(names: list[str], *, dependants: bool = True, wheelhouse: Path | None = None,
                resolve_deps: bool = True, check: bool = False,
                on_start: Callable[[Stack, str], None] | None = None,
                progress: Callable[[str], None] | None = None,
                on_done: Callable[[StackLock], None] | None = None) -> LockRun:
    """Lock `names` (and, with `dependants`, the stacks that extend them). `on_start(stack, why)` before a stack is
    locked, `progress` for each step of its lock as it starts, `on_done` with each stack's result: a lock of every
    stack takes minutes and says what it does as it goes."""
    plan, named = lockmod.lock_plan(names, dependants=dependants)
    run = LockRun(check, [], named)
    review, said = Review(skip=LOCK_RULES), set()  # the lock's own state is what locking repairs
    bads = {stack.name: [r for r in review.stack(stack) if r.level == "error"] for stack, _ in plan}
    whys = {stack.name: why for stack, why in plan}
    # the stacks' locks run side by side (each is mostly pip waiting on the index); reported in the plan's order
    lockmod.PROGRESS = progress  # each step as it starts, timed
    locks = lockmod.lock_each([st for st, _ in plan if not bads[st.name]], wheelhouse, resolve_deps=resolve_deps,
                              start=(lambda st: on_start(st, whys[st.name])) if on_start else None)
    try:
        for stack, _why in plan:
            bad = bads[stack.name]
            if bad:  # a pin the rules refuse is not locked (nor written into a lock), each finding said once
                first = []
                for r in bad:
                    if r.where not in said:
                        said.add(r.where)
                        first.append(r)
                result = StackLock(stack.name, problems=[r.line() for r in bad], refused=bad, said_first=first)
            else:
                rep = next(locks).result()
                result = StackLock(stack.name, rep.changes, rep.problems, rep.unreachable, rep.incomplete)
                if not rep.problems and not check:
                    result.written = str(lockmod.write_lock(stack, rep.lock))
            run.stacks.append(result)
            if on_done:
                on_done(result)
    finally:
        locks.close()  # a stack that failed: the locks not started are not started
        lockmod.PROGRESS = None
    return run
