"""A scan of an image's `docker save` archive: every file of every layer, caches, duplicate and shadowed bytes,
and the PEM certificates in it (test and benchmark tool; `bench/build.py` imports it from here).

Not part of the product: the build never needs it, so it lives beside the tests that check images for leaked
secrets and caches and the benchmark that reports wasted bytes.
"""

from __future__ import annotations

import hashlib
import json
import re
import tarfile
from dataclasses import dataclass
from typing import Callable, Iterable

from trainbox.image.engine import Client


# -- scanning an image's layers -------------------------------------------------------------------

@dataclass
class LayerFile:
    layer: int  # 0 = bottom layer
    path: str  # without a leading "./" or "/"
    size: int
    kind: str  # "file", "dir", "link", "symlink", "other", "whiteout"
    sha256: str | None = None


@dataclass
class ImageScan:
    files: list[LayerFile]
    layer_count: int
    needle_hits: list[tuple[str, str]]  # (path, needle label) for each file that held a needle

    def matching(self, pred: Callable[[str], bool]) -> list[LayerFile]:
        return [f for f in self.files if pred(f.path)]

    def cache_files(self) -> list[LayerFile]:
        return [f for f in self.files if f.kind == "file" and is_cache_path(f.path)]

    def duplicate_bytes(self) -> tuple[int, list[tuple[str, int, int]]]:
        """Bytes in regular files whose content appears more than once across all layers (a file
        shadowed by a later layer counts too: its bytes still ship). Returns (total, [(sha, size, n)])."""
        by_sha: dict[str, list[LayerFile]] = {}
        for f in self.files:
            if f.kind == "file" and f.sha256 and f.size > 0:
                by_sha.setdefault(f.sha256, []).append(f)
        dups = [(sha, fs[0].size, len(fs)) for sha, fs in by_sha.items() if len(fs) > 1]
        return sum(size * (n - 1) for _, size, n in dups), sorted(dups, key=lambda d: -d[1] * (d[2] - 1))

    def shadowed_bytes(self) -> tuple[int, list[tuple[str, int, int]]]:
        """Bytes of files that a later layer replaces or deletes: they ship but nobody sees them.
        Returns (total, [(path, size, layer)])."""
        last_layer: dict[str, int] = {}
        deleted_in: dict[str, int] = {}  # path prefix -> layer of its whiteout
        for f in self.files:
            if f.kind == "whiteout":
                head, _, name = f.path.rpartition("/")
                target = (head + "/" if head else "") + name[len(".wh."):]
                if name == ".wh..wh..opq":  # opaque dir: everything below from lower layers is hidden
                    target = head
                deleted_in[target] = max(deleted_in.get(target, -1), f.layer)
            else:
                last_layer[f.path] = max(last_layer.get(f.path, -1), f.layer)
        out = []
        for f in self.files:
            if f.kind != "file" or f.size == 0:
                continue
            if last_layer.get(f.path, f.layer) > f.layer or any(
                    deleted_in.get(p, -1) > f.layer for p in _prefixes(f.path)):
                out.append((f.path, f.size, f.layer))
        return sum(x[1] for x in out), sorted(out, key=lambda x: -x[1])


def _prefixes(path: str) -> list[str]:
    parts = path.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]


_CACHE_PATTERNS = [
    re.compile(r"^var/cache/debconf/.+-old$"),
    re.compile(r"(^|/)\.cache/pip(/|$)"),
    re.compile(r"^var/cache/apt/archives/.+\.deb$"),
    re.compile(r"^var/cache/apt/[^/]+\.bin$"),
    re.compile(r"^var/lib/apt/lists/(?!lock$|partial$|auxfiles$).+"),
    re.compile(r"^root/\.cache/"),
    re.compile(r"^tmp/.+"),
]


def is_cache_path(path: str) -> bool:
    """Paths that are package-manager caches or leftovers: they never belong in an image layer."""
    return any(p.search(path) for p in _CACHE_PATTERNS)


def scan_image(client: Client, ref: str, hash_files: bool = False,
               needles: dict[str, bytes] | None = None) -> ImageScan:
    """Stream `docker save ref` and list every entry of every layer; optionally hash file contents
    and look for secret needles (byte strings) inside them. Handles the legacy and the OCI layout."""
    needles = {k: v for k, v in (needles or {}).items() if v}
    files: list[LayerFile] = []
    hits: list[tuple[str, str]] = []
    layer_blobs: dict[str, list[LayerFile]] = {}
    manifest_layers: list[str] = []
    with client.save_stream(ref) as stream:
        with tarfile.open(fileobj=stream, mode="r|") as outer:
            for member in outer:
                name = member.name.lstrip("./")
                if name == "manifest.json":
                    data = json.load(outer.extractfile(member))  # type: ignore[arg-type]
                    manifest_layers = [p.lstrip("./") for p in data[0]["Layers"]]
                    continue
                if not member.isfile() or name.endswith((".json", "VERSION", "index.json", "oci-layout")):
                    continue
                if not (name.endswith("layer.tar") or name.startswith("blobs/")):
                    continue
                fobj = outer.extractfile(member)
                if fobj is None:
                    continue
                entries: list[LayerFile] = []
                try:
                    with tarfile.open(fileobj=fobj, mode="r|*") as inner:
                        for m in inner:
                            entries.append(_layer_entry(inner, m, hash_files, needles, hits))
                except tarfile.ReadError:
                    continue  # an OCI config or other non-tar blob
                layer_blobs[name] = entries
    order = manifest_layers or list(layer_blobs)
    for i, blob in enumerate(order):
        for e in layer_blobs.get(blob, []):
            e.layer = i
            files.append(e)
    return ImageScan(files=files, layer_count=len(order), needle_hits=hits)


def _layer_entry(tar: tarfile.TarFile, m: tarfile.TarInfo, hash_files: bool,
                 needles: dict[str, bytes], hits: list[tuple[str, str]]) -> LayerFile:
    path = m.name.lstrip("./")
    base = path.rsplit("/", 1)[-1]
    if base.startswith(".wh."):
        return LayerFile(0, path, 0, "whiteout")
    if m.isdir():
        return LayerFile(0, path, 0, "dir")
    if m.issym():
        return LayerFile(0, path, 0, "symlink")
    if m.islnk():
        return LayerFile(0, path, 0, "link")
    if not m.isfile():
        return LayerFile(0, path, 0, "other")
    sha = None
    if hash_files or needles:
        f = tar.extractfile(m)
        if f is not None:
            h = hashlib.sha256()
            keep = max((len(n) for n in needles.values()), default=0)
            prev = b""
            found: set[str] = set()
            while True:
                chunk = f.read(1 << 20)
                if not chunk:
                    break
                h.update(chunk)
                if needles:
                    window = prev + chunk
                    for label, n in needles.items():
                        if label not in found and n in window:
                            found.add(label)
                    prev = window[-keep:] if keep else b""
            sha = h.hexdigest()
            hits.extend((path, label) for label in sorted(found))
    return LayerFile(0, path, m.size, "file", sha)


def iter_pem_certificates(data: bytes) -> Iterable[bytes]:
    """The PEM certificate blocks in `data`, each including its BEGIN/END lines."""
    for m in re.finditer(rb"-----BEGIN CERTIFICATE-----\s+[A-Za-z0-9+/=\s]+?-----END CERTIFICATE-----", data):
        yield m.group(0)
