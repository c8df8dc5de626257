"""A stack file's parts below the stack itself: its `base:` section and its components; and the lock file beside
it, NAME.lock, whose entries are those components' pins (host module).

trainbox.specs.stack composes them into a Stack; a component's kind (trainbox.specs.kinds) says how it is fetched and installed.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from . import grammar
from .dists import canon
from .documents import format_validation
from .kinds import Kind, kind_of
from .platforms import PLATFORM_RE
from ..runtime.errors import TrainboxError
from ..runtime.install_source import TOOLKITS

SHA256_RE = re.compile(r"^[0-9a-f]{64}\Z")


class StrictModel(BaseModel):
    """A model of a file trainbox reads: a key it does not know is refused (a typo cannot drop a value)."""

    model_config = ConfigDict(extra="forbid", frozen=False)


class BaseSpec(StrictModel):
    """A stack file's `base:` section (what the stack asks for). The base a build really used is
    build.plan.BuildBase; trainbox.image.base makes and probes base images; `trainbox base` is their command."""

    image: str = Field(description="FROM image, with tag")
    # How to get the Python that wheels go into. "image": the base already ships it first on PATH (CANN bases);
    # "apt": install python3 + venv from the distribution and use /opt/venv.
    python_from: Literal["image", "apt"] = "image"
    python: str = Field("python3", description="interpreter command in the base once set up")
    cann: str | None = None
    chip: str | None = None
    os: str | None = None
    # Image to build on when `image` cannot be pulled (smoke builds, air-gapped CI). Recorded in the manifest.
    substitute: str | None = None
    # True only for stacks that must build anywhere (cpu): fall back to `substitute` without being asked.
    auto_substitute: bool = False

    @field_validator("image", "substitute")
    @classmethod
    def _image(cls, v: str | None) -> str | None:
        return v if v is None else grammar.check_image(v)

    @field_validator("python")
    @classmethod
    def _python(cls, v: str) -> str:
        return grammar.check_command(v)

    @field_validator("cann", "chip", "os")
    @classmethod
    def _tokens(cls, v: str | None, info) -> str | None:
        return v if v is None else grammar.check_token(v, info.field_name)


class PlatformPin(StrictModel):
    """A per-platform variant of a PyPI component (e.g. torch's CPU build on x86_64, PyPI's on aarch64)."""

    version: str | None = None
    index: str | None = None
    sha256: list[str] = Field(default_factory=list)

    @field_validator("version")
    @classmethod
    def _version(cls, v: str | None) -> str | None:
        return v if v is None else grammar.check_version(v)

    @field_validator("index")
    @classmethod
    def _index(cls, v: str | None) -> str | None:
        return v if v is None else grammar.check_name(v, "index")


#: What `needs:` may name: the toolkits the builder knows how to find (trainbox.runtime.install_source).
ToolkitName = Literal[tuple(sorted(TOOLKITS))]  # type: ignore[valid-type]


class Component(StrictModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    source: str  # a kind in trainbox.specs.kinds.KINDS
    name: str | None = None  # distribution name (pypi), defaults to the key
    version: str | None = None  # pypi: the pin; git with install: pip: the version the built wheel must have
    index: str = "pypi"
    sha256: list[str] = Field(default_factory=list)
    extras: list[str] = Field(default_factory=list)
    platforms: dict[str, PlatformPin] = Field(default_factory=dict)
    git: str | None = None
    commit: str | None = None
    ref: str | None = None  # tag or branch the commit was taken from; informational
    subdir: str | None = None  # git: where the package lives below the repository root
    url: str | None = None
    patches: str | None = None  # series name: a directory under patches/
    # false: listed only (e.g. what the base provides); git: pip (a wheel built from the tree), tree, or
    # build (its own build commands compile it: kernels against a toolkit of the base)
    install: bool | Literal["pip", "tree", "build"] = True
    build_isolation: bool = True  # git, install: pip: false builds with the venv's own setuptools
    # git, install: pip: PEP 518 build requirements, hash-pinned by the lock (`build_deps`); None: pip's default
    build_requires: list[str] | None = None
    build: list[str] = Field(default_factory=list)  # git, install: build: shell commands run in the tree
    wheels: str | None = None  # git, install: build: the wheels they leave, a glob in the tree (dist/*.whl)
    # toolkits the build needs from the base; on a substitute base (which has none) the component is left out
    needs: list[ToolkitName] = Field(default_factory=list)
    note: str | None = None

    @field_validator("sha256")
    @classmethod
    def _hashes(cls, v: list[str]) -> list[str]:
        for h in v:
            if not SHA256_RE.match(h):
                raise ValueError(f"sha256 {h!r} is not 64 lowercase hex digits")
        return v

    @field_validator("name")
    @classmethod
    def _dist_name(cls, v: str | None) -> str | None:
        return v if v is None else grammar.check_dist_name(v)

    @field_validator("extras")
    @classmethod
    def _extras(cls, v: list[str]) -> list[str]:
        return [grammar.check_dist_name(x) for x in v]

    @field_validator("index", "patches")
    @classmethod
    def _names(cls, v: str | None, info) -> str | None:
        return v if v is None else grammar.check_name(v, info.field_name)

    @field_validator("git")
    @classmethod
    def _git(cls, v: str | None) -> str | None:
        return v if v is None else grammar.check_git_url(v)

    @field_validator("url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        return v if v is None else grammar.check_url(v, ("https", "http", "file"))

    @field_validator("ref")
    @classmethod
    def _ref(cls, v: str | None) -> str | None:
        return v if v is None else grammar.check_git_ref(v)

    @field_validator("subdir")
    @classmethod
    def _subdir(cls, v: str | None) -> str | None:
        return v if v is None else grammar.check_relpath(v, "subdir")

    @field_validator("note")
    @classmethod
    def _note(cls, v: str | None) -> str | None:
        return v if v is None else grammar.check_text(v, "note")

    @field_validator("platforms")
    @classmethod
    def _platform_keys(cls, v: dict[str, PlatformPin]) -> dict[str, PlatformPin]:
        for p in v:
            if not PLATFORM_RE.match(p):
                raise ValueError(f"platform {p!r} is not one of linux/amd64, linux/arm64")
        return v

    @field_validator("source")
    @classmethod
    def _known_kind(cls, v: str) -> str:
        kind_of(v)
        return v

    @model_validator(mode="after")
    def _source_fields(self) -> "Component":
        self.kind.validate(self)
        if self.version:
            grammar.check_version(self.version)
        return self

    @property
    def kind(self) -> Kind:
        return kind_of(self.source)

    @property
    def extras_suffix(self) -> str:
        return f"[{','.join(self.extras)}]" if self.extras else ""

    @property
    def dist_name(self) -> str:
        return self.name or self.key

    # not fields, so a stack file cannot set them: the mapping key (set by Stack), the hashes the lock recorded for
    # this pin per platform (set by Stack.with_lock), git's tree hash of the fetched commit (set once fetched;
    # recorded in the manifest)
    _key: str = PrivateAttr("")
    _locked: dict[str, list[str]] = PrivateAttr(default_factory=dict)
    _tree_id: str | None = PrivateAttr(None)

    @property
    def key(self) -> str:
        return self._key

    @property
    def locked(self) -> dict[str, list[str]]:
        return self._locked

    @property
    def tree_id(self) -> str | None:
        return self._tree_id

    def pin_for(self, platform: str) -> PlatformPin:
        """The version / index / hashes in force on one platform (stack file first, then the lock)."""
        over = self.platforms.get(platform)
        if over and (over.sha256 or over.version or over.index):
            # another version or index on this platform: the component-level hashes are for other files
            sha = over.sha256 or self.locked.get(platform, [])
        else:
            sha = self.sha256 or self.locked.get(platform, [])
        return PlatformPin(
            version=(over.version if over and over.version else self.version),
            index=(over.index if over and over.index else self.index),
            sha256=list(sha),
        )

    @property
    def pinned_ref(self) -> str:
        return self.kind.pinned_ref(self)


# ---------------------------------------------------------------------------------------------------------
# the lock file (build/stacks/NAME.lock): what it may hold, field by field, and its seal
#
# A lock is machine-written (`trainbox stack lock`), but it is a file in the tree like the stack beside it, and its
# values end up in the generated requirement files pip installs from as root: a newline in a sha256 added an
# `evilpkg @ http://...` line, a version `1.0; touch /x` or `>=1` and a dep name with spaces or options went
# through as written. So a lock gets the stack files' grammar (trainbox.specs.grammar), checked when it is loaded: a
# value outside it is refused in one line naming the file and key path.
#
# An entry in the grammar can still be one the resolver never produced (a `deps:` package added by hand). The lock
# is sealed: `content_digest` is the sha256 of everything else in it, written by `stack lock`; a lock whose content
# does not match its digest is stale (`lock-fresh`), and nothing in it is used.

#: the key that holds the seal (sha256 of the rest of the lock as canonical JSON)
DIGEST_KEY = "content_digest"
_HEX16 = r"^[0-9a-f]{16}$"
_HEX64 = r"^[0-9a-f]{64}$"


def _hashes(v: list[str]) -> list[str]:
    for h in v:
        if not SHA256_RE.match(h):
            raise ValueError(f"sha256 {h!r}: expected 64 lowercase hex digits (a file hash the index published)")
    return v


class LockedDep(StrictModel):
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


class LockedPlatform(StrictModel):
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


class LockFile(StrictModel):
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
        return grammar.check_indexes(v)

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
        # strict: a YAML !!binary or a number is no string here (lax mode would decode bytes, and the raw value,
        # not the model, is what the lock's users read)
        LockFile.model_validate(data, strict=True)
    except ValidationError as exc:
        lines = format_validation(Path(path), exc, "a lock holds only what `trainbox stack lock` writes")
        raise error("\n".join(f"{_printable(line)}; {fix}" for line in lines.splitlines())) from None
    return data


def _printable(line: str) -> str:
    """pydantic's message quotes the value with repr(), but a key could still hold a control character."""
    return re.sub(r"[\x00-\x1f\x7f]", lambda m: f"\\x{ord(m.group()):02x}", line)
