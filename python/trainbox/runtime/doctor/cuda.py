"""Doctor checks: cuda."""

from __future__ import annotations

from ..nvidia import CTL_NODE, DRIVER_LIBDIRS
from .core import (
    CPU_ON_PURPOSE,
    FAIL,
    PASS,
    SKIP,
    WARN,
    Context,
    Result,
    check,
    find_command,
    skip_unless,
)
from .npu import device_nodes, lib_status, visible_check


@check("cuda.driver")
def check_cuda_driver(ctx: Context) -> Result:
    """An NVIDIA GPU and driver are visible: /dev/nvidiactl, /dev/nvidiaN, libcuda.so.1, nvidia-smi."""
    skip = skip_unless(ctx, "cuda")
    if skip:
        return skip
    gpus = device_nodes(ctx, "/dev/nvidia[0-9]*", "nvidia")
    ctl = ctx.exists(CTL_NODE)
    data = {"gpus": gpus}
    fix = ("run with --gpus all (NVIDIA Container Toolkit), or on Kubernetes request nvidia.com/gpu; "
           + CPU_ON_PURPOSE)
    if not gpus or not ctl:
        return Result(FAIL, "no NVIDIA GPU visible (" + ("no /dev/nvidiaN" if not gpus else f"no {CTL_NODE}")
                      + ")", fix, data)
    libdirs = DRIVER_LIBDIRS
    status = lib_status(ctx, ["libcuda.so.1"], libdirs)
    path, err = status["libcuda.so.1"]
    data["libcuda"] = path
    if err:
        return Result(FAIL, f"{len(gpus)} GPU node(s) but the driver library cannot be loaded: {err}",
                      "the NVIDIA Container Toolkit mounts libcuda.so.1: run with --gpus (or --runtime nvidia)",
                      data)
    if not find_command(ctx, "nvidia-smi"):
        return Result(WARN, f"{len(gpus)} GPU(s) and libcuda.so.1, but no nvidia-smi on PATH",
                      "run with --gpus all (it mounts nvidia-smi) or NVIDIA_DRIVER_CAPABILITIES=compute,utility",
                      data)
    return Result(PASS, f"{len(gpus)} GPU(s), driver library loads", data=data)


@check("cuda.visible_devices")
def check_cuda_visible(ctx: Context) -> Result:
    """CUDA_VISIBLE_DEVICES names existing GPUs (ids 0..n-1 of the GPUs the container sees, or UUIDs)."""
    skip = skip_unless(ctx, "cuda")
    if skip:
        return skip
    count = len(device_nodes(ctx, "/dev/nvidia[0-9]*", "nvidia"))
    if count == 0:
        return Result(SKIP, "no GPU visible (see cuda.driver)")
    return visible_check(ctx, "CUDA_VISIBLE_DEVICES", count, "GPU", allow_uuid=True)


if __name__ == "__main__":  # `python3 -m` on a library module must fail loudly, not pass silently
    from trainbox.runtime.errors import not_a_command

    raise SystemExit(not_a_command(__spec__.name))
