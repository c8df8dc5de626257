"""Component kinds: one object per `source:` value (host module).

Each kind says, for a stack component of its kind, what validation requires, its pinned reference, the lines
it adds to the build's hash-checked requirements, its entry in the image manifest, and how it is installed.
No other module branches on `source:`; they ask the component's kind (`KINDS[c.source]`). A kind added here
is a new `source:` value everywhere at once; a value with no kind is refused at validation.

    pypi  name==version from an index, hash-checked (the lock records the hashes per platform); with `needs:`
          an sdist compiled against a toolkit of the base in its own step, after the pins it builds against
          (`build_isolation: false`: against the venv's torch), left out on a substitute base
    url   one file by URL and sha256: a wheel (installed from its URL, hash-checked), an archive of wheels
          (.tar.gz/.tgz/.zip: fetched on the host, verified, its wheels installed --no-deps), or a source archive
          that its own `build:` commands turn into wheels (`install: build`: an sdist built with another
          pyproject, as sglang's NPU image builds sglang)
    git   a repository at a full 40-hex commit: a wheel built from the tree (`install: pip`), the tree itself
          on sys.path (`install: tree`), optionally below `subdir:`, or the wheels its own `build:` commands
          leave (`install: build`, with the toolkits it `needs:`); a patch series applies first

Kinds are data only: nothing here fetches. trainbox.supply.fetch turns a component into a `Pin` and fetches it
the way its `source:` says; trainbox.supply.pins holds what a fetched source means for a patch series.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar, Literal, Protocol, runtime_checkable

from . import grammar
from .platforms import platform_marker
from ..runtime.errors import TrainboxError

ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".zip")
#: A git pin is a full commit: a branch or a short hash can move or collide.
COMMIT_RE = re.compile(r"^[0-9a-f]{40}\Z")
#: Where `install: tree` checkouts live in the image (one directory per component key).
TREE_ROOT = "/opt/src"
#: pip's PEP 518 default for a tree without [build-system] (MindSpeed, ms-swift): what `build_requires:` means unset
DEFAULT_BUILD_REQUIRES = ("setuptools>=40.8.0", "wheel")


def _hash_suffix(shas: Sequence[str]) -> str:
    return " ".join(f"--hash=sha256:{h}" for h in shas)


# What a kind reads of a component and its stack, named here because the model (trainbox.specs.component, .stack)
# imports the kinds: component.Component and stack.Stack satisfy these (tests/test_kinds.py checks it), and a
# kind reads nothing else of them.

@runtime_checkable
class PlatformPinView(Protocol):
    """A component's pin on one platform (component.PlatformPin)."""

    @property
    def version(self) -> str | None: ...
    @property
    def index(self) -> str | None: ...
    @property
    def sha256(self) -> list[str]: ...


@runtime_checkable
class PinnedComponent(Protocol):
    """A stack component as its kind sees it (component.Component): its fields, its key in the stack, the hashes
    the lock gave it and, once fetched, git's tree hash of its commit."""

    @property
    def key(self) -> str: ...
    @property
    def source(self) -> str: ...
    @property
    def dist_name(self) -> str: ...
    @property
    def version(self) -> str | None: ...
    @property
    def index(self) -> str: ...
    @property
    def sha256(self) -> list[str]: ...
    @property
    def extras(self) -> list[str]: ...
    @property
    def extras_suffix(self) -> str: ...
    @property
    def git(self) -> str | None: ...
    @property
    def commit(self) -> str | None: ...
    @property
    def ref(self) -> str | None: ...
    @property
    def subdir(self) -> str | None: ...
    @property
    def url(self) -> str | None: ...
    @property
    def patches(self) -> str | None: ...
    @property
    def install(self) -> bool | Literal["pip", "tree", "build"]: ...
    @property
    def build_isolation(self) -> bool: ...
    @property
    def build_requires(self) -> list[str] | None: ...
    @property
    def build(self) -> list[str]: ...
    @property
    def wheels(self) -> str | None: ...
    @property
    def needs(self) -> Sequence[str]: ...
    @property
    def locked(self) -> dict[str, list[str]]: ...
    @property
    def tree_id(self) -> str | None: ...

    def pin_for(self, platform: str) -> PlatformPinView: ...


@runtime_checkable
class StackView(Protocol):
    """The stack a component belongs to, as its kind sees it (stack.Stack)."""

    @property
    def name(self) -> str: ...
    @property
    def platforms(self) -> list[str]: ...
    @property
    def lock(self) -> dict | None: ...
    @property
    def source_file(self) -> Path | None: ...

    def lock_staleness(self) -> list[str]: ...



class Kind:
    """What every kind supplies. `c` is a stack component, `stack` its stack."""

    name: ClassVar[str] = ""
    #: its artifacts come from a PyPI-style index: locked per platform, served by a wheelhouse, resolved by pip
    from_index: ClassVar[bool] = False
    #: fields that belong to other kinds only (refused here so a typo'd kind cannot hide a pin)
    foreign: ClassVar[tuple[str, ...]] = ()

    def validate(self, c: PinnedComponent) -> None:
        """Raise ValueError (pydantic turns it into file + key path) when `c` cannot be installed as given."""
        for f in self.foreign:
            if getattr(c, f, None) not in (None, [], False):
                raise ValueError(f"`{f}` does not belong to a {self.name} component")

    def pinned_ref(self, c: PinnedComponent) -> str:
        raise NotImplementedError

    def requirement_lines(self, c: PinnedComponent, stack: StackView) -> list[str]:
        """Lines for the build's hash-checked requirements.txt (none: the kind installs another way)."""
        return []

    def manifest_entry(self, c: PinnedComponent, stack: StackView) -> dict:
        return {"name": c.dist_name, "source": self.name}

    def install_args(self, c: PinnedComponent) -> list[str]:
        """Arguments of the builder's install_source.py, for a component whose fetched source (tree or
        archive) the image build stages into the build context ([]: pip installs it from the requirements)."""
        return []

    def builder_packages(self, c: PinnedComponent) -> list[str]:
        """Distribution packages the builder stage needs to install this component."""
        return []

    def compiled(self, c: PinnedComponent) -> bool:
        """Whether the build runs the component's own build code (no index credentials reach it)."""
        return False

    def needs_build_env(self, c: PinnedComponent) -> bool:
        """Its wheel is built in an isolated build environment whose PEP 518 requirements the lock pins."""
        return False

    def builds_apart(self, c: PinnedComponent) -> bool:
        """Its wheel's build needs nothing of the venv (an isolated PEP 517 build): it can run in a stage of its own,
        beside the venv's pins, and the builder only installs the wheel."""
        return False

    def pin_warnings(self, c: PinnedComponent, stack: StackView) -> list[str]:
        """What `trainbox stack check` should say about a pin that validates but is not fully pinned."""
        return []

class PypiKind(Kind):
    name = "pypi"
    from_index = True
    foreign = ("git", "commit", "url", "subdir", "build", "wheels", "build_requires")

    def validate(self, c: PinnedComponent) -> None:
        super().validate(c)
        if not c.version:
            raise ValueError("a pypi component needs `version` (an exact pin, used as name==version)")
        if any(ch in c.version for ch in "<>=!~*, "):
            raise ValueError(f"version {c.version!r} must be one exact version, not a range")
        if c.install not in (True, False, "pip"):
            raise ValueError(f"install: {c.install!r} is for git components; a pypi component takes true or false")
        if not c.build_isolation and not c.needs:
            raise ValueError("build_isolation: false is for a pypi component compiled in the build (`needs:`); "
                             "a pinned wheel is not built")
        if c.needs and c.extras:
            raise ValueError("a pypi component with `needs:` is built from its sdist --no-deps: pin what an extra "
                             "would add as components of its own")

    def compiled(self, c: PinnedComponent) -> bool:
        """Built from its sdist against a toolkit of the base (a CUDA extension), not installed from a wheel."""
        return bool(c.needs)

    def pinned_ref(self, c: PinnedComponent) -> str:
        return f"{c.dist_name}=={c.version}"

    def _sdist_hashes(self, c: PinnedComponent) -> list[str]:
        """The sdist's hashes: the stack file's and the lock's (one file serves every platform)."""
        return sorted({*c.sha256, *(h for hs in c.locked.values() for h in hs)})

    def install_args(self, c: PinnedComponent) -> list[str]:
        if not self.compiled(c):
            return []
        shas = self._sdist_hashes(c)
        if not shas:
            raise TrainboxError(f"components.{c.key}: no sha256 for its sdist; run `trainbox stack lock` (the "
                                "sdist is staged and checked against it before it is built)")
        args = ["--mode", "sdist", "--dist", c.dist_name, "--version", c.version]
        for h in shas:
            args += ["--sha256", h]
        for name in c.needs:
            args += ["--needs", name]
        if not c.build_isolation:
            args.append("--no-build-isolation")
        return args

    def requirement_lines(self, c: PinnedComponent, stack: StackView) -> list[str]:
        if self.compiled(c):
            return []  # built in its own step (install_source --mode sdist), once what it compiles against is in
        groups: dict[tuple, list[str]] = {}
        for plat in stack.platforms:
            pin = c.pin_for(plat)
            if not pin.sha256:
                stale = stack.lock_staleness() if stack.lock else []
                raise TrainboxError(
                    f"{stack.source_file}: components.{c.key}: no sha256 for {plat}; run "
                    f"`trainbox stack lock {stack.name}` (every artifact is installed in hash-checking mode)"
                    + (f"; the lock is stale: {stale[0]}" if stale else ""))
            groups.setdefault((pin.version, tuple(sorted(pin.sha256))), []).append(plat)
        lines = []
        for (version, shas), plats in sorted(groups.items()):
            marker = platform_marker(plats, stack.platforms)
            lines.append(f"{c.dist_name}{c.extras_suffix}=={version}{marker} {_hash_suffix(shas)}")
        return lines

    def manifest_entry(self, c: PinnedComponent, stack: StackView) -> dict:
        pins = {p: c.pin_for(p) for p in stack.platforms}
        entry = {**super().manifest_entry(c, stack), "version": c.version, "index": c.index,
                 "sha256": sorted({h for pin in pins.values() for h in pin.sha256})}
        variants = {p: pin.version for p, pin in pins.items() if pin.version != c.version}
        if variants:
            entry["platform_versions"] = variants
        if self.compiled(c):
            entry.update(install="sdist", needs=list(c.needs),
                         build_flags=[] if c.build_isolation else ["--no-build-isolation"])
        return entry

    def pin_warnings(self, c: PinnedComponent, stack: StackView) -> list[str]:
        return [f"no sha256 for {plat}; run `trainbox stack lock {stack.name}`"
                for plat in stack.platforms if not c.pin_for(plat).sha256]


class UrlKind(Kind):
    name = "url"
    foreign = ("git", "commit", "subdir")

    def validate(self, c: PinnedComponent) -> None:
        super().validate(c)
        if not c.url:
            raise ValueError("a url component needs `url`")
        if len(c.sha256) != 1:
            raise ValueError("a url component needs exactly one `sha256` (of the file at `url`)")
        path = c.url.split("?", 1)[0].split("#", 1)[0]
        if not path.endswith((".whl",) + ARCHIVE_SUFFIXES):
            raise ValueError(f"url {c.url!r}: expected a wheel (.whl) or an archive of wheels "
                             f"({', '.join(ARCHIVE_SUFFIXES)}); other files cannot be installed")
        if c.install == "build":
            if not self.is_archive(c):
                raise ValueError("install: build needs a source archive (.tar.gz/.tgz/.zip), not a wheel")
            _validate_build(c)
            for r in c.build_requires or []:
                grammar.check_requirement(r, "build_requires")
            return
        if c.build_requires is not None:
            raise ValueError("`build_requires` are the PEP 518 requirements an `install: build` archive's commands "
                             "build with (a wheel or an archive of wheels builds nothing)")
        for f in ("build", "wheels", "needs"):
            if getattr(c, f) not in (None, []):
                raise ValueError(f"`{f}` belongs to `install: build` (a source archive its own commands compile)")
        if c.install not in (True, False, "pip"):
            raise ValueError(f"install: {c.install!r}: a url component takes true, false or build (a source "
                             "archive its `build:` commands turn into wheels)")

    def is_archive(self, c: PinnedComponent) -> bool:
        return c.url.split("?", 1)[0].split("#", 1)[0].endswith(ARCHIVE_SUFFIXES)

    def pinned_ref(self, c: PinnedComponent) -> str:
        return str(c.url)

    def requirement_lines(self, c: PinnedComponent, stack: StackView) -> list[str]:
        if self.is_archive(c):
            return []  # staged by the host, verified and installed by the builder (see install_source.py)
        return [f"{c.dist_name} @ {c.url} {_hash_suffix(c.sha256)}"]

    def needs_build_env(self, c: PinnedComponent) -> bool:
        # an sdist its own commands build (sglang's `pip wheel`): given `build_requires`, the lock pins them and
        # the commands' pip gets exactly those (install_source: on PYTHONPATH, build isolation off)
        return c.install == "build" and c.build_requires is not None

    def install_args(self, c: PinnedComponent) -> list[str]:
        if c.install == "build":  # the staged archive is the tree: unpacked, patched, built by its commands
            patches = ["--patches", f"/tmp/trainbox/patches/{c.patches}"] if c.patches else []
            return ["--mode", "build", "--url", c.url, "--sha256", c.sha256[0], *_build_args(c), *patches]
        return ["--mode", "archive", "--sha256", c.sha256[0]] if self.is_archive(c) else []

    def manifest_entry(self, c: PinnedComponent, stack: StackView) -> dict:
        entry = {**super().manifest_entry(c, stack), "url": c.url, "sha256": list(c.sha256)}
        if c.install == "build":
            entry["install"] = "build"
            if c.needs:
                entry["needs"] = list(c.needs)
        return entry


def _validate_build(c: PinnedComponent) -> None:
    """`install: build` (git trees and source archives): one-line commands, a wheels glob."""
    if not c.build:
        raise ValueError("install: build needs `build:`, the commands that compile it (run in the tree)")
    for cmd in c.build:  # one line each: a newline or other control would end the Dockerfile's RUN
        if not cmd.strip() or grammar.controls(cmd):
            raise ValueError(f"build: {cmd[:60]!r}: expected one command per line (no control characters)")
        grammar.check_text(cmd, "build")
    if c.wheels is not None:
        grammar.check_glob(c.wheels, "wheels")


def _build_args(c: PinnedComponent) -> list[str]:
    args: list[str] = []
    for cmd in c.build:
        args += ["--build", cmd]
    if c.wheels:
        args += ["--wheels", c.wheels]
    for name in c.needs:
        args += ["--needs", name]
    return args


class GitKind(Kind):
    name = "git"
    foreign = ("url", "extras")

    def validate(self, c: PinnedComponent) -> None:
        super().validate(c)
        if not c.git:
            raise ValueError("a git component needs `git` (the repository URL)")
        if not c.commit:
            raise ValueError(f"a git component needs `commit:` (the full 40-hex sha{' that ' + repr(c.ref) + ' names' if c.ref else ''}); "
                             "a branch or tag alone moves, so it is refused")
        if not COMMIT_RE.match(c.commit):
            raise ValueError(f"commit {c.commit!r} must be a full 40-hex sha (a branch, tag or short sha is refused)")
        scheme = c.git.split("://", 1)[0] if "://" in c.git else ("ssh" if re.match(r"^[\w.-]+@[\w.-]+:", c.git) else "")
        if scheme not in ("https", "ssh", "file"):
            raise ValueError(f"git {c.git!r}: only https://, ssh:// (or user@host:path) and file:// URLs are "
                             "allowed (use git's url.<base>.insteadOf for mirrors)")
        if c.subdir and (c.subdir.startswith("/") or ".." in c.subdir.split("/")):
            raise ValueError(f"subdir {c.subdir!r} must be a relative path inside the repository")
        if c.install not in (True, False, "pip", "tree", "build"):
            raise ValueError(f"install: {c.install!r}: expected pip (a wheel built from the tree), tree "
                             "(the checkout on sys.path), build (its own build commands) or false")
        self._validate_build(c)
        if c.sha256:
            raise ValueError("`sha256` does not belong to a git component (the commit is its pin)")
        if c.build_requires is not None and not self.needs_build_env(c):
            raise ValueError("`build_requires` are the PEP 518 requirements of a wheel built in isolation (install: "
                             "pip, build_isolation: true); this component builds none")
        for r in c.build_requires or []:
            grammar.check_requirement(r, "build_requires")
        if c.install == "tree" and c.version:
            raise ValueError("`version` is checked against the wheel built from the tree; `install: tree` builds none")

    def _validate_build(self, c: PinnedComponent) -> None:
        if c.install != "build":
            for f in ("build", "wheels", "needs"):
                if getattr(c, f) not in (None, []):
                    raise ValueError(f"`{f}` belongs to `install: build` (a component its own commands compile)")
            return
        _validate_build(c)
        if c.version or c.subdir:
            raise ValueError("`version` and `subdir` are for install: pip; install: build installs the wheels "
                             "its commands leave (`wheels:`)")

    def pinned_ref(self, c: PinnedComponent) -> str:
        return f"{c.git}@{c.commit}"

    def install_args(self, c: PinnedComponent) -> list[str]:
        args = ["--mode", self.mode(c), "--git", c.git, "--commit", c.commit]
        if c.subdir:
            args += ["--subdir", c.subdir]
        if c.version:
            args += ["--version", c.version]
        if not c.build_isolation:
            args.append("--no-build-isolation")
        args += _build_args(c)
        if c.patches:
            args += ["--patches", f"/tmp/trainbox/patches/{c.patches}"]
        return args

    def compiled(self, c: PinnedComponent) -> bool:
        return c.install == "build"

    def needs_build_env(self, c: PinnedComponent) -> bool:
        return c.install is not False and self.mode(c) == "pip" and c.build_isolation

    def builds_apart(self, c: PinnedComponent) -> bool:
        return self.needs_build_env(c)  # `install: pip` in isolation; `build:` commands build against the venv

    def builder_packages(self, c: PinnedComponent) -> list[str]:
        # a plain `docker build` without staged trees fetches the commit with git in the builder
        return ["git", "ca-certificates"]

    def mode(self, c: PinnedComponent) -> str:
        return c.install if c.install in ("tree", "build") else "pip"

    def tree_path(self, c: PinnedComponent) -> str:
        return f"{TREE_ROOT}/{c.key}"

    def manifest_entry(self, c: PinnedComponent, stack: StackView) -> dict:
        entry = {**super().manifest_entry(c, stack), "git": c.git, "commit": c.commit, "ref": c.ref,
                 "install": self.mode(c), "subdir": c.subdir,
                 "build_flags": [] if c.build_isolation else ["--no-build-isolation"]}
        if c.version:
            entry["version"] = c.version
        if c.needs:
            entry["needs"] = list(c.needs)
        if c.tree_id:
            entry["tree"] = c.tree_id  # git's tree hash of the commit, known once fetched
        if self.mode(c) == "tree":
            entry["path"] = self.tree_path(c) + (f"/{c.subdir}" if c.subdir else "")
        return entry


KINDS: dict[str, Kind] = {k.name: k for k in (PypiKind(), UrlKind(), GitKind())}


def kind_of(source: str) -> Kind:
    try:
        return KINDS[source]
    except KeyError:
        raise ValueError(f"source {source!r}: expected one of {', '.join(KINDS)}") from None
