"""Python distribution files: PEP 503 names, wheel/sdist file names, versions and sha256 (host module).

The one place index, lock, sources and image turn a file name into (project, version), compare project
names and hash artifacts. The PEP 503 name rule itself is the runtime's (`canon`, from the patch applier, which
must run alone in the builder), so the host, the doctor and the applier compare names one way.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from pathlib import Path

from packaging.utils import parse_sdist_filename, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from ..yamlfile import json_loads
from ..paths import cache_dir, write_atomic
from ..runtime.apply_patches import canon_name as canon  # PEP 503 names: the runtime's one copy

#: File names pip installs from: wheels and the two sdist formats.
DIST_SUFFIXES = (".whl", ".tar.gz", ".zip")


def norm_version(v: str) -> str:
    """A version in PEP 440's normal form (2.13.0+CPU -> 2.13.0+cpu); an invalid one as it was given."""
    try:
        return str(Version(v))
    except InvalidVersion:
        return v


def parse_dist(filename: str) -> tuple[str, Version] | None:
    """(canonical project name, version) of a wheel or sdist file name; None when it is neither."""
    try:
        if filename.endswith(".whl"):
            name, ver, _, _ = parse_wheel_filename(filename)
        elif filename.endswith((".tar.gz", ".zip")):
            name, ver = parse_sdist_filename(filename)
        else:
            return None
    except (InvalidVersion, ValueError):
        return None
    return canon(name), ver


def dist_key(filename: str) -> tuple[str, str]:
    """(canonical name, normalised version string) of a file; ("", "") for a file that is no distribution."""
    parsed = parse_dist(filename)
    return (parsed[0], str(parsed[1])) if parsed else ("", "")


def is_dist_of(filename: str, project: str, version: str) -> bool:
    """Whether `filename` is a wheel or sdist of `project`==`version`."""
    parsed = parse_dist(filename)
    if parsed is None:
        return False
    try:
        return parsed[0] == canon(project) and parsed[1] == Version(version)
    except InvalidVersion:
        return False


def wheel_tags(filename: str) -> frozenset:
    """The packaging.tags.Tag set of a wheel file name (empty for anything else)."""
    try:
        return frozenset(parse_wheel_filename(filename)[3])
    except (InvalidVersion, ValueError):
        return frozenset()


def _hash(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def sha256_file(path: Path, remember: bool = False) -> str:
    """sha256 of a file. `remember`: keyed by (path, size, mtime) in the cache, so a 200 MB wheel in a
    wheelhouse is hashed once; integrity checks of downloaded artifacts leave it off and always re-read."""
    if not remember:
        return _hash(path)
    st = path.stat()
    cache = cache_dir() / "sha256.json"
    key = f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}"
    try:
        memo = json_loads(cache.read_text())
    except (OSError, ValueError):
        memo = {}
    if key in memo:
        return memo[key]
    memo[key] = _hash(path)
    with contextlib.suppress(OSError):
        cache.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(cache, json.dumps(memo))
    return memo[key]
