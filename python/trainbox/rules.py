"""Compatibility rules for stacks (host module). One place, one function per rule.

Each rule has an id and a one-line explanation, and yields findings for a loaded Stack. To add a rule, write a
function here decorated with @rule("my-rule-id", "why it matters"); `trainbox stack validate` runs them all.
`error` findings fail validation; `warning` findings fail it only with --strict; `info` findings never do (they
say where something comes from).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Callable, Iterator

import yaml
from packaging.version import InvalidVersion, Version

from .paths import COMPAT_DIR, PATCHES_DIR
from .runtime.errors import TrainboxError
from .platforms import PLATFORM_MACHINE
from .stack import Stack


@dataclass(frozen=True)
class Finding:
    rule: str
    level: str  # "error" | "warning" | "info"
    message: str

    def format(self, stack: Stack) -> str:
        return f"{stack.source_file}: [{self.rule}] {self.level}: {self.message}"


@dataclass(frozen=True)
class Rule:
    id: str
    explanation: str
    check: Callable[[Stack], Iterator[Finding]]


RULES: list[Rule] = []


def rule(rule_id: str, explanation: str):
    def deco(fn: Callable[[Stack], Iterator[Finding]]):
        RULES.append(Rule(rule_id, explanation, fn))
        return fn

    return deco


def _version(v: str | None) -> Version | None:
    try:
        return Version(v) if v else None
    except InvalidVersion:
        return None


def _component(stack: Stack, *names: str):
    """The installed component whose key or distribution name matches (names compare with - and _ alike)."""
    want = {n.replace("_", "-").lower() for n in names}
    for c in stack.installed_components.values():
        if c.key.replace("_", "-").lower() in want or c.dist_name.replace("_", "-").lower() in want:
            return c
    return None


@rule("pinned-sources", "every component is pinned: pypi with == and sha256 per platform, git by full commit, url "
      "with sha256; a moved pin needs `trainbox stack lock`")
def pinned_sources(stack: Stack) -> Iterator[Finding]:
    for key, c in stack.installed_components.items():
        for msg in c.kind.pin_warnings(c, stack):
            yield Finding("pinned-sources", "warning", f"components.{key}: {msg}")


@rule("torch-npu-cann", "torch_npu pairs with exactly one torch and one CANN release line (Ascend's table, "
      "build/compat/torch-npu.yaml): a mismatch fails at import (undefined symbols) or at run time (missing kernels)")
def torch_npu_cann(stack: Stack) -> Iterator[Finding]:
    npu = _component(stack, "torch-npu")
    if not npu:
        return
    torch = _component(stack, "torch")
    cann = stack.base.cann
    for plat in stack.platforms:
        nv = npu.pin_for(plat).version or ""
        tv = _version(torch.pin_for(plat).version) if torch else None
        row = torch_npu_row(nv)
        if row is None:
            yield Finding("torch-npu-cann", "warning",
                          f"components.torch-npu: {nv} is not in build/compat/torch-npu.yaml (Ascend's pairing "
                          "table); check https://gitcode.com/Ascend/pytorch and add its row")
            continue
        if tv and tv.public.split("+")[0] != row["torch"] and tv.base_version != row["torch"]:
            yield Finding("torch-npu-cann", "error",
                          f"components.torch: {tv} on {plat}, but torch_npu {nv} is built for torch {row['torch']} "
                          f"(branch {row['branch']}); pin torch {row['torch']}")
        if cann and _cann_line(cann) != row["cann"]:
            pairs = [r["torch_npu"] for r in _table() if r["cann"] == _cann_line(cann) and tv
                     and r["torch"] == tv.base_version]
            hint = f"pin torch-npu {pairs[0]}" if pairs else "pick a torch_npu of that CANN line from the table"
            yield Finding("torch-npu-cann", "error",
                          f"base.cann: {cann}, but torch_npu {nv} is built for CANN {row['cann']}.x (branch "
                          f"{row['branch']}); {hint}, or move the base to CANN {row['cann']}")
        if row.get("python") and stack.python not in row["python"]:
            yield Finding("torch-npu-cann", "error",
                          f"python: {stack.python}, but torch_npu {nv} supports Python {', '.join(row['python'])}")


def _cann_line(version: str) -> str:
    """8.5.1 -> '8.5' (patch releases share their line's torch_npu); 8.3.RC1 -> '8.3'."""
    return ".".join(str(version).split(".")[:2])


@functools.lru_cache(maxsize=1)
def _table() -> tuple:
    path = COMPAT_DIR / "torch-npu.yaml"
    try:
        rows = (yaml.safe_load(path.read_text()) or {})["rows"]
    except (OSError, KeyError, TypeError, yaml.YAMLError) as exc:
        raise TrainboxError(f"{path}: unreadable pairing table ({exc}); restore it from git") from None
    return tuple({k: (str(v) if k not in ("python",) else v) for k, v in r.items()} for r in rows)


def torch_npu_row(version: str) -> dict | None:
    """The row of Ascend's table for this torch_npu release (local labels such as +gitabc ignored)."""
    want = _version(version)
    for r in _table():
        if want is not None and _version(r["torch_npu"]) == Version(want.public):
            return r
    return None


@rule("npu-needs-triton-ascend", "NPU stacks ship torch_npu and triton-ascend together (Triton kernels used by "
      "MindSpeed, sglang and FLA need triton-ascend; the plain triton wheel does not run on NPU)")
def npu_triton(stack: Stack) -> Iterator[Finding]:
    if stack.device != "npu":
        return
    npu, tri = _component(stack, "torch-npu"), _component(stack, "triton-ascend")
    if not npu:
        yield Finding("npu-needs-triton-ascend", "error", "an npu stack needs a torch_npu component")
    if not tri:
        yield Finding("npu-needs-triton-ascend", "error",
                      "an npu stack needs a triton-ascend component next to torch_npu")


@rule("npu-no-cuda-torch", "a CUDA build of torch next to torch_npu is fatal: NPU stacks take the CPU build on "
      "x86_64 (PyTorch's CPU index, +cpu) and PyPI's build on aarch64")
def npu_no_cuda_torch(stack: Stack) -> Iterator[Finding]:
    if stack.device != "npu":
        return
    torch = _component(stack, "torch")
    if not torch:
        return
    for plat in stack.platforms:
        pin = torch.pin_for(plat)
        v = pin.version or ""
        local = v.split("+", 1)[1] if "+" in v else ""
        if local.startswith("cu") or local.startswith("rocm"):
            yield Finding("npu-no-cuda-torch", "error", f"components.torch {v} on {plat} is a {local} build")
        elif PLATFORM_MACHINE[plat] == "x86_64" and local != "cpu":
            yield Finding("npu-no-cuda-torch", "error",
                          f"components.torch {v} on {plat}: PyPI's x86_64 torch is the CUDA build; use "
                          "version X.Y.Z+cpu from PyPI's CPU index (index: pytorch-cpu)")


@rule("mindspeed-megatron", "MindSpeed core_rX.Y is made for Megatron X.Y; another pairing breaks its patches")
def mindspeed_megatron(stack: Stack) -> Iterator[Finding]:
    ms, mg = _component(stack, "mindspeed"), _component(stack, "megatron-core")
    if not (ms and mg):
        return
    m = re.search(r"core_r(\d+\.\d+)", ms.ref or ms.version or "")
    mv = _version(mg.version)
    if not m:
        yield Finding("mindspeed-megatron", "warning",
                      f"components.{ms.key}: cannot tell the Megatron line from ref {ms.ref!r} (expected core_rX.Y)")
        return
    if mv and m.group(1) != f"{mv.major}.{mv.minor}":
        yield Finding("mindspeed-megatron", "error",
                      f"MindSpeed {ms.ref} pairs with Megatron {m.group(1)}, but megatron-core is {mv}; use "
                      f"MindSpeed core_r{mv.major}.{mv.minor}.x or megatron-core {m.group(1)}.x")


@rule("megatron-gdn", "megatron-core < 0.16 has no native Gated-DeltaNet: Qwen3.5 needs USE_MCORE_GDN=0 (the "
      "transformers GDN: no packing, no GDN TP/CP)")
def megatron_gdn(stack: Stack) -> Iterator[Finding]:
    mg = _component(stack, "megatron-core")
    mv = _version(mg.version) if mg else None
    if mv and mv < Version("0.16") and stack.env.get("USE_MCORE_GDN") != "0":
        yield Finding("megatron-gdn", "error",
                      f"megatron-core {mv} < 0.16: set env.USE_MCORE_GDN: \"0\" in the stack")


@rule("python-tag", "the base image's Python must match the Python the wheels are pinned for (cpXY tags)")
def python_tag(stack: Stack) -> Iterator[Finding]:
    m = re.search(r"py(\d\.\d+)", stack.base.image.rsplit(":", 1)[-1])
    if m and m.group(1) != stack.python:
        yield Finding("python-tag", "error",
                      f"base {stack.base.image} ships Python {m.group(1)} but the stack pins wheels for Python "
                      f"{stack.python}; change `python:` or the base tag")


# quay.io/ascend/cann:<cann>-<chip>-<os><osver>-py<py>, e.g. 8.5.1-910b-ubuntu22.04-py3.11 (mirrors keep the tag)
CANN_TAG_RE = re.compile(r"^(?P<cann>\d+\.\d+\.[^-]+)-(?P<chip>[^-]+)-(?P<os>[a-z]+\d+(?:\.\d+)?)-py(?P<python>\d\.\d+)$")


def cann_tag(image: str) -> dict[str, str] | None:
    """The facts a CANN base image's tag states, or None when the image is not a CANN base reference."""
    repo, _, tag = image.rpartition(":")
    if not repo or "/" in tag or repo.rsplit("/", 1)[-1] != "cann":
        return None
    m = CANN_TAG_RE.match(tag.split("@", 1)[0])
    return m.groupdict() if m else {}


@rule("base-reference", "what the stack declares (base.cann, base.chip, base.os, python) must be what its base "
      "image's tag says (quay.io/ascend/cann:<cann>-<chip>-<os><osver>-py<py>); a CANN other than the one torch_npu "
      "was built for fails at import or at run time")
def base_reference(stack: Stack) -> Iterator[Finding]:
    facts = cann_tag(stack.base.image)
    if facts is None:
        return
    if not facts:
        yield Finding("base-reference", "warning",
                      f"base.image {stack.base.image}: the tag is not <cann>-<chip>-<os><osver>-py<py> (e.g. "
                      "8.5.1-910b-ubuntu22.04-py3.11), so base.cann/chip/os cannot be checked against it")
        return
    declared = {"cann": stack.base.cann, "chip": stack.base.chip, "os": stack.base.os, "python": stack.python}
    for key, value in declared.items():
        where = "python" if key == "python" else f"base.{key}"
        if value is None:
            if key == "cann":
                yield Finding("base-reference", "warning", f"{where} is not set; base.image {stack.base.image} "
                              f"is CANN {facts[key]}: declare `{where}: {facts[key]}`")
        elif str(value) != facts[key]:
            yield Finding("base-reference", "error",
                          f"{where}: {value}, but base.image {stack.base.image} is {key} {facts[key]}; make them "
                          f"agree (change `{where}` or the image tag)")


@rule("lock-fresh", "the lock file must be computed for the pins, indexes and Python the stack has now; a stale "
      "lock's hashes and dependency closure are for other pins (a derived stack goes stale when its parent moves)")
def lock_fresh(stack: Stack) -> Iterator[Finding]:
    for why in stack.lock_staleness():
        yield Finding("lock-fresh", "error",
                      f"{stack.lock_path.name if stack.lock_path else 'lock'} is stale: {why}; run "
                      f"`trainbox stack lock {stack.name}`")


@rule("patch-series-exists", "a patched component's series must exist, or the build would silently skip patches")
def patch_series(stack: Stack) -> Iterator[Finding]:
    for key, c in stack.installed_components.items():
        if c.patches and not (PATCHES_DIR / c.patches / "series").is_file():
            yield Finding("patch-series-exists", "error",
                          f"components.{key}.patches: {PATCHES_DIR / c.patches / 'series'} does not exist; create "
                          f"it (`trainbox patches edit {key}` then `export`) or drop `patches:`")


@rule("secure-sources", "sources come over an authenticated transport: a hash still checks http:// and file:// "
      "downloads, but say so (and fail under --strict) instead of accepting them silently")
def secure_sources(stack: Stack) -> Iterator[Finding]:
    plain = {"http": "plain HTTP (anyone on the path can stall or swap it; only the hash stands)",
             "git": "the unauthenticated git:// protocol (the fetcher refuses it: GIT_ALLOW_PROTOCOL)",
             "file": "a local file (it exists only on this machine)"}
    for key, c in stack.installed_components.items():
        for field in ("url", "git"):
            scheme = (getattr(c, field, None) or "").partition("://")[0].lower()
            if scheme in plain:
                yield Finding("secure-sources", "warning", f"components.{key}.{field}: {scheme}:// is {plain[scheme]}; "
                              "use https:// (or ssh for git)")
    for name, url in stack.indexes.items():
        scheme = url.partition("://")[0].lower()
        if scheme in ("http", "file"):
            yield Finding("secure-sources", "warning", f"indexes.{name}: {scheme}:// is {plain[scheme]}; use https://")


def check(stack: Stack) -> list[Finding]:
    return [f for r in RULES for f in r.check(stack)]


#: Indexes whose owners are named in `arm64-artifacts` findings (by a part of their URL).
_INDEX_OWNERS = {"download.pytorch.org": "PyTorch's own index", "ascend": "Ascend's own index",
                 "huawei": "Huawei's own index"}


@rule("arm64-artifacts", "where each pin's linux/arm64 (Kunpeng) artifact comes from: PyPI, or only PyTorch's or "
      "Ascend's own index (hash from the stack file where that index is unreachable), or the stack does not "
      "target linux/arm64 at all; a pin with no arm64 artifact fails `stack lock` and `lock-fresh`")
def arm64_artifacts(stack: Stack) -> Iterator[Finding]:
    plat = "linux/arm64"
    if plat not in stack.platforms:
        yield Finding("arm64-artifacts", "info", f"platforms: {', '.join(stack.platforms)}: no linux/arm64 image "
                      "can be built from this stack (add linux/arm64 and lock it where every pin has an aarch64 "
                      "artifact)")
        return
    locked = ((((stack.lock or {}).get("platforms") or {}).get(plat) or {}).get("components")) or {}
    for key, c in sorted(stack.installed_components.items()):
        if not c.kind.from_index:
            continue
        pin = c.pin_for(plat)
        url = stack.indexes.get(pin.index, "")
        if key not in locked or not pin.sha256:
            yield Finding("arm64-artifacts", "info", f"components.{key}: {c.dist_name}=={pin.version} has no "
                          f"linux/arm64 artifact in the lock (index {pin.index}: {url})")
        elif pin.index != "pypi":
            owner = next((o for part, o in _INDEX_OWNERS.items() if part in url), f"index {pin.index} only")
            yield Finding("arm64-artifacts", "info", f"components.{key}: {c.dist_name}=={pin.version} for "
                          f"linux/arm64 is on {owner} ({url}), not on PyPI; sha256 {pin.sha256[0][:12]}... as the "
                          f"stack file or lock records")
