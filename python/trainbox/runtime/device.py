"""One device API for Ascend NPU, NVIDIA CUDA and CPU (what training code imports inside the image).

Runtime module: standard library only at import time. torch and torch_npu are imported lazily inside
the functions, and nothing is computed or cached at import, so an answer can never be frozen before
the launcher has set the environment. Every call reads the environment again.

Environment overrides:
  TRAINBOX_DEVICE        force the device type (npu, cuda, cpu, ...); TRAINBOX_DEVICE=cpu is the
                         deliberate way to run on the CPU in an image whose torch_npu cannot load (in a
                         trainbox image every Python process then finds no torch_npu: trainbox.runtime.cpu_mode)
  TRAINBOX_DIST_BACKEND  force the torch.distributed backend (hccl, nccl, gloo, "cpu:gloo,npu:hccl")
"""

from __future__ import annotations

import importlib
import os
import sys

from trainbox.runtime import npu as npu_facts, nvidia as cuda_facts
from trainbox.runtime.errors import TrainboxError

# Why a fused causal_conv1d kernel is not chosen on an NPU, and what to call instead (capabilities() says it;
# trainbox.runtime.kernels, which builds on this module, picks the implementation).
CAUSAL_CONV1D_NPU_REASON = ("the Triton causal_conv1d kernel (FLA / causal-conv1d) overflows the Ascend 192 KB "
                            "unified buffer under sequence parallel")
CAUSAL_CONV1D_ALTERNATIVE = ("use trainbox.runtime.kernels.causal_conv1d (torch conv1d); "
                             "choose_causal_conv1d() picks it where no fused kernel is safe")

__all__ = [
    "Capability",
    "CapabilityError",
    "DeviceUnavailableError",
    "capabilities",
    "device_count",
    "empty_cache",
    "explain_npu_failure",
    "get_device_type",
    "get_dist_backend",
    "get_local_device",
    "local_device_index",
    "memory_stats",
    "optional_import",
    "require",
    "reset_peak_memory_stats",
    "set_device",
    "synchronize",
]

# Device type -> the variable that restricts which devices a process sees.
VISIBLE_DEVICES_VAR = {"cuda": cuda_facts.VISIBLE_DEVICES_VAR, "npu": npu_facts.VISIBLE_DEVICES_VAR}
# Backend per device type where torch cannot tell (older torch, or torch_npu not registered).
_FALLBACK_BACKENDS = {"npu": "hccl", "cuda": "nccl", "cpu": "gloo", "xpu": "xccl", "hpu": "hccl"}
# Ray's resource names for accelerators.
_RAY_RESOURCES = {"cuda": "GPU", "npu": "NPU", "hpu": "HPU"}
_CPU_WAY_OUT = (
    "To run on the CPU deliberately, set TRAINBOX_DEVICE=cpu (trainbox then imports torch with "
    "TORCH_DEVICE_BACKEND_AUTOLOAD=0; export that as well if your code imports torch before trainbox)."
)

# The first failed `import torch` of this process. Re-importing torch after a failed backend autoload
# fails in unrelated ways, so later calls repeat the first diagnosis instead. Set at run time only.
_torch_import_error: BaseException | None = None


class DeviceUnavailableError(TrainboxError):
    """An accelerator stack is installed but cannot be used (and silently using the CPU would be wrong)."""


class CapabilityError(TrainboxError):
    """A feature the caller asked for is not available on this device; the message names the alternative."""


# --------------------------------------------------------------------------------------------------
# torch import and failure diagnosis


def _forced_device() -> str | None:
    raw = os.environ.get("TRAINBOX_DEVICE", "").strip().lower()
    if not raw:
        return None
    if raw == "gpu":
        raise TrainboxError("environment: TRAINBOX_DEVICE=gpu: expected a torch device type; use cuda")
    if not (raw.isascii() and raw.isidentifier()):
        raise TrainboxError(
            f"environment: TRAINBOX_DEVICE={raw!r}: expected a torch device type such as npu, cuda or cpu"
        )
    return raw


def _exception_chain(exc: BaseException) -> list[BaseException]:
    chain, seen = [], set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__
    return chain


def _dist_version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _npu_devices_named() -> str:
    """`--device /dev/davinciN, /dev/davinci_manager, ...`: what docker run needs for the cards."""
    return "--device " + ", ".join((npu_facts.NPU_CARD_NODE + "N",) + npu_facts.NPU_DEVICE_NODES)


def _cann_locations() -> list[str]:
    candidates = [os.environ.get("ASCEND_TOOLKIT_HOME"), os.environ.get("ASCEND_HOME_PATH"),
                  *(os.path.dirname(s) for s in npu_facts.TOOLKIT_SET_ENV)]
    return [path for path in dict.fromkeys(c for c in candidates if c) if os.path.isdir(path)]


def explain_npu_failure(exc: BaseException) -> str:
    """Turn a failed torch_npu load (directly, or through torch's backend autoload) into one message.

    The message says why (CANN libraries missing or not on the loader path, driver not mounted,
    torch/torch_npu mismatch) and names TRAINBOX_DEVICE=cpu as the deliberate way out.
    """
    import re

    chain = _exception_chain(exc)
    root = chain[-1]
    text = " | ".join(str(e) for e in chain)
    lines = [
        "torch_npu is installed but cannot be loaded, so no NPU can be used "
        "(refusing to fall back to the CPU silently).",
        f"Cause: {type(root).__name__}: {root}",
    ]
    missing = re.search(r"(lib[\w.+-]+?\.so[\w.]*): cannot open shared object file", text)
    if missing and missing.group(1).startswith(npu_facts.DRIVER_LIBS):
        lines.append(
            f"{missing.group(1)} belongs to the Ascend driver, which is not mounted into this container: "
            f"mount {' and '.join(list(npu_facts.NPU_DRIVER_MOUNTS)[:2])} read-only and "
            f"pass {_npu_devices_named()} (`trainbox launch` adds them)."
        )
    elif missing:
        found = _cann_locations()
        if found:
            lines.append(
                f"{missing.group(1)} is a CANN library; CANN is present ({', '.join(found)}) but its "
                f"environment is not set: source {npu_facts.TOOLKIT_SET_ENV[0]} (newer CANN: "
                f"{npu_facts.TOOLKIT_SET_ENV[1]}), or bake it as ENV as trainbox images do; "
                "check LD_LIBRARY_PATH."
            )
        else:
            lines.append(
                f"{missing.group(1)} is a CANN library and no CANN toolkit is installed (no "
                f"{' or '.join(os.path.dirname(s) for s in npu_facts.TOOLKIT_SET_ENV)}, ASCEND_TOOLKIT_HOME "
                f"unset): build the image on a CANN base ({npu_facts.BASE_IMAGE}:{npu_facts.BASE_TAG_FORM})."
            )
    elif "undefined symbol" in text:
        lines.append(
            f"torch {_dist_version('torch')} and torch-npu {_dist_version('torch-npu')} do not match: they "
            "must share major.minor (torch 2.9.0 <-> torch_npu 2.9.0.postN); install a matching pair."
        )
    lines.append(_CPU_WAY_OUT)
    return "\n".join(lines)


def _npu_related(exc: BaseException) -> bool:
    if "torch_npu" in " | ".join(str(e) for e in _exception_chain(exc)):
        return True
    tb = exc.__traceback__
    while tb is not None:
        if "torch_npu" in tb.tb_frame.f_code.co_filename:
            return True
        tb = tb.tb_next
    return False


def _import_torch(required: bool = True):
    """Import torch (lazily); None when torch is not installed and `required` is false."""
    global _torch_import_error
    torch = sys.modules.get("torch")
    if torch is not None:
        return torch
    if _torch_import_error is not None:
        raise DeviceUnavailableError(explain_npu_failure(_torch_import_error)) from _torch_import_error
    from importlib import util

    if util.find_spec("torch") is None:
        if required:
            raise TrainboxError("torch is not installed in this environment; install the stack's torch")
        return None
    if _forced_device() == "cpu":
        # A deliberate CPU run must not die in the NPU backend autoload of `import torch`.
        os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
    try:
        import torch
    except Exception as exc:
        if not _npu_related(exc):
            raise
        _torch_import_error = exc
        raise DeviceUnavailableError(explain_npu_failure(exc)) from exc
    return torch


def _load_torch_npu() -> bool:
    """Import torch_npu under a guard: False when not installed; raises with the reason when it cannot load."""
    if "torch_npu" in sys.modules:
        return True
    from importlib import util

    if util.find_spec("torch_npu") is None:
        return False
    try:
        importlib.import_module("torch_npu")  # registers torch.npu and the hccl backend
    except Exception as exc:
        raise DeviceUnavailableError(explain_npu_failure(exc)) from exc
    return True


def _npu_usable(torch) -> bool:
    """True when torch_npu loads and sees an NPU; False when it is not installed; raises otherwise."""
    if not _load_torch_npu():
        return False
    npu = getattr(torch, "npu", None)
    if npu is None:
        raise DeviceUnavailableError("torch_npu imported but torch.npu is missing (broken install?)\n"
                                     + _CPU_WAY_OUT)
    if npu.is_available() and npu.device_count() > 0:
        return True
    visible = os.environ.get(npu_facts.VISIBLE_DEVICES_VAR)
    why = [
        "torch_npu loaded but sees no NPU (torch.npu.is_available() is False), so no NPU can be used "
        "(refusing to fall back to the CPU silently).",
    ]
    if visible is not None:
        why.append(f"{npu_facts.VISIBLE_DEVICES_VAR}={visible!r} may hide every device.")
    manager = npu_facts.NPU_DEVICE_NODES[0]
    if not os.path.exists(manager):
        why.append(
            f"{manager} is missing: the NPU devices and driver are not mounted into this container "
            f"(docker run needs {_npu_devices_named()} "
            f"and read-only mounts of {' and '.join(list(npu_facts.NPU_DRIVER_MOUNTS)[:2])}; `trainbox launch` "
            "adds them)."
        )
    why.append(_CPU_WAY_OUT)
    raise DeviceUnavailableError("\n".join(why))


def _current_accelerator(torch) -> str | None:
    acc_mod = getattr(torch, "accelerator", None)
    current = getattr(acc_mod, "current_accelerator", None)
    if current is None:
        return None
    try:
        acc = current(check_available=True)
    except TypeError:  # torch 2.6: no check_available, and the answer is the build's, not the host's
        acc = current()
        if acc is not None and not acc_mod.is_available():
            acc = None
    return acc.type if acc is not None else None


# --------------------------------------------------------------------------------------------------
# device type, local device, backend


def get_device_type() -> str:
    """"npu", "cuda", "cpu" (or what newer torch reports through torch.accelerator).

    Order: TRAINBOX_DEVICE; torch.accelerator.current_accelerator(); CUDA; NPU (torch_npu imported
    under a guard); CPU. An installed torch_npu that cannot load, or that sees no device, raises
    DeviceUnavailableError instead of silently returning "cpu".
    """
    forced = _forced_device()
    if forced:
        return forced
    torch = _import_torch(required=False)
    if torch is None:
        return "cpu"
    acc = _current_accelerator(torch)
    if acc is not None:
        return acc
    if torch.cuda.is_available():
        return "cuda"
    if _npu_usable(torch):
        return "npu"
    _require_stack_device()
    return "cpu"


def _require_stack_device() -> None:
    """No accelerator was found: fine on a CPU stack, an error in an image built for NPU or CUDA.

    The image's manifest names the device its stack was built for. Training such a job on the CPU with
    Gloo would "work" very slowly and hide the missing --gpus / device mounts, so, as for the NPU, the
    stack's device is required unless TRAINBOX_DEVICE says otherwise; the message is the doctor's."""
    from .manifest import ManifestError, load_manifest

    try:
        manifest = load_manifest()
    except ManifestError:
        return  # the entrypoint and the doctor report a broken manifest; it cannot tell us the device
    wanted = (manifest or {}).get("device")
    if wanted not in ("cuda", "npu"):
        return
    from .doctor.core import Context
    from .doctor.cuda import check_cuda_driver
    from .doctor.npu import check_npu_devices

    result = (check_cuda_driver if wanted == "cuda" else check_npu_devices)(Context(manifest=manifest, quick=True))
    detail = f"doctor: {result.message}" + (f"; fix: {result.fix}" if getattr(result, "fix", None) else "")
    raise DeviceUnavailableError(
        f"this image's stack {manifest.get('stack')!r} is built for {wanted}, but torch sees no {wanted} device "
        f"(refusing to fall back to the CPU silently).\n{detail}\n{_CPU_WAY_OUT}")


def _device_module(torch, device_type: str):
    if device_type == "cpu":
        return None
    if device_type == "npu" and not hasattr(torch, "npu"):
        _load_torch_npu()  # TRAINBOX_DEVICE=npu with autoload disabled: torch.npu appears on import
    return getattr(torch, device_type, None)


def device_count(device_type: str | None = None) -> int:
    """Number of visible devices of `device_type` (default: the active type); 0 for the CPU."""
    dt = device_type or get_device_type()
    if dt == "cpu":
        return 0
    mod = _device_module(_import_torch(), dt)
    if mod is None or not hasattr(mod, "device_count"):
        raise TrainboxError(f"torch has no torch.{dt} module: is the {dt} backend installed?")
    return int(mod.device_count())


def _ray_local_index(device_type: str):
    """Logical device index from Ray's accelerator assignment, or None when not a Ray worker."""
    ray = sys.modules.get("ray")  # never import Ray: only a process Ray started has it loaded
    if ray is None:
        return None
    try:
        if not ray.is_initialized():
            return None
        ids = ray.get_runtime_context().get_accelerator_ids()
    except Exception:
        return None
    resource = _RAY_RESOURCES.get(device_type, device_type.upper())
    assigned = [str(i) for i in ids.get(resource) or []]
    if not assigned:
        return None
    physical = assigned[0]
    var = VISIBLE_DEVICES_VAR.get(device_type)
    visible = os.environ.get(var, "") if var else ""
    if visible.strip():
        # Ray narrowed visibility (default), or NOSET mode with a user list: map physical -> logical.
        listed = [v.strip() for v in visible.split(",")]
        if physical not in listed:
            raise TrainboxError(
                f"Ray assigned {resource} {physical} but {var}={visible!r} does not list it; with "
                f"RAY_EXPERIMENTAL_NOSET_* set, keep {var} covering the devices Ray hands out"
            )
        return listed.index(physical), f"Ray {resource} id {physical} (position in {var})"
    # NOSET mode without a visibility list: Ray's physical id is torch's index.
    return int(physical), f"Ray {resource} id {physical}"


def local_device_index(device_type: str | None = None, local_rank: int | None = None) -> int | None:
    """Index of this process's device: `local_rank`, else LOCAL_RANK (or the MPI local rank), else
    Ray's assignment, else RANK % device count, else 0. Range-checked. None on the CPU."""
    from trainbox.runtime.rankenv import read_rank_env

    dt = device_type or get_device_type()
    if dt == "cpu":
        return None
    count = device_count(dt)
    var = VISIBLE_DEVICES_VAR.get(dt)
    visible = f" ({var}={os.environ[var]!r})" if var and var in os.environ else ""
    if count == 0:
        raise DeviceUnavailableError(f"no {dt} device is visible{visible}.\n{_CPU_WAY_OUT}")
    env = read_rank_env()
    if local_rank is not None:
        index, source = int(local_rank), f"local_rank={local_rank}"
    elif env.local_rank is not None:
        index, source = env.local_rank, f"{env.local_rank_var}={env.local_rank}"
    else:
        from_ray = _ray_local_index(dt)
        if from_ray is not None:
            index, source = from_ray
        elif env.rank is not None:
            index, source = env.rank % count, f"rank {env.rank} % {count} devices"
        else:
            index, source = 0, "default"
    if not 0 <= index < count:
        raise TrainboxError(
            f"{source} selects {dt} device {index}, but only {count} {dt} device(s) are visible{visible}: "
            f"start at most {count} processes per node (torchrun --nproc-per-node) or widen the visible devices"
        )
    return index


def get_local_device(device_type: str | None = None, local_rank: int | None = None):
    """torch.device for this process: e.g. npu:3 for LOCAL_RANK=3; cpu on the CPU."""
    torch = _import_torch()
    dt = device_type or get_device_type()
    index = local_device_index(dt, local_rank)
    return torch.device(dt) if index is None else torch.device(dt, index)


def set_device(device=None):
    """Bind this process to `device` (default get_local_device()); returns the torch.device."""
    torch = _import_torch()
    dev = get_local_device() if device is None else torch.device(device)
    if dev.type == "cpu":
        return dev
    mod = _device_module(torch, dev.type)
    if mod is None or not hasattr(mod, "set_device"):
        raise TrainboxError(f"torch has no torch.{dev.type}.set_device: is the {dev.type} backend installed?")
    mod.set_device(dev.index if dev.index is not None else 0)
    return dev


def get_dist_backend(device_type: str | None = None, mixed: bool = False) -> str:
    """torch.distributed backend for the device: TRAINBOX_DIST_BACKEND; else torch's
    get_default_backend_for_device; else hccl / nccl / gloo. mixed=True gives "cpu:gloo,npu:hccl"."""
    forced = os.environ.get("TRAINBOX_DIST_BACKEND", "").strip()
    if forced:
        return forced
    dt = device_type or get_device_type()
    backend = None
    try:
        torch = _import_torch(required=False)
    except DeviceUnavailableError:  # an explicit device type needs no working torch to be mapped
        torch = None
    lookup = getattr(getattr(torch, "distributed", None), "get_default_backend_for_device", None)
    if lookup is not None:
        try:
            backend = lookup(dt)
        except Exception:  # unknown device string or no backend registered for it (torch_npu not loaded)
            backend = None
    backend = (backend or _FALLBACK_BACKENDS.get(dt, "gloo")).lower()
    if not mixed:
        return backend
    if dt == "cpu":
        return "cpu:gloo"
    return f"cpu:gloo,{dt}:{backend}"


# --------------------------------------------------------------------------------------------------
# memory helpers


def _resolve(device):
    torch = _import_torch()
    dev = get_local_device() if device is None else torch.device(device)
    return torch, dev, _device_module(torch, dev.type)


def _call(torch, mod, name, dev, *args):
    fn = getattr(mod, name, None) if mod is not None else None
    if fn is None and getattr(torch, "accelerator", None) is not None:
        fn = getattr(torch.accelerator, name, None)
    if fn is None:
        return None
    return fn(*args)


def empty_cache(device=None) -> None:
    """Release cached blocks of the active device's allocator (no-op on the CPU)."""
    torch, dev, mod = _resolve(device)
    if dev.type != "cpu":
        _call(torch, mod, "empty_cache", dev)


def synchronize(device=None) -> None:
    """Wait for the device's queued work (no-op on the CPU)."""
    torch, dev, mod = _resolve(device)
    if dev.type != "cpu":
        _call(torch, mod, "synchronize", dev, dev)


def memory_stats(device=None) -> dict:
    """Bytes allocated / reserved now and at peak on the device; on the CPU the process's max RSS."""
    torch, dev, mod = _resolve(device)
    stats = {"device": str(dev), "allocated": None, "reserved": None, "max_allocated": None,
             "max_reserved": None}
    if dev.type == "cpu":
        import resource

        stats["max_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
        return stats
    for key, fn in (("allocated", "memory_allocated"), ("reserved", "memory_reserved"),
                    ("max_allocated", "max_memory_allocated"), ("max_reserved", "max_memory_reserved")):
        value = _call(torch, mod, fn, dev, dev)
        stats[key] = int(value) if value is not None else None
    return stats


def reset_peak_memory_stats(device=None) -> None:
    """Reset the peak counters that memory_stats() reports as max_* (no-op on the CPU)."""
    torch, dev, mod = _resolve(device)
    if dev.type != "cpu":
        _call(torch, mod, "reset_peak_memory_stats", dev, dev)


# --------------------------------------------------------------------------------------------------
# optional imports and capabilities


def optional_import(name: str):
    """(module, None) when `name` imports, else (None, reason). Never raises for a broken package."""
    try:
        return importlib.import_module(name), None
    except Exception as exc:  # a broken native extension raises OSError/RuntimeError, not ImportError
        return None, f"{type(exc).__name__}: {exc}"


def _has_module(name: str) -> bool:
    from importlib import util

    try:
        return util.find_spec(name) is not None
    except (ImportError, ValueError):
        return name in sys.modules


class Capability:
    """One feature on one device: truthy when available; `reason` says why not, `alternative` what to do."""

    __slots__ = ("name", "device_type", "available", "reason", "alternative")

    def __init__(self, name, device_type, available, reason, alternative):
        self.name, self.device_type = name, device_type
        self.available, self.reason, self.alternative = bool(available), reason, alternative

    def __bool__(self):
        return self.available

    def __repr__(self):
        state = "available" if self.available else f"unavailable: {self.reason}"
        return f"<Capability {self.name} on {self.device_type}: {state}>"


def _check_flex_attention(torch, dt):
    if dt == "npu":
        return False, "FlexAttention has no Ascend NPU kernel"
    mod, why = optional_import("torch.nn.attention.flex_attention")
    return (True, None) if mod is not None else (False, why)


def _check_sdpa(torch, dt):
    ok = hasattr(torch.nn.functional, "scaled_dot_product_attention")
    return ok, None if ok else f"torch {torch.__version__} has no scaled_dot_product_attention"


def _check_flash_attn(torch, dt):
    if dt == "npu":
        ok = hasattr(sys.modules.get("torch_npu"), "npu_fusion_attention")
        return ok, None if ok else "torch_npu has no npu_fusion_attention"
    if dt == "cuda":
        ok = _has_module("flash_attn")
        return ok, None if ok else "the flash-attn package is not installed"
    return False, f"no flash-attention kernel for {dt}"


def _check_bf16(torch, dt):
    mod = _device_module(torch, dt)
    probe = getattr(mod, "is_bf16_supported", None)
    if probe is None:
        return True, None
    ok = bool(probe())
    return ok, None if ok else f"this {dt} device has no bfloat16 support"


def _check_bf16_gru(torch, dt):
    if dt == "npu":
        return False, "Ascend's DynamicGRU kernel has no bfloat16 support"
    return True, None


def _check_fused_adam(torch, dt):
    foreach_utils, _ = optional_import("torch.utils._foreach_utils")
    supported = getattr(foreach_utils, "_get_fused_kernels_supported_devices", None)
    devices = supported() if supported is not None else ["cuda"]  # older torch: fused meant CUDA only
    ok = dt in devices
    return ok, None if ok else f"torch's fused optimizers support {', '.join(devices)}, not {dt}"


def _check_triton(torch, dt):
    if dt == "cpu":
        return False, "no Triton backend is used for the CPU"
    ok = _has_module("triton")
    pkg = "triton-ascend" if dt == "npu" else "triton"
    return ok, None if ok else f"{pkg} is not installed"


def _check_npu_fused_ops(torch, dt):
    if dt != "npu":
        return False, f"torch_npu fused operators exist only on the NPU, not on {dt}"
    torch_npu = sys.modules.get("torch_npu")
    missing = [op for op in ("npu_rms_norm", "npu_rotary_mul", "npu_fusion_attention")
               if not hasattr(torch_npu, op)]
    return not missing, f"torch_npu lacks {', '.join(missing)}" if missing else None


def _check_causal_conv1d(torch, dt):
    # A fused causal_conv1d kernel that is safe here; trainbox.runtime.kernels.choose_causal_conv1d picks the
    # implementation to call.
    if dt == "npu":
        return False, CAUSAL_CONV1D_NPU_REASON
    if dt != "cuda":
        return False, f"no fused causal_conv1d kernel for {dt}"
    ok = _has_module("causal_conv1d")
    return ok, None if ok else "the causal-conv1d package is not installed"


# name -> (check, alternative to name when unavailable)
_CAPABILITIES = {
    "bf16": (_check_bf16, "train in float16 with loss scaling, or float32"),
    "causal_conv1d": (_check_causal_conv1d, CAUSAL_CONV1D_ALTERNATIVE),
    "bf16_gru": (_check_bf16_gru, "run the GRU in float16 (a float16 copy synced each step, outputs cast back) "
                 "or float32"),
    "flash_attn": (_check_flash_attn, "use --attention-backend sdpa"),
    "flex_attention": (_check_flex_attention, "use --attention-backend sdpa (or eager)"),
    "fused_adam": (_check_fused_adam, "use foreach=True (the default) instead of fused=True"),
    "npu_fused_ops": (_check_npu_fused_ops, "use the eager PyTorch implementation"),
    "sdpa": (_check_sdpa, "use --attention-backend eager"),
    "triton": (_check_triton, "install triton (CUDA) or triton-ascend (NPU), or pick a non-Triton kernel path"),
}


def _capability(name, torch, dt):
    check, alternative = _CAPABILITIES[name]
    if torch is None:
        return Capability(name, dt, False, "torch is not installed", alternative)
    try:
        ok, reason = check(torch, dt)
    except Exception as exc:  # a probe must not take the caller down; report it as the reason
        ok, reason = False, f"probe failed: {type(exc).__name__}: {exc}"
    return Capability(name, dt, ok, reason, None if ok else alternative)


def capabilities(device_type: str | None = None) -> dict:
    """{name: Capability} for flex_attention, flash_attn, sdpa, bf16, bf16_gru, causal_conv1d (a fused kernel
    that is safe here), fused_adam, triton and npu_fused_ops on `device_type` (default: the active device)."""
    dt = device_type or get_device_type()
    torch = _import_torch(required=False)
    return {name: _capability(name, torch, dt) for name in _CAPABILITIES}


def require(capability: str, device_type: str | None = None) -> Capability:
    """Return the Capability, or raise CapabilityError naming why and the alternative."""
    if capability not in _CAPABILITIES:
        raise TrainboxError(f"unknown capability {capability!r}; known: {', '.join(sorted(_CAPABILITIES))}")
    dt = device_type or get_device_type()
    cap = _capability(capability, _import_torch(required=False), dt)
    if not cap:
        raise CapabilityError(f"{capability} is not available on {dt}: {cap.reason}; {cap.alternative}")
    return cap


if __name__ == "__main__":  # `python3 -m` on a library module must fail loudly, not pass silently
    from trainbox.runtime.errors import not_a_command

    raise SystemExit(not_a_command(__spec__.name))
