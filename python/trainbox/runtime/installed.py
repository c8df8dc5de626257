"""What an environment really has installed, read from package metadata (runtime module, stdlib only).

`python -m trainbox.runtime.installed` prints one JSON object (schema `trainbox.inventory/1`): every
distribution the interpreter's sys.path holds, as pip sees it (`pip inspect`: the first one of a name on
sys.path wins), with its version, the PEP 610 `direct_url.json` pip wrote (URL installs carry the artifact's
hash there), the wheel tags it was installed from, and a sha256 of its RECORD; and the CANN / CUDA toolkit
versions the image holds. `trainbox image build` runs it in the built image and merges it with the build's
plan (git sources, patches, base) into the image's SBOM (trainbox.image.sbom, host side: the CycloneDX library
never enters an image). The doctor's `packages.sbom` check compares the SBOM with the same listing.
Imports nothing at import time beyond the standard library, and never imports the distributions it lists.
"""

from __future__ import annotations

import glob
import hashlib
import importlib.metadata as md
import json
import os
import sys

from .apply_patches import canon_name
from .nvidia import CUDA_VERSION_FILE
from .npu import TOOLKIT_HOMES, TOOLKIT_INSTALL_INFO, VERSIONED_HOMES

SCHEMA = "trainbox.inventory/1"
#: Where `trainbox image build` writes the image's CycloneDX SBOM (made on the host: trainbox.image.sbom).
SBOM_FILE = "/etc/trainbox/sbom.cdx.json"
#: Where CANN keeps its toolkit's install record (`version=8.5.1`), newest layout last.
CANN_INFO_GLOBS = tuple(f"{home}/{TOOLKIT_INSTALL_INFO}" for home in TOOLKIT_HOMES + (VERSIONED_HOMES,))
canon = canon_name  # PEP 503 normalised name (what pip compares): the package's one rule


def _read(dist: md.Distribution, name: str) -> str | None:
    try:
        return dist.read_text(name)
    except (OSError, UnicodeDecodeError):
        return None


def _direct_url(dist: md.Distribution) -> dict | None:
    text = _read(dist, "direct_url.json")
    if not text:
        return None
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def _wheel_tags(dist: md.Distribution) -> list[str]:
    text = _read(dist, "WHEEL") or ""
    return sorted(line.partition(":")[2].strip() for line in text.splitlines() if line.startswith("Tag:"))


def _record_sha256(dist: md.Distribution) -> str | None:
    text = _read(dist, "RECORD")
    return hashlib.sha256(text.encode()).hexdigest() if text is not None else None


def _local_file_sha256(direct_url: dict | None) -> str | None:
    """sha256 of the local wheel a distribution was installed from, where pip kept no hash and the file is still
    there (the venv's pip, from the base's Debian python3-pip-whl)."""
    url = str((direct_url or {}).get("url") or "")
    if not url.startswith("file:///") or "archive_info" not in (direct_url or {}):
        return None
    h = hashlib.sha256()
    try:
        with open(url[len("file://"):], "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    except OSError:
        return None
    return h.hexdigest()


def _entry(dist: md.Distribution) -> dict | None:
    name = dist.metadata["Name"] if dist.metadata else None
    if not name:
        return None  # a metadata directory without a name: pip skips it too
    path = getattr(dist, "_path", None)  # the .dist-info / .egg-info directory (PathDistribution)
    entry = {
        "name": name, "canonical_name": canon(name), "version": dist.version,
        "location": os.path.dirname(str(path)) if path else None,
        "installer": (_read(dist, "INSTALLER") or "").strip() or None,
        "requested": _read(dist, "REQUESTED") is not None,
        "direct_url": _direct_url(dist), "wheel_tags": _wheel_tags(dist), "record_sha256": _record_sha256(dist),
    }
    archive = (entry["direct_url"] or {}).get("archive_info") or {}
    if not archive.get("hashes") and not archive.get("hash"):
        entry["local_file_sha256"] = _local_file_sha256(entry["direct_url"])
    return entry


def distributions(path: list[str] | None = None) -> list[dict]:
    """Every distribution on `path` (default sys.path), the first of each name, sorted by canonical name."""
    seen: dict[str, dict] = {}
    for dist in md.distributions(path=path if path is not None else sys.path):
        entry = _entry(dist)
        if entry and entry["canonical_name"] not in seen:
            seen[entry["canonical_name"]] = entry
    return [seen[k] for k in sorted(seen)]


def _kv_version(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                key, _, value = line.partition("=")
                if key.strip().lower() == "version" and value.strip():
                    return value.strip()
    except OSError:
        pass
    return None


def toolkits(root: str = "/") -> dict:
    """The CANN and CUDA toolkits found in the image: {"cann": {"version", "source"} | None, "cuda": ...}."""
    out: dict = {"cann": None, "cuda": None}
    for pattern in CANN_INFO_GLOBS:
        for info in sorted(glob.glob(os.path.join(root, pattern.lstrip("/")))):
            version = _kv_version(info)
            if version:
                out["cann"] = {"version": version, "source": "/" + os.path.relpath(info, root)}
                break
        if out["cann"]:
            break
    try:
        with open(os.path.join(root, CUDA_VERSION_FILE.lstrip("/")), encoding="utf-8") as fh:
            version = ((json.load(fh) or {}).get("cuda") or {}).get("version")
        if version:
            out["cuda"] = {"version": str(version), "source": CUDA_VERSION_FILE}
    except (OSError, ValueError, AttributeError):
        pass
    return out


def inventory() -> dict:
    return {"schema": SCHEMA, "python": ".".join(map(str, sys.version_info[:3])),
            "distributions": distributions(), "toolkits": toolkits()}


def main() -> int:
    json.dump(inventory(), sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
