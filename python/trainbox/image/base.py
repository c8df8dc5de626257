"""The base image a build starts FROM: which one (the stack's own, its substitute, or one given with --base),
and, for bases that do not come from a registry, `trainbox base bootstrap`, which builds a minimal Debian root
filesystem with debootstrap from Debian's archive and imports it as a one-layer image.

Host module. This is how the cpu stack gets a base where no registry is reachable (only Debian's
archive and PyPI are, on the machines this project is developed on), and how air-gapped sites that
mirror Debian make their own. `image build` and `smoke` choose through the same `own_or_substitute`.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..specs import grammar
from .engine import Client, EngineError, find_client, registry_reachable
from ..specs.platforms import (EMULATE_HINT, PLATFORM_ARCH, emulation_problem, host_platform, local_base_for,
                        platform_of, tag_suffix)
from ..runtime.errors import TrainboxError
from ..runtime.redact import redact
from ..specs.stack import Stack

DEFAULT_TAG = "local/debian:bookworm"
LOCAL_REPO = "local/debian:"  # the repository of every base `trainbox base bootstrap` makes (any suite, platform)
DEFAULT_SUITE = "bookworm"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
DEFAULT_SECURITY_MIRROR = "http://deb.debian.org/debian-security"

#: What the system stage of a trainbox Dockerfile installs with apt on every base: the CA store and tini (PID 1).
RUNTIME_PACKAGES = ("ca-certificates", "tini")
#: ... and, where the stack's Python comes from apt (cpu, and every stack built on a Debian substitute), the
#: interpreter and Debian's pip wheel (the venv is made with --without-pip and gets its pip from that wheel:
#: neither python3-venv nor python3-pip is needed, and neither lands in the image).
APT_PYTHON_PACKAGES = ("python3", "python3-pip-whl")
#: A bootstrapped base holds them already, so that a build's system stage finds them all installed and skips
#: apt (apt-get update alone is seconds to tens of seconds of a cold build). The image records its list in the
#: INCLUDE_LABEL; a trainbox base whose list lacks one of these is outdated and remade when a build needs it.
DEFAULT_INCLUDE = tuple(sorted(RUNTIME_PACKAGES + APT_PYTHON_PACKAGES))
INCLUDE_LABEL = "org.trainbox.base.include"
PLATFORM_LABEL = "org.trainbox.base.platform"

# What docker's official Debian images configure (debuerreotype): no recommends, no kept .debs, no
# services started by package scripts. Without these every image built FROM it grows apt caches.
_APT_CONF = {
    "etc/apt/apt.conf.d/docker-clean": (
        'DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb '
        '/var/cache/apt/*.bin || true"; };\n'
        'APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb '
        '/var/cache/apt/*.bin || true"; };\n'
        'Dir::Cache::pkgcache ""; Dir::Cache::srcpkgcache "";\n'
    ),
    "etc/apt/apt.conf.d/docker-no-recommends": 'APT::Install-Recommends "false";\nAPT::Install-Suggests "false";\n',
    "etc/apt/apt.conf.d/docker-gzip-indexes": 'Acquire::GzipIndexes "true";\nAcquire::CompressionTypes::Order:: "gz";\n',
    "etc/apt/apt.conf.d/docker-autoremove-suggests": 'Apt::AutoRemove::SuggestsImportant "false";\n',
    # Like debian:*-slim: no documentation, manuals or translations in a training image.
    "etc/dpkg/dpkg.cfg.d/docker-slim": (
        "path-exclude /usr/share/doc/*\npath-include /usr/share/doc/*/copyright\n"
        "path-exclude /usr/share/man/*\npath-exclude /usr/share/groff/*\npath-exclude /usr/share/info/*\n"
        "path-exclude /usr/share/lintian/*\npath-exclude /usr/share/linda/*\n"
        "path-exclude /usr/share/locale/*\npath-include /usr/share/locale/locale.alias\n"
    ),
    "usr/sbin/policy-rc.d": "#!/bin/sh\n# containers run no services at install time\nexit 101\n",
}


def _say(msg: str) -> None:
    print(f"trainbox: {msg}", file=sys.stderr, flush=True)


def base_available(image: str, client: Client | None = None, timeout: float = 8.0,
                   platform: str | None = None) -> tuple[bool, str]:
    """(True, how) when `image` is present locally (for `platform`, when given) or its registry answers;
    (False, why) otherwise.

    Never hangs: a registry probe with a short timeout instead of a pull (a real pull of a large
    base may rightly take many minutes and is left to the build)."""
    client = client or find_client()
    local = ""
    if platform is None:
        if client.image_exists(image):
            return True, "present locally"
    else:
        info = client.image_info(image)
        if info is not None and platform_of(info) == platform:
            return True, "present locally"
        if info is not None:  # the engine keeps one image per name: a copy for another platform does not count
            local = f"present locally for {platform_of(info) or 'another platform'}, not {platform}; "
    ok, detail = registry_reachable(image, timeout=timeout)
    return (True, f"registry answers ({detail})") if ok else (False, f"{local}registry unreachable: {detail}")


@dataclass
class Choice:
    """A base decided on: the image to build on, the substitute it is (None: the stack's own) and why."""

    used: str
    substituted: str | None
    why: str
    available: bool = True  # False: the own base cannot be had and no substitute may stand in


def own_or_substitute(image: str, substitute: str | None, may_substitute: bool, client: Client | None = None,
                      timeout: float = 8.0, platform: str | None = None) -> Choice:
    """The stack's own base when it can be had (present locally, or its registry answers), else its substitute
    where one is declared and the caller's policy allows it. Decides in seconds (a probe, not a pull)."""
    ok, why = base_available(image, client, timeout=timeout, platform=platform)
    if ok:
        return Choice(image, None, f"{image}: {why}")
    if substitute and may_substitute:
        return Choice(substitute, substitute, f"{image} cannot be pulled ({why})")
    return Choice(image, None, f"{image} cannot be pulled ({why})", available=False)


@dataclass(frozen=True)
class ProfileBase:
    """A smoke profile's base decision for one stack: `trainbox smoke` and `image build --profile` both take it
    from here, so the two never build one stack on different bases."""

    decision: str  # own | explicit | substitute
    base: str | None  # what to pass as `image build --base`; None: the stack's own choice
    substituted: str | None  # the image standing in for the stack's own base, if any
    reason: str


def profile_base(mode: str, own: str, substitute: str | None, auto_substitute: bool,
                 timeout: float = 8.0) -> ProfileBase:
    """`substitute_base: auto | never | IMAGE` for a stack whose own base is `own`: auto builds on the stack's
    base.substitute when `own` cannot be had. Where no engine answers (a dry run, or a smoke whose build step
    will say so) auto plans on the substitute, as the build on a CPU host would."""
    if mode == "never":
        return ProfileBase("own", None, None, "substitute_base never")
    if mode != "auto":
        return ProfileBase("explicit", mode, mode if mode != own else None, f"substitute_base {mode}")
    try:
        choice = own_or_substitute(own, substitute, may_substitute=True, timeout=timeout)
    except TrainboxError as exc:
        choice = Choice(substitute or own, substitute, f"{own}: not probed ({exc})", available=bool(substitute))
    if not choice.substituted:
        return ProfileBase("own", None, None, choice.why if choice.available else
                           f"{choice.why} and the stack declares no base.substitute; the build says how to "
                           "provide one")
    # a stack that substitutes by itself (cpu) gets no --base: its image is the very one `trainbox image build`
    # makes for everyone (same content hash, a cache hit when it exists)
    return ProfileBase("substitute", None if auto_substitute else substitute, substitute,
                       f"{choice.why}; built on the stack's base.substitute {substitute}")


def pull_hint(image: str) -> str:
    """What to do about a base that cannot be pulled."""
    first, sep, rest = image.partition("/")
    path = rest if sep and ("." in first or ":" in first or first == "localhost") else image
    # no registry-mirrors advice: the availability check asks the image's own registry, so only a local copy
    # or an explicit --base helps
    return (f"pass --base IMAGE to build on another image that holds the same contents (a mirror, e.g. "
            f"--base my-registry.example.com/{path}), or `docker pull`/`docker load` it first (a local image is "
            f"used as it is)")


def resolve_base(stack: Stack, client: Client, say: Callable[[str], None],
                 platform: str | None = None) -> tuple[str, str | None, bool, str | None]:
    """The base `image build` uses for `platform` (default: this host's): (image to build FROM, the substitute
    used or None, whether it must be bootstrapped first, its image id when it is present and used as it is).
    Only a stack that allows it (base.auto_substitute: cpu) falls back to its substitute by itself. trainbox's
    own bases are per platform (local/debian:bookworm-arm64 for linux/arm64). Decides in seconds; raises
    naming the base and the ways out when it cannot be had."""
    plat = platform or host_platform()
    image = stack.base.image
    explicit = "base.image" in (stack.overrides or {})
    if explicit and image.startswith(LOCAL_REPO):
        # trainbox's own base namespace (`trainbox base bootstrap`): made here, never pulled
        image = _local_for(image, plat, say)
        info = client.image_info(image)
        if info is None or outdated(image, client, info) or _other_platform(info, plat):
            say(f"base {image} is not present or outdated; bootstrapping it from Debian's archive first")
            return image, None, True, None
        return image, None, False, info.get("Id")
    sub = stack.base.substitute
    local = bool(sub) and (sub == DEFAULT_TAG or sub.startswith(LOCAL_REPO))
    sub = _local_for(sub, plat, None) if local else sub
    choice = own_or_substitute(image, sub, stack.base.auto_substitute and not explicit, client, platform=plat)
    if not choice.substituted and choice.available:
        return image, None, False, None
    if choice.substituted:
        say(f"base {choice.why}; building on {sub} instead (stack {stack.name} allows it)")
        info = client.image_info(sub)
        if info is not None and not (local and (outdated(sub, client, info) or _other_platform(info, plat))):
            return sub, sub, False, info.get("Id")
        if local:
            return sub, sub, True, None
        raise TrainboxError(f"base {choice.why} and its substitute {sub} is not present either; "
                            f"{pull_hint(image)}")
    hint = pull_hint(image)
    if sub:
        hint += "; " + substitute_hint(stack.name, sub)
    raise TrainboxError(f"stack {stack.name}: base image {choice.why}; {hint}")


#: The project's profile for hosts that reach PyPI only (no CANN, no PyTorch index): the pins and base it names
#: are what a CPU host can build an NPU stack with (`make smoke` builds every NPU stack this way).
CPU_HOST_PROFILE = "ci/smoke-offline.yaml"


def cpu_host_profile() -> str:
    """CPU_HOST_PROFILE as a user would type it here: relative inside the checkout, else absolute."""
    from ..paths import REPO_ROOT

    path = REPO_ROOT / CPU_HOST_PROFILE
    return os.path.relpath(path) if Path.cwd() in path.parents else str(path)


def profile_names(stack_name: str) -> bool:
    """Whether CPU_HOST_PROFILE holds substitute pins for the stack (its `set:` names it)."""
    from ..paths import REPO_ROOT
    from ..yamlfile import load_yaml_file

    try:
        return stack_name in ((load_yaml_file(REPO_ROOT / CPU_HOST_PROFILE, "smoke profile") or {}).get("set") or {})
    except (OSError, TrainboxError):
        return False


def substitute_hint(stack_name: str, sub: str) -> str:
    """The one step from "this host has no such base" to a build that works here: the profile that names the
    stack's substitute pins when there is one, else the substitute base with the pins left to the user."""
    shown = cpu_host_profile()
    if profile_names(stack_name):
        return (f"on a host without it (no CANN, a CPU host), build the stack on its substitute {sub} with the pins "
                f"a PyPI-only host can install: `trainbox image build {stack_name} --profile {shown}` (not an NPU "
                "image: it proves the build, the patches and the Python side; docs/howto/npu-on-a-cpu-host.md)")
    return (f"on a host without it, --base {sub} builds the stack on trainbox's Debian base, with --set for the pins "
            f"this host cannot install ({shown} shows which; docs/howto/npu-on-a-cpu-host.md)")


def _local_for(image: str, plat: str, say: Callable[[str], None] | None) -> str:
    """trainbox's own base for `plat` (local/debian:bookworm -> local/debian:bookworm-arm64 for linux/arm64)."""
    mapped = local_base_for(image, plat)
    if say and mapped != image:
        say(f"base {image} for {plat} is {mapped} (trainbox's bases are named per platform)")
    return mapped


def native_twin(used: str, plat: str, client: Client | None) -> str | None:
    """For a build for another machine's platform: trainbox's own base for this machine that `used` is the
    `plat` twin of (local/debian:bookworm for local/debian:bookworm-arm64), when the engine holds it. The build
    then compiles the venv's bytecode natively (build/templates/partials/pyc.j2). None for a build for this
    machine, for other bases (their twin's Python is not known) and when the engine lacks it."""
    suffix = tag_suffix(plat)
    if client is None or plat == host_platform() or not suffix or not used.endswith(suffix) \
            or not used.startswith(LOCAL_REPO):
        return None
    twin = local_base_for(used[: -len(suffix)], host_platform())
    return twin if client.image_exists(twin) else None


def outdated(image: str, client: Client, info: dict | None = None) -> str | None:
    """Why `image`, a base that `bootstrap` made, must be made again (it lacks packages of DEFAULT_INCLUDE:
    made by an older trainbox), or None: current, absent, or not made by trainbox (then left alone). `info`:
    its `Client.image_info`, when the caller has it already."""
    if info is None:
        info = client.image_info(image)
    labels = ((info or {}).get("Config") or {}).get("Labels") or {}
    if "org.trainbox.base.suite" not in labels:
        return None
    missing = sorted(set(DEFAULT_INCLUDE) - set(filter(None, labels.get(INCLUDE_LABEL, "").split(","))))
    return f"it lacks {', '.join(missing)}, which builds on it would install every time" if missing else None


def default_mirror() -> str:
    return os.environ.get("TRAINBOX_DEBIAN_MIRROR") or DEFAULT_MIRROR


def suite_of(tag: str) -> str:
    """The Debian suite a trainbox base tag names (local/debian:bookworm-arm64 -> bookworm)."""
    name = tag.rsplit(":", 1)[-1]
    for plat in PLATFORM_ARCH:
        if tag_suffix(plat) and name.endswith(tag_suffix(plat)):
            return name[: -len(tag_suffix(plat))]
    return name


def bootstrap(tag: str | None = None, suite: str = DEFAULT_SUITE, mirror: str | None = None,
              security_mirror: str | None = DEFAULT_SECURITY_MIRROR, force: bool = False,
              include: list[str] | None = None, client: Client | None = None,
              say: Callable[[str], None] = _say, verbose: bool = False, platform: str | None = None) -> str:
    """Make `tag` from Debian's archive with debootstrap (--variant=minbase, with DEFAULT_INCLUDE and
    `include`) for `platform` (default: this host's), and import it. Returns the image id.

    Another architecture's root filesystem is made through qemu (binfmt_misc) and imported with BuildKit
    (`FROM scratch`, --platform), since `docker import` records the engine's own architecture, not the
    rootfs's. `tag` defaults to local/debian:bookworm, with the platform's suffix (local/debian:bookworm-arm64).

    Idempotent: returns the existing image id when `tag` exists, unless `force` or it is an outdated trainbox
    base (see `outdated`), or for another platform: then it is made again, and its new image id changes every
    build hash on it."""
    plat = platform or host_platform()
    if plat not in PLATFORM_ARCH:
        raise TrainboxError(f"--platform {plat}: not one of {', '.join(PLATFORM_ARCH)}")
    # every input checked in milliseconds, before the engine is asked and minutes of debootstrap run
    check_bootstrap_inputs(tag, suite, mirror, security_mirror, include)
    tag = tag or local_base_for(DEFAULT_TAG, plat)
    client = client or find_client()
    client.require_engine()
    info = client.image_info(tag)
    existing = (info or {}).get("Id")
    include = sorted(set(DEFAULT_INCLUDE) | set(include or []))
    if existing and not force:
        why = outdated(tag, client, info) or _other_platform(info, plat)
        if not why:
            say(f"base {tag} exists ({existing[:19]}); nothing to do (--force rebuilds it)")
            return existing
        say(f"base {tag} exists ({existing[:19]}) but {why}: making it again")
    problem = emulation_problem(plat)
    if problem:
        raise TrainboxError(f"--platform {plat} on this {host_platform()} host: {problem}; {EMULATE_HINT}")
    mirror = mirror or default_mirror()
    debootstrap = shutil.which("debootstrap")
    if not debootstrap:
        raise TrainboxError("debootstrap is not installed: `apt-get install debootstrap` "
                            "(ci/ensure-docker.sh installs it)")
    if os.geteuid() != 0:
        raise TrainboxError("`trainbox base bootstrap` runs debootstrap, which needs root: run it as root "
                            "(or with sudo)")

    t0 = time.monotonic()
    # /var/tmp, not /tmp: a tmpfs /tmp may be too small or mounted nodev/noexec, which debootstrap needs.
    # SIGTERM / SIGHUP / Ctrl-C: debootstrap stopped and its tree removed (not left behind in /var/tmp)
    with _interruptible(), _removed(_tmp_parent()) as workdir:
        rootfs = workdir / "rootfs"
        arch = PLATFORM_ARCH[plat]
        say(f"bootstrapping Debian {suite} ({arch}) from {mirror} into {rootfs} (debootstrap --variant=minbase"
            + (", through qemu" if plat != host_platform() else "") + ")")
        cmd = [debootstrap, "--variant=minbase", f"--arch={arch}", "--force-check-gpg",
               "--include=" + ",".join(include), suite, str(rootfs), mirror]
        _run_debootstrap(cmd, say, verbose)
        _finish_rootfs(rootfs, suite, mirror, security_mirror)
        say(f"importing the root filesystem as {tag} ({plat})")
        facts = _changes(suite, mirror, include, plat)
        if plat == host_platform():
            image_id = _import(client, rootfs, tag, facts)
        else:
            image_id = _import_buildkit(client, rootfs, workdir / "context", tag, facts, plat)
    if existing and existing != image_id:
        client.remove_image(existing)  # the replaced base, now untagged; kept if something still uses it
    say(f"base {tag} ready ({image_id[:19]}) in {time.monotonic() - t0:.0f}s")
    return image_id


_SUITE_RE = re.compile(r"^[a-z][a-z0-9-]{0,31}\Z")  # bookworm, trixie, sid, bookworm-backports
# debootstrap's --include: package names only (no =version), joined with commas
_INCLUDE_RE = re.compile(r"^[a-z0-9][a-z0-9+.-]+\Z")


def check_bootstrap_inputs(tag: str | None, suite: str, mirror: str | None, security_mirror: str | None,
                           include: list[str] | None) -> None:
    """`base bootstrap`'s inputs, each in one line naming its option: they go to debootstrap, into the image's
    sources.list and labels, and name the image; checked before anything runs (they were checked after minutes
    of debootstrap)."""
    def bad(option: str, value: object, expected: str) -> TrainboxError:
        return TrainboxError(f"{option} {redact(str(value))!r}: expected {expected}")

    if tag is not None:
        try:
            grammar.check_image(tag)
        except ValueError:
            raise bad("--tag", tag, "an image name such as local/debian:bookworm (lower-case path, optional "
                      ":tag; no spaces or shell syntax)") from None
        if "@" in tag:
            raise bad("--tag", tag, "a name and tag to create, not a digest")
    if not isinstance(suite, str) or not _SUITE_RE.match(suite):
        raise bad("--suite", suite, "a Debian suite name such as bookworm or trixie (lower-case letters, digits, -)")
    for option, url in (("--mirror" if mirror else "$TRAINBOX_DEBIAN_MIRROR", mirror or default_mirror()),
                        ("--security-mirror", None if security_mirror in (None, "none") else security_mirror)):
        if url is None:
            continue
        try:
            grammar.check_url(url, ("http", "https", "file"), option)
        except ValueError as exc:
            raise TrainboxError(f"{exc} (a Debian mirror such as {DEFAULT_MIRROR})") from None
    for pkg in include or []:
        if not isinstance(pkg, str) or not _INCLUDE_RE.match(pkg) or len(pkg) > 128:
            raise bad("--include", pkg, "one Debian package name such as curl (lower-case letters, digits, +.-; "
                      "repeat --include for several)")


@contextlib.contextmanager
def _interruptible():
    """SIGTERM and SIGHUP raise KeyboardInterrupt while the bootstrap runs, as Ctrl-C does, so that the `finally`
    blocks stop debootstrap and remove its tree (the default action ended the process with a 243 MB tree left in
    /var/tmp). Only the main thread can set handlers; elsewhere the signals keep their actions."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupted(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    old = {s: signal.signal(s, interrupted) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


@contextlib.contextmanager
def _removed(parent: str):
    """A new work directory under `parent`, removed at the end whatever happens; a second signal while it is
    being removed does not cut the removal short."""
    import threading

    workdir = Path(tempfile.mkdtemp(prefix="trainbox-debootstrap-", dir=parent))
    try:
        yield workdir
    finally:
        main = threading.current_thread() is threading.main_thread()
        sigs = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
        old = {sig: signal.signal(sig, signal.SIG_IGN) for sig in sigs} if main else {}
        try:
            _cleanup(workdir)
        finally:
            for sig, h in old.items():
                signal.signal(sig, h)


def _tmp_parent() -> str:
    p = os.environ.get("TRAINBOX_BOOTSTRAP_TMP") or "/var/tmp"
    return p if os.path.isdir(p) else tempfile.gettempdir()


def _run_debootstrap(cmd: list[str], say: Callable[[str], None], verbose: bool) -> None:
    """Run debootstrap, showing one line per phase (not one per package) unless verbose."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            errors="replace", env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    assert proc.stdout is not None
    try:
        _follow(proc, say, verbose)
    except BaseException:
        _stop(proc)  # interrupted: debootstrap must not go on writing into the tree about to be removed
        raise


def _stop(proc: subprocess.Popen) -> None:
    with contextlib.suppress(OSError):
        proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _follow(proc: subprocess.Popen, say: Callable[[str], None], verbose: bool) -> None:
    assert proc.stdout is not None
    tail: list[str] = []
    per_package = 0
    for line in proc.stdout:
        line = line.rstrip()
        if not line:
            continue
        tail = (tail + [line])[-20:]
        if not verbose and _PER_PACKAGE.match(line):
            per_package += 1
            if per_package % 100 == 0:
                say(f"  ... {per_package} package steps")
            continue
        say("  " + line)
    rc = proc.wait()
    if rc != 0:
        joined = "\n  ".join(tail)
        raise TrainboxError(f"debootstrap failed (exit {rc}); its last lines:\n  {joined}\n"
                            "check that the mirror is reachable (--mirror URL) and the suite exists (--suite)")


# "I: Retrieving libc6 2.36-9" and the like: one per package, hundreds of them.
_PER_PACKAGE = re.compile(r"^I: ((Retrieving|Validating) [^ ]+ [^ ]+|(Extracting|Unpacking|Configuring) [^ ]+\.\.\.)$")


def _finish_rootfs(rootfs: Path, suite: str, mirror: str, security_mirror: str | None) -> None:
    lines = [f"deb {mirror} {suite} main", f"deb {mirror} {suite}-updates main"]
    if security_mirror and security_mirror != "none":
        lines.append(f"deb {security_mirror} {suite}-security main")
    (rootfs / "etc/apt/sources.list").write_text("\n".join(lines) + "\n")
    for rel, text in _APT_CONF.items():
        p = rootfs / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
        if rel.startswith("usr/sbin/"):
            p.chmod(0o755)
    # Caches and indexes debootstrap leaves behind; an image starts with none.
    for pattern in ("var/cache/apt/archives/*.deb", "var/cache/apt/*.bin", "var/lib/apt/lists/*",
                    "var/cache/debconf/*-old", "var/log/*.log", "var/log/apt/*", "tmp/*", "var/tmp/*"):
        for p in rootfs.glob(pattern):
            if p.is_dir() and not p.is_symlink():
                if p.name != "partial":
                    shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
    # What the dpkg excludes above keep out of later installs, removed from the packages already in.
    for sub in ("usr/share/man", "usr/share/info", "usr/share/groff", "usr/share/lintian", "usr/share/linda"):
        for p in (rootfs / sub).glob("*"):
            _rm(p)
    for p in (rootfs / "usr/share/locale").glob("*"):
        if p.name != "locale.alias":
            _rm(p)
    for d in (rootfs / "usr/share/doc").glob("*"):
        if d.is_dir() and not d.is_symlink():
            for p in d.iterdir():
                if p.name != "copyright":
                    _rm(p)
    (rootfs / "etc/hostname").write_text("localhost\n")
    (rootfs / "etc/resolv.conf").write_text("")  # the engine supplies one at run time


def _rm(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    else:
        p.unlink(missing_ok=True)


def _other_platform(info: dict | None, plat: str) -> str | None:
    """Why an image made for another platform cannot stand for `plat`'s base (None: it can, or it says nothing)."""
    if not (info or {}).get("Architecture"):
        return None
    found = platform_of(info)
    return f"it is for {found or info['Architecture']}, not {plat}" if found != plat else None


def _changes(suite: str, mirror: str, include: list[str], plat: str) -> list[str]:
    """The image config of a bootstrapped base, as Dockerfile instructions (for `docker import --change` and
    for the BuildKit import alike)."""
    return [
        'CMD ["bash"]',
        "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "ENV LANG=C.UTF-8",
        f"LABEL org.opencontainers.image.description=\"Debian {suite} (debootstrap minbase, imported by trainbox)\"",
        f"LABEL org.trainbox.base.suite={suite}",
        f"LABEL org.trainbox.base.mirror={mirror}",
        f"LABEL {INCLUDE_LABEL}={','.join(include)}",
        f"LABEL {PLATFORM_LABEL}={plat}",
        f"LABEL org.trainbox.base.created={time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}",
    ]


# The engine provides /dev, /proc and /sys in every container: their contents stay out of the image.
_ROOTFS_EXCLUDE = ("./dev/*", "./proc/*", "./sys/*")


def _import_buildkit(client: Client, rootfs: Path, context: Path, tag: str, changes: list[str], plat: str) -> str:
    """The root filesystem as a one-layer image whose config records `plat` (the engine client's BuildKit
    import), checked to record it."""
    image_id = client.import_tree_for(rootfs, tag, changes, plat, context, exclude=_ROOTFS_EXCLUDE)
    found = platform_of(client.image_info(tag))
    if found != plat:
        raise EngineError(f"BuildKit made {tag} for {found or 'an unknown platform'}, not {plat}")
    return image_id


def _import(client: Client, rootfs: Path, tag: str, changes: list[str]) -> str:
    return client.import_tree(rootfs, tag, changes, exclude=_ROOTFS_EXCLUDE)


def _cleanup(workdir: Path) -> None:
    """Unmount what debootstrap may have left mounted (after a failure) before deleting the tree."""
    try:
        mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
    except OSError:
        mounts = []
    prefix = str(workdir) + "/"
    for mnt in sorted((m for m in mounts if m.startswith(prefix)), key=len, reverse=True):
        subprocess.run(["umount", "-l", mnt], capture_output=True)
    shutil.rmtree(workdir, ignore_errors=True)
