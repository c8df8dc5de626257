"""Stack files: load, merge `extends`, validate (host module).

A stack is one YAML file in build/stacks/. Every error names the file, the key path, what was expected and
how to fix it; unknown keys are rejected so that a typo cannot silently drop a pin.

The models' fields are exactly what a stack file may say. What loading and a build work out for it (the file it
came from, --set/--base overrides, the lock and the hashes it gives each pin, indexes a build dropped) is a
`Resolution` beside the fields (trainbox.specs.resolution): a stack file cannot set it, and a resolved stack is frozen,
so each step that resolves more returns a new stack instead of changing the one it was given. A stack without a
lock of its own uses its parent's for every pin it does not change (`with_parent_lock`).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
import threading
from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from .kinds import DEFAULT_BUILD_REQUIRES
from ..runtime.errors import TrainboxError
from . import grammar
from .dists import canon
from ..paths import STACKS_DIR
from .platforms import PLATFORM_RE
from ..yamlfile import load_yaml_file
from . import documents
from .documents import MAX_EXTENDS_DEPTH, extends_too_deep, format_validation, merge, named_file
from .resolution import INTERNAL_KEYS, Resolution
from .component import BaseSpec, Component, StrictModel, broken_seal, check_lock, intact


class StackError(TrainboxError):
    """A stack file that cannot be used as it is."""


class Stack(StrictModel):
    """A stack: its fields are what the file says (with --set/--base applied); the rest is `Resolution`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    extends: str | None = None
    description: str = ""
    device: Literal["npu", "cuda", "cpu"]
    python: str = Field(pattern=r"^3\.\d+$")
    platforms: list[str] = Field(default_factory=lambda: ["linux/amd64"])
    base: BaseSpec
    system_packages: list[str] = Field(default_factory=list)  # runtime apt packages
    build_packages: list[str] = Field(default_factory=list)  # builder stage only (compilers for sdists ...)
    indexes: dict[str, str] = Field(default_factory=lambda: {"pypi": "https://pypi.org/simple"})
    components: dict[str, Component] = Field(default_factory=dict)
    env: dict[str, str] = Field(default_factory=dict)
    _resolved: Resolution = PrivateAttr(default_factory=Resolution)

    @field_validator("platforms")
    @classmethod
    def _platforms(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError("at least one platform is needed")
        for p in v:
            if not PLATFORM_RE.match(p):
                raise ValueError(f"platform {p!r} is not one of linux/amd64, linux/arm64")
        return v

    @field_validator("env", mode="before")
    @classmethod
    def _env_strings(cls, v: Any) -> Any:
        if isinstance(v, dict):
            for k, val in v.items():
                if not isinstance(val, str):
                    raise ValueError(f"env {k}: value {val!r} must be a quoted string (YAML turns 0/1/on into "
                                     "numbers and booleans)")
        return v

    @field_validator("env")
    @classmethod
    def _env_grammar(cls, v: dict[str, str]) -> dict[str, str]:
        for k, val in v.items():
            grammar.check_env_name(k)
            try:
                grammar.check_env_value(val)
            except ValueError as exc:
                raise ValueError(f"env {k}: {exc}") from None
        return v

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return grammar.check_name(v, "stack name")

    @field_validator("extends")
    @classmethod
    def _extends(cls, v: str | None) -> str | None:
        return v if v is None else grammar.check_name(v, "extends")

    @field_validator("description")
    @classmethod
    def _description(cls, v: str) -> str:
        return grammar.check_image_text(v, "description")

    @field_validator("system_packages", "build_packages")
    @classmethod
    def _packages(cls, v: list[str]) -> list[str]:
        return [grammar.check_deb_package(p) for p in v]

    @field_validator("indexes")
    @classmethod
    def _indexes(cls, v: dict[str, str]) -> dict[str, str]:
        return grammar.check_indexes(v)

    @field_validator("components")
    @classmethod
    def _component_keys(cls, v: dict[str, Component]) -> dict[str, Component]:
        for key in v:
            grammar.check_name(key, "component")
        return v

    @model_validator(mode="after")
    def _cross(self) -> "Stack":
        for key, comp in self.components.items():
            comp._key = key
            if comp.kind.from_index:
                for plat in [comp.index] + [p.index for p in comp.platforms.values() if p.index]:
                    if plat not in self.indexes:
                        raise ValueError(f"components.{key}.index {plat!r} is not defined under `indexes`")
        return self

    # -- what was resolved: read here, changed only by the methods below, each returning a new stack --

    # read-only views of the resolution (properties, not fields: a stack file cannot set them)
    @property
    def resolution(self) -> Resolution:
        return self._resolved

    @property
    def source_file(self) -> Path | None:
        return self._resolved.source_file

    @property
    def overrides(self) -> dict[str, str]:
        return self._resolved.overrides

    @property
    def declared_base(self) -> str | None:
        return self._resolved.declared_base

    @property
    def lock(self) -> dict | None:
        return self._resolved.lock

    @property
    def dropped_indexes(self) -> dict[str, str]:
        return self._resolved.dropped_indexes

    def resolved(self, **changes: object) -> "Stack":
        """A copy with these `Resolution` parts replaced (this stack stays as it is)."""
        new = self.model_copy()
        new._resolved = dataclasses.replace(self._resolved, **changes)
        return new

    def with_lock(self, lock: dict | None, origin: str | None = None) -> "Stack":
        """A copy that uses `lock`'s hashes for the pins it matches (an entry for another version or index is
        stale, so not used); `origin` says where the lock came from."""
        comps = {key: comp.model_copy() for key, comp in self.components.items()}
        for comp in comps.values():
            comp._locked = {}
        # a lock whose seal is broken was changed by hand: none of its hashes is used (lock_staleness says why)
        trusted = lock if intact(lock) else None
        for plat, entry in ((trusted or {}).get("platforms") or {}).items():
            for key, rec in ((entry or {}).get("components") or {}).items():
                comp = comps.get(key)
                if comp is None or not comp.kind.from_index:
                    continue
                pin = comp.pin_for(plat)
                if rec.get("version") == pin.version and rec.get("index") == pin.index:
                    comp._locked[plat] = list(rec.get("sha256") or [])
        new = self.model_copy(update={"components": comps})
        # a lock given here is this stack's own (or one resolved for its overrides): nothing inherited any more
        return new.resolved(lock=lock, lock_origin=origin if lock else None, lock_inherited=None,
                            inherited_fresh=False, inherited_staleness=(), own_changes=())

    def with_parent_lock(self, parent: "Stack") -> "Stack":
        """A copy that uses `parent`'s lock (its own or inherited in turn) for every pin it does not change: a
        stack that extends a locked one needs no lock of its own until it adds, moves or drops a pin."""
        if not parent.lock:
            return self
        changes = self.pin_changes(parent)
        new = self.with_lock(parent.lock, parent.resolution.lock_origin)
        name = parent.resolution.lock_inherited or (parent.lock_path.name if parent.lock_path else "lock")
        return new.resolved(lock_inherited=name, inherited_fresh=parent.lock_is_fresh(),
                            inherited_staleness=tuple(parent.lock_staleness()), own_changes=tuple(changes))

    def pin_changes(self, parent: "Stack") -> list[str]:
        """The installed pypi pins this stack adds, moves or drops relative to `parent` (all platforms)."""
        out: dict[str, None] = {}
        mine, theirs = self._pypi(), parent._pypi()
        for plat in self.platforms:
            for key, c in sorted(mine.items()):
                pin, was = c.pin_for(plat), theirs[key].pin_for(plat) if key in theirs else None
                if was is None:
                    out[f"adds {c.dist_name}{c.extras_suffix}=={pin.version}"] = None
                elif (pin.version, pin.index, c.dist_name, c.extras) != (was.version, was.index,
                                                                        theirs[key].dist_name, theirs[key].extras):
                    out[f"moves {c.dist_name}{c.extras_suffix} to {pin.version} from {pin.index}"] = None
            for key in sorted(set(theirs) - set(mine)):
                out[f"drops {theirs[key].dist_name}"] = None
        if self.python != parent.python:
            out[f"python {self.python}"] = None
        # a wheel built in the image (a git component with install: pip, an sdist with build_requires) needs its
        # PEP 518 requirements hash-pinned in the lock: adding one the parent's lock has none for makes it stale
        reqs = self.build_requirements()
        if reqs != parent.build_requirements():
            mine_b, theirs_b = self._built_from_source(), parent._built_from_source()
            built = sorted(k for k, c in mine_b.items()
                           if k not in theirs_b or c.build_requires != theirs_b[k].build_requires)
            out[f"builds {', '.join(built) or 'wheels'} from source (build requirements "
                f"{', '.join(reqs) or 'none'})"] = None
        return list(out)

    def with_hashes(self, hashes: dict[str, list[str]]) -> "Stack":
        """A copy whose components named in `hashes` are pinned to those sha256s (e.g. a wheelhouse's files)."""
        comps = {key: comp.model_copy(update={"sha256": list(hashes[key])}) if key in hashes else comp
                 for key, comp in self.components.items()}
        return self.model_copy(update={"components": comps})

    def with_tree_ids(self, trees: dict[str, str]) -> "Stack":
        """A copy that records git's tree hash of each fetched commit on its component (for the manifest)."""
        comps = dict(self.components)
        for key, tree in trees.items():
            comps[key] = comps[key].model_copy()
            comps[key]._tree_id = tree
        return self.model_copy(update={"components": comps})

    def narrowed(self, platform: str) -> "Stack":
        """A copy for one platform (a build is for one)."""
        return self.model_copy(update={"platforms": [platform]})

    def without_indexes(self, names: list[str]) -> "Stack":
        """A copy whose build leaves these indexes out (they do not answer; the wheelhouse serves their pins).
        The lock was computed against them, so they are kept as dropped_indexes for judging its freshness."""
        kept = {k: v for k, v in self.indexes.items() if k not in names}
        dropped = {**self.dropped_indexes, **{k: v for k, v in self.indexes.items() if k in names}}
        return self.model_copy(update={"indexes": kept}).resolved(dropped_indexes=dropped)

    def component(self, key: str) -> Component:
        try:
            return self.components[key]
        except KeyError:
            raise StackError(
                f"{self.source_file}: stack {self.name!r} has no component {key!r} "
                f"(components: {', '.join(sorted(self.components))})"
            ) from None

    @property
    def installed_components(self) -> dict[str, Component]:
        left_out = self.left_out
        return {k: c for k, c in self.components.items() if c.install and k not in left_out}

    @property
    def left_out(self) -> dict[str, str]:
        """Components built against a toolkit of the base (`needs:`) that a substitute base (plain Debian
        standing in for a CANN or CUDA base) does not have: left out of its build, and named in its manifest."""
        if not self.declared_base:
            return {}
        return {k: f"needs {', '.join(c.needs)}, which the substitute base {self.base.image} does not have"
                for k, c in sorted(self.components.items()) if c.install and c.needs}

    def pins_digest(self) -> str:
        """What the dependency lock depends on: every installed pypi pin per platform."""
        rows = []
        for plat in self.platforms:
            for key, c in sorted(self.installed_components.items()):
                if c.kind.from_index:
                    pin = c.pin_for(plat)
                    rows.append(f"{plat} {c.dist_name}{c.extras_suffix}"
                                f"=={pin.version} {pin.index}")
        rows.append(f"python {self.python}")
        return hashlib.sha256("\n".join(rows).encode()).hexdigest()[:16]

    @property
    def lock_path(self) -> Path | None:
        return self.source_file.with_suffix(".lock") if self.source_file else None

    def lock_is_fresh(self) -> bool:
        if self._resolved.lock_inherited:  # the parent's lock fits the parent, and this stack changes no pin
            return self._resolved.inherited_fresh and not self._resolved.own_changes
        return bool(self.lock) and not self.lock_staleness()

    @property
    def lock_inherited(self) -> str | None:
        """The ancestor's lock file this stack uses (it has none of its own), or None."""
        return self._resolved.lock_inherited

    @property
    def own_changes(self) -> tuple[str, ...]:
        """With an inherited lock: the pins this stack adds, moves or drops, which that lock does not cover."""
        return self._resolved.own_changes

    def lock_staleness(self) -> list[str]:
        """Why the lock no longer fits this stack ([] when it fits or there is none): the pins, indexes or
        Python it was computed for, each named, so `validate` can say what moved (offline: no index asked)."""
        lock = self.lock
        if not lock:
            return []
        if self._resolved.lock_inherited:  # the parent's staleness (its finding); this stack's changes apart
            return list(self._resolved.inherited_staleness)
        broken = broken_seal(lock)
        # a broken seal alone makes it stale (nothing in it is used); what else no longer fits is said too
        why = [broken] if broken else []
        if lock.get("stack") != self.name:
            why.append(f"stack: locked for stack {lock.get('stack')!r}, this is {self.name!r}")
        if str(lock.get("python")) != self.python:
            why.append(f"python: locked for {lock.get('python')}, the stack has {self.python}")
        declared = {**self.indexes, **self.dropped_indexes}
        for name in sorted(set(lock.get("indexes") or {}) | set(declared)) if "indexes" in lock else []:
            was, now = (lock.get("indexes") or {}).get(name), declared.get(name)
            if was != now and any(c.pin_for(p).index == name for c in self._pypi().values() for p in self.platforms):
                why.append(f"indexes.{name}: locked against {was or '(none)'}, the stack has {now or '(none)'}")
        per_plat: dict[str, list[str]] = {}  # one line per problem, naming the platforms it holds on
        for plat in self.platforms:
            entry = (lock.get("platforms") or {}).get(plat)
            if not entry:
                why.append(f"platforms: {plat} is not in the lock")
                continue
            locked = entry.get("components") or {}
            for key, c in sorted(self._pypi().items()):
                pin, rec = c.pin_for(plat), locked.get(key)
                if rec is None:
                    per_plat.setdefault(f"components.{key}: {c.dist_name}=={pin.version} is not in the lock", []
                                        ).append(plat)
                elif (rec.get("version"), rec.get("index")) != (pin.version, pin.index):
                    per_plat.setdefault(f"components.{key}: locked {rec.get('version')} from {rec.get('index')}, "
                                        f"the stack pins {pin.version} from {pin.index}", []).append(plat)
            for key in sorted(set(locked) - set(self._pypi())):
                per_plat.setdefault(f"components.{key}: locked but no longer an installed pypi component", []
                                    ).append(plat)
        why += [f"{msg} ({', '.join(plats)})" for msg, plats in per_plat.items()]
        why += self._build_staleness(lock)
        if not why and lock.get("pins_digest") != self.pins_digest():
            why.append("the pinned requirements (extras or names) changed since the lock was computed")
        return list(dict.fromkeys(why))

    def _build_staleness(self, lock: dict) -> list[str]:
        """The wheels built in the image need their PEP 518 requirements hash-pinned in the lock."""
        reqs = self.build_requirements()
        plats = [p for p in self.platforms if not ((lock.get("platforms") or {}).get(p) or {}).get("build_deps")]
        if reqs and lock.get("build_requires") != reqs:
            return [f"build_requires: locked for {lock.get('build_requires') or '(none)'}, the stack's built wheels "
                    f"build with {reqs}"]
        return [f"build_deps: not locked for {', '.join(plats)}"] if reqs and plats else []

    def _built_from_source(self) -> dict[str, "Component"]:
        return {k: c for k, c in self.installed_components.items() if c.kind.needs_build_env(c)}

    def _pypi(self) -> dict[str, "Component"]:
        return {k: c for k, c in self.installed_components.items() if c.source == "pypi"}

    def build_requirements(self) -> list[str]:
        """The PEP 518 requirements of the wheels built in the image: git trees and `install: build` sdists that
        name `build_requires` (the lock pins them as `build_deps`)."""
        return sorted({r for c in self.installed_components.values() if c.kind.needs_build_env(c)
                       for r in (DEFAULT_BUILD_REQUIRES if c.build_requires is None else c.build_requires)})

    def locked_build_deps(self, platform: str) -> dict[str, dict]:
        """The hash-pinned build requirements for a platform, from a fresh lock; {} otherwise."""
        fresh = self.build_requirements() and self.lock_is_fresh()
        return ((self.lock.get("platforms", {}).get(platform) or {}).get("build_deps") or {}) if fresh else {}

    def locked_deps(self, platform: str) -> dict[str, dict]:
        """Resolved dependencies (not components) for a platform, from a fresh lock; {} otherwise."""
        if not self.lock_is_fresh():
            return {}
        names = {canon(c.dist_name) for c in self.installed_components.values()}
        deps = (self.lock.get("platforms", {}).get(platform) or {}).get("deps") or {}
        return {n: d for n, d in deps.items() if canon(n) not in names}


# ---------------------------------------------------------------------------------------------------------
# loading


def list_stacks(stacks_dir: Path | None = None) -> list[str]:
    d = stacks_dir or STACKS_DIR
    return sorted(p.stem for p in d.glob("*.yaml"))


def dependants(name: str, stacks_dir: Path | None = None) -> list[str]:
    """Stacks that extend `name`, directly or through others, parents before children (offline: `extends:` only).

    A file that cannot be read is skipped here; loading it reports it properly."""
    d = stacks_dir or STACKS_DIR
    parent_of = {}
    for other in list_stacks(d):
        try:
            parent_of[other] = read_yaml(d / f"{other}.yaml").get("extends")
        except StackError:
            continue
    out: list[str] = []
    frontier = [name]
    while frontier:
        children = sorted(s for s, p in parent_of.items() if p in frontier and s not in out and s != name)
        out += children
        frontier = children
    return out


def stack_path(name_or_path: str | Path, stacks_dir: Path | None = None) -> Path:
    """The stack file a name or path means; StackError (exit 2) naming the known stacks when there is none."""
    return named_file(name_or_path, stacks_dir or STACKS_DIR, "stack", StackError)


def read_yaml(path: Path) -> dict:
    return documents.read_yaml(path, StackError, "stack")


# Within one load_stack (and one findings.ancestors walk) every file of an `extends:` chain is read, merged and
# validated once: each level loads its parent for the lock it inherits and the rules load every ancestor, which
# made the cost cubic in the depth (40 levels: 12,000 file reads, 80 levels: two minutes).
_LOCAL = threading.local()  # per thread: `smoke --jobs` loads stacks in several at once


def _memo() -> dict | None:
    return getattr(_LOCAL, "memo", None)


@contextlib.contextmanager
def one_reading():
    """Files read inside are read once (the memo ends with the outermost `with`: a later call sees edits)."""
    if _memo() is not None:
        yield
        return
    _LOCAL.memo = {}
    try:
        yield
    finally:
        _LOCAL.memo = None


def merged_yaml(path: Path, stacks_dir: Path | None = None, seen: tuple[Path, ...] = ()) -> dict:
    """The stack file's mapping with its `extends:` chain merged in (parents first), walked without recursion
    and at most MAX_EXTENDS_DEPTH files deep."""
    key = ("raw", path, stacks_dir)
    memo = _memo()
    if memo is not None and key in memo:
        return copy.deepcopy(memo[key])
    chain: list[tuple[Path, dict]] = []
    visited = list(seen)
    here: Path | None = path
    while here is not None:
        if here in visited:
            looped = " -> ".join(str(p.name) for p in visited + [here])
            raise StackError(f"{here}: `extends` loops: {looped}")
        visited.append(here)
        if len(visited) > MAX_EXTENDS_DEPTH:
            raise extends_too_deep(path, visited, StackError)
        data = read_yaml(here)
        chain.append((here, data))
        parent = data.get("extends")
        if not parent:
            break
        if not isinstance(parent, str) or not grammar.NAME_RE.match(parent):
            raise StackError(f"{here}: extends: expected the name of a stack beside it or in "
                             f"{stacks_dir or STACKS_DIR} (lower-case, no '/' or '..'), got {parent!r}")
        here = parent_path(here, parent, stacks_dir)
    merged = chain[-1][1]
    for _p, data in reversed(chain[:-1]):
        merged.pop("name", None)
        merged.pop("extends", None)
        merged = merge(merged, data)
    if memo is not None:
        memo[key] = copy.deepcopy(merged)
    return merged


def parent_path(path: Path, parent: str, stacks_dir: Path | None = None) -> Path:
    """The file `extends: parent` names from the stack file `path`: only a sibling or a stack of the stacks
    directory, never a path that leaves them."""
    sibling = path.parent / f"{parent}.yaml"
    return sibling if sibling.is_file() else stack_path(parent, stacks_dir)


def apply_sets(data: dict, sets: dict[str, str], path: Path) -> dict:
    """`--set COMPONENT.FIELD=VALUE` overrides, before validation so the result is validated too."""
    data = copy.deepcopy(data)
    comps = data.setdefault("components", {})
    for dotted, value in sets.items():
        if dotted == "base.cann":  # the CANN a substitute-built smoke image is paired against (no CANN inside)
            data.setdefault("base", {})["cann"] = value
            continue
        if "." not in dotted:
            raise StackError(f"--set {dotted}={value}: expected COMPONENT.FIELD=VALUE, e.g. torch.version=2.9.0")
        key, field = dotted.split(".", 1)
        if key not in comps:
            raise StackError(
                f"--set {dotted}: {path.name} has no component {key!r} (components: {', '.join(sorted(comps))})"
            )
        comp = comps[key]
        if field == "version":
            comp["version"] = value
            # a moved pin invalidates the hashes and per-platform variants recorded for the old one
            comp["sha256"] = []
            comp.pop("platforms", None)
        elif field == "install":
            if value.lower() not in ("true", "false"):
                raise StackError(f"--set {dotted}={value}: expected true or false")
            comp["install"] = value.lower() == "true"
        elif field in ("index", "commit", "url", "git", "ref"):
            comp[field] = value
            if field in ("commit", "url"):
                comp["sha256"] = []
        elif field == "sha256":
            comp["sha256"] = [h for h in value.split(",") if h]
        else:
            raise StackError(
                f"--set {dotted}: field {field!r} cannot be overridden (use version, install, index, commit, url, "
                "git, ref or sha256)"
            )
    return data


def load_stack(
    name_or_path: str | Path,
    sets: dict[str, str] | None = None,
    base: str | None = None,
    stacks_dir: Path | None = None,
    repair_lock: bool = False,
) -> Stack:
    """The stack `name_or_path` with --set / --base applied and its lock attached. A lock outside the lock grammar
    is refused (StackError), except with `repair_lock` (`trainbox stack lock`, which rewrites it): then the stack
    loads as if it had none, and `resolution.lock_problem` says what was wrong."""
    path = stack_path(name_or_path, stacks_dir)
    key = ("stack", path, stacks_dir, repair_lock)
    if sets or base:
        with one_reading():
            return _load(path, sets, base, stacks_dir, repair_lock)
    memo = _memo()
    if memo is not None and key in memo:
        return memo[key]  # a Stack is not changed in place: each with_* method returns a copy
    with one_reading():
        stack = _load(path, None, None, stacks_dir, repair_lock)
        _memo()[key] = stack
    return stack


def _load(path: Path, sets: dict[str, str] | None, base: str | None, stacks_dir: Path | None,
          repair_lock: bool = False) -> Stack:
    data = merged_yaml(path, stacks_dir)
    if data.get("name") != path.stem:
        raise StackError(f"{path}: name: expected {path.stem!r} (the file name), got {data.get('name')!r}")
    overrides: dict[str, str] = {}
    if sets:
        data = apply_sets(data, sets, path)
        overrides.update(sets)
    declared_base = (data.get("base") or {}).get("image")
    if base and base != declared_base:
        data.setdefault("base", {})["image"] = base
        overrides["base.image"] = base
    try:
        stack = Stack.model_validate(data)
    except ValidationError as exc:
        raise StackError(_format_stack_errors(path, exc)) from None
    stack._resolved = Resolution(source_file=path, overrides=overrides,
                                 declared_base=declared_base if "base.image" in overrides else None)
    return _attach_lock(stack, stacks_dir, repair_lock)


def _format_stack_errors(path: Path, exc: ValidationError) -> str:
    """format_validation, with a key that names trainbox's own build state said to be that (and what to do)."""
    lines = []
    unknown = "unknown keys are rejected so a typo cannot drop a pin"
    for err, line in zip(exc.errors(), format_validation(path, exc, unknown).splitlines()):
        key = str(err["loc"][-1]) if err["loc"] else ""
        if err["type"] == "extra_forbidden" and key in INTERNAL_KEYS:
            loc = ".".join(str(x) for x in err["loc"])
            line = (f"{path}: {loc}: trainbox's own build state, not a stack file key: remove it "
                    f"({INTERNAL_KEYS[key]})")
        lines.append(line)
    return "\n".join(lines)


def _attach_lock(stack: Stack, stacks_dir: Path | None = None, repair: bool = False) -> Stack:
    lock_path = stack.lock_path
    if not lock_path or not lock_path.exists():
        parent = parent_path(stack.source_file, stack.extends, stacks_dir) if stack.extends else None
        return stack.with_parent_lock(load_stack(parent, stacks_dir=stacks_dir, repair_lock=repair)) \
            if parent else stack
    try:
        lock = load_yaml_file(lock_path, "lock", StackError) or {}
        lock = check_lock(lock, lock_path, stack.name, StackError)
    except StackError as exc:
        msg = str(exc) if "trainbox stack lock" in str(exc) else \
            f"{exc}; regenerate it with `trainbox stack lock {stack.name}`"
        if repair:
            return stack.resolved(lock_problem=msg)
        raise StackError(msg) from None
    return stack.with_lock(lock, str(lock_path))


def parse_sets(items: list[str] | None) -> dict[str, str]:
    """`--set COMPONENT.FIELD=VALUE` items as a dict (load_stack validates the components and fields)."""
    from .sets import split_assignment

    out: dict[str, str] = {}
    for item in items or []:
        key, value = split_assignment(item, "COMPONENT.FIELD=VALUE", "torch.version=2.13.0+cpu")
        if "." not in key or not value.strip():
            raise StackError(f"--set {item}: expected COMPONENT.FIELD=VALUE, e.g. --set torch.version=2.13.0+cpu")
        out[key.strip()] = value.strip()
    return out
