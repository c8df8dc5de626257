"""Stack -> Dockerfile text, hash-pinned requirements and the image manifest (host module).

Jinja2 with StrictUndefined: a template that names something the stack does not have is an error, not an
empty string. The same input always gives the same bytes (sorted keys, no timestamps). The default stacks are
rendered to the top-level Dockerfile.npu / Dockerfile.cuda (and every stack's build/generated/<stack>/ files),
committed, and drift-checked with `trainbox render --check`.
"""

from __future__ import annotations

import functools
import json
import os
import shlex
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import jinja2

from .. import __version__
from . import toolkits
from .base import APT_PYTHON_PACKAGES, RUNTIME_PACKAGES
from ..specs.grammar import check_env_name, check_image, check_requirement_line, controls
from ..runtime.errors import TrainboxError
from ..runtime.installed import canon
from ..paths import GENERATED_DIR, PATCHES_DIR, REPO_ROOT, TEMPLATES_DIR
from ..templating import make_env
from ..specs.platforms import PLATFORM_MACHINE, platform_marker, requirements_for
from ..specs.component import BaseSpec
from ..specs.stack import Stack, list_stacks, load_stack

# Stacks whose Dockerfile is rendered to the repo root (the rest live under build/generated/ only).
DEFAULT_DOCKERFILES = {"npu-910b": "Dockerfile.npu", "cuda": "Dockerfile.cuda"}


@dataclass
class RenderedStack:
    stack: Stack
    dockerfile: str
    manifest: dict
    requirements: str
    deps: str
    # repo-relative path -> bytes, placed in the build context (and committed for the default stacks)
    context_files: dict[str, bytes] = field(default_factory=dict)

    @property
    def generated_dir(self) -> str:
        return f"{GENERATED_DIR}/{self.stack.name}"


#: The pin installed in a layer of its own, before the others (partials/install.j2): the largest wheel (torch is
#: about 750 MB installed), and the one that most stacks on one base pin alike.
LAYER_OF_ITS_OWN = "torch"


def _require_lines(stack: Stack) -> tuple[list[str], list[str]]:
    """Each installed component's hash-checked requirement lines, as its kind writes them, and among them those of
    LAYER_OF_ITS_OWN (one per platform marker; none when the stack does not install it from an index, and then the
    build has no such layer)."""
    lines, own = [], []
    for key, c in sorted(stack.installed_components.items()):
        mine = _checked(c.kind.requirement_lines(c, stack), stack, f"components.{key}", url=c.source == "url")
        lines += mine
        if canon(c.dist_name) == LAYER_OF_ITS_OWN:
            own += mine
    return lines, own


def _checked(lines: list[str], stack: Stack, what: str, url: bool = False) -> list[str]:
    """`lines`, each checked against the one requirement-line grammar (TrainboxError naming the stack's lock)."""
    try:
        return [check_requirement_line(line, f"{stack.lock_path or stack.source_file}: {what}", url)
                for line in lines]
    except ValueError as exc:
        raise TrainboxError(f"{exc}; regenerate the lock with `trainbox stack lock {stack.name}`") from None


def _dep_lines(stack: Stack) -> list[str]:
    """The locked dependency closure, or [] when some platform has none (then the build resolves deps)."""
    return _checked(_locked_lines(stack, {p: stack.locked_deps(p) for p in stack.platforms}), stack, "deps")


def _build_req_lines(stack: Stack) -> list[str]:
    """The hash-pinned PEP 518 build requirements of the wheels built in the image (git trees, `install: build`
    sdists that name `build_requires`), or [] when not locked."""
    return _checked(_locked_lines(stack, {p: stack.locked_build_deps(p) for p in stack.platforms}), stack,
                    "build_deps")


def _locked_lines(stack: Stack, per_plat: dict[str, dict[str, dict]]) -> list[str]:
    """`name==version[; marker] --hash=...` lines for a lock section, or [] when some platform has none."""
    if not all(per_plat.values()):
        return []
    groups: dict[tuple, list[str]] = {}
    for plat, deps in per_plat.items():
        for name, d in deps.items():
            groups.setdefault((name, d["version"], tuple(sorted(d.get("sha256") or []))), []).append(plat)
    lines = []
    for (name, version, shas), plats in sorted(groups.items()):
        if not shas:
            continue
        marker = platform_marker(plats, stack.platforms)
        lines.append(f"{name}=={version}{marker} " + " ".join(f"--hash=sha256:{h}" for h in shas))
    return lines


def _patch_list(stack: Stack) -> dict[str, list[dict]]:
    """{component: [{file, sha256}]} read through the same series parser the image build's applier uses."""
    from ..supply.patches import applied_patches

    out: dict[str, list[dict]] = {}
    for key, c in sorted(stack.installed_components.items()):
        if not c.patches:
            continue
        try:
            out[key] = applied_patches(c.patches, PATCHES_DIR)
        except TrainboxError as exc:
            raise TrainboxError(f"{stack.source_file}: components.{key}.patches: {exc}") from None
    return out


def manifest(stack: Stack, patches: dict[str, list[dict]]) -> dict:
    comps = {}
    for key, c in sorted(stack.installed_components.items()):
        entry = c.kind.manifest_entry(c, stack)
        if c.patches:
            entry["patches"] = c.patches
        comps[key] = entry
    return {
        "schema": 1,
        "trainbox_version": __version__,
        "stack": stack.name,
        "description": stack.description,
        "device": stack.device,
        "python": stack.python,
        "platforms": stack.platforms,
        # image: the stack's own base; substituted: what the image was really built on, when not that
        "base": {"image": stack.declared_base or stack.base.image, "cann": stack.base.cann,
                 "chip": stack.base.chip, "substituted": stack.base.image if stack.declared_base else None},
        "components": comps,
        "left_out": stack.left_out,  # {component: why}: compiled components a substitute base cannot build
        "env": dict(sorted(stack.env.items())),
        "patches": patches,
        "deps_locked": bool(_dep_lines(stack)),
        "overrides": dict(sorted(stack.overrides.items())),
    }


#: A source component's locked build requirements are installed in a stage of their own (build-env-<component>, the
#: one step of its build given the index credentials) at BUILD_ENV_OUT; the step that builds bind-mounts them at
#: BUILD_ENV_MOUNT. Nothing of them reaches the venv's stages, so the final image can continue the builder.
BUILD_ENV_OUT = "/out/build-env"
BUILD_ENV_MOUNT = "/tmp/trainbox/build-env"
#: A wheel built from a tree in isolation (`install: pip` with locked build requirements) is built in its own stage
#: (wheel-<component>, beside the venv's pins: on another core, off the build's critical path) into WHEEL_OUT; the
#: builder installs it from WHEEL_MOUNT.
WHEEL_OUT = "/out/wheel"
WHEEL_MOUNT = "/tmp/trainbox/wheel"


@dataclass(frozen=True)
class Sourced:
    """How the template builds each source component the build context stages; each value a list of
    install_source.py arguments, which the template quotes word by word.

    `steps`: {component: the builder's step}. `build_envs`: {component: its build-env stage's step}, for a component
    whose build gets the lock's build requirements. `wheels`: {component: its wheel stage's step}, for a wheel built
    in isolation (then the builder's step only installs that wheel).

    A build step runs the tree's own code (setup.py, a PEP 517 backend, `build:` commands) and is given no index
    credentials; the build-env step is a pip install from the index, hash-pinned, and the only one that is."""
    steps: dict[str, list[str]]
    build_envs: dict[str, list[str]]
    wheels: dict[str, list[str]]


def _sourced(stack: Stack) -> Sourced:
    steps, envs, wheels = {}, {}, {}
    build_reqs = _build_req_lines(stack)
    for key, c in sorted(stack.installed_components.items()):
        args = c.kind.install_args(c)
        if not args:
            continue
        if c.kind.needs_build_env(c) and build_reqs:
            # the wheel's build environment: exactly the locked build requirements, --require-hashes (without a
            # lock pip would fill an isolated one with whatever version the wheelhouse or index offers)
            envs[key] = ["--mode", "build-env", "--build-env", BUILD_ENV_OUT,
                         *(a for line in build_reqs for a in ("--build-req", line))]
            if c.kind.builds_apart(c):  # built in isolation: it needs nothing of the venv, so not on its path
                wheels[key] = [*args, "--build-env", BUILD_ENV_OUT, "--wheel-out", WHEEL_OUT]
                args = [*_without(args, "--patches", "--subdir"), "--wheel-in", WHEEL_MOUNT]
            else:  # built against the venv (its torch ...): in the builder, its build requirements mounted
                args = [*args, "--build-env", BUILD_ENV_MOUNT]
        steps[key] = list(args)
    return Sourced(steps, envs, wheels)


def _without(args: list[str], *flags: str) -> list[str]:
    """`args` less each of `flags` and its value (what only the wheel's build reads, not its install)."""
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a in flags:
            skip = True
        else:
            out.append(a)
    return out


class _Lines(str):
    """Text a filter joined from checked one-line items with the template's own line continuations: the only
    value `_finalize` lets carry a newline."""


def _joined(items, sep: str) -> _Lines:
    return _Lines(sep.join(_one_line(i) for i in items))


def _finalize(value):
    """Every `{{ ... }}` in a build template goes through here: whatever field it prints, a newline (a new
    Dockerfile instruction) or another control character is refused, even where a filter was forgotten."""
    if isinstance(value, _Lines) or value is None:
        return value
    return _one_line(value)


def _env() -> jinja2.Environment:
    return _env_for(str(TEMPLATES_DIR))  # read at each call: tests point TEMPLATES_DIR elsewhere


@functools.lru_cache(maxsize=4)
def _env_for(templates_dir: str) -> jinja2.Environment:
    # One environment per directory, so that each template is compiled once per process, not once per stack
    # (jinja2's auto_reload still picks up an edited file). Quoting by context, the second line of defence
    # behind the stack schema (trainbox.specs.grammar)
    return make_env(templates_dir, {
        "tojson_compact": lambda v: json.dumps(v, sort_keys=True),
        "sh": lambda v: shlex.quote(_one_line(v)),  # a word in a RUN shell command
        "dq": dockerfile_string,  # a double-quoted ENV / LABEL / ARG value
        "line": _one_line,  # text in a comment or an instruction argument
        "image": _image_ref,  # FROM / ARG BASE_IMAGE
        "lines": _joined,  # checked one-line items joined with a line continuation
    }, finalize=_finalize)


def _one_line(value) -> str:
    text = str(value)
    bad = controls(text)
    if bad:
        raise TrainboxError(f"refusing to render {text[:60]!r} into a Dockerfile: it holds control characters "
                            f"({', '.join(bad)})")
    return text


def dockerfile_string(value) -> str:
    """A Dockerfile double-quoted word: backslash, quote and `$` escaped, so the builder neither ends
    the word early nor substitutes variables into it."""
    text = _one_line(value)
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$") + '"'


def _image_ref(value) -> str:
    try:
        return check_image(str(value))
    except ValueError as exc:
        raise TrainboxError(f"refusing to render the base image: {exc}") from None


def _template_base(stack: Stack) -> BaseSpec:
    """The base as the templates see it. A base.substitute is a plain distribution image (Debian from `trainbox
    base bootstrap`): a stack whose own base ships its Python (CANN) gets python3 from apt when built on it."""
    b = stack.base
    if b.substitute and b.image == b.substitute and b.python_from == "image":
        return b.model_copy(update={"python_from": "apt", "python": "python3"})
    return b


def _apt_packages(stack: Stack, base: BaseSpec, patching: bool) -> tuple[list[str], list[str]]:
    """(the system stage's apt packages, the builder's). The system stage's are what `trainbox base bootstrap`
    includes for an apt Python, so that on such a base it runs no apt at all."""
    system = {*RUNTIME_PACKAGES, *(APT_PYTHON_PACKAGES if base.python_from == "apt" else ()), *stack.system_packages}
    build = {*(["patch"] if patching else []), *stack.build_packages,
             *(p for c in stack.installed_components.values() for p in c.kind.builder_packages(c))}
    return sorted(system), sorted(build - system)


def _env_record(stack: Stack) -> dict | None:
    """The toolkit's environment record step (CANN's set_env exports, baked after the build), or None."""
    toolkit = toolkits.for_device(stack.device)
    if toolkit is None or toolkit.ENV_RECORD is None:
        return None
    return {"module": toolkit.ENV_RECORD.__name__, "file": toolkit.ENV_RECORD_FILE}


def render_stack(stack: Stack, template: str = "Dockerfile.j2", native_base: str | None = None,
                 platform: str | None = None) -> RenderedStack:
    """The stack's Dockerfile, requirement files and manifest. `native_base`: a cross build's base for the build
    machine (the twin of the stack's base, same Python), for the `platform` the image is built for; what does not
    depend on the machine is made there, natively (partials/cross_venv.j2, partials/pyc.j2)."""
    if native_base and platform not in PLATFORM_MACHINE:
        raise TrainboxError(f"a cross build needs its target platform (one of {', '.join(PLATFORM_MACHINE)}), "
                            f"got {platform!r}")
    patches = _patch_list(stack)
    req_lines, own_lines = _require_lines(stack)
    dep_lines = _dep_lines(stack)
    man = manifest(stack, patches)
    gen = f"{GENERATED_DIR}/{stack.name}"
    # No stack name in these files: BuildKit keys the install step on their content (not their path), so stacks
    # with the same pins (twinkle and twinkle-a3 on a substitute base) share that layer instead of installing twice.
    header = "# GENERATED by `trainbox stack lock`/`trainbox render` from the pins of the stack that stack.json " \
             "beside this file names; do not edit.\n"
    requirements = header + "".join(line + "\n" for line in req_lines)
    deps = header + "".join(line + "\n" for line in dep_lines)
    own_layer = header + "".join(line + "\n" for line in own_lines)
    manifest_text = json.dumps(man, indent=2, sort_keys=True) + "\n"
    names = sorted({c.dist_name + c.extras_suffix
                    for c in stack.installed_components.values() if c.kind.from_index})
    src = stack.source_file.relative_to(REPO_ROOT) if stack.source_file and \
        stack.source_file.is_relative_to(REPO_ROOT) else stack.source_file
    base = _template_base(stack)
    patched = {k: stack.components[k] for k in patches
               if not stack.components[k].kind.install_args(stack.components[k])}
    sourced = _sourced(stack)
    system_pkgs, build_pkgs = _apt_packages(stack, base, bool(patched or sourced.steps))
    trees = any(c.install == "tree" for c in stack.installed_components.values())
    builder = bool(patched or sourced.steps or trees or build_pkgs)
    # a cross build whose venv pip can make natively: no builder (nothing built or patched under emulation) and
    # every dependency locked (no resolution, whose markers pip would evaluate for the build machine)
    cross_venv = bool(native_base and not builder and dep_lines)
    target_dir = f"{gen}/{platform.replace('/', '-')}" if cross_venv else None
    try:
        text = _env().get_template(template).render(
            stack=stack,
            base=base,
            gen=gen,
            source=str(src),
            dockerfile_name=DEFAULT_DOCKERFILES.get(stack.name, f"{gen}/Dockerfile"),
            deps_locked=bool(dep_lines),
            dep_names=names,
            own_layer=LAYER_OF_ITS_OWN if own_lines else None,
            patched=patched,
            sourced=sourced.steps,
            build_envs=sourced.build_envs,
            wheel_builds=sourced.wheels,
            out_env=BUILD_ENV_OUT, mount_env=BUILD_ENV_MOUNT, out_wheel=WHEEL_OUT, mount_wheel=WHEEL_MOUNT,
            compiled=sorted(k for k, c in stack.installed_components.items() if c.kind.compiled(c)),
            system_pkgs=system_pkgs,
            build_pkgs=build_pkgs,
            # a builder stage only where build-only work happens: otherwise the venv is made in the final stage
            builder=builder,
            trees=trees,
            patches=patches,
            env=dict(sorted(stack.env.items())),
            env_lines=[f"{_env_key(k)}={dockerfile_string(v)}" for k, v in sorted(stack.env.items())],
            label_lines=[f"{k}={dockerfile_string(v)}" for k, v in _labels(stack).items()],
            trainbox_version=__version__,
            native_base=native_base,
            cross_venv=cross_venv,
            target_dir=target_dir,
            target_machine=PLATFORM_MACHINE.get(platform or ""),
            env_record=_env_record(stack),
        )
    except jinja2.TemplateError as exc:
        raise TrainboxError(f"{_template_location(exc, template)}: template error: {exc}") from None
    files = {
        f"{gen}/requirements.txt": requirements.encode(),
        f"{gen}/deps.txt": deps.encode(),
        f"{gen}/{LAYER_OF_ITS_OWN}.txt": own_layer.encode(),
        f"{gen}/stack.json": manifest_text.encode(),
    }
    if target_dir:
        files.update(_target_files(target_dir, platform, header, req_lines, own_lines, dep_lines))
    return RenderedStack(stack, text, man, requirements, deps, files)


def _target_files(target_dir: str, platform: str, header: str, req_lines: list[str], own_lines: list[str],
                  dep_lines: list[str]) -> dict[str, bytes]:
    """A cross venv's requirement files: the target's own lines (the native pip would evaluate the markers for the
    build machine). Each pin step installs into a tree of its own, where pip cannot see the own layer's pin
    installed: the other pins' file leaves it out."""
    texts = {"requirements.txt": [ln for ln in req_lines if ln not in own_lines], "deps.txt": dep_lines,
             f"{LAYER_OF_ITS_OWN}.txt": own_lines}
    return {f"{target_dir}/{name}": requirements_for(header + "".join(ln + "\n" for ln in lines), platform).encode()
            for name, lines in texts.items()}


def _env_key(key: str) -> str:
    try:
        return check_env_name(key)
    except ValueError as exc:
        raise TrainboxError(f"refusing to render an ENV line: {exc}") from None


def _template_location(exc: jinja2.TemplateError, template: str) -> str:
    """file:line of a template error; runtime errors (undefined names) carry it only in the traceback."""
    if getattr(exc, "lineno", None):
        return f"{getattr(exc, 'filename', None) or TEMPLATES_DIR / template}:{exc.lineno}"
    where = f"{TEMPLATES_DIR / template}:?"
    tb = exc.__traceback__
    while tb is not None:
        fname = tb.tb_frame.f_code.co_filename
        if fname.endswith(".j2"):
            where = f"{fname}:{tb.tb_lineno}"
        tb = tb.tb_next
    return where


def _labels(stack: Stack) -> dict[str, str]:
    torch = stack.components.get("torch")
    labels = {
        "org.opencontainers.image.title": f"trainbox-{stack.name}",
        "org.opencontainers.image.description": stack.description,
        "org.opencontainers.image.version": __version__,
        "org.opencontainers.image.base.name": stack.base.image,
        "io.trainbox.stack": stack.name,
        "io.trainbox.runtime.device": stack.device,
        "io.trainbox.python": stack.python,
        "io.trainbox.runtime.manifest": "/etc/trainbox/stack.json",
    }
    if torch and torch.version:
        labels["io.trainbox.torch"] = torch.version
    toolkit = toolkits.for_device(stack.device)
    if toolkit is not None:  # the toolkit's own label (what a substitute-built image declares without holding it)
        labels.update(toolkit.image_labels(stack.base.cann, bool(stack.declared_base)))
    for key, c in stack.installed_components.items():
        if c.kind.install_args(c):  # provenance of what the build staged: URL, commit, tree, mode, patches
            entry = c.kind.manifest_entry(c, stack)
            labels[f"io.trainbox.source.{key}"] = json.dumps(entry, sort_keys=True, separators=(",", ":"))
    for key in ("torch-npu", "megatron-core"):
        c = stack.components.get(key)
        if c and c.install and c.version:
            labels[f"io.trainbox.{key}"] = c.version
    return dict(sorted(labels.items()))


# ---------------------------------------------------------------------------------------------------------
# writing and drift checking


def outputs_for(rendered: RenderedStack) -> dict[str, bytes]:
    out = dict(rendered.context_files)
    out[f"{rendered.generated_dir}/Dockerfile"] = rendered.dockerfile.encode()
    top = DEFAULT_DOCKERFILES.get(rendered.stack.name)
    if top:
        out[top] = rendered.dockerfile.encode()
    return out


def write_set(outputs: dict[str, bytes], root: Path) -> list[str]:
    """Write every output under `root`, all or nothing: each file is first staged beside its target, and
    only when every one is staged are they moved into place (a failure then puts back what was moved).
    Returns the paths written. A place that cannot be written is one TrainboxError, nothing changed."""
    staged: list[tuple[Path, Path]] = []
    moved: list[tuple[Path, Path | None]] = []  # target, backup of what it replaced
    try:
        for rel, data in sorted(outputs.items()):
            target = root / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
            staged.append((Path(tmp), target))
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.chmod(tmp, 0o644)
        for tmp, target in staged:
            backup = None
            if target.exists():
                backup = target.with_name(f".{target.name}.trainbox-old")
                os.replace(target, backup)
            moved.append((target, backup))
            os.replace(tmp, target)
    except OSError as exc:
        for target, backup in reversed(moved):
            if backup is not None:
                os.replace(backup, target)
            else:
                target.unlink(missing_ok=True)
        for tmp, _target in staged:
            tmp.unlink(missing_ok=True)
        where = getattr(exc, "filename", None) or root
        raise TrainboxError(f"{where}: cannot write there ({exc.strerror or exc}); nothing was changed "
                            f"under {root}") from None
    for _target, backup in moved:
        if backup is not None:
            backup.unlink(missing_ok=True)
    return sorted(outputs)


# what a build/generated/<stack>/ directory holds, so a stale one (its stack removed) can be told apart
GENERATED_FILES = {"Dockerfile", "deps.txt", "requirements.txt", f"{LAYER_OF_ITS_OWN}.txt", "stack.json"}


def stale_generated(outputs: dict[str, bytes], root: Path) -> list[Path]:
    """build/generated/<name>/ directories under `root` that no rendered stack produced (its stack was
    removed or renamed): they would otherwise go on looking current."""
    d = root / GENERATED_DIR
    if not d.is_dir():
        return []
    live = {rel.split("/")[2] for rel in outputs if rel.startswith(GENERATED_DIR + "/")}
    return sorted(p for p in d.iterdir() if p.is_dir() and p.name not in live)


def render_all(names: list[str] | None = None) -> dict[str, bytes]:
    """Every output of every named stack, fully rendered in memory before anything is written."""
    out: dict[str, bytes] = {}
    for name in names or list_stacks():
        out.update(outputs_for(render_stack(load_stack(name))))
    return out


def drift(outputs: dict[str, bytes], root: Path, whole: bool = True) -> list[str]:
    """What differs between `outputs` and the files under `root`; with `whole` (every stack rendered)
    also generated directories that no stack produces any more."""
    bad = [f"{p.relative_to(root)}/: stale, no stack produces it (its stack was removed); delete it"
           for p in (stale_generated(outputs, root) if whole else [])]
    for rel, data in sorted(outputs.items()):
        p = root / rel
        if not p.exists():
            bad.append(f"{rel}: missing")
        elif p.read_bytes() != data:
            bad.append(f"{rel}: differs from what the templates produce")
    return bad
