"""What a lock file (build/stacks/NAME.lock) may hold, field by field, and its seal (host module).

A lock is machine-written (`trainbox stack lock`), but it is a file in the tree like the stack beside it, and its
values end up in the generated requirement files pip installs from as root: a newline in a sha256 added an
`evilpkg @ http://...` line, a version `1.0; touch /x` or `>=1` and a dep name with spaces or options went
through as written. So a lock gets the stack files' grammar (trainbox.grammar), checked when it is loaded: a
value outside it is refused in one line naming the file and key path.

An entry in the grammar can still be one the resolver never produced (a `deps:` package added by hand). The lock
is sealed: `content_digest` is the sha256 of everything else in it, written by `stack lock`; a lock whose content
does not match its digest is stale (`lock-fresh`), and nothing in it is used.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from pydantic import Field, ValidationError, field_validator

from . import grammar
from .component import SHA256_RE, _Strict
from .dists import canon
from .documents import format_validation
from .platforms import PLATFORM_RE
from .runtime.errors import TrainboxError

#: the key that holds the seal (sha256 of the rest of the lock as canonical JSON)
DIGEST_KEY = "content_digest"
_HEX16 = r"^[0-9a-f]{16}$"
_HEX64 = r"^[0-9a-f]{64}$"


def _hashes(v: list[str]) -> list[str]:
    for h in v:
        if not SHA256_RE.match(h):
            raise ValueError(f"sha256 {h!r}: expected 64 lowercase hex digits (a file hash the index published)")
    return v


class LockedDep(_Strict):
    """One package of a resolved closure (`deps`, `build_deps`): an exact version and its files' hashes."""

    version: str
    sha256: list[str] = Field(default_factory=list)

    @field_validator("version")
    @classmethod
    def _check_version(cls, v: str) -> str:
        return grammar.check_version(v)

    @field_validator("sha256")
    @classmethod
    def _check_hashes(cls, v: list[str]) -> list[str]:
        return _hashes(v)


class LockedPin(LockedDep):
    """A component's pin on one platform: its version, the index it comes from and its files' hashes."""

    index: str

    @field_validator("index")
    @classmethod
    def _check_index(cls, v: str) -> str:
        return grammar.check_name(v, "index")


def _dist_names(v: dict) -> dict:
    """Closure keys are PEP 503 names as the resolver reports them (lower case, '-'): nothing else."""
    for name in v:
        grammar.check_dist_name(name)
        if canon(name) != name:
            raise ValueError(f"distribution name {name!r}: expected its normalized form {canon(name)!r}")
    return v


class LockedPlatform(_Strict):
    components: dict[str, LockedPin] = Field(default_factory=dict)
    deps: dict[str, LockedDep] | None = None
    build_deps: dict[str, LockedDep] | None = None

    @field_validator("components")
    @classmethod
    def _keys(cls, v: dict) -> dict:
        for key in v:
            grammar.check_name(key, "component")
        return v

    @field_validator("deps", "build_deps")
    @classmethod
    def _closure(cls, v: dict | None) -> dict | None:
        return v if v is None else _dist_names(v)


class LockFile(_Strict):
    """Exactly what `trainbox stack lock` writes."""

    stack: str
    python: str = Field(pattern=r"^3\.\d+$")
    pins_digest: str = Field(pattern=_HEX16)
    indexes: dict[str, str]
    platforms: dict[str, LockedPlatform]
    build_requires: list[str] | None = None
    # absent (a lock from before the seal) or not matching: stale, not invalid; `stack lock` rewrites it
    content_digest: str | None = Field(None, pattern=_HEX64)

    @field_validator("stack")
    @classmethod
    def _check_stack(cls, v: str) -> str:
        return grammar.check_name(v, "stack")

    @field_validator("indexes")
    @classmethod
    def _indexes(cls, v: dict[str, str]) -> dict[str, str]:
        for name, url in v.items():
            grammar.check_name(name, "index name")
            grammar.check_url(url, ("https", "http", "file"), f"indexes.{name}")
        return v

    @field_validator("platforms")
    @classmethod
    def _platforms(cls, v: dict) -> dict:
        for p in v:
            if not PLATFORM_RE.match(p):
                raise ValueError(f"platform {p!r} is not one of linux/amd64, linux/arm64")
        return v

    @field_validator("build_requires")
    @classmethod
    def _reqs(cls, v: list[str] | None) -> list[str] | None:
        return v if v is None else [grammar.check_requirement(r, "build_requires") for r in v]


def digest(lock: dict) -> str:
    """sha256 of the lock without its seal, as canonical JSON (the same for the YAML file and the dict)."""
    rest = {k: v for k, v in lock.items() if k != DIGEST_KEY}
    return hashlib.sha256(json.dumps(rest, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def seal(lock: dict) -> dict:
    """The lock with its content_digest (what `stack lock` writes, and what a build resolves for --set)."""
    return {**{k: v for k, v in lock.items() if k != DIGEST_KEY}, DIGEST_KEY: digest(lock)}


def intact(lock: dict | None) -> bool:
    """Whether `lock` is as `trainbox stack lock` sealed it (no entry added, changed or removed since)."""
    return bool(lock) and isinstance(lock.get(DIGEST_KEY), str) and lock[DIGEST_KEY] == digest(lock)


def broken_seal(lock: dict) -> str | None:
    """Why `lock` is not as `trainbox stack lock` sealed it, or None when it is."""
    if intact(lock):
        return None
    if DIGEST_KEY not in lock:
        return (f"{DIGEST_KEY}: missing (a lock from an older trainbox, or one edited by hand); none of it is used "
                "until it is rewritten")
    return (f"{DIGEST_KEY}: does not match the lock's content: an entry was added, changed or removed after "
            "`trainbox stack lock` wrote it (not by the resolver), so none of it is used")


def check_lock(data: object, path: Path | str, stack_name: str,
               error: type[TrainboxError] = TrainboxError) -> dict:
    """`data` (a loaded lock) if every field is in the grammar, else `error` with one line per problem: the file,
    the key path, what was expected, and the fix (the lock is regenerated, never edited)."""
    fix = f"regenerate it with `trainbox stack lock {stack_name}` (a lock is written by trainbox, not by hand)"
    if not isinstance(data, dict):
        raise error(f"{path}: expected a mapping at the top level, got {type(data).__name__}; {fix}")
    try:
        LockFile.model_validate(data)
    except ValidationError as exc:
        lines = format_validation(Path(path), exc, "a lock holds only what `trainbox stack lock` writes")
        raise error("\n".join(f"{_printable(line)}; {fix}" for line in lines.splitlines())) from None
    return data


def _printable(line: str) -> str:
    """pydantic's message quotes the value with repr(), but a key could still hold a control character."""
    return re.sub(r"[\x00-\x1f\x7f]", lambda m: f"\\x{ord(m.group()):02x}", line)
