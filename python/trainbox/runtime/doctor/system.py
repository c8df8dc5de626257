"""Doctor checks: system."""

from __future__ import annotations

import os

from .core import (
    FAIL,
    PASS,
    WARN,
    Context,
    GiB,
    MiB,
    Result,
    check,
    human_size,
)

# ---------------------------------------------------------------------------------------------------
# checks: system limits


def _gib_env(ctx: Context, name: str, default: float) -> float:
    try:
        return float(ctx.env.get(name) or default)
    except ValueError:
        return default


@check("system.shm")
def check_shm(ctx: Context) -> Result:
    """/dev/shm is large enough for DataLoader workers and NCCL/HCCL shared memory (>= 4 GiB; < 512 MiB fails)."""
    path = ctx.path("/dev/shm")
    try:
        st = os.statvfs(path)
    except OSError as exc:
        return Result(FAIL, f"/dev/shm is not usable: {exc.strerror}",
                      "mount a tmpfs at /dev/shm (docker: --shm-size=16g or --ipc=host)")
    size = st.f_blocks * st.f_frsize
    free = st.f_bavail * st.f_frsize
    data = {"size_bytes": size, "free_bytes": free}
    fix = ("run with --shm-size=16g (or --ipc=host); on Kubernetes mount an emptyDir with medium: Memory "
           "at /dev/shm")
    fail_below = _gib_env(ctx, "TRAINBOX_MIN_SHM_GB", 0.5) * GiB
    warn_below = max(fail_below, 4 * GiB)
    if size < fail_below:
        return Result(FAIL, f"/dev/shm is {human_size(size)}: DataLoader workers and NCCL's shared-memory transport "
                            "run out ('Bus error', 'No space left on device')", fix, data)
    if size < warn_below:
        return Result(WARN, f"/dev/shm is {human_size(size)}, below {human_size(warn_below)}: several DataLoader workers "
                            "with large batches can run out", fix, data)
    return Result(PASS, f"/dev/shm is {human_size(size)} ({human_size(free)} free)", data=data)


@check("system.memlock")
def check_memlock(ctx: Context) -> Result:
    """The memlock ulimit is unlimited, as RDMA (HCCL over RoCE, NCCL over InfiniBand) needs."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    inf = resource.RLIM_INFINITY
    data = {"soft": None if soft == inf else soft, "hard": None if hard == inf else hard}
    if soft == inf:
        return Result(PASS, "memlock unlimited", data=data)
    msg = f"memlock ulimit is {human_size(soft) if soft >= MiB else f'{soft // 1024} KiB'}"
    if ctx.device == "cpu":
        return Result(PASS, msg + " (only RDMA needs more; no accelerator here)", data=data)
    return Result(WARN, msg + ": RDMA collectives (HCCL over RoCE, NCCL over InfiniBand) pin memory and fail "
                              "to register buffers", "run with --ulimit memlock=-1:-1 (Kubernetes: set it in the "
                              "container runtime's default ulimits)", data)


@check("system.disk")
def check_disk(ctx: Context) -> Result:
    """Free space where checkpoints go (TRAINBOX_CHECKPOINT_DIR, else the working directory)."""
    target = ctx.env.get("TRAINBOX_CHECKPOINT_DIR") or os.getcwd()
    probe = ctx.path(target)
    while not os.path.exists(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    try:
        st = os.statvfs(probe)
    except OSError as exc:
        return Result(FAIL, f"cannot inspect {target}: {exc.strerror}", "mount the checkpoint volume")
    free = st.f_bavail * st.f_frsize
    data = {"path": target, "free_bytes": free}
    min_free = _gib_env(ctx, "TRAINBOX_MIN_FREE_GB", 20) * GiB
    fix = ("mount a larger volume for checkpoints and point TRAINBOX_CHECKPOINT_DIR (and the job's save dir) at it; "
           "TRAINBOX_MIN_FREE_GB sets this threshold")
    if os.path.isdir(ctx.path(target)) and not os.access(ctx.path(target), os.W_OK):
        return Result(FAIL, f"checkpoint dir {target} is not writable by uid {os.getuid()}",
                      "mount it read-write, or chown it to the container user", data)
    if free < 1 * GiB:
        return Result(FAIL, f"only {human_size(free)} free at {target}: a checkpoint save will fail", fix, data)
    if free < min_free:
        return Result(WARN, f"{human_size(free)} free at {target}, below {human_size(min_free)}: LLM checkpoints "
                            "(weights plus optimizer state) may not fit", fix, data)
    return Result(PASS, f"{human_size(free)} free at {target}", data=data)


if __name__ == "__main__":  # `python3 -m` on a library module must fail loudly, not pass silently
    from trainbox.runtime.errors import not_a_command

    raise SystemExit(not_a_command(__spec__.name))
