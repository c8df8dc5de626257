"""Offline bundles: everything one stack's image build needs, in one file, for an air-gapped builder (host module).

`trainbox fetch STACK --bundle FILE` writes a tar with

    bundle.json             stack, platform, pins digest, trainbox version, the stack's manifest
    stack/<name>.yaml/.lock the stack as resolved (extends merged) and its lock, for the record
    wheelhouse/             every hash-pinned wheel (components and the locked dependency closure) and the
                            build requirements of wheels built from git trees (setuptools, wheel)
    sources/                trainbox's cache layout for the git commits (bare repositories holding just them)
                            and the archives (by sha256)
    SHA256SUMS              of every file above

and `trainbox image build --stack STACK --bundle FILE` checks the sums and the stack, then builds from the bundle
alone with the build's network off (`--network none`); the tag is the online build's (the wheelhouse is not part
of the content hash when every requirement is hash-locked).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml

from .runtime.errors import TrainboxError

SCHEMA = "trainbox.bundle/1"


class BundleError(TrainboxError):
    """A bundle that cannot be written or used as it is."""


def _sha256(path: Path) -> str:
    from .dists import sha256_file

    return sha256_file(path)


def _pypi_pins(stack, plat: str) -> list:
    """kinds.Pin for every hash-pinned wheel the build installs on `plat`: components, then locked deps."""
    from .kinds import Pin
    from .sources import index_url

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


def _build_requirements(stack, ctx_sources: Path, dest: Path, plat: str, say) -> None:
    """The PEP 518 build requirements of each wheel built from a git tree with build isolation, downloaded
    for the stack's Python (pip resolves them inside the build from the wheelhouse, with no index)."""
    import tomllib

    reqs: set[str] = set()
    for key, c in stack.installed_components.items():
        if c.install is False or c.install == "tree" or not c.kind.install_args(c) or not c.git \
                or not c.build_isolation:
            continue
        tree = ctx_sources / key / (c.subdir or "")
        pp = tree / "pyproject.toml"
        data = tomllib.loads(pp.read_text()) if pp.is_file() else {}
        reqs.update((data.get("build-system") or {}).get("requires") or ["setuptools>=40.8.0", "wheel"])
    if not reqs:
        return
    say(f"downloading build requirements {', '.join(sorted(reqs))} for python {stack.python}")
    machine = {"linux/amd64": "manylinux2014_x86_64", "linux/arm64": "manylinux2014_aarch64"}[plat]
    proc = subprocess.run([sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "-q",
                           "--only-binary=:all:", "--python-version", stack.python, "--platform", machine,
                           "--platform", "any", "-d", str(dest), *sorted(reqs)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise BundleError(f"cannot download the build requirements {sorted(reqs)}: "
                          f"{(proc.stderr.strip().splitlines() or ['?'])[-1]}")


def write_bundle(stack_name: str, out: Path, *, wheelhouse: Path | None = None, platform: str | None = None,
                 say=print) -> dict:
    from .fetch import fetch_sources, stage
    from .index import IndexUnreachable
    from .platforms import host_platform
    from .render import render_stack
    from .kinds import fetch
    from .stack import _raw, _stack_path, load_stack

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
        for pin in _pypi_pins(stack, plat):
            try:
                got = fetch(pin, prefer=pin.sha256, cache_dir=cache)
            except IndexUnreachable as exc:  # the build's advice, for the bundle too
                raise BundleError(f"{exc}; {pin.name}=={pin.version} is not in the cache: pass --wheelhouse DIR "
                                  "holding the pinned wheels (`trainbox image wheelhouse` fills one where the index "
                                  "answers)") from None
            shutil.copy2(got.path, wh / got.filename)
        srcs = fetch_sources(stack, cache_dir=cache, say=say)
        stack = srcs.stack  # with the fetched commits' tree hashes, for the manifest
        staged = work / "staged"
        stage(staged, srcs)
        _build_requirements(stack, staged / "build" / "sources", wh, plat, say)
        if (cache / "sources" / "git").is_dir():
            shutil.copytree(cache / "sources" / "git", root / "sources" / "git", symlinks=True)
        for key, f in srcs.fetched.items():
            if not f.commit:
                shutil.copytree(f.path.parent, root / "sources" / "sha256" / f.sha256)
        path = _stack_path(stack_name, None)
        (root / "stack").mkdir()
        (root / "stack" / f"{stack.name}.yaml").write_text(yaml.safe_dump(_raw(path, None), sort_keys=True))
        if stack.lock_path and stack.lock_path.exists():
            shutil.copy2(stack.lock_path, root / "stack" / f"{stack.name}.lock")
        meta = {"schema": SCHEMA, "stack": stack.name, "platform": plat, "pins_digest": stack.pins_digest(),
                "manifest": render_stack(stack).manifest}
        (root / "bundle.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
        sums = [f"{_sha256(p)}  {p.relative_to(root).as_posix()}"
                for p in sorted(root.rglob("*")) if p.is_file() and not p.is_symlink()]
        (root / "SHA256SUMS").write_text("\n".join(sums) + "\n")
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.name}.partial")
        with tarfile.open(tmp, "w") as tar:
            tar.add(root, arcname=".")
        os.replace(tmp, out)
        return {"schema": SCHEMA, "bundle": str(out), "stack": stack.name, "platform": plat, "files": len(sums),
                "size": out.stat().st_size}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _mismatch(meta: dict, stack) -> str:
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


def use_bundle(opts, stack, say) -> None:
    """`image build --bundle`: unpack and check the bundle, then point the build's wheelhouse and sources at it
    (offline; the build runs with --network none)."""
    import atexit

    if opts.sources_cache:  # already opened (the inputs are checked twice: fast, then in the plan)
        return
    dest = Path(tempfile.mkdtemp(prefix="trainbox-bundle-"))
    atexit.register(shutil.rmtree, dest, True)
    ob = open_bundle(Path(opts.bundle), stack, dest)
    say(f"building from bundle {opts.bundle} ({ob.meta['stack']}, {ob.meta['platform']}) with the network off")
    opts.wheelhouse, opts.sources_cache, opts.offline = str(ob.wheelhouse), str(ob.cache_dir), True


def open_bundle(file: Path, stack, dest: Path) -> OpenBundle:
    """Unpack into `dest` and check every file against SHA256SUMS, and that the bundle is for `stack`."""
    if not Path(file).is_file():
        raise BundleError(f"--bundle {file}: no such file; write one with `trainbox fetch STACK --bundle FILE`")
    with tarfile.open(file) as tar:
        tar.extractall(dest, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    sums = dest / "SHA256SUMS"
    if not sums.is_file():
        raise BundleError(f"--bundle {file}: no SHA256SUMS; not a trainbox bundle")
    for line in sums.read_text().splitlines():
        want, _, rel = line.partition("  ")
        p = dest / rel
        if not p.is_file() or _sha256(p) != want:
            raise BundleError(f"--bundle {file}: {rel} does not match its SHA256SUMS entry (damaged or tampered)")
    meta = json.loads((dest / "bundle.json").read_text())
    if meta.get("stack") != stack.name or meta.get("pins_digest") != stack.pins_digest():
        raise BundleError(f"--bundle {file}: {_mismatch(meta, stack)}; write a new bundle for it")
    return OpenBundle(dest, meta)
