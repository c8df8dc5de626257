"""`trainbox image build`: a stack's image, built for real with BuildKit (host module).

The flow: load the stack (with --set / --base overrides), make sure its base can be had (the cpu stack
falls back to a debootstrapped Debian), render the Dockerfile and manifest, stage a build context
that holds exactly the inputs, hash them into the image tag, skip the build when that tag exists,
otherwise build with secrets (CA bundle, index URL) and cache mounts, and write a build report.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import fcntl
import hashlib
import json
import os
import platform as _platform
import shlex
import shutil
import ssl
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from .dists import DIST_SUFFIXES, canon, dist_key, norm_version, sha256_file
from .engine import Client, ConsoleProgress, find_client, run_build
from .runtime.errors import TrainboxError
from .index import ca_bundle, ssl_context
from .paths import CACHE_DIR, REPO_ROOT
from .sources import Pin, pin_from_component

#: Top-level parts of the checkout that go into every build context (the rendered files come on top).
CONTEXT_ITEMS = ["pyproject.toml", "README.md", "LICENSE", "python", "patches", "launchers"]
#: Where the wheelhouse lies inside the build context (the Dockerfile bind-mounts it for pip).
WHEELHOUSE_DIR = "wheelhouse"
REPORTS_DIR = REPO_ROOT / "build" / "reports"
DEFAULT_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "*.pyo", "*.egg-info", ".pytest_cache", ".mypy_cache")


class BuildFailed(TrainboxError):
    """The engine ran the build and a step failed."""

    exit_code = 1


def _say(msg: str) -> None:
    print(f"trainbox: {msg}", file=sys.stderr, flush=True)


# -- inputs --------------------------------------------------------------------------------------------

def host_platform() -> str:
    m = _platform.machine().lower()
    return "linux/arm64" if m in ("aarch64", "arm64") else "linux/amd64"


def default_ca_bundle() -> str | None:
    """pip's own CA setting, else the system bundle (one rule for every HTTPS call trainbox makes)."""
    return ca_bundle()


def check_ca_bundle(path: str | os.PathLike) -> Path:
    """The bundle must hold at least one PEM certificate that OpenSSL accepts."""
    p = Path(path)
    if not p.is_file():
        raise TrainboxError(f"--ca-bundle {p}: no such file; give a PEM file of CA certificates "
                            f"(e.g. {DEFAULT_CA_BUNDLE})")
    data = p.read_bytes()
    if b"-----BEGIN CERTIFICATE-----" not in data:
        raise TrainboxError(f"--ca-bundle {p}: holds no PEM certificate (no '-----BEGIN CERTIFICATE-----' "
                            "block); give a PEM file of CA certificates, not a key, DER file or directory")
    try:
        ssl.create_default_context(cafile=str(p))
    except ssl.SSLError as exc:
        raise TrainboxError(f"--ca-bundle {p}: OpenSSL cannot load it as CA certificates ({exc.reason or exc}); "
                            "check that every block is a complete PEM certificate") from None
    return p


@dataclass
class WheelFile:
    name: str
    size: int
    sha256: str
    path: Path


def read_wheelhouse(path: str | os.PathLike) -> list[WheelFile]:
    d = Path(path)
    if not d.is_dir():
        raise TrainboxError(f"--wheelhouse {d}: no such directory; give a directory of wheels "
                            "(e.g. made with `pip download --only-binary=:all: -d DIR ...`)")
    files = sorted(p for p in d.iterdir() if p.is_file() and p.name.endswith(DIST_SUFFIXES))
    if not files:
        raise TrainboxError(f"--wheelhouse {d}: holds no wheels (*.whl) or sdists; put the pinned wheels there")
    return [WheelFile(p.name, p.stat().st_size, sha256_file(p, remember=True), p) for p in files]


def pins_for(stack, platform: str) -> list[Pin]:
    """The stack's pypi pins as they stand on one platform."""
    return [pin_from_component(c, stack, platform=platform)
            for c in stack.installed_components.values() if c.source == "pypi"]


def check_wheelhouse(wheels: list[WheelFile], pins: list[Pin], where: str) -> list[Pin]:
    """Every wheel in the wheelhouse for a pinned project must be the pinned artifact, and the
    wheelhouse must hold at least one pinned artifact. Returns the pins it serves."""
    served: list[Pin] = []
    for pin in pins:
        cname = canon(pin.name)
        mine = [w for w in wheels if dist_key(w.name)[0] == cname]
        if not mine:
            continue
        good = [w for w in mine if w.sha256 in pin.sha256] if pin.sha256 else \
            [w for w in mine if dist_key(w.name)[1] == norm_version(pin.version)]
        if good:
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


def check_indexes(pins: list[Pin], served: list[Pin], indexes: dict[str, str],
                  timeout: float = 6.0, cafile: str | None = None) -> dict[str, str]:
    """A pin whose index does not answer and that the wheelhouse does not serve would fail deep
    inside pip after minutes of work: say so now. Returns {index name: why} for the indexes that do
    not answer (pip would spend minutes retrying each of them for every requirement)."""
    served_keys = {p.key for p in served}
    down: dict[str, str] = {}
    for name, url in indexes.items():
        if url.startswith(("http://", "https://")):
            ok, why = _url_answers(url, timeout, cafile)
            if not ok:
                down[name] = why
    missing = []
    for pin in pins:
        if pin.key in served_keys or pin.index_name not in down:
            continue
        missing.append(f"{pin.name}=={pin.version} (index {pin.index_url}: {down[pin.index_name]})")
    if missing:
        raise TrainboxError(
            "these pins come from an index that does not answer, and no wheelhouse provides them: "
            + "; ".join(missing) + ". Pass --wheelhouse DIR holding the pinned wheels, or --set "
            "COMPONENT.index=NAME to take them from a reachable index")
    return down


def _url_answers(url: str, timeout: float, cafile: str | None = None) -> tuple[bool, str]:
    import urllib.error
    import urllib.request

    try:
        # the CA the build will give pip: behind a TLS-intercepting proxy the system bundle alone would fail
        urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout,
                               context=ssl_context(cafile) if url.startswith("https:") else None)
        return True, ""
    except urllib.error.HTTPError:
        return True, ""
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return False, str(getattr(exc, "reason", exc))


# -- the build context -----------------------------------------------------------------------------

def _copy_item(src: Path, dst: Path) -> None:
    if src.is_dir():
        shutil.copytree(src, dst, ignore=_IGNORE, symlinks=True)
    else:
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)


def copy_inputs(dst: Path) -> None:
    """The checkout's build inputs (CONTEXT_ITEMS, caches left out) copied under `dst`."""
    for item in CONTEXT_ITEMS:
        src = REPO_ROOT / item
        if src.exists():
            _copy_item(src, dst / item)


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)  # same file system: instant, and BuildKit sees the same mtime every time
    except OSError:
        shutil.copy2(src, dst)


@contextlib.contextmanager
def staged_context(stack_name: str, rendered_files: dict[str, bytes], wheels: list[WheelFile],
                   root: Path | None = None, private: bool = False) -> Iterator[Path]:
    """A build context that holds exactly the build's inputs, at a stable path per stack (BuildKit
    then re-sends only what changed), locked against a concurrent build of the same stack.
    `private`: a throw-away directory instead (dry runs: no lock, no waiting)."""
    if private:
        tmp = Path(tempfile.mkdtemp(prefix=f"trainbox-context-{stack_name}-"))
        try:
            _populate(tmp / stack_name, rendered_files, wheels)
            yield tmp / stack_name
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return
    base = Path(root or (CACHE_DIR / "context"))
    base.mkdir(parents=True, exist_ok=True)
    ctx = base / stack_name
    with open(base / f"{stack_name}.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _say(f"another build of stack {stack_name} is running; waiting for it")
            fcntl.flock(lock, fcntl.LOCK_EX)
        _populate(ctx, rendered_files, wheels)
        yield ctx


def _populate(ctx: Path, rendered_files: dict[str, bytes], wheels: list[WheelFile]) -> None:
    if ctx.exists():
        shutil.rmtree(ctx)
    ctx.mkdir(parents=True)
    copy_inputs(ctx)
    for rel, data in rendered_files.items():
        p = ctx / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    wh = ctx / WHEELHOUSE_DIR
    wh.mkdir(exist_ok=True)
    for w in wheels:
        _link_or_copy(w.path, wh / w.name)


def content_hash(ctx: Path, wheels: list[WheelFile], extra: dict[str, str]) -> str:
    """sha256 over every staged file (path, exec bit, bytes), the wheelhouse listing (name, size,
    sha256: the wheels themselves are not re-read) and `extra` (base image id, platform)."""
    h = hashlib.sha256()
    h.update(b"trainbox-context-v1\0")
    wh = ctx / WHEELHOUSE_DIR
    for p in sorted(ctx.rglob("*")):
        if p.is_dir() and not p.is_symlink():
            continue
        if wh in p.parents:
            continue
        rel = p.relative_to(ctx).as_posix()
        h.update(rel.encode() + b"\0")
        if p.is_symlink():
            h.update(b"L" + os.readlink(p).encode() + b"\0")
            continue
        h.update(b"X" if os.access(p, os.X_OK) else b"F")
        h.update(p.read_bytes())
        h.update(b"\0")
    for w in sorted(wheels, key=lambda w: w.name):
        h.update(f"wheel {w.name} {w.size} {w.sha256}\0".encode())
    for k in sorted(extra):
        h.update(f"{k}={extra[k]}\0".encode())
    return h.hexdigest()


# -- the build -------------------------------------------------------------------------------------

@dataclass
class BuildOptions:
    stack: str
    tags: list[str] = field(default_factory=list)
    base: str | None = None
    sets: dict[str, str] = field(default_factory=dict)
    wheelhouse: str | None = None
    pip_index_url: str | None = None
    ca_bundle: str | None = None
    platform: str | None = None
    force: bool = False
    dry_run: bool = False
    report: str | None = None
    verbose: bool = False
    no_cache: bool = False
    cache_from: list[str] = field(default_factory=list)  # BuildKit cache sources, e.g. type=local,src=DIR
    cache_to: list[str] = field(default_factory=list)  # BuildKit cache exports (buildx only)
    labels: dict[str, str] = field(default_factory=dict)  # extra labels (tests mark their images)
    tag_latest: bool = True  # also tag trainbox/<stack>:latest (plain builds of the stack as it is)
    check_wheelhouse: bool = True  # tests turn this off to prove pip's own hash check in the build


@dataclass
class BuildOutcome:
    tag: str
    tags: list[str]
    skipped: bool
    report: dict
    report_path: Path | None
    argv: list[str]


def _pull_hint(image: str) -> str:
    first, sep, rest = image.partition("/")
    path = rest if sep and ("." in first or ":" in first or first == "localhost") else image
    # no registry-mirrors advice: the availability check asks the image's own registry, so only a local copy
    # or an explicit --base helps
    return (f"pass --base IMAGE to build on another image that holds the same contents (a mirror, e.g. "
            f"--base my-registry.example.com/{path}), or `docker pull`/`docker load` it first (a local image is "
            f"used as it is)")


def resolve_base(stack, client: Client, say: Callable[[str], None]) -> tuple[str, str | None, bool]:
    """(image to build FROM, the substitute used or None, whether the substitute must be bootstrapped
    first). Decides in seconds; raises naming the base and the ways out when it cannot be had."""
    from .base import DEFAULT_TAG, base_available

    image = stack.base.image
    explicit = "base.image" in (stack.overrides or {})
    if explicit and image.startswith("local/debian:") and not client.image_exists(image):
        # trainbox's own base namespace (`trainbox base bootstrap`): made here, never pulled
        say(f"base {image} is not present; bootstrapping it from Debian's archive first")
        return image, None, True
    ok, why = base_available(image, client)
    if ok:
        return image, None, False
    sub = stack.base.substitute
    if stack.base.auto_substitute and sub and not explicit:
        say(f"base {image} cannot be pulled ({why}); building on {sub} instead (stack {stack.name} allows it)")
        if client.image_exists(sub):
            return sub, sub, False
        if sub == DEFAULT_TAG or sub.startswith("local/debian:"):
            return sub, sub, True
        raise TrainboxError(f"base {image} cannot be pulled ({why}) and its substitute {sub} is not "
                            f"present either; {_pull_hint(image)}")
    hint = _pull_hint(image)
    if sub:
        hint += f"; for a smoke build without the real base: --base {sub}"
    raise TrainboxError(f"stack {stack.name}: base image {image} cannot be pulled ({why}); {hint}")


def _render(stack, base_image: str, substituted: str | None):
    """The rendered Dockerfile, manifest and requirements for `stack` built FROM `base_image`.

    A substitute base is not an override the user asked for: the manifest keeps the stack's base
    image and records the substitute in base.substituted."""
    from . import render

    if not substituted:
        return render.render_stack(stack)
    original = stack.base.image
    sub_stack = stack.model_copy(deep=True)
    sub_stack.source_file = stack.source_file
    sub_stack.base.image = base_image
    rendered = render.render_stack(sub_stack)
    rendered.manifest["base"]["image"] = original
    rendered.manifest["base"]["substituted"] = substituted
    for rel in list(rendered.context_files):
        if rel.endswith("/stack.json"):
            rendered.context_files[rel] = (json.dumps(rendered.manifest, indent=2, sort_keys=True) + "\n").encode()
    return rendered


def _lock_overrides(stack, plat: str, wheels: list[WheelFile], wheelhouse: str | None,
                    say: Callable[[str], None]) -> None:
    """Hashes for pins that --set moved (the stack's own hashes and lock are for the old versions).

    The build is for one platform, so the stack is narrowed to it. A moved pin whose wheel is in the
    wheelhouse is pinned to that file (the wheelhouse is the trust root the user gave); the others
    get the hashes their index publishes, and the dependency closure is resolved again, exactly as
    `trainbox stack lock` does, so the build still installs everything in hash-checking mode."""
    from .lock import lock_stack
    from .stack import attach_lock

    def missing() -> list:
        return [c for c in stack.installed_components.values()
                if c.source == "pypi" and not c.pin_for(plat).sha256]

    if not missing() and stack.lock_is_fresh():
        return
    stack.platforms = [plat]
    for c in missing():
        pin = c.pin_for(plat)
        mine = [w for w in wheels if dist_key(w.name) == (canon(c.dist_name), norm_version(pin.version))]
        if mine:
            c.sha256 = sorted({w.sha256 for w in mine})
            say(f"--set {c.key}: pinned {c.dist_name}=={pin.version} to the wheelhouse's "
                f"{', '.join(w.name for w in mine)} (sha256 {c.sha256[0][:12]}...)")
    # The same overrides resolve to the same lock: remember it, so an unchanged rebuild stays a matter
    # of seconds (and the image does not drift with new releases of unpinned dependencies).
    key = hashlib.sha256(json.dumps(
        [stack.name, plat, stack.pins_digest(), sorted(stack.overrides.items()),
         {k: c.pin_for(plat).sha256 for k, c in sorted(stack.components.items())},
         sorted((w.name, w.sha256) for w in wheels)], sort_keys=True).encode()).hexdigest()[:24]
    memo = CACHE_DIR / "override-locks" / f"{stack.name}-{key}.json"
    try:
        lock = json.loads(memo.read_text())
    except (OSError, ValueError):
        say(f"resolving hashes and dependencies for the overridden pins of {stack.name} ({plat})")
        rep = lock_stack(stack, wheelhouse=Path(wheelhouse) if wheelhouse else None, resolve_deps=True)
        if rep.problems:
            raise TrainboxError("the overridden stack cannot be pinned: " + "; ".join(rep.problems)
                                + ". Check the versions given with --set, or put the wheels in --wheelhouse")
        lock = rep.lock
        with contextlib.suppress(OSError):
            memo.parent.mkdir(parents=True, exist_ok=True)
            memo.write_text(json.dumps(lock, sort_keys=True))
    attach_lock(stack, lock)
    left = missing()
    if left:
        raise TrainboxError("no sha256 known for " + ", ".join(f"{c.dist_name}=={c.pin_for(plat).version}"
                                                              for c in left)
                            + ": their index does not answer and the wheelhouse does not hold them")


def build(opts: BuildOptions, say: Callable[[str], None] = _say) -> BuildOutcome:
    from .stack import load_stack

    # Everything that can be wrong with the input is checked before anything slow starts.
    stack = load_stack(opts.stack, sets=opts.sets or None, base=opts.base)
    plat = opts.platform or host_platform()
    if plat not in stack.platforms:
        raise TrainboxError(f"--platform {plat}: stack {stack.name} supports {', '.join(stack.platforms)} "
                            f"({stack.source_file}: platforms)")
    ca = check_ca_bundle(opts.ca_bundle) if opts.ca_bundle else None
    if ca is None:
        default = default_ca_bundle()
        ca = check_ca_bundle(default) if default else None
    wheels = read_wheelhouse(opts.wheelhouse) if opts.wheelhouse else []
    if wheels and opts.check_wheelhouse:  # pins --set moved have no hash yet: matched by version here
        check_wheelhouse(wheels, pins_for(stack, plat), str(opts.wheelhouse))
    client = find_client()
    client.require_engine()
    base_image, substituted, needs_bootstrap = resolve_base(stack, client, say)

    # Slower checks (index queries), still before anything is built.
    if stack.overrides:
        _lock_overrides(stack, plat, wheels, opts.wheelhouse, say)
    pins = pins_for(stack, plat)
    if wheels and opts.check_wheelhouse:
        served = check_wheelhouse(wheels, pins, str(opts.wheelhouse))
    else:  # by name and version only: the hashes are left to pip inside the build
        names = {dist_key(w.name) for w in wheels}
        served = [p for p in pins if (canon(p.name), norm_version(p.version or "")) in names]
    indexes = {k: v for k, v in stack.indexes.items() if not (opts.pip_index_url and k == "pypi")}
    down = check_indexes(pins, served, indexes, cafile=str(ca) if ca else None)
    for name in sorted(down):
        if name != "pypi":
            # everything pinned to it is in the wheelhouse (checked above); pip must not wait on it
            say(f"index {name} ({stack.indexes[name]}) does not answer; its pins come from the wheelhouse")
            del stack.indexes[name]
    if needs_bootstrap:
        if opts.dry_run:
            say(f"would first make {base_image} with `trainbox base bootstrap --tag {base_image}`")
        else:
            from .base import bootstrap

            bootstrap(tag=base_image, suite=base_image.rsplit(":", 1)[-1], client=client, say=say)
    rendered = _render(stack, base_image, substituted)

    files = dict(rendered.context_files)
    dockerfile_rel = f"build/generated/{stack.name}/Dockerfile"
    files[dockerfile_rel] = rendered.dockerfile.encode()
    repo = f"trainbox/{stack.name}"

    with staged_context(stack.name, files, wheels, private=opts.dry_run) as ctx:
        base_id = client.image_id(base_image) or base_image
        extra = {"base": base_id, "platform": plat, **{f"label {k}": v for k, v in opts.labels.items()}}
        digest = content_hash(ctx, wheels, extra)
        hash_tag = f"{repo}:{digest[:12]}"
        tags = [hash_tag]
        if opts.tag_latest and not stack.overrides:
            tags.append(f"{repo}:latest")
        tags += [t for t in opts.tags if t not in tags]
        # Build-time facts only the builder knows; the template's LABELs describe the stack itself.
        labels = {
            "io.trainbox.content-hash": digest,
            "io.trainbox.base.used": base_image,
            **({"io.trainbox.base.substituted": substituted} if substituted else {}),
            **opts.labels,
        }
        args = ["-f", str(ctx / dockerfile_rel), "--network", "host", "--platform", plat]
        for t in tags:
            args += ["-t", t]
        for k, v in labels.items():
            args += ["--label", f"{k}={v}"]
        if opts.cache_to and client.mode != "buildx":
            raise TrainboxError(f"--cache-to needs docker buildx with a builder that exports caches (`docker buildx "
                                f"create --use --driver docker-container`); this client is {client.describe()}")
        for spec in opts.cache_from:
            args += ["--cache-from", spec]
        for spec in opts.cache_to:
            args += ["--cache-to", spec]
        if client.mode == "buildx" and (opts.cache_to or opts.cache_from):
            # a docker-container builder grants --network host only when asked (and started with
            # --allow-insecure-entitlement network.host)
            args += ["--allow", "network.host"]
        if opts.no_cache:
            args.append("--no-cache")
        secrets_dir = Path(tempfile.mkdtemp(prefix="trainbox-secrets-"))
        try:
            if ca is not None:
                args += ["--secret", f"id=pip_cert,src={ca}"]
            if opts.pip_index_url:
                f = secrets_dir / "pip_index_url"
                fd = os.open(f, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "w") as fh:
                    fh.write(opts.pip_index_url)
                args += ["--secret", f"id=pip_index_url,src={f}"]
            argv = client.build_argv + ["--progress", "plain", *args, str(ctx)]
            report_path = Path(opts.report) if opts.report else REPORTS_DIR / f"{stack.name}.json"
            common = {
                "stack": stack.name, "device": stack.device, "platform": plat, "tag": hash_tag, "tags": tags,
                "content_hash": digest, "base": {"requested": stack.base.image, "used": base_image,
                                                 "substituted": substituted},
                "overrides": dict(stack.overrides or {}), "wheelhouse": [w.name for w in wheels],
                "client": client.describe(),
                "started_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            }
            if opts.dry_run:
                env = "DOCKER_BUILDKIT=1 " if client.mode == "buildkit" else ""
                print(env + " ".join(shlex.quote(a) for a in argv))
                say(f"dry run: would build {hash_tag} (the context above was a temporary copy, now removed)")
                return BuildOutcome(hash_tag, tags, False, {**common, "dry_run": True}, None, argv)

            if not opts.force and client.image_exists(hash_tag):
                t0 = time.monotonic()
                for t in tags[1:]:
                    client.tag(hash_tag, t)
                report = {**common, **_image_facts(client, hash_tag), "ok": True, "skipped": True,
                          "wall_s": round(time.monotonic() - t0, 3), "steps": [], "cached_steps": 0,
                          "rebuilt_steps": 0}
                _write_report(report, report_path)
                say(f"{hash_tag} is up to date (its inputs are unchanged); not rebuilding (--force rebuilds)")
                print(_summary(report))
                return BuildOutcome(hash_tag, tags, True, report, report_path, argv)

            say(f"building {hash_tag} for {plat} on {base_image} with {client.describe()}")
            progress = ConsoleProgress(verbose=opts.verbose)
            result = run_build(client, args, ctx, on_event=progress)
        finally:
            shutil.rmtree(secrets_dir, ignore_errors=True)

    steps = [s.as_dict() for s in _dockerfile_order(result.steps, rendered.dockerfile)]
    for st in steps:
        st["from"] = st["name"].partition("] ")[2].startswith("FROM ")  # the base, not a build step
    report = {**common, "ok": result.ok, "skipped": False, "wall_s": round(result.wall_s, 2), "steps": steps,
              "cached_steps": sum(s["status"] == "cached" for s in steps if not s["from"]),
              "rebuilt_steps": sum(s["status"] == "done" for s in steps if not s["from"])}
    if not result.ok:
        failed = result.failed
        report["error"] = {"step": failed.name if failed else None, "message": result.error,
                           "last_lines": list(failed.log)[-25:] if failed else result.output_tail[-25:]}
        _write_report(report, report_path)
        lines = report["error"]["last_lines"] or result.output_tail[-25:]
        where = f"step {failed.name}" if failed else "the build"
        raise BuildFailed(
            f"building {hash_tag} failed at {where}: {result.error or 'exit ' + str(result.returncode)}\n"
            "  last lines of its output:\n    " + "\n    ".join(lines) + f"\n  report: {report_path}")
    report.update(_image_facts(client, hash_tag))
    _write_report(report, report_path)
    print(_summary(report))
    return BuildOutcome(hash_tag, tags, False, report, report_path, argv)


def _dockerfile_order(steps: list, dockerfile: str) -> list:
    """BuildKit reports steps as they start (stages run in parallel); put them in Dockerfile order."""
    import re

    stages: list[str] = []
    for m in re.finditer(r"(?im)^\s*FROM\s+\S+(?:\s+AS\s+(\S+))?", dockerfile):
        stages.append(m.group(1) or f"stage-{len(stages)}")
    rank = {name: i for i, name in enumerate(stages)}
    return sorted(steps, key=lambda s: (rank.get(s.stage or "", len(stages)), s.index or 0))


def _image_facts(client: Client, ref: str) -> dict:
    info = client.inspect(ref)
    return {"image_id": info.get("Id"), "size": int(info.get("Size") or 0), "layers": client.layers(ref)}


def _write_report(report: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(report, indent=2, sort_keys=False) + "\n")
    tmp.replace(path)


def _summary(report: dict) -> str:
    size = report.get("size")
    size_s = f"{size / 1e6:.0f} MB" if size else "?"
    if report.get("skipped"):
        how = "up to date, not rebuilt"
    else:
        how = (f"built in {report.get('wall_s', 0):.1f}s, {report.get('rebuilt_steps', 0)} steps run, "
               f"{report.get('cached_steps', 0)} cached")
    sub = report.get("base", {}).get("substituted")
    return (f"{report['tag']} {(report.get('image_id') or '')[7:19]} {size_s} {len(report.get('layers') or [])} "
            f"layers: {how}" + (f" (base substituted by {sub})" if sub else ""))
