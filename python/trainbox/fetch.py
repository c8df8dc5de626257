"""`trainbox fetch`: every source a stack needs, in trainbox's content-addressed cache, verified (host module).

Wheels and archives are kept by sha256 (CACHE_DIR/sources/sha256/<hex>/), git commits in one bare repository per
URL (CACHE_DIR/sources/git/), each fetched with the user's own git and its configuration (url.<base>.insteadOf
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

from .paths import PATCHES_DIR
from .platforms import PLATFORM_MACHINE, PLATFORM_RE, host_platform
from .runtime.errors import TrainboxError
from .sources import Fetched, SourceError, tree_id, unpack, verified_tree_id
from .stack import list_stacks, load_stack

SOURCES_DIR = "build/sources"
MARKER = ".trainbox-source.json"


@dataclass
class StackSources:
    """The fetched sources of one stack's staged components: {component key: Fetched}."""

    stack: object
    fetched: dict[str, Fetched]


def staged_components(stack) -> dict:
    """The installed components whose kind stages a fetched source into the build context."""
    return {k: c for k, c in sorted(stack.installed_components.items()) if c.kind.install_args(c)}


def fetch_sources(stack, *, offline: bool = False, cache_dir: Path | None = None, say=None) -> StackSources:
    """Fetch (or find in the cache) and verify each staged component's source. Its `stack` is a copy of the one
    given with the git tree hashes recorded on the components, so that the manifest and the content hash name the
    exact files (the stack given stays as it was)."""
    out: dict[str, Fetched] = {}
    trees: dict[str, str] = {}
    for key, c in staged_components(stack).items():
        if say:
            say(f"fetching {key}: {c.pinned_ref}")
        try:
            got = c.kind.fetch(c, stack, offline=offline, cache_dir=cache_dir)
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
                got = c.kind.fetch(c, stack, offline=offline, cache_dir=cache_dir,
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


def check_series(key: str, c, tree: Path, patches_dir: Path) -> None:
    """The series must be made for the pinned commit and apply to its tree: fail here, naming the patch (and
    the file and hunk), not deep in a build."""
    from .runtime import apply_patches as ap

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
