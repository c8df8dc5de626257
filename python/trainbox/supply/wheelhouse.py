"""Wheelhouses: directories of pinned wheels a build installs from, checked, planned and filled (host module).

A wheelhouse is the trust root for air-gapped builds, so every file in it for a pinned project must be the
pinned artifact (sha256). `wanted` lists what a stack installs on one platform (its pypi components and the
locked dependency closure), `fetch_plan` says where each of those will come from, and `fill` downloads them,
hash-verified, for `trainbox image wheelhouse STACK --platform P -o DIR`.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from ..specs.dists import DIST_SUFFIXES, canon, dist_key, norm_version, sha256_file
from ..runtime.errors import TrainboxError
from ..specs.stack import Stack
from .fetch import pin_from_component
from .pins import Pin

SCHEMA = "trainbox.wheelhouse/1"


@dataclass
class WheelFile:
    name: str
    size: int
    sha256: str
    path: Path


def read_wheelhouse(path: str | os.PathLike) -> list[WheelFile]:
    d = Path(path)
    if not d.is_dir():
        raise TrainboxError(f"--wheelhouse {d}: no such directory; give a directory of wheels (fill one with "
                            "`trainbox image wheelhouse STACK -o DIR`)")
    files = sorted(p for p in d.iterdir() if p.is_file() and p.name.endswith(DIST_SUFFIXES))
    if not files:
        raise TrainboxError(f"--wheelhouse {d}: holds no wheels (*.whl) or sdists; put the pinned wheels there "
                            "(`trainbox image wheelhouse STACK -o DIR` fills it)")
    return [WheelFile(p.name, p.stat().st_size, sha256_file(p, remember=True), p) for p in files]


def pins_for(stack: Stack, platform: str) -> list[Pin]:
    """The stack's pypi components as they stand on one platform."""
    return [pin_from_component(c, stack, platform=platform)
            for c in stack.installed_components.values() if c.kind.from_index]


def wanted(stack: Stack, platform: str) -> list[Pin]:
    """Everything the build installs from an index on `platform`: the components, then the locked deps
    (key `dep:NAME`; their index is any of the stack's, pip tries them all)."""
    out = pins_for(stack, platform)
    for name, d in sorted(stack.locked_deps(platform).items()):
        out.append(Pin(key=f"dep:{name}", source="pypi", name=name, version=d["version"], index_name="*",
                       index_url=" ".join(stack.indexes.values()), sha256=tuple(d.get("sha256") or ())))
    return out


def serves(wheels: list[WheelFile], pin: Pin) -> list[WheelFile]:
    """The wheelhouse files that are this pin's artifact (by sha256, or by name and version when unhashed)."""
    key = (canon(pin.name), norm_version(pin.version or ""))
    mine = [w for w in wheels if dist_key(w.name) == key]
    return [w for w in mine if w.sha256 in pin.sha256] if pin.sha256 else mine


def check_wheelhouse(wheels: list[WheelFile], pins: list[Pin], where: str) -> list[Pin]:
    """Every wheel in the wheelhouse for a pinned project must be the pinned artifact, and the
    wheelhouse must hold at least one pinned artifact. Returns the pins it serves."""
    served: list[Pin] = []
    for pin in pins:
        mine = [w for w in wheels if dist_key(w.name)[0] == canon(pin.name)]
        if not mine:
            continue
        if serves(mine, pin):
            served.append(pin)
            continue
        listing = ", ".join(f"{w.name} (sha256 {w.sha256[:12]}...)" for w in mine)
        want = f"{pin.name}=={pin.version}" + (f" with sha256 {', '.join(h[:12] + '...' for h in pin.sha256)}"
                                                 if pin.sha256 else "")
        raise TrainboxError(
            f"--wheelhouse {where}: holds {listing} but the stack pins {want}; put the pinned wheel there "
            f"(e.g. `pip download --no-deps {pin.name}=={pin.version} -d {where}`) or change the pin with "
            f"--set {pin.key}.version=V")
    if not served:
        pinned = ", ".join(f"{p.name}=={p.version}" for p in pins) or "nothing"
        raise TrainboxError(
            f"--wheelhouse {where}: holds none of the stack's pinned artifacts ({pinned}); "
            "add the pinned wheels (matching name, version and sha256) or drop --wheelhouse")
    return served


def fetch_plan(stack: Stack, platform: str, wheels: list[WheelFile], wheelhouse: str | None) -> list[dict]:
    """Where each artifact the build installs will come from (offline: no index is asked)."""
    out = []
    for pin in wanted(stack, platform):
        here = serves(wheels, pin)
        if here:
            src = f"wheelhouse {wheelhouse}: {here[0].name}"
        elif pin.index_name == "*":
            src = "the stack's indexes"
        else:
            src = f"index {pin.index_name} ({pin.index_url})"
        if not pin.sha256:
            src += "; no sha256 yet: resolved from the index before the build"
        out.append({"key": pin.key, "requirement": f"{pin.name}=={pin.version}", "from": src,
                    "sha256": list(pin.sha256)})
    return out


def wheelhouse_notes(stack: Stack, platform: str, wheels: list[WheelFile], wheelhouse: str | None) -> list[str]:
    """What a given wheelhouse lacks, by pin (so an offline build can be completed before it is tried)."""
    if not wheelhouse:
        return []
    lacks = [f"{p.name}=={p.version}" for p in wanted(stack, platform) if not serves(wheels, p)]
    if not lacks:
        return []
    return [f"wheelhouse {wheelhouse} lacks {len(lacks)} pinned artifact(s), taken from an index instead: "
            + ", ".join(lacks) + f" (fill it: trainbox image wheelhouse {stack.name} --platform {platform} "
            f"-o {wheelhouse})"]


# -- filling ------------------------------------------------------------------------------------------

def _artifact(stack: Stack, platform: str, pin: Pin, cache_dir: Path | None) -> tuple[Path, str]:
    """The pinned artifact for `platform`, from the source cache, where pip finds it on this disk, or its index,
    hash-verified; with where it came from."""
    import urllib.parse

    from .index import IndexUnreachable, artifacts_for, project_files, wheel_fits
    from .sources import cached_artifact, download_to_cache

    for sha in pin.sha256:
        hit = cached_artifact(sha, cache_dir)
        if hit is not None and dist_key(hit.name) == (canon(pin.name), norm_version(pin.version or "")):
            if not hit.name.endswith(".whl") or wheel_fits(hit.name, stack.python, platform):
                return hit, "trainbox's cache"
    from .pipconfig import find_local

    local = find_local(pin.name, pin.version or "", pin.sha256)  # where pip itself finds it on this disk
    if local is not None and (not local[0].name.endswith(".whl") or wheel_fits(local[0].name, stack.python, platform)):
        return local
    names = [pin.index_name] if pin.index_name in stack.indexes else list(stack.indexes)
    why = []
    for name in names:
        url = stack.indexes[name]
        try:
            files = project_files(name, url, pin.name)
        except (IndexUnreachable, TrainboxError) as exc:
            why.append(str(exc))
            continue
        for art in artifacts_for(files, pin.name, pin.version or "", stack.python, platform):
            if art.sha256 in pin.sha256:
                full = urllib.parse.urljoin(f"{url.rstrip('/')}/{canon(pin.name)}/", art.url)
                what = f"{pin.key} ({pin.name}=={pin.version})"
                return download_to_cache(full, art.sha256, art.filename, cache_dir, what), f"index {name} ({url})"
        why.append(f"index {name} has no {platform} artifact of {pin.name}=={pin.version} with a pinned sha256")
    raise TrainboxError(f"{pin.key}: cannot fetch {pin.name}=={pin.version} for {platform}: " + "; ".join(why))


def fill(stack: Stack, platform: str, dest: Path, cache_dir: Path | None = None, say=print) -> dict:
    """Put every pinned artifact the build of `stack` on `platform` installs into `dest`, hash-verified.
    Files already there with the right hash are kept; a file there for a pinned project with another hash
    is an error (the wheelhouse must not serve two artifacts for one pin)."""
    if platform not in stack.platforms:
        raise TrainboxError(f"--platform {platform}: stack {stack.name} supports {', '.join(stack.platforms)} "
                            f"({stack.source_file}: platforms)")
    pins = wanted(stack, platform)
    unhashed = [f"{p.name}=={p.version}" for p in pins if not p.sha256]
    if unhashed:
        raise TrainboxError(f"stack {stack.name}: no sha256 pinned for {', '.join(unhashed)} on {platform}; run "
                            f"`trainbox stack lock {stack.name}` first (a wheelhouse holds only verified files)")
    dest.mkdir(parents=True, exist_ok=True)
    have = [WheelFile(p.name, p.stat().st_size, sha256_file(p, remember=True), p)
            for p in sorted(dest.iterdir()) if p.is_file() and p.name.endswith(DIST_SUFFIXES)]
    for pin in pins:  # a second artifact for a pinned project would make the build's choice ambiguous
        other = [w.name for w in have if dist_key(w.name)[0] == canon(pin.name) and w.sha256 not in pin.sha256]
        if other:
            raise TrainboxError(f"{dest}: {', '.join(other)} is not the pinned artifact of {pin.name}=={pin.version}; "
                                "remove it (or fill another directory)")
    added, kept = [], []
    for pin in pins:
        if serves(have, pin):
            kept.append(serves(have, pin)[0].name)
            continue
        art, origin = _artifact(stack, platform, pin, cache_dir)
        target = dest / art.name
        tmp = target.with_name(f".{target.name}.part")
        try:
            shutil.copy2(art, tmp)
            if sha256_file(tmp) not in pin.sha256:  # the cache re-checks, this re-checks the copy
                raise TrainboxError(f"{target}: copy does not match its pin's sha256; nothing was added")
            tmp.replace(target)
        finally:  # a full disk, Ctrl-C: no .part stays in the wheelhouse
            tmp.unlink(missing_ok=True)
        added.append(art.name)
        say(f"trainbox: {pin.name}=={pin.version} -> {target} (from {origin})")
    return {"schema": SCHEMA, "stack": stack.name, "platform": platform, "dir": str(dest), "added": added,
            "kept": kept, "deps_locked": bool(stack.locked_deps(platform))}
