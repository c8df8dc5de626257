"""Compatibility rules for stacks (host module). One place, one function per rule.

Each rule has an id and a one-line explanation, and yields findings for a loaded Stack. To add a rule, write a
function here decorated with @rule("my-rule-id", "why it matters"); trainbox.specs.findings runs them all wherever a stack
is used (validate, lock, render, patches verify, image build and its dry run). `error` findings fail; `warning`
findings fail validation only with --strict; `info` findings never do (they say where something comes from). A rule decides from facts (pins, commits, the tables under
build/compat/), never from a label a stack file may write freely (`ref:`, `note:`).

A finding that holds on some platforms only names them (`platforms`); `check` folds the same finding on several
platforms into one. Its message never names the stack, so a stack that inherits the problem from the stack it
extends has the very same finding, and trainbox.specs.findings reports it once, at the file that holds the pin.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from dataclasses import dataclass
from typing import Callable, Iterator

import yaml
from packaging.version import InvalidVersion, Version

from ..paths import COMPAT_DIR, PATCHES_DIR
from ..runtime.errors import TrainboxError
from ..runtime.npu import BASE_IMAGE as CANN_BASE_IMAGE, BASE_TAG_FORM as CANN_TAG_FORM
from .platforms import PLATFORM_MACHINE
from .stack import Stack


@dataclass(frozen=True)
class Finding:
    rule: str
    level: str  # "error" | "warning" | "info"
    message: str
    platforms: tuple[str, ...] = ()  # the platforms it holds on; () where the platform does not matter
    key: str | None = None  # what makes two findings the same one when the message names the stack (lock rules)

    @property
    def identity(self) -> tuple:
        return (self.rule, self.level, self.key or self.message, self.platforms)

    def text(self) -> str:
        return self.message + (f" ({', '.join(self.platforms)})" if self.platforms else "")

    def format(self, stack: Stack) -> str:
        return f"{stack.source_file}: [{self.rule}] {self.level}: {self.text()}"


def fold(findings: list[Finding], platforms: list[str]) -> list[Finding]:
    """The same finding on several platforms as one that names them all (in the stack's platform order)."""
    merged: dict[tuple, Finding] = {}
    for f in findings:
        k = (f.rule, f.level, f.key or f.message, bool(f.platforms))
        if k in merged and f.platforms:
            have = set(merged[k].platforms) | set(f.platforms)
            merged[k] = dataclasses.replace(merged[k], platforms=tuple(p for p in platforms if p in have))
        else:
            merged.setdefault(k, f)
    return list(merged.values())


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
      "with sha256; a moved pin needs `trainbox stack lock` (a stack that extends a locked one uses its parent's "
      "lock for every pin it does not change)")
def pinned_sources(stack: Stack) -> Iterator[Finding]:
    if stack.lock_inherited and stack.own_changes:
        # one line for what the stack changes; the parent's pins come hashed from the parent's lock
        yield Finding("pinned-sources", "warning",
                      f"{'; '.join(stack.own_changes)}: {stack.lock_inherited} (inherited) was not computed for "
                      f"that and {stack.name} has no lock of its own; run `trainbox stack lock {stack.name}`",
                      key="own changes: " + "; ".join(stack.own_changes))
    unhashed: dict[str, list[str]] = {}  # platform -> pins without a hash there
    for key, c in stack.installed_components.items():
        if c.kind.from_index:
            for plat in stack.platforms:
                if not c.pin_for(plat).sha256 and not stack.own_changes:
                    unhashed.setdefault(plat, []).append(f"{c.dist_name}=={c.pin_for(plat).version}")
        else:
            for msg in c.kind.pin_warnings(c, stack):
                yield Finding("pinned-sources", "warning", f"components.{key}: {msg}")
    for plat, pins in unhashed.items():
        what = ", ".join(sorted(pins))
        yield Finding("pinned-sources", "warning", f"no sha256 for {what}; run `trainbox stack lock {stack.name}` "
                      "(every artifact is installed in hash-checking mode)", (plat,), key=f"no sha256 for {what}")


@rule("torch-npu-cann", "torch_npu is built for one torch and recommended with one CANN release line (Ascend's "
      "table, build/compat/torch-npu.yaml): another torch fails at import (undefined symbols); a CANN outside "
      "Ascend's documented compatibility fails at import or at run time (missing kernels), one inside it but off "
      "the recommended pair is a warning")
def torch_npu_cann(stack: Stack) -> Iterator[Finding]:
    npu = _component(stack, "torch-npu")
    if not npu:
        return
    torch = _component(stack, "torch")
    for plat in stack.platforms:
        nv = npu.pin_for(plat).version or ""
        tv = _version(torch.pin_for(plat).version) if torch else None
        row = torch_npu_row(nv)
        if row is None:
            yield Finding("torch-npu-cann", "warning",
                          f"components.torch-npu: {nv} is not in build/compat/torch-npu.yaml (Ascend's pairing "
                          "table); check https://gitcode.com/Ascend/pytorch and add its row", (plat,))
            continue
        if tv and tv.public.split("+")[0] != row["torch"] and tv.base_version != row["torch"]:
            yield Finding("torch-npu-cann", "error",
                          f"components.torch-npu: torch_npu {nv} is built for torch {row['torch']} (branch "
                          f"{row['branch']}), but components.torch is {tv}; pin torch {row['torch']}, or the "
                          f"torch_npu built for torch {tv.base_version}", (plat,))
        if stack.base.cann:
            yield from _cann_pairing(stack.base.cann, nv, row, tv, plat)
        if row.get("python") and stack.python not in row["python"]:
            yield Finding("torch-npu-cann", "error",
                          f"python: {stack.python}, but torch_npu {nv} supports Python {', '.join(row['python'])}",
                          (plat,))


def _cann_pairing(cann: str, nv: str, row: dict, tv: Version | None, plat: str) -> Iterator[Finding]:
    """The base's CANN against torch_npu's recommended line, then against Ascend's documented compatibility."""
    line = _cann_line(cann)
    if line == row["cann"]:
        return
    release = _release_line(row["branch"])
    pairs = [r["torch_npu"] for r in _table() if r["cann"] == line and tv and r["torch"] == tv.base_version]
    hint = f"pin torch-npu {pairs[0]}" if pairs else "pick a torch_npu of that CANN line from the table"
    documented = [c["source"] for c in _compatible() if release in c["torch_npu"] and line in c["cann"]]
    if documented:
        yield Finding("torch-npu-cann", "warning",
                      f"base.cann: {cann}, and torch_npu {nv} (TorchNPU {release}.x, branch {row['branch']}) is "
                      f"recommended with CANN {row['cann']}.x; Ascend documents TorchNPU {release}.x as compatible "
                      f"with CANN {line}.x ({documented[0]}); for the recommended pair {hint}, or move the base to "
                      f"CANN {row['cann']}", (plat,))
        return
    yield Finding("torch-npu-cann", "error",
                  f"base.cann: {cann}, but torch_npu {nv} is built for CANN {row['cann']}.x (branch {row['branch']}) "
                  f"and Ascend documents no compatibility of TorchNPU {release}.x with CANN {line}.x; {hint}, or move "
                  f"the base to CANN {row['cann']}", (plat,))


def _cann_line(version: str) -> str:
    """8.5.1 -> '8.5' (patch releases share their line's torch_npu); 8.3.RC1 -> '8.3'."""
    return ".".join(str(version).split(".")[:2])


def _release_line(branch: str) -> str:
    """v2.9.0-7.3.0 -> '7.3': the TorchNPU release line Ascend's compatibility table is written in."""
    return _cann_line(branch.rsplit("-", 1)[-1])


@functools.lru_cache(maxsize=1)
def _compat_doc() -> dict:
    path = COMPAT_DIR / "torch-npu.yaml"
    try:
        doc = yaml.safe_load(path.read_text()) or {}
        doc["rows"], doc.get("compatible", [])
    except (OSError, KeyError, TypeError, yaml.YAMLError) as exc:
        raise TrainboxError(f"{path}: unreadable pairing table ({exc}); restore it from git") from None
    return doc


def _table() -> tuple:
    return tuple({k: (str(v) if k not in ("python",) else v) for k, v in r.items()} for r in _compat_doc()["rows"])


def _compatible() -> tuple:
    """Ascend's documented compatibility beyond the recommended pairs: release lines x CANN lines, with source."""
    return tuple({"source": str(c["source"]), "torch_npu": [str(x) for x in c["torch_npu"]],
                  "cann": [str(x) for x in c["cann"]]} for c in _compat_doc().get("compatible") or [])


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
            yield Finding("npu-no-cuda-torch", "error", f"components.torch {v} is a {local} build", (plat,))
        elif PLATFORM_MACHINE[plat] == "x86_64" and local != "cpu":
            yield Finding("npu-no-cuda-torch", "error",
                          f"components.torch {v}: PyPI's x86_64 torch is the CUDA build; use "
                          "version X.Y.Z+cpu from PyPI's CPU index (index: pytorch-cpu)", (plat,))


@rule("mindspeed-megatron", "MindSpeed core_rX.Y is made for Megatron X.Y; another pairing breaks its patches. The "
      "line is read from the pinned commit (build/compat/mindspeed.yaml, commits checked against the upstream tree), "
      "else from `version:` (the build checks the wheel built from the tree has it), never from `ref:`")
def mindspeed_megatron(stack: Stack) -> Iterator[Finding]:
    ms, mg = _component(stack, "mindspeed"), _component(stack, "megatron-core")
    if not (ms and mg):
        return
    known = _mindspeed_commits().get((ms.commit or "").lower())
    line = known["megatron"] if known else None
    how = f"commit {(ms.commit or '')[:12]} (branch {known['branch']})" if known else None
    if line is None and _version(ms.version):
        v = _version(ms.version)
        line, how = f"{v.major}.{v.minor}", f"version {ms.version} (the wheel the build makes from the tree)"
    if line is None:
        yield Finding("mindspeed-megatron", "warning",
                      f"components.{ms.key}: commit {ms.commit} is not in build/compat/mindspeed.yaml and has no "
                      "`version:`, so its Megatron line cannot be told (`ref:` is a label, not a fact); add the "
                      "commit with its branch, or `version:` as its setup.py says")
        return
    mv = _version(mg.version)
    if mv and line != f"{mv.major}.{mv.minor}":
        yield Finding("mindspeed-megatron", "error",
                      f"components.{ms.key}: MindSpeed at {how} is made for Megatron {line}, but megatron-core is "
                      f"{mv}; pin a MindSpeed commit of core_r{mv.major}.{mv.minor}.x or megatron-core {line}.x")


@functools.lru_cache(maxsize=1)
def _mindspeed_commits() -> dict:
    path = COMPAT_DIR / "mindspeed.yaml"
    try:
        rows = (yaml.safe_load(path.read_text()) or {})["commits"]
        return {str(c).lower(): {"megatron": str(r["megatron"]), "branch": str(r["branch"])} for c, r in rows.items()}
    except (OSError, KeyError, TypeError, AttributeError, yaml.YAMLError) as exc:
        raise TrainboxError(f"{path}: unreadable commit table ({exc}); restore it from git") from None


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


# CANN_BASE_IMAGE:CANN_TAG_FORM (trainbox.runtime.npu), e.g. 8.5.1-910b-ubuntu22.04-py3.11 (mirrors keep the tag)
CANN_TAG_RE = re.compile(r"^(?P<cann>\d+\.\d+\.[^-]+)-(?P<chip>[^-]+)-(?P<os>[a-z]+\d+(?:\.\d+)?)-py(?P<python>\d\.\d+)$")


def cann_tag(image: str) -> dict[str, str] | None:
    """The facts a CANN base image's tag states, or None when the image is not a CANN base reference."""
    repo, _, tag = image.rpartition(":")
    if not repo or "/" in tag or repo.rsplit("/", 1)[-1] != CANN_BASE_IMAGE.rsplit("/", 1)[-1]:
        return None
    m = CANN_TAG_RE.match(tag.split("@", 1)[0])
    return m.groupdict() if m else {}


@rule("base-reference", "what the stack declares (base.cann, base.chip, base.os, python) must be what its base "
      f"image's tag says ({CANN_BASE_IMAGE}:{CANN_TAG_FORM}); a CANN other than the one torch_npu "
      "was built for fails at import or at run time")
def base_reference(stack: Stack) -> Iterator[Finding]:
    facts = cann_tag(stack.base.image)
    if facts is None:
        return
    if not facts:
        yield Finding("base-reference", "warning",
                      f"base.image {stack.base.image}: the tag is not {CANN_TAG_FORM} (e.g. "
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
    name = stack.lock_inherited or (stack.lock_path.name if stack.lock_path else "lock")
    owner = name[:-len(".lock")] if name.endswith(".lock") else stack.name
    for why in stack.lock_staleness():
        yield Finding("lock-fresh", "error", f"{name} is stale: {why}; run `trainbox stack lock {owner}`",
                      key=f"stale: {why}")


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
    """Every rule's findings for `stack`, the same finding on several platforms folded into one."""
    return fold([f for r in RULES for f in r.check(stack)], stack.platforms)


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
                          f"linux/arm64 is on {owner} ({url}), not on PyPI; its sha256 among "
                          f"{', '.join(h[:12] + '...' for h in pin.sha256)} as the stack file or lock records")
