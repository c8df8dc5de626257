"""`trainbox fetch`: every source a stack needs, in trainbox's content-addressed cache, verified (host module).

Wheels and archives are kept by sha256 ($TRAINBOX_CACHE/sources/sha256/<hex>/), git commits in one bare repository per
URL ($TRAINBOX_CACHE/sources/git/), each fetched with the user's own git and its configuration (url.<base>.insteadOf
mirrors, credential helpers, proxies). `image build` calls `fetch_sources` for what is missing and `stage` to put
the trees and archives into its build context under build/sources/<component>/, where the Dockerfile
bind-mounts them (no .git, no credential ever reaches a layer).
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from ..paths import PATCHES_DIR
from ..runtime.errors import TrainboxError
from ..specs.component import Component
from ..specs.kinds import kind_of
from ..specs.platforms import PLATFORM_MACHINE, PLATFORM_RE, host_platform
from ..specs.stack import Stack, list_stacks, load_stack
from .pins import DEFAULT_INDEX, Fetched, Pin
from .sources import SourceError, fetch_git, fetch_pypi, fetch_url, index_url, tree_id, unpack, verified_tree_id

SOURCES_DIR = "build/sources"
MARKER = ".trainbox-source.json"


@dataclass
class StackSources:
    """The fetched sources of one stack's staged components: {component key: Fetched}."""

    stack: Stack
    fetched: dict[str, Fetched]


def staged_components(stack: Stack) -> dict[str, Component]:
    """The installed components whose kind stages a fetched source into the build context."""
    return {k: c for k, c in sorted(stack.installed_components.items()) if c.kind.install_args(c)}


def fetch_sources(stack: Stack, *, offline: bool = False, cache_dir: Path | None = None, say=None) -> StackSources:
    """Fetch (or find in the cache) and verify each staged component's source. Its `stack` is a copy of the one
    given with the git tree hashes recorded on the components, so that the manifest and the content hash name the
    exact files (the stack given stays as it was)."""
    out: dict[str, Fetched] = {}
    trees: dict[str, str] = {}
    for key, c in staged_components(stack).items():
        if say:
            say(f"fetching {key}: {c.pinned_ref}")
        try:
            got = fetch_component(c, stack, offline=offline, cache_dir=cache_dir)
        except SourceError as exc:
            raise SourceError(f"component {exc}") from None
        if got.commit:
            trees[key] = tree_id(got)
        out[key] = got
    return StackSources(stack.with_tree_ids(trees) if trees else stack, out)


def check_platform(platform: str | None) -> None:
    """A --platform that no stack can target is refused in one line (exit 2), before anything is fetched: it was
    ignored, and the host's artifacts were fetched and cached under the name of the platform asked for."""
    if platform is not None and not PLATFORM_RE.match(platform):
        raise TrainboxError(f"--platform {platform!r}: not a platform trainbox builds for; expected one of "
                            f"{', '.join(PLATFORM_MACHINE)}")


def fetch_stacks(names: list[str] | None = None, *, sources_only: bool = False, offline: bool = False,
                 cache_dir: Path | None = None, platform: str | None = None, say=None) -> list[dict]:
    """`trainbox fetch`: every installed component of each stack (PyPI artifacts too unless sources_only), for
    `platform` (default: this host's where the stack has it, else the stack's first).
    `say`: one line per component as its fetch starts (a git commit or a torch wheel takes minutes)."""
    import time

    check_platform(platform)
    stacks = [load_stack(name) for name in names or list_stacks()]
    for stack in stacks:  # every stack checked before the first is fetched
        if platform and platform not in stack.platforms:
            raise TrainboxError(f"--platform {platform}: stack {stack.name} supports {', '.join(stack.platforms)} "
                                f"({stack.source_file}: platforms)")
    rows, t0 = [], time.monotonic()
    for stack in stacks:
        plat = platform or (host_platform() if host_platform() in stack.platforms else stack.platforms[0])
        for key, c in sorted(stack.installed_components.items()):
            if sources_only and not c.kind.install_args(c):
                continue
            pin = c.pin_for(plat) if c.kind.from_index else None
            if say:
                say(f"[{time.monotonic() - t0:5.1f}s] {stack.name}: {key} ({c.pinned_ref})")
            try:
                got = fetch_component(c, stack, offline=offline, cache_dir=cache_dir,
                                   prefer=pin.sha256 if pin else ())
            except SourceError as exc:
                raise SourceError(f"stack {stack.name}: component {exc}") from None
            row = {"stack": stack.name, "component": key, "ref": c.pinned_ref,
                   "cached": str(got.path), "sha256": got.sha256, "commit": got.commit}
            if got.commit:  # every object under the commit re-hashed, as staging does
                row["tree"] = verified_tree_id(got)
            rows.append(row)
    return rows


def stage(ctx: Path, sources: StackSources, check_patches: bool = True, patches_dir: Path | None = None) -> None:
    """Put each fetched source under ctx/build/sources/<key>/ (a git tree without .git, or the archive file),
    and check that each component's patch series applies to its tree before the build starts."""
    root = ctx / SOURCES_DIR
    root.mkdir(parents=True, exist_ok=True)
    for key, got in sources.fetched.items():
        c = sources.stack.components[key]
        dest = root / key
        if got.commit:
            unpack(got, dest)
            if check_patches and c.patches:
                check_series(key, c, dest, patches_dir or PATCHES_DIR)
            meta = {"git": c.git, "commit": got.commit, "tree": c._tree_id}
        else:
            dest.mkdir(parents=True)
            try:
                os.link(got.path, dest / got.filename)
            except OSError:
                shutil.copy2(got.path, dest / got.filename)
            meta = {"url": c.url, "sha256": got.sha256}
        (dest / MARKER).write_text(json.dumps(meta, sort_keys=True) + "\n")


def check_series(key: str, c: Component, tree: Path, patches_dir: Path) -> None:
    """The series must be made for the pinned commit and apply to its tree: fail here, naming the patch (and
    the file and hunk), not deep in a build."""
    from ..runtime import apply_patches as ap

    where = f"patches/{c.patches}"
    try:
        patches = ap.load_series(patches_dir / c.patches)
        for p in patches:
            m = ap.GIT_REF_RE.match(p.upstream_ref or "")
            if m and m.group("commit") != c.commit:
                raise TrainboxError(
                    f"component {key}: patch {where}/{p.name} was made against {m.group('url')}@"
                    f"{m.group('commit')[:12]}, not the pinned {c.git}@{c.commit[:12]}; rebase the series with "
                    f"`trainbox patches edit {key}` and `export`")
        results = ap.apply_series(patches, tree, dry_run=True)
    except ap.PatchError as exc:
        raise TrainboxError(f"component {key}: {where}: {exc}") from None
    bad = next((r for r in results if not r.ok), None)
    if bad is not None:
        raise TrainboxError(f"component {key}: patch {where}/{bad.name} does not apply to "
                            f"{c.git}@{c.commit}: {bad.describe()}")

def pin_from_component(comp: Component | Pin, stack: Stack | None = None, platform: str | None = None) -> Pin:
    """A Pin from a stack Component (or a Pin, as it is).

    The hashes are the component's own plus, when a stack is given, those in force on each of its
    platforms (the stack file or its lock), so any pinned artifact of that version can serve.
    With `platform`: the pin as it stands on that one platform (its version, index and hashes only).
    """
    if platform is not None and hasattr(comp, "pin_for"):
        pp = comp.pin_for(platform)
        indexes = getattr(stack, "indexes", None) or {}
        # an index the build dropped (it does not answer; the wheelhouse serves its pins) has no URL any more
        url = index_url(pp.index, indexes) if pp.index in indexes or pp.index == "pypi" else ""
        return Pin(key=comp.key, source=comp.source, name=comp.dist_name, version=pp.version,
                   index_name=pp.index, index_url=url, sha256=tuple(pp.sha256))
    hashes: list[str] = list(getattr(comp, "sha256", None) or [])
    if stack is not None and hasattr(comp, "pin_for"):
        for plat in getattr(stack, "platforms", None) or []:
            pin = comp.pin_for(plat)
            if pin.version == comp.version:
                hashes.extend(pin.sha256)
    seen: list[str] = []
    for h in hashes:
        if h not in seen:
            seen.append(h)
    index_name = getattr(comp, "index", None) or "pypi"
    name = getattr(comp, "dist_name", None) or getattr(comp, "name", None) or comp.key
    source = comp.source
    return Pin(
        key=comp.key,
        source=source,
        name=name,
        version=getattr(comp, "version", None),
        index_name=index_name,
        index_url=(index_url(index_name, getattr(stack, "indexes", None)) if kind_of(source).from_index
                   else DEFAULT_INDEX),
        sha256=tuple(seen),
        git=getattr(comp, "git", None),
        commit=getattr(comp, "commit", None),
        url=getattr(comp, "url", None),
    )


#: How each `source:` is fetched (its kind in trainbox.specs.kinds names the same three).
_FETCHERS: dict[str, Callable[..., Fetched]] = {
    "pypi": lambda pin, prefer, offline, cache_dir: fetch_pypi(pin, prefer, offline, cache_dir),
    "url": lambda pin, prefer, offline, cache_dir: fetch_url(pin, offline, cache_dir),
    "git": lambda pin, prefer, offline, cache_dir: fetch_git(pin, offline, cache_dir),
}


def fetch(pin: Pin, *, prefer: Iterable[str] = (), offline: bool = False, cache_dir: Path | None = None) -> Fetched:
    """The pinned source, from the cache or downloaded into it, the way its `source:` fetches. `prefer`: sha256s
    to choose first."""
    return _FETCHERS[pin.source](pin, list(prefer), offline, cache_dir)


def fetch_component(comp: Component, stack: Stack | None = None, *, offline: bool = False,
                    cache_dir: Path | None = None, prefer: Iterable[str] = ()) -> Fetched:
    """A stack component's pinned source in trainbox's cache, verified."""
    return fetch(pin_from_component(comp, stack), prefer=prefer, offline=offline, cache_dir=cache_dir)
