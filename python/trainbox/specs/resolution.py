"""What trainbox resolves for a stack beside what its file says (host module; imports no trainbox module).

A stack file's fields are what a user writes (trainbox.specs.stack). What loading and a build work out for it (the file
it came from, --set/--base overrides, the lock in force and where it came from, indexes a build dropped) is a
`Resolution`: a stack file cannot set it, and a resolved stack is frozen, so each step returns a new stack.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

#: Keys that name trainbox's own build state, never written in a stack file: why, and what to do instead.
INTERNAL_KEYS = {
    "source_file": "the stack's file is the one being read",
    "overrides": "give them on the command line: --set COMPONENT.FIELD=VALUE or --base IMAGE",
    "declared_base": "the stack's own base is base.image; a build on another one takes --base IMAGE",
    "lock": "the lock is the machine-written NAME.lock beside the stack file: run `trainbox stack lock NAME`",
    "dropped_indexes": "a build drops an index that does not answer by itself; remove an index from `indexes`",
    "key": "a component's key is its name under `components`",
    "locked": "a pin's hashes go in sha256: (or come from the lock, `trainbox stack lock NAME`)",
}


@dataclass(frozen=True)
class Resolution:
    """What trainbox resolved for a stack, apart from what its file says (and where each part came from)."""

    source_file: Path | None = None  # the stack file (its `extends` parents merged in)
    overrides: dict[str, str] = field(default_factory=dict)  # --set COMPONENT.FIELD / base.image (--base), as given
    # the stack file's own base when --base substituted another one (recorded in the manifest)
    declared_base: str | None = None
    # the lock in force: the stack's NAME.lock, or one resolved for the pins --set moved (`lock_origin` says which)
    lock: dict | None = None
    lock_origin: str | None = None
    # indexes a build dropped because they did not answer (the wheelhouse serves their pins): the lock was
    # computed against them, so they still count when its freshness is judged
    dropped_indexes: dict[str, str] = field(default_factory=dict)
    # the stack has no NAME.lock of its own and uses its parent's (an ancestor's) for every pin it does not change:
    # that lock's file name, whether it fits the parent's own pins (and why not: the parent's finding), and the
    # pins this stack adds, moves or drops, which the parent's lock was not computed for
    lock_inherited: str | None = None
    inherited_fresh: bool = False
    inherited_staleness: tuple[str, ...] = ()
    own_changes: tuple[str, ...] = ()
    # `trainbox stack lock` only: why the stack's lock file could not be used (outside the lock grammar); the
    # stack was loaded without it, and the lock is rewritten
    lock_problem: str | None = None
