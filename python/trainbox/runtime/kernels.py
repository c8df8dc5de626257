"""Kernel choices that depend on the device, with pure-torch references a workload can call (runtime: stdlib
only at import time; torch is imported inside the functions).

causal_conv1d: Qwen3.5's Gated-DeltaNet runs a short causal depthwise convolution. Its fused kernels (the
causal-conv1d package's CUDA kernel, FLA's Triton one) are fast on CUDA, but on Ascend FLA's Triton backward
kernel overflows the 192 KB unified buffer once sequence parallelism reshapes the tensors (local heads H/sp,
global sequence S*sp; Twinkle PR #208). `choose_causal_conv1d()` says which implementation to use here:

    npu   -> causal_conv1d() below (torch conv1d: the Ascend conv kernel, no Triton autotune)
    cuda  -> causal_conv1d.causal_conv1d_fn when the package imports, else causal_conv1d() below
    cpu   -> causal_conv1d() below
"""

from __future__ import annotations

from typing import Callable, NamedTuple

from trainbox.runtime import device
from trainbox.runtime.errors import TrainboxError

_ACTIVATIONS = (None, "silu", "swish")


class KernelChoice(NamedTuple):
    """Which implementation to call on this device: `name` ("torch" or the package), `fn`, and `reason`."""

    name: str
    device_type: str
    fn: Callable
    reason: str


def causal_conv1d(x, weight, bias=None, activation: str | None = None):
    """Causal depthwise conv1d, as causal-conv1d's `causal_conv1d_fn(x, weight, bias, activation)` computes it.

    x: (batch, dim, seqlen); weight: (dim, width); bias: (dim,) or None; activation: None, "silu" or "swish".
    out[b, c, t] = act(bias[c] + sum_k weight[c, k] * x[b, c, t - (width - 1) + k]), x before t=0 being zero.
    Computed in the weight's dtype and returned in x's dtype (as the package does)."""
    import torch.nn.functional as F

    if activation not in _ACTIVATIONS:
        raise TrainboxError(f"causal_conv1d: activation={activation!r}: expected None, 'silu' or 'swish'")
    if x.dim() != 3 or weight.dim() != 2 or x.shape[1] != weight.shape[0]:
        raise TrainboxError(f"causal_conv1d: x {tuple(x.shape)} and weight {tuple(weight.shape)}: expected x "
                            "(batch, dim, seqlen) and weight (dim, width)")
    dim, width = weight.shape
    dtype_in = x.dtype
    # left padding only: output t sees inputs t-width+1 .. t, never the future
    xp = F.pad(x.to(weight.dtype), (width - 1, 0))
    out = F.conv1d(xp, weight.unsqueeze(1), bias, groups=dim)
    if activation is not None:
        out = F.silu(out)
    return out.to(dtype_in)


def choose_causal_conv1d(device_type: str | None = None) -> KernelChoice:
    """The causal_conv1d implementation to use on `device_type` (default: the active device)."""
    dt = device_type or device.get_device_type()
    if dt == "npu":
        return KernelChoice("torch", dt, causal_conv1d, device.CAUSAL_CONV1D_NPU_REASON)
    if dt == "cuda":
        mod, why = device.optional_import("causal_conv1d")
        fn = getattr(mod, "causal_conv1d_fn", None)
        if fn is not None:
            return KernelChoice("causal_conv1d", dt, fn, "the causal-conv1d package's fused kernel imports")
        return KernelChoice("torch", dt, causal_conv1d,
                            f"the causal-conv1d package does not import ({why or 'no causal_conv1d_fn'})")
    return KernelChoice("torch", dt, causal_conv1d, f"no fused causal_conv1d kernel for {dt}")


if __name__ == "__main__":  # `python3 -m` on a library module must fail loudly, not pass silently
    from trainbox.runtime.errors import not_a_command

    raise SystemExit(not_a_command(__spec__.name))
