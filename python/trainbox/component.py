"""A stack file's parts below the stack itself: its `base:` section and its components (host module).

trainbox.stack composes them into a Stack; a component's kind (trainbox.kinds) says how it is fetched and installed.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from . import grammar
from .kinds import Kind, kind_of
from .platforms import PLATFORM_RE
from .runtime.install_source import TOOLKITS

SHA256_RE = re.compile(r"^[0-9a-f]{64}\Z")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=False)


class BaseSpec(_Strict):
    """A stack file's `base:` section (what the stack asks for). The base a build really used is
    buildplan.BuildBase; trainbox.base makes and probes base images; `trainbox base` is their command."""

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


class PlatformPin(_Strict):
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


class Component(_Strict):
    model_config = ConfigDict(extra="forbid", frozen=True)

    source: str  # a kind in trainbox.kinds.KINDS
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
