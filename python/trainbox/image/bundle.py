"""Offline bundles: everything one stack's image build needs, in one file, for an air-gapped builder (host module).

`trainbox fetch STACK --bundle FILE` writes a tar with

    bundle.json             stack, platform, pins digest, trainbox version, the stack's manifest
    stack/<name>.yaml/.lock the stack as resolved (extends merged) and its lock, for the record
    wheelhouse/             every hash-pinned wheel: components, the locked dependency closure and the locked
                            build requirements of wheels built in the image (setuptools, wheel ...), nothing else
    sources/                trainbox's cache layout for the git commits (bare repositories holding just them)
                            and the archives (by sha256)
    SHA256SUMS              of every file above

and `trainbox image build --stack STACK --bundle FILE` checks the sums and the stack, then builds from the bundle
alone with the build's network off (`--network none`); the tag is the online build's (the wheelhouse is not part
of the content hash when every requirement is hash-locked).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
import tarfile
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import yaml

from ..runtime.errors import TrainboxError
from ..specs.stack import Stack
from ..supply.pins import Pin

SCHEMA = "trainbox.bundle/1"


class BundleError(TrainboxError):
    """A bundle that cannot be written or used as it is."""


def _sha256(path: Path) -> str:
    from ..specs.dists import sha256_file

    return sha256_file(path)


def _pypi_pins(stack: Stack, plat: str) -> list[Pin]:
    """A Pin for every hash-pinned wheel the build installs on `plat`: components, then locked deps."""
    from ..supply.sources import index_url

    pins = []
    for c in stack.installed_components.values():
        if c.kind.from_index:
            p = c.pin_for(plat)
            pins.append(Pin(key=c.key, source=c.source, name=c.dist_name, version=p.version, index_name=p.index,
                            index_url=index_url(p.index, stack.indexes), sha256=tuple(p.sha256)))
    for name, d in stack.locked_deps(plat).items():
        pins.append(Pin(key=name, source="pypi", name=name, version=d["version"],
                        index_url=index_url("pypi", stack.indexes), sha256=tuple(d.get("sha256") or ())))
    return pins


def _seed_cache(wheelhouse: Path | None, cache_dir: Path) -> None:
    """Wheels the user already has (e.g. a torch wheel from an index unreachable here) go into the cache by
    hash; only those whose sha256 a pin names will ever be used."""
    if not wheelhouse:
        return
    root = cache_dir / "sources" / "sha256"
    for w in Path(wheelhouse).glob("*.whl"):
        d = root / _sha256(w)
        if not d.exists():
            d.mkdir(parents=True)
            shutil.copy2(w, d / w.name)


def _build_pins(stack: Stack, plat: str) -> list[Pin]:
    """A Pin for each hash-pinned PEP 518 build requirement of the wheels built in the image (the lock's
    `build_deps`: the builder installs exactly these, --require-hashes)."""
    from ..supply.sources import index_url

    return [Pin(key=f"build:{name}", source="pypi", name=name, version=d["version"],
                index_url=index_url("pypi", stack.indexes), sha256=tuple(d.get("sha256") or ()))
            for name, d in sorted(stack.locked_build_deps(plat).items())]


def write_bundle(stack_name: str, out: Path, *, wheelhouse: Path | None = None, platform: str | None = None,
                 say=print) -> dict:
    from ..supply.fetch import fetch_sources
    from ..supply.index import IndexUnreachable
    from ..specs.platforms import host_platform
    from .render import render_stack
    from ..supply.fetch import fetch
    from ..specs.stack import load_stack, merged_yaml, stack_path

    _check_output(Path(out))
    stack = load_stack(stack_name)
    plat = platform or host_platform()
    if plat not in stack.platforms:
        raise BundleError(f"--platform {plat}: stack {stack.name} supports {', '.join(stack.platforms)}")
    if not stack.lock_is_fresh():
        raise BundleError(f"stack {stack.name}: its lock is missing or stale, so the dependency closure is unknown; "
                          f"run `trainbox stack lock {stack.name}` where the indexes answer, then bundle")
    work = Path(tempfile.mkdtemp(prefix="trainbox-bundle-"))
    try:
        root = work / "bundle"
        cache = work / "cache"
        _seed_cache(wheelhouse, cache)
        wh = root / "wheelhouse"
        wh.mkdir(parents=True)
        for pin in _pypi_pins(stack, plat) + _build_pins(stack, plat):
            try:
                got = fetch(pin, prefer=pin.sha256, cache_dir=cache)
            except IndexUnreachable as exc:  # the build's advice, for the bundle too
                raise BundleError(f"{exc}; {pin.name}=={pin.version} is not in the cache: pass --wheelhouse DIR "
                                  "holding the pinned wheels (`trainbox image wheelhouse` fills one where the index "
                                  "answers)") from None
            shutil.copy2(got.path, wh / got.filename)
        srcs = fetch_sources(stack, cache_dir=cache, say=say)
        stack = srcs.stack  # with the fetched commits' tree hashes, for the manifest
        if (cache / "sources" / "git").is_dir():
            shutil.copytree(cache / "sources" / "git", root / "sources" / "git", symlinks=True,
                            ignore=shutil.ignore_patterns("hooks", ".*.lock"))  # nothing from a bundle runs
        for key, f in srcs.fetched.items():
            if not f.commit:
                shutil.copytree(f.path.parent, root / "sources" / "sha256" / f.sha256)
        path = stack_path(stack_name)
        (root / "stack").mkdir()
        (root / "stack" / f"{stack.name}.yaml").write_text(yaml.safe_dump(merged_yaml(path), sort_keys=True))
        if stack.lock_path and stack.lock_path.exists():
            shutil.copy2(stack.lock_path, root / "stack" / f"{stack.name}.lock")
        elif stack.lock:  # the parent's lock it uses (it has none of its own): the lock in force, for the record
            (root / "stack" / f"{stack.name}.lock").write_text(yaml.safe_dump(stack.lock, sort_keys=True))
        meta = {"schema": SCHEMA, "stack": stack.name, "platform": plat, "pins_digest": stack.pins_digest(),
                "manifest": render_stack(stack).manifest}
        (root / "bundle.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
        sums = [f"{_sha256(p)}  {p.relative_to(root).as_posix()}"
                for p in sorted(root.rglob("*")) if p.is_file() and not p.is_symlink()]
        (root / "SHA256SUMS").write_text("\n".join(sums) + "\n")
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.name}.partial")
        try:
            with tarfile.open(tmp, "w") as tar:
                tar.add(root, arcname=".")
            os.replace(tmp, out)
        finally:  # a full disk, Ctrl-C: no half-written bundle stays behind (the old one, if any, is kept)
            tmp.unlink(missing_ok=True)
        return {"schema": SCHEMA, "bundle": str(out), "stack": stack.name, "platform": plat, "files": len(sums),
                "size": out.stat().st_size}
    except OSError as exc:
        from ..runtime.errors import describe_os_error

        raise BundleError(f"--bundle {out}: the bundle cannot be written: {describe_os_error(exc)}; nothing was "
                          "written") from None
    finally:
        shutil.rmtree(work, ignore_errors=True)


# kernel file systems: their "regular files" (/proc/self/mem, /sys/...) are interfaces, not places for a bundle
_PSEUDO_ROOTS = ("/proc", "/sys", "/dev")


def _pseudo(path: Path) -> bool:
    real = os.path.realpath(path)
    return any(real == r or real.startswith(r + "/") for r in _PSEUDO_ROOTS)


def _check_output(out: Path) -> None:
    """The bundle replaces `out` when done: only a regular file (or nothing) may be there, never `/`, a directory,
    a device (`/dev/full` was replaced by the tar), a link, or a file of /proc, /sys or /dev."""
    try:
        bad = out.name in ("", ".", "..") or _pseudo(out) or (os.path.exists(out.parent) and not out.parent.is_dir()) or (
            os.path.lexists(out) and not stat.S_ISREG(os.lstat(out).st_mode))
    except OSError as exc:  # a name too long, a path through a file
        raise BundleError(f"--bundle {str(out)[:200]}: not a usable path ({exc.strerror or exc})") from None
    if bad:
        raise BundleError(f"--bundle {out}: not a regular file; name a new or existing .tar file to write the "
                          "bundle to")


def _mismatch(meta: dict, stack: Stack) -> str:
    """What a bundle made for something else differs in, each fact once."""
    why = []
    if meta.get("stack") != stack.name:
        why.append(f"made for stack {meta.get('stack')}, not {stack.name}")
    if meta.get("pins_digest") != stack.pins_digest():
        why.append(f"its pins (digest {str(meta.get('pins_digest'))[:12]}) are not {stack.name}'s now "
                   f"({stack.pins_digest()[:12]}): a pin moved since it was written")
    return "; ".join(why)


@dataclass
class OpenBundle:
    root: Path
    meta: dict

    @property
    def cache_dir(self) -> Path:
        return self.root  # holds sources/ in the cache's own layout

    @property
    def wheelhouse(self) -> Path:
        return self.root / "wheelhouse"


def use_bundle(file: Path, stack: Stack, say: Callable[[str], None]) -> OpenBundle:
    """`image build --bundle`: the bundle unpacked and checked in a directory removed when trainbox exits, whose
    wheelhouse and sources the build uses instead of every index and git host (offline, --network none)."""
    import atexit

    dest = Path(tempfile.mkdtemp(prefix="trainbox-bundle-"))
    atexit.register(shutil.rmtree, dest, True)
    ob = open_bundle(file, stack, dest)
    say(f"building from bundle {file} ({ob.meta['stack']}, {ob.meta['platform']}) with the network off")
    return ob


def open_bundle(file: Path, stack: Stack, dest: Path) -> OpenBundle:
    """Unpack into `dest` what SHA256SUMS lists, and nothing else, each file checked as it is written; then check
    that the bundle is for `stack` and that its git objects are the pinned commits' own (see `_check_git`)."""
    file = Path(file)
    if not file.is_file() or _pseudo(file):
        raise BundleError(f"--bundle {file}: not a bundle file (no such file, or a directory or device); write one "
                          "with `trainbox fetch STACK --bundle FILE`")
    try:
        with tarfile.open(file) as tar:
            files = _sealed_members(tar, file)
            sums = _read_sums(tar, files, file)
            _extract_checked(tar, files, sums, dest, file)
    except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
        reason = " ".join(str(exc).split())[:300]  # tarfile's own reasons span lines (one per compression)
        raise BundleError(f"--bundle {file}: cannot be read as a tar ({reason}); write it again with "
                          "`trainbox fetch STACK --bundle FILE`") from None
    meta = _read_meta(dest / "bundle.json", file)
    if meta.get("stack") != stack.name or meta.get("pins_digest") != stack.pins_digest():
        raise BundleError(f"--bundle {file}: {_mismatch(meta, stack)}; write a new bundle for it")
    _check_wheelhouse(stack, meta, dest, file)
    _check_git(stack, dest, file)
    return OpenBundle(dest, meta)


def _check_wheelhouse(stack: Stack, meta: dict, root: Path, file: Path) -> None:
    """Every wheelhouse file is one a pin names by sha256 (SHA256SUMS proves a bundle complete, not who wrote
    it: a setuptools-99 wheel added with the sums rewritten must still not reach pip)."""
    plat = meta.get("platform")
    if plat not in stack.platforms:
        raise BundleError(f"--bundle {file}: made for platform {plat!r}, which stack {stack.name} does not have")
    pinned = {h for pin in _pypi_pins(stack, plat) + _build_pins(stack, plat) for h in pin.sha256}
    wh = root / "wheelhouse"
    for p in sorted(wh.rglob("*")) if wh.is_dir() else []:
        if p.is_file() and _sha256(p) not in pinned:
            raise BundleError(f"--bundle {file}: wheelhouse/{p.relative_to(wh).as_posix()} is not a file the "
                              f"stack's pins or lock name by sha256; refusing the bundle (tampered)")


_SUM_LINE = re.compile(r"^([0-9a-f]{64})  ((?:wheelhouse|sources|stack)/[A-Za-z0-9_.+~=/-]+|bundle\.json)$")


def _sealed_members(tar: tarfile.TarFile, file: Path) -> dict[str, tarfile.TarInfo]:
    """{path: member} of the regular files; anything else but a directory, a path that leaves the bundle or
    one given twice is refused."""
    files: dict[str, tarfile.TarInfo] = {}
    dirs: set[str] = set()
    for m in tar.getmembers():
        rel = m.name[2:] if m.name.startswith("./") else m.name
        rel = rel.rstrip("/") if m.isdir() else rel
        parts = rel.split("/")
        if m.isdir() and rel in ("", "."):
            continue
        if rel.startswith("/") or any(p in ("", ".", "..") for p in parts):
            raise BundleError(f"--bundle {file}: member {m.name!r} would land outside the bundle; refusing it")
        if not (m.isfile() or m.isdir()):
            raise BundleError(f"--bundle {file}: member {m.name!r} is a link or device; a bundle holds only files")
        if rel in files or rel in dirs:
            raise BundleError(f"--bundle {file}: member {m.name!r} is given twice; refusing the bundle")
        if m.isfile():
            files[rel] = m
        else:
            dirs.add(rel)
    return files


def _read_sums(tar: tarfile.TarFile, files: dict[str, tarfile.TarInfo], file: Path) -> dict[str, str]:
    """SHA256SUMS as {path: sha256}: every line `<64 hex>  <path>`, at least bundle.json, no path twice, and
    exactly the bundle's other files (an extra wheel is not offered to pip, a missing file not skipped)."""
    if "SHA256SUMS" not in files:
        raise BundleError(f"--bundle {file}: no SHA256SUMS; not a trainbox bundle")
    raw = tar.extractfile(files["SHA256SUMS"]).read(1 << 24)
    try:
        lines = raw.decode("utf-8").splitlines()
    except UnicodeDecodeError:
        raise BundleError(f"--bundle {file}: SHA256SUMS is not UTF-8 text; the bundle is damaged") from None
    sums: dict[str, str] = {}
    for n, line in enumerate(lines, 1):
        m = _SUM_LINE.match(line)
        if not m or ".." in m.group(2).split("/"):
            raise BundleError(f"--bundle {file}: SHA256SUMS line {n}: {line[:80]!r} is not `<sha256>  <path>` "
                              "of a bundle file")
        if m.group(2) in sums:
            raise BundleError(f"--bundle {file}: SHA256SUMS names {m.group(2)} twice")
        sums[m.group(2)] = m.group(1)
    if "bundle.json" not in sums:
        raise BundleError(f"--bundle {file}: SHA256SUMS is empty or lists no bundle.json; the bundle is damaged "
                          "or tampered with")
    extra = sorted(set(files) - set(sums) - {"SHA256SUMS"})
    missing = sorted(set(sums) - set(files))
    if extra or missing:
        what = (f"{len(extra)} file(s) not in SHA256SUMS ({', '.join(extra[:3])})" if extra
                else f"{len(missing)} file(s) SHA256SUMS lists are missing ({', '.join(missing[:3])})")
        raise BundleError(f"--bundle {file}: {what}; a bundle holds exactly what its SHA256SUMS lists")
    return sums


def _extract_checked(tar: tarfile.TarFile, files: dict, sums: dict[str, str], dest: Path, file: Path) -> None:
    """Write each listed file under `dest` (plain files, mode 0644, directories made here), hashing as it goes."""
    for rel in sorted(sums):
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        h = hashlib.sha256()
        src = tar.extractfile(files[rel])
        with open(target, "xb") as out:
            for chunk in iter(lambda: src.read(1 << 20), b""):
                h.update(chunk)
                out.write(chunk)
        if h.hexdigest() != sums[rel]:
            raise BundleError(f"--bundle {file}: {rel} does not match its SHA256SUMS entry (damaged or tampered)")


def _read_meta(path: Path, file: Path) -> dict:
    from ..yamlfile import json_loads as loads

    try:
        meta = loads(path.read_bytes())
    except OSError as exc:
        raise BundleError(f"--bundle {file}: bundle.json cannot be read ({exc.strerror or exc}); the bundle is "
                          "damaged") from None
    except ValueError as exc:  # yamlfile.JsonError: malformed, not UTF-8, or 100,000 brackets deep
        raise BundleError(f"--bundle {file}: bundle.json cannot be read ({exc}); the bundle is damaged or "
                          "tampered with") from None
    if not isinstance(meta, dict) or meta.get("schema") != SCHEMA:
        raise BundleError(f"--bundle {file}: bundle.json is not a {SCHEMA} object; write the bundle again")
    return meta


# what git reads besides objects and refs that could substitute an object or run a program
_GIT_REFUSED = ("refs/replace", "info/grafts", "objects/info/alternates", "objects/info/http-alternates")


def _check_git(stack: Stack, root: Path, file: Path) -> None:
    """Each bundled repository: no replace ref, graft or alternate; its configuration replaced by a minimal one
    and its hooks dropped (git must run nothing from a bundle); and each pinned commit's tree re-derived from the
    objects, every object hashed against its name, before the build starts."""
    from ..supply.gitobjects import ObjectError, verify_tree
    from ..supply.sources import git_cache_repo

    gitroot = root / "sources" / "git"
    for repo in sorted(p for p in gitroot.iterdir() if p.is_dir()) if gitroot.is_dir() else []:
        packed = repo / "packed-refs"
        for bad in _GIT_REFUSED:
            if (repo / bad).exists() or (packed.is_file() and f" {bad}/" in packed.read_text(errors="replace")):
                raise BundleError(f"--bundle {file}: {repo.relative_to(root)}/{bad} would substitute git objects; "
                                  "a bundle never holds one (tampered)")
        shutil.rmtree(repo / "hooks", ignore_errors=True)
        (repo / "config").write_text("[core]\n\trepositoryformatversion = 0\n\tbare = true\n")
    for key, c in sorted(stack.installed_components.items()):
        if not (c.kind.install_args(c) and c.commit):
            continue
        repo = git_cache_repo(c.git, root)
        if not repo.is_dir():
            raise BundleError(f"--bundle {file}: holds no repository for {key} ({c.git}); write the bundle again")
        try:
            verify_tree(repo, c.commit)
        except ObjectError as exc:
            raise BundleError(f"--bundle {file}: component {key}: {exc}") from None
