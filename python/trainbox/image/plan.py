"""A build as a plan: everything `trainbox image build` will do, decided before anything runs (host module).

`make_plan` is pure: from a loaded stack, the chosen base and the build options it computes the build
context's files, their content hash, the tags, labels, the BuildKit arguments, the secrets, and where each
pinned artifact will come from. It reads files and asks nothing of an engine or an index, so `--dry-run`
prints it offline. `stage` writes the context a plan names; trainbox.image.run executes it.
"""

from __future__ import annotations

import contextlib
import fcntl
import fnmatch
import hashlib
import json
import os
import shlex
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from ..paths import GENERATED_DIR, REPO_ROOT, cache_dir
from ..specs.findings import Reported
from ..specs.platforms import tag_suffix
from ..specs.stack import Stack
from .engine import Client
from .render import RenderedStack, render_stack
from .sbom import source_date_epoch
from ..supply.wheelhouse import WheelFile, fetch_plan, wheelhouse_notes

SCHEMA = "trainbox.image-plan/1"
#: Top-level parts of the checkout that go into every build context (the rendered files come on top). Only what
#: the Dockerfiles may use (.dockerignore lets nothing else through): the content hash covers exactly these, so an
#: edit to the README does not make a new image tag.
CONTEXT_ITEMS = ["pyproject.toml", "python", "patches", "launchers"]
#: How a plan note starts when the real build would fail there (a dry run with one exits 1)
STOP = "the build would stop here: "
#: Where the wheelhouse lies inside the build context (the Dockerfile bind-mounts it for pip).
WHEELHOUSE_DIR = "wheelhouse"
#: The label that names the platform an image was built for (`image ls` reads the image config's Architecture).
PLATFORM_LABEL = "io.trainbox.platform"
_IGNORED = ("__pycache__", "*.pyc", "*.pyo", "*.egg-info", ".pytest_cache", ".mypy_cache")


@dataclass
class BuildBase:
    """The image a build starts FROM, and how it was chosen."""

    requested: str  # the stack's own base
    used: str  # what the Dockerfile's FROM names
    substituted: str | None = None  # set when `used` replaces the stack's base
    bootstrap: bool = False  # `trainbox base bootstrap` makes `used` first
    image_id: str | None = None  # the engine's id for `used`; None when no engine was asked
    note: str = ""  # why, when the choice could not be checked
    stops: bool = False  # the build could not have this base (a dry run plans on, and says so)


@dataclass
class BuildPlan:
    stack: Stack  # narrowed to the build
    platform: str
    base: BuildBase
    files: dict[str, Path | bytes]  # the context, relative path -> source file or rendered bytes
    dockerfile_rel: str
    dockerfile: str
    wheels: list[WheelFile]
    content_hash: str
    tags: list[str]
    labels: dict[str, str]
    args: list[str]  # BuildKit arguments without the executable, the secrets and the context
    secrets: dict[str, str]  # secret id -> file
    build_argv_prefix: list[str]  # e.g. [docker, build]
    build_env: dict[str, str]  # variables the command needs set (DOCKER_BUILDKIT=1)
    client: str  # the client that will run it, in words
    fetch: list[dict] = field(default_factory=list)  # where each pinned artifact comes from
    notes: list[str] = field(default_factory=list)  # what the plan could not decide offline
    findings: list[Reported] = field(default_factory=list)  # the stack's warnings
    context: Path | None = None  # where `stage` put the context

    @property
    def tag(self) -> str:
        return self.tags[0]

    @property
    def stops(self) -> list[str]:
        """The notes that say where the real build would fail (a dry run with any exits 1)."""
        return [n for n in self.notes if n.startswith(STOP)]

    def build_args(self) -> list[str]:
        """The arguments after `build --progress plain`, secrets included, without the context."""
        return [*self.args, *(a for sid, src in self.secrets.items() for a in ("--secret", f"id={sid},src={src}"))]

    def argv(self) -> list[str]:
        return [*self.build_argv_prefix, "--progress", "plain", *self.build_args(), str(self.context or ".")]

    def command(self) -> str:
        env = "".join(f"{k}={shlex.quote(v)} " for k, v in self.build_env.items())
        return env + " ".join(shlex.quote(a) for a in self.argv())

    def as_dict(self) -> dict:
        s = self.stack
        return {
            "schema": SCHEMA, "stack": s.name, "device": s.device, "platform": self.platform,
            "base": self.base.__dict__, "content_hash": self.content_hash, "tag": self.tag, "tags": self.tags,
            "labels": self.labels, "overrides": dict(s.overrides or {}), "dockerfile": self.dockerfile_rel,
            "context": str(self.context) if self.context else None, "inputs": len(self.files),
            "wheelhouse": [w.name for w in self.wheels], "secrets": sorted(self.secrets),
            "fetch": self.fetch, "client": self.client, "argv": self.argv(), "command": self.command(),
            "notes": self.notes, "findings": [r.as_dict() for r in self.findings],
            "would_stop": bool(self.stops),
        }


# -- the context's files -----------------------------------------------------------------------------

def _ignored(name: str) -> bool:
    return any(fnmatch.fnmatch(name, pat) for pat in _IGNORED)


def tree_files(root: Path, items: list[str] | None = None) -> dict[str, Path]:
    """Every file (and symlink) under `root`, or under its `items`, by relative path; caches left out."""
    out: dict[str, Path] = {}
    tops = [root / i for i in items] if items is not None else [root]
    for top in tops:
        if top.is_symlink() or top.is_file():
            out[top.relative_to(root).as_posix()] = top
            continue
        for dirpath, dirnames, filenames in os.walk(top):
            d = Path(dirpath)
            dirnames[:] = [n for n in dirnames if not _ignored(n)]
            links = [n for n in dirnames if (d / n).is_symlink()]  # kept as links, as copytree(symlinks=True)
            for n in filenames + links:
                if not _ignored(n):
                    out[(d / n).relative_to(root).as_posix()] = d / n
    return out


def input_files(root: Path | None = None) -> dict[str, Path]:
    """The checkout's build inputs (CONTEXT_ITEMS)."""
    return tree_files(Path(root or REPO_ROOT), [i for i in CONTEXT_ITEMS if (Path(root or REPO_ROOT) / i).exists()])


def content_hash(files: dict[str, Path | bytes], wheels: list[WheelFile], extra: dict[str, str]) -> str:
    """sha256 over every context file (path, exec bit, bytes), the wheelhouse listing (name, size, sha256: the
    wheels themselves are not re-read) and `extra` (base image, platform, labels)."""
    h = hashlib.sha256()
    h.update(b"trainbox-context-v2\0")
    for rel in sorted(files):
        src = files[rel]
        h.update(rel.encode() + b"\0")
        if isinstance(src, Path) and src.is_symlink():
            h.update(b"L" + os.readlink(src).encode() + b"\0")
            continue
        execbit = isinstance(src, Path) and os.access(src, os.X_OK)
        h.update(b"X" if execbit else b"F")
        h.update(src.read_bytes() if isinstance(src, Path) else src)
        h.update(b"\0")
    for w in sorted(wheels, key=lambda w: w.name):
        h.update(f"wheel {w.name} {w.size} {w.sha256}\0".encode())
    for k in sorted(extra):
        h.update(f"{k}={extra[k]}\0".encode())
    return h.hexdigest()


# -- planning -----------------------------------------------------------------------------------------

@dataclass
class PlanInputs:
    """What make_plan needs beyond the stack: the options image.build checked."""

    platform: str
    wheels: list[WheelFile] = field(default_factory=list)
    wheelhouse: str | None = None
    wheelhouse_from_pip: bool = False  # pip's own find-links: what it lacks is not a note (the indexes serve it)
    ca_bundle: str | None = None
    pip_index_url: bool = False  # the secret file is written by stage()
    tags: list[str] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)
    tag_latest: bool = True
    no_cache: bool = False
    cache_from: list[str] = field(default_factory=list)
    cache_to: list[str] = field(default_factory=list)
    source_root: Path | None = None  # the checkout whose inputs are built (tests and bench use a copy)
    sources: dict[str, Path] = field(default_factory=dict)  # staged git trees and archives (build/sources/...)
    offline: bool = False  # `--bundle`: the build runs with --network none and pip uses the wheelhouse only
    findings: list[Reported] = field(default_factory=list)  # the stack's warnings: plan notes
    native_base: str | None = None  # a cross build: the base's twin for the build machine (compiles the venv)


def render_for(stack: Stack, base: BuildBase, native_base: str | None = None,
               platform: str | None = None) -> RenderedStack:
    """The rendered Dockerfile, manifest and requirements for `stack` built FROM base.used (for `platform`, on
    `native_base` where that is a cross build). A substitute base is recorded by render.manifest as
    base.substituted, the stack's own base staying base.image."""
    if not base.substituted or stack.declared_base:
        return render_stack(stack, native_base=native_base, platform=platform)
    sub = stack.model_copy(update={"base": stack.base.model_copy(update={"image": base.used})})
    return render_stack(sub.resolved(declared_base=stack.base.image), native_base=native_base, platform=platform)


def _args(inp: PlanInputs, dockerfile: Path, tags: list[str], labels: dict[str, str], mode: str) -> list[str]:
    args = ["-f", str(dockerfile), "--network", "none" if inp.offline else "host", "--platform", inp.platform]
    args += ["--build-arg", "TRAINBOX_OFFLINE=1"] if inp.offline else []
    if os.environ.get("SOURCE_DATE_EPOCH"):  # the mtime of what trainbox writes (the templates' default: 0)
        args += ["--build-arg", f"SOURCE_DATE_EPOCH={source_date_epoch()}"]
    for t in tags:
        args += ["-t", t]
    for k, v in labels.items():
        args += ["--label", f"{k}={v}"]
    for spec in inp.cache_from:
        args += ["--cache-from", spec]
    for spec in inp.cache_to:
        args += ["--cache-to", spec]
    if mode == "buildx" and (inp.cache_to or inp.cache_from):
        # a docker-container builder grants --network host only when asked
        args += ["--allow", "network.host"]
    if inp.no_cache:
        args.append("--no-cache")
    return args


def manifest_for(manifest: dict, platform: str) -> dict:
    """The image's /etc/trainbox/stack.json: the rendered manifest (for every platform of the stack) narrowed to the
    one the image is built for: it names the platform, and each component's version is the one installed there
    (`platform_versions`: e.g. torch 2.10.0 on linux/arm64), which `trainbox doctor` compares with."""
    comps = {}
    for key, comp in (manifest.get("components") or {}).items():
        variant = (comp.get("platform_versions") or {}).get(platform)
        comps[key] = {**comp, "version": variant} if variant else comp
    return {**manifest, "components": comps, "platform": platform}


def make_plan(stack: Stack, base: BuildBase, inp: PlanInputs, client: Client | None = None) -> BuildPlan:
    """The plan for building `stack` on `base` (pure: reads the checkout, asks no engine and no index).
    `client`: the engine client that will run it (None: a BuildKit-capable `docker build` is assumed)."""
    rendered = render_for(stack, base, inp.native_base, inp.platform)
    dockerfile_rel = f"{GENERATED_DIR}/{stack.name}/Dockerfile"
    files: dict[str, Path | bytes] = dict(input_files(inp.source_root))
    files.update(rendered.context_files)
    files[f"{rendered.generated_dir}/stack.json"] = (json.dumps(
        manifest_for(rendered.manifest, inp.platform), indent=2, sort_keys=True) + "\n").encode()
    files[dockerfile_rel] = rendered.dockerfile.encode()
    files.update(inp.sources)
    extra = {"base": base.image_id or base.used, "platform": inp.platform,
             **{f"label {k}": v for k, v in inp.labels.items()},
             # another mtime makes other layers (only when set: the default keeps every tag as it was)
             **({"source_date_epoch": str(source_date_epoch())} if os.environ.get("SOURCE_DATE_EPOCH") else {})}
    # the wheelhouse counts only where it can change what is installed: with every requirement hash-locked,
    # online and `--bundle` builds install the same bytes and get the same tag
    digest = content_hash(files, [] if rendered.manifest.get("deps_locked") else inp.wheels, extra)
    repo, suffix = f"trainbox/{stack.name}", tag_suffix(inp.platform)  # "" for linux/amd64, "-arm64" ...
    tags = [f"{repo}:{digest[:12]}{suffix}"]
    if inp.tag_latest and not stack.overrides:
        tags.append(f"{repo}:latest{suffix}")
    tags += [t for t in inp.tags if t not in tags]
    # build-time facts only the builder knows; the template's LABELs describe the stack itself
    # the substitute label is the manifest's base.substituted (the doctor's): one fact, read by image ls and run
    substituted = rendered.manifest["base"].get("substituted")
    labels = {"io.trainbox.content-hash": digest, "io.trainbox.base.used": base.used, PLATFORM_LABEL: inp.platform,
              **({"io.trainbox.base.substituted": substituted} if substituted else {}),
              # `image ls` flags images built with --set/--base: not what the stack file alone would give
              **({"io.trainbox.overrides": json.dumps(stack.overrides, sort_keys=True)} if stack.overrides else {}),
              **inp.labels}
    mode = client.mode if client else "buildkit"
    context = plan_dir(stack.name + suffix) / "context"  # an arm64 build does not wait on the amd64 one
    secrets = {"pip_cert": str(inp.ca_bundle)} if inp.ca_bundle else {}
    if inp.pip_index_url:
        secrets["pip_index_url"] = str(context.parent / "secrets" / "pip_index_url")
    notes = [f"finding: {r.line()}" for r in inp.findings] + (
        [] if inp.wheelhouse_from_pip else wheelhouse_notes(stack, inp.platform, inp.wheels, inp.wheelhouse))
    if not base.image_id and not base.stops:
        notes.append(f"base {base.used}: {base.note or 'not asked of an engine'}; the tag hashes its name, the "
                     "real build hashes its image id (so its tag may differ)")
    return BuildPlan(
        stack=stack, platform=inp.platform, base=base, files=files, dockerfile_rel=dockerfile_rel,
        dockerfile=rendered.dockerfile, wheels=inp.wheels, content_hash=digest, tags=tags, labels=labels,
        args=_args(inp, context / dockerfile_rel, tags, labels, mode), secrets=secrets,
        build_argv_prefix=client.build_argv if client else ["docker", "build"],
        build_env={"DOCKER_BUILDKIT": "1"} if mode == "buildkit" else {},
        client=client.describe() if client else "DOCKER_BUILDKIT=1 docker build (no client checked)",
        fetch=fetch_plan(stack, inp.platform, inp.wheels, inp.wheelhouse) + source_plan(rendered.manifest),
        notes=notes, context=context,
        findings=list(inp.findings))


def source_plan(manifest: dict) -> list[dict]:
    """Where the rest comes from, as the image's manifest records it: each git component's URL and commit (and
    tree, once fetched), each archive's URL and sha256, and each patch series with the sha256 of every patch."""
    out = []
    for key, c in sorted(manifest["components"].items()):
        if c.get("source") == "git":
            tree = f", tree {c['tree']}" if c.get("tree") else ""
            out.append({"key": key, "requirement": f"{c['name']} @ {c['commit'][:12]}",
                        "from": f"git {c['git']} commit {c['commit']}{tree} ({c['install']})", "sha256": []})
        elif c.get("source") == "url":
            out.append({"key": key, "requirement": c["name"], "from": f"url {c['url']}", "sha256": c["sha256"]})
    for key, patches in sorted(manifest.get("patches", {}).items()):
        series = manifest["components"][key].get("patches", key)
        out.append({"key": f"patches:{key}", "requirement": f"patches/{series} ({len(patches)} patches)",
                    "from": "this checkout: " + ", ".join(f"{p['file']} sha256 {p['sha256'][:12]}" for p in patches),
                    "sha256": [p["sha256"] for p in patches], "patches": patches})
    return out


def plan_dir(stack_name: str) -> Path:
    """Where a stack's builds stage their context (a stable path: BuildKit then re-sends only what changed),
    the lock that keeps two builds of the stack apart, and the index-URL secret."""
    return cache_dir() / "build" / stack_name


# -- staging --------------------------------------------------------------------------------------------

def _place(src: Path | bytes, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(src, bytes):
        dst.write_bytes(src)
    elif src.is_symlink():
        os.symlink(os.readlink(src), dst)
    else:
        shutil.copy2(src, dst)


def _link_or_copy(src: Path, dst: Path) -> None:
    src = src.resolve()  # a wheelhouse entry may link to the wheel: Linux's link(2) would link the link itself
    try:
        os.link(src, dst)  # same file system: instant, and BuildKit sees the same mtime every time
    except OSError:
        shutil.copy2(src, dst)


def populate(ctx: Path, files: dict[str, Path | bytes], wheels: list[WheelFile]) -> None:
    """Make `ctx` hold exactly `files` and the wheels (hard-linked) under WHEELHOUSE_DIR."""
    if ctx.exists():
        shutil.rmtree(ctx)
    ctx.mkdir(parents=True)
    for rel, src in files.items():
        _place(src, ctx / rel)
    wh = ctx / WHEELHOUSE_DIR
    wh.mkdir(exist_ok=True)
    for w in wheels:
        _link_or_copy(w.path, wh / w.name)


def copy_inputs(dst: Path, root: Path | None = None) -> None:
    """The checkout's build inputs (CONTEXT_ITEMS, caches left out) copied under `dst`."""
    for rel, src in input_files(root).items():
        _place(src, dst / rel)


def _write_secret(path: Path, value: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(value)


@contextlib.contextmanager
def stage(plan: BuildPlan, pip_index_url: str | None = None, wait: bool = True) -> Iterator[Path]:
    """Write the plan's context (and its index-URL secret, mode 0600, outside the context), locked against a
    concurrent build of the same stack. `wait=False` (dry runs): never wait on a running build; fail instead."""
    from ..runtime.errors import TrainboxError

    ctx = plan.context
    assert ctx is not None
    ctx.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with open(ctx.parent / "lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if not wait:
                raise TrainboxError(f"a build of stack {plan.stack.name} is using {ctx} now; run the dry run "
                                    "again when it is done") from None
            print(f"trainbox: another build of stack {plan.stack.name} is running; waiting for it",
                  file=sys.stderr, flush=True)
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            populate(ctx, plan.files, plan.wheels)
            if "pip_index_url" in plan.secrets and pip_index_url:
                _write_secret(Path(plan.secrets["pip_index_url"]), pip_index_url)
        except BaseException as exc:  # a full disk, Ctrl-C: no half-staged context (or secret) is left for a build
            shutil.rmtree(ctx, ignore_errors=True)
            Path(plan.secrets.get("pip_index_url", ctx.parent / "secrets" / "none")).unlink(missing_ok=True)
            if isinstance(exc, OSError):
                from ..runtime.errors import describe_os_error

                # copy2 names the source file; what failed is the write into the context
                where = OSError(exc.errno, exc.strerror, str(ctx))
                raise TrainboxError(f"cannot stage the build context: {describe_os_error(where)}") from None
            raise
        if not wait:  # a dry run leaves the context and the secret for the printed command
            yield ctx
            return
        try:
            yield ctx
        finally:
            Path(plan.secrets.get("pip_index_url", ctx.parent / "secrets" / "none")).unlink(missing_ok=True)


def format_plan(plan: BuildPlan) -> str:
    """The plan for people: what would be built, from what, and the command that builds it."""
    b = plan.base
    lines = [f"plan: build {plan.tag} (stack {plan.stack.name}, {plan.platform})",
             f"  base:     {b.used}" + (f" (substitute for {b.requested})" if b.substituted else "")
             + (" [bootstrapped first: `trainbox base bootstrap --tag " + b.used + "`]" if b.bootstrap else ""),
             f"  hash:     {plan.content_hash} over {len(plan.files)} inputs"
             + (f" + {len(plan.wheels)} wheels" if plan.wheels else ""),
             f"  tags:     {', '.join(plan.tags)}",
             f"  context:  {plan.context}",
             f"  secrets:  {', '.join(f'{k} ({v})' for k, v in plan.secrets.items()) or 'none'}",
             "  fetch:"]
    for f in plan.fetch:
        lines.append(f"    {f['requirement']:<40} {f['from']}")
    lines += [f"  note:     {n}" for n in plan.notes]
    lines += ["  command (run from anywhere):", "    " + plan.command()]
    return "\n".join(lines)
