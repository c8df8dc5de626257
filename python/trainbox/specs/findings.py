"""One findings pass for every command that uses a stack (host module).

`stack validate`, `stack lock`, `render`, `patches verify` and `image build` (and its dry run) all run the rules of
trainbox.specs.rules through `review`, and report what they find the same way: each finding once, naming the platforms
it holds on, at the file that holds the pin. A stack that extends another and has the very same finding as an
ancestor inherits it: the finding is reported at the ancestor's file, once, however many stacks extend it, and
the dependant says "inherited from npu-910b.yaml" (or, when the ancestor is reported in the same run, nothing).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .rules import Finding, check
from ..runtime.errors import EXIT_PROBLEMS, TrainboxError
from .stack import Stack, list_stacks, load_stack, one_reading, parent_path, stack_path

#: The exit status of a command whose stack has an error finding (with `stack validate --strict`: any warning),
#: whichever command found it: validate, lock, render, patches verify, image build and its dry run. A finding is
#: a check that found a problem (1), not a usage error (2): the same stack file gives the same status everywhere.
EXIT_FINDINGS = EXIT_PROBLEMS

#: Rules about the lock's state: what `stack lock` repairs, and what a build with --set resolves by itself.
LOCK_RULES = frozenset({"pinned-sources", "lock-fresh"})


@dataclass(frozen=True)
class Reported:
    """A finding of one stack, placed at the file that holds it."""

    finding: Finding
    stack: str  # the stack it was found on
    file: Path | None  # the stack's own file, or the ancestor's it is inherited from
    inherited_from: str | None = None  # that ancestor's file name, when inherited

    @property
    def level(self) -> str:
        return self.finding.level

    @property
    def where(self) -> tuple:
        """The same finding at the same file is one finding, whichever stacks have it."""
        return (str(self.file), self.finding.identity)

    def line(self) -> str:
        f = self.finding
        inh = f" (inherited from {self.inherited_from})" if self.inherited_from else ""
        return f"{self.file}: [{f.rule}] {f.level}: {f.text()}{inh}"

    def as_dict(self) -> dict:
        f = self.finding
        return {"rule": f.rule, "level": f.level, "message": f.message, "platforms": list(f.platforms),
                "file": str(self.file) if self.file else None, "inherited_from": self.inherited_from}


class FindingsRefused(TrainboxError):
    """A command refused a stack for its error findings (each line names the file that holds the pin)."""

    exit_code = EXIT_FINDINGS

    def __init__(self, what: str, reported: list[Reported]):
        self.reported = reported
        lines = unique_lines(reported)
        super().__init__(f"{what}: {len(lines)} error finding{'s' if len(lines) != 1 else ''}:\n"
                         + "\n".join(f"  {line}" for line in lines))


def ancestors(stack: Stack, stacks_dir: Path | None = None) -> list[Stack]:
    """The stacks `stack` extends, root first, each loaded as its own file says (no --set, no --base)."""
    chain: list[Stack] = []
    path, parent = stack.source_file, stack.extends
    with one_reading():  # each ancestor read and validated once, not once per descendant
        while parent and path is not None:
            st = load_stack(parent_path(path, parent, stacks_dir), stacks_dir=stacks_dir)
            chain.insert(0, st)
            path, parent = st.source_file, st.extends
    return chain


class Review:
    """Runs the rules over stacks, each stack's ancestors checked once per run (cached by file)."""

    def __init__(self, skip: frozenset[str] | set[str] = frozenset(), stacks_dir: Path | None = None,
                 with_info: bool = False):
        # `info` findings (where an artifact comes from) are for `stack validate` only: elsewhere they would be a
        # note on every build of every stack
        self.skip, self.stacks_dir, self.with_info = frozenset(skip), stacks_dir, with_info
        self._checked: dict[str, dict[tuple, Finding]] = {}

    def _findings(self, stack: Stack) -> dict[tuple, Finding]:
        key = str(stack.source_file)
        if stack.overrides or key not in self._checked:
            found = {f.identity: f for f in check(stack)
                     if f.rule not in self.skip and (self.with_info or f.level != "info")}
            if stack.overrides:
                return found
            self._checked[key] = found
        return self._checked[key]

    def stack(self, stack: Stack) -> list[Reported]:
        """`stack`'s findings, each placed at the root-most ancestor that has the very same finding."""
        chain = ancestors(stack, self.stacks_dir) if stack.extends else []
        out = []
        for ident, f in self._findings(stack).items():
            origin = next((a for a in chain if ident in self._findings(a)), None)
            if origin is None:
                out.append(Reported(f, stack.name, stack.source_file))
            else:  # the ancestor's own wording (e.g. the lock command that fixes it names the ancestor)
                out.append(Reported(self._findings(origin)[ident], stack.name, origin.source_file,
                                    origin.source_file.name if origin.source_file else origin.name))
        return out


def review(stack: Stack, skip: frozenset[str] | set[str] = frozenset()) -> list[Reported]:
    """One stack's findings (rules in `skip` left out), placed where the pin is held."""
    return Review(skip).stack(stack)


def unique_lines(reported: list[Reported]) -> list[str]:
    """One line per finding, however many stacks have it."""
    seen: dict[tuple, str] = {}
    for r in reported:
        seen.setdefault(r.where, r.line())
    return list(seen.values())


def errors(reported: list[Reported]) -> list[Reported]:
    return [r for r in reported if r.level == "error"]


def exit_status(refused: bool) -> int:
    """What a command that found error findings (`refused`) exits with: the one mapping every command uses."""
    return EXIT_FINDINGS if refused else 0


def refuse_errors(what: str, reported: list[Reported]) -> None:
    """Raise FindingsRefused when any finding is an error (the command does nothing for this stack)."""
    bad = errors(reported)
    if bad:
        raise FindingsRefused(what, bad)


# -- `stack validate` ------------------------------------------------------------------------------------

@dataclass
class Verdict:
    """One stack's part of a validation: its findings and those that fail it, or why its file does not load."""

    stack: str
    file: str | None = None
    found: list[Reported] = field(default_factory=list)
    bad: list[Reported] = field(default_factory=list)  # errors (with strict: every finding but info)
    error: str | None = None  # the file does not load: invalid input, not a finding

    @property
    def ok(self) -> bool:
        return not self.bad and self.error is None

    def as_dict(self) -> dict:
        if self.error is not None:
            return {"stack": self.stack, "ok": False,
                    "findings": [{"rule": "schema", "level": "error", "message": self.error}]}
        return {"stack": self.stack, "ok": self.ok, "file": self.file, "findings": [r.as_dict() for r in self.found]}


@dataclass
class Validation:
    """What `stack validate` found: the stacks that do not load (in the order named), then each loaded stack after
    the stacks of the run it extends."""

    strict: bool
    stacks: list[Verdict]

    @property
    def invalid(self) -> bool:
        """A stack file does not load (the command's usage error, 2)."""
        return any(v.error is not None for v in self.stacks)

    @property
    def failed(self) -> bool:
        return not all(v.ok for v in self.stacks)

    def as_dict(self) -> dict:
        return {"ok": not self.failed, "strict": self.strict, "stacks": [v.as_dict() for v in self.stacks]}


def parents_first(stacks: list[Stack]) -> list[Stack]:
    """`stacks` with each one after the stacks of the list it extends (otherwise in the order given)."""
    by_name = {st.name: st for st in stacks}
    out: list[Stack] = []

    def visit(st: Stack) -> None:
        if st in out:
            return
        if st.extends in by_name:
            visit(by_name[st.extends])
        out.append(st)

    for st in stacks:
        visit(st)
    return out


def validate(names: list[str] | None = None, strict: bool = False) -> Validation:
    """Load each named stack (None: every stack) and run every rule over it, info findings included. A name that
    is no stack raises (a usage error); a file that does not load is a verdict with its error."""
    names = names or list_stacks()
    for name in names:
        stack_path(name)
    verdicts, loaded = [], []
    for name in names:
        try:
            loaded.append(load_stack(name))
        except TrainboxError as exc:
            verdicts.append(Verdict(name, error=str(exc)))
    review = Review(with_info=True)
    for stack in parents_first(loaded):
        found = review.stack(stack)
        bad = [r for r in found if r.level == "error" or (strict and r.level != "info")]
        verdicts.append(Verdict(stack.name, str(stack.source_file), found, bad))
    return Validation(strict, verdicts)
