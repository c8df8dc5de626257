"""`trainbox image build`: a stack's image, planned then built with BuildKit (host module).

The flow, one direction: check the input (stack with --set / --base, platform, CA bundle, wheelhouse) in
milliseconds; choose the base (trainbox.image.base: the cpu stack falls back to a debootstrapped Debian); pin what
--set moved (trainbox.supply.lock); check the indexes against the wheelhouse; make the plan (trainbox.image.plan:
rendered files, content hash, tags, argv, secrets, what is fetched from where); then either print it
(--dry-run: no engine, no index needed) or run it (trainbox.image.run: stage, skip when the tag exists, build,
report). Each step that resolves more returns a new stack: the one loaded is only read.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import ssl
import sys
import tempfile
import urllib.parse
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from . import run as buildrun
from .base import bootstrap, native_twin, resolve_base, suite_of
from .plan import BuildBase, BuildPlan, PlanInputs, STOP, format_plan, make_plan, stage, tree_files
from .run import BuildOutcome
from ..specs.dists import canon, dist_key, norm_version
from .engine import Client, EngineError, find_client
from ..supply.index import ca_bundle, ssl_context
from ..supply.lock import lock_overrides
from .. import paths
from ..specs.platforms import EMULATE_HINT, emulation_problem, host_platform, tag_suffix
from ..runtime.errors import TrainboxError
from ..specs.findings import Reported
from ..specs.stack import Stack
from ..supply.pins import Pin
from ..supply.wheelhouse import check_wheelhouse, pins_for, read_wheelhouse

DEFAULT_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"


def _say(msg: str) -> None:
    print(f"trainbox: {msg}", file=sys.stderr, flush=True)


# -- inputs --------------------------------------------------------------------------------------------

def default_ca_bundle() -> str | None:
    """pip's own CA setting, else the system bundle (one rule for every HTTPS call trainbox makes)."""
    return ca_bundle()


def check_ca_bundle(path: str | os.PathLike) -> Path:
    """The bundle must hold at least one PEM certificate that OpenSSL accepts."""
    p = Path(path)
    if not p.is_file():
        raise TrainboxError(f"--ca-bundle {p}: no such file; give a PEM file of CA certificates "
                            f"(e.g. {DEFAULT_CA_BUNDLE})")
    try:
        with open(p, "rb") as fh:
            data = fh.read(16 << 20)  # the system's whole bundle is ~200 KiB; /dev/zero would never end
    except OSError as exc:  # /proc/self/mem, a file it may not read
        raise TrainboxError(f"--ca-bundle {p}: cannot be read ({exc.strerror or exc}); give a PEM file of CA "
                            "certificates") from None
    if b"-----BEGIN CERTIFICATE-----" not in data:
        raise TrainboxError(f"--ca-bundle {p}: holds no PEM certificate (no '-----BEGIN CERTIFICATE-----' "
                            "block); give a PEM file of CA certificates, not a key, DER file or directory")
    try:
        ssl_context(str(p))  # cached: the index probes and source downloads reuse it
    except ssl.SSLError as exc:
        raise TrainboxError(f"--ca-bundle {p}: OpenSSL cannot load it as CA certificates ({exc.reason or exc}); "
                            "check that every block is a complete PEM certificate") from None
    return p


def probe_indexes(indexes: dict[str, str], pool: ThreadPoolExecutor, timeout: float = 6.0,
                  cafile: str | None = None) -> dict[str, Future]:
    """Each HTTP(S) index asked at once, in `pool`: {name: future of (answers, why not)}. Started before the
    base is resolved, so the round trips overlap the engine calls instead of adding to them."""
    return {name: pool.submit(url_answers, url, timeout, cafile)
            for name, url in indexes.items() if url.startswith(("http://", "https://"))}


def check_indexes(pins: list[Pin], served: list[Pin], indexes: dict[str, str],
                  timeout: float = 6.0, cafile: str | None = None,
                  answers: dict[str, Future] | None = None) -> dict[str, str]:
    """A pin whose index does not answer and that the wheelhouse does not serve would fail deep
    inside pip after minutes of work: say so now. Returns {index name: why} for the indexes that do
    not answer (pip would spend minutes retrying each of them for every requirement). `answers`: the
    probes `probe_indexes` started (else they are made here)."""
    served_keys = {p.key for p in served}
    if answers is None:
        with ThreadPoolExecutor(max_workers=4) as pool:
            answers = probe_indexes(indexes, pool, timeout, cafile)
    down: dict[str, str] = {}
    for name, fut in answers.items():
        if name in indexes:
            ok, why = fut.result()
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


def url_answers(url: str, timeout: float, cafile: str | None = None) -> tuple[bool, str]:
    import urllib.error
    import urllib.request

    class _Answered(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None  # a redirect is an answer (pypi.org/simple -> /simple/): not followed, one round trip less

    # the CA the build will give pip: behind a TLS-intercepting proxy the system bundle alone would fail
    handlers = [_Answered()] + ([urllib.request.HTTPSHandler(context=ssl_context(cafile))]
                                if url.startswith("https:") else [])
    try:
        urllib.request.build_opener(*handlers).open(urllib.request.Request(url, method="HEAD"), timeout=timeout)
        return True, ""
    except urllib.error.HTTPError:
        return True, ""
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return False, str(getattr(exc, "reason", exc))


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
    json: bool = False  # dry run: print the plan as JSON
    report: str | None = None
    verbose: bool = False
    no_cache: bool = False
    cache_from: list[str] = field(default_factory=list)  # BuildKit cache sources, e.g. type=local,src=DIR
    cache_to: list[str] = field(default_factory=list)  # BuildKit cache exports (buildx only)
    labels: dict[str, str] = field(default_factory=dict)  # extra labels (tests mark their images)
    tag_latest: bool = True  # also tag trainbox/<stack>:latest (plain builds of the stack as it is)
    check_wheelhouse: bool = True  # tests turn this off to prove pip's own hash check in the build
    source_root: Path | None = None  # build another checkout's inputs (tests and the bench edit a copy)
    offline: bool = False  # git commits and archives only from trainbox's cache (`trainbox fetch` filled it)
    bundle: str | None = None  # `trainbox fetch --bundle` file: build from it alone, with the network off
    sources_cache: str | None = None  # where fetched sources live (default trainbox's cache; a bundle's own)
    pip_config: bool = True  # no --wheelhouse / --pip-index-url: take pip's own (find-links, index-url), as pip does


def choose_base(stack: Stack, client: Client | None, say: Callable[[str], None], dry_run: bool = False,
                platform: str | None = None) -> BuildBase:
    """The base as a plan records it. Without an engine (a dry run offline) the stack's base is taken as
    declared and the plan says what could not be checked; a dry run also plans on a base it cannot have."""
    # `--base IMAGE` is a substitute as render.manifest records it (base.substituted), so the plan, the
    # io.trainbox.base.substituted label (`image ls`, `run`) and the manifest (`doctor`) say one thing
    given = stack.base.image if stack.declared_base else None
    if client is None:
        sub = stack.base.substitute if stack.base.auto_substitute and not given else None
        note = "no engine answers, so it was not checked" + (
            f" (if it cannot be pulled the build uses the substitute {sub}, which changes the tag)" if sub else "")
        return BuildBase(requested=stack.declared_base or stack.base.image, used=stack.base.image, substituted=given,
                    note=note)
    try:
        used, substituted, boot, image_id = resolve_base(stack, client, say, platform)
    except TrainboxError as exc:
        if not dry_run:
            raise
        return BuildBase(requested=stack.declared_base or stack.base.image, used=stack.base.image, substituted=given,
                         note=str(exc), stops=True)
    return BuildBase(requested=stack.declared_base or stack.base.image, used=used, substituted=substituted or given,
                bootstrap=boot, image_id=None if boot else (image_id or client.image_id(used)),
                note="made by `trainbox base bootstrap` first" if boot else "")


def _client(dry_run: bool, say: Callable[[str], None]) -> Client | None:
    """The engine client; a dry run goes on without one (and without an engine)."""
    try:
        client = find_client()
        client.require_engine()
        return client
    except EngineError as exc:
        if not dry_run:
            raise
        say(f"dry run without an engine: {str(exc).split(';')[0]}")
        return None


def _check_inputs(opts: BuildOptions) -> tuple[Stack, PlanInputs]:
    """Everything that can be wrong with the input, checked in milliseconds before anything slow."""
    from ..specs.stack import load_stack

    stack = load_stack(opts.stack, sets=opts.sets or None, base=opts.base)
    # its checked wheelhouse and sources stand in for every index and git host; opened once (the inputs are
    # checked twice: fast, then in the plan)
    if opts.bundle and not opts.sources_cache:
        from .bundle import use_bundle

        ob = use_bundle(Path(opts.bundle), stack, print if opts.dry_run else _say)
        opts.wheelhouse, opts.sources_cache, opts.offline = str(ob.wheelhouse), str(ob.cache_dir), True
    plat = opts.platform or host_platform()
    if plat not in stack.platforms:
        raise TrainboxError(f"--platform {plat}: stack {stack.name} supports {', '.join(stack.platforms)} "
                            f"({stack.source_file}: platforms)")
    from_pip = _from_pip_config(opts) if opts.pip_config and not opts.bundle else False
    ca = check_ca_bundle(opts.ca_bundle) if opts.ca_bundle else None
    if ca is None:
        default = default_ca_bundle()
        ca = check_ca_bundle(default) if default else None
    wheels = read_wheelhouse(opts.wheelhouse) if opts.wheelhouse else []
    # pins --set moved have no hash yet: matched by version here. pip's own find-links directory may hold other
    # versions of a pinned project, as it may for pip: the build's pip takes only the pinned hashes from it
    if wheels and opts.check_wheelhouse and not from_pip:
        check_wheelhouse(wheels, pins_for(stack, plat), str(opts.wheelhouse))
    inp = PlanInputs(platform=plat, findings=_findings(stack, plat), wheels=wheels, wheelhouse=opts.wheelhouse,
                     wheelhouse_from_pip=from_pip,
                     ca_bundle=str(ca) if ca else None,
                     pip_index_url=bool(opts.pip_index_url), tags=list(opts.tags), labels=dict(opts.labels),
                     tag_latest=opts.tag_latest, no_cache=opts.no_cache, cache_from=list(opts.cache_from),
                     cache_to=list(opts.cache_to), source_root=opts.source_root, offline=bool(opts.bundle))
    return stack, inp


def _from_pip_config(opts: BuildOptions) -> bool:
    """Where pip itself would find wheels, for what the command line leaves open: its first find-links directory
    that holds wheels becomes the wheelhouse, its (remote) index-url the build's index; each said in one line.
    True when the wheelhouse is pip's."""
    from ..supply.pipconfig import pip_config

    cfg = pip_config()
    from_pip = False
    if not opts.wheelhouse and (found := cfg.wheelhouse()):
        opts.wheelhouse, from_pip = str(found[0]), True
        _say(f"wheelhouse {found[0]}: pip's find-links ({found[1]}); --wheelhouse DIR overrides")
    if not opts.pip_index_url and (index := cfg.index_url()):
        opts.pip_index_url = index.value
        shown = redact_url(index.value)
        _say(f"index {shown}: pip's index-url ({index.origin}), passed to the build as a secret; "
             "--pip-index-url URL overrides")
    return from_pip


def redact_url(url: str) -> str:
    """A URL without its password, for a line a user may paste."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def _findings(stack: Stack, plat: str) -> list[Reported]:
    """The findings pass, as `stack validate` runs it, for the platform built: an error refuses the build (and its
    dry run alike) before anything slow; the warnings become plan notes. The lock's state is never a refusal here:
    pins --set moved get their hashes and closure before the build (trainbox.supply.lock.lock_overrides), and without
    --set a stale lock only leaves the dependency closure to the build's resolver, as the plan's fetch list says."""
    from ..specs.findings import LOCK_RULES, Review, refuse_errors

    found = [r for r in Review(skip=LOCK_RULES if stack.overrides else ()).stack(stack)
             if not r.finding.platforms or plat in r.finding.platforms]
    refuse_errors(f"image build {stack.name} ({plat})", [r for r in found if r.finding.rule not in LOCK_RULES])
    # a stale lock is the lock's error (`stack validate` fails on it); for the build it is a note
    return [dataclasses.replace(r, finding=dataclasses.replace(r.finding, level="warning")) for r in found]


def _indexes_to_check(stack: Stack, opts: BuildOptions) -> dict[str, str]:
    return {k: v for k, v in stack.indexes.items() if not (opts.pip_index_url and k == "pypi")}


def _check_sources(stack: Stack, inp: PlanInputs, opts: BuildOptions, say: Callable[[str], None],
                   notes: list[str], answers: dict[str, Future]) -> Stack:
    """Pins against the wheelhouse and the indexes (`answers`: their probes, under way). Returns the stack
    without the indexes that do not answer and whose pins the wheelhouse serves (pip would wait on them). A dry
    run records problems instead of failing."""
    pins = pins_for(stack, inp.platform)
    if inp.wheels and opts.check_wheelhouse and not inp.wheelhouse_from_pip:
        served = check_wheelhouse(inp.wheels, pins, str(opts.wheelhouse))
    else:  # by name and version only: the hashes are left to pip inside the build
        names = {dist_key(w.name) for w in inp.wheels}
        served = [p for p in pins if (canon(p.name), norm_version(p.version or "")) in names]
    try:
        down = check_indexes(pins, served, _indexes_to_check(stack, opts), cafile=inp.ca_bundle, answers=answers)
    except TrainboxError as exc:
        if not opts.dry_run:
            raise
        notes.append(f"{STOP}{exc}")
        return stack
    dropped = [name for name in sorted(down) if name != "pypi"]
    for name in dropped:
        say(f"index {name} ({stack.indexes[name]}) does not answer; its pins come from the wheelhouse")
    return stack.without_indexes(dropped) if dropped else stack


def _staged_sources(stack: Stack, opts: BuildOptions,
                    say: Callable[[str], None]) -> tuple[dict[str, Path], Stack]:
    """The stack's git trees and archives, fetched (or found in the cache) and verified, their patch series
    checked, staged for the context as build/sources/<component>/... (bind-mounted by the builder). Returns
    the staged files and the stack with the fetched commits' tree hashes recorded."""
    import atexit

    from ..supply.fetch import fetch_sources, stage as stage_sources

    sources = fetch_sources(stack, offline=opts.offline, say=say,
                            cache_dir=Path(opts.sources_cache) if opts.sources_cache else None)
    if not sources.fetched:
        return {}, stack
    root = Path(tempfile.mkdtemp(prefix=f"trainbox-sources-{stack.name}-"))
    atexit.register(shutil.rmtree, root, True)
    stage_sources(root, sources)
    return tree_files(root, ["build"]), sources.stack


def _check_cache_to(opts: BuildOptions, client: Client | None) -> None:
    if opts.cache_to and (client is None or client.mode != "buildx"):
        raise TrainboxError("--cache-to needs docker buildx with a builder that exports caches (`docker buildx "
                            "create --use --driver docker-container`); this client is "
                            + (client.describe() if client else "not known (no engine)"))


def plan(opts: BuildOptions, client: Client | None, say: Callable[[str], None] = _say,
         make_base: bool = False, checked: tuple[Stack, PlanInputs] | None = None) -> BuildPlan:
    """The build plan for `opts`: input checks, base, pins moved by --set, indexes, then make_plan.
    `client` None: no engine (dry runs). `make_base`: bootstrap a base that must be made (real builds),
    after the quicker checks and before the hash, which covers the base's image id. `checked`: what
    _check_inputs(opts) already returned (not loaded twice)."""
    stack, inp = checked or _check_inputs(opts)
    _check_cache_to(opts, client)
    pool = ThreadPoolExecutor(max_workers=4)
    try:  # a failure below does not wait for the probes
        answers = probe_indexes(_indexes_to_check(stack, opts), pool, cafile=inp.ca_bundle)
        base = choose_base(stack, client, say, dry_run=opts.dry_run, platform=inp.platform)
        notes: list[str] = [f"{STOP}{base.note}"] if base.stops else []
        if stack.overrides:
            stack = lock_overrides(stack, inp.platform, inp.wheels, opts.wheelhouse, say,
                                   notes if opts.dry_run else None)
        stack = _check_sources(stack, inp, opts, say, notes, answers)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    if make_base and base.bootstrap:
        bootstrap(tag=base.used, suite=suite_of(base.used), client=client, say=say, platform=inp.platform)
        base.image_id = client.image_id(base.used)
    inp.native_base = native_twin(base.used, inp.platform, client)
    if inp.platform != host_platform() and not inp.native_base:
        notes.append(f"the venv's bytecode is compiled under emulation: a native compile needs trainbox's own base "
                     f"for {host_platform()} beside {base.used} (`trainbox base bootstrap` on a bootstrapped base)")
    inp.sources, stack = _staged_sources(stack, opts, say)
    p = make_plan(stack, base, inp, client)
    p.notes[:0] = notes
    return p


def build(opts: BuildOptions, say: Callable[[str], None] = _say) -> BuildOutcome:
    """Plan the build, then print the plan (--dry-run) or run it through the engine client."""
    checked = _check_inputs(opts)  # bad input fails in milliseconds, before the engine is even looked for
    problem = None if opts.dry_run else emulation_problem(checked[1].platform)
    if problem:  # another architecture's RUN steps need qemu; without it the build would fail at its first RUN
        raise TrainboxError(f"--platform {checked[1].platform} on this {host_platform()} host: {problem}; "
                            f"{EMULATE_HINT}")
    client = _client(opts.dry_run, say)
    p = plan(opts, client, say, make_base=not opts.dry_run, checked=checked)
    if opts.dry_run:
        return _dry_run(p, opts, say)
    # one report per stack and platform: an arm64 build does not overwrite the amd64 one that `image push` reads
    report_path = (Path(opts.report) if opts.report
                   else paths.REPORTS_DIR / f"{p.stack.name}{tag_suffix(p.platform)}.json")
    return buildrun.run(p, client, report_path, force=opts.force, verbose=opts.verbose,
                        pip_index_url=opts.pip_index_url, say=say)


def _dry_run(p: BuildPlan, opts: BuildOptions, say: Callable[[str], None]) -> BuildOutcome:
    """Stage the plan's context where the printed command expects it, and print the plan."""
    with stage(p, pip_index_url=opts.pip_index_url, wait=False):
        pass
    if opts.json:
        print(json.dumps(p.as_dict(), indent=2))
    else:
        print(format_plan(p))
    if p.stops:  # a plan the build could not carry out is a failed check, as `render --check` with drift is
        say(f"dry run: the build of {p.tag} would stop ({len(p.stops)} reason(s) in the notes above); nothing was "
            f"built; exit 1")
    else:
        say(f"dry run: would build {p.tag} (nothing was built; the context is staged at {p.context})")
    return BuildOutcome(p.tag, p.tags, False, {**p.as_dict(), "dry_run": True}, None, p.argv())
