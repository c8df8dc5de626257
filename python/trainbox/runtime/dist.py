"""Process-group bring-up, device mesh and Python-object collectives on NPU, CUDA and CPU.

Runtime module: standard library only at import time (torch imported inside the functions).

    from trainbox.runtime.dist import init_distributed, all_gather_object, destroy_distributed
    info = init_distributed()          # torchrun, Ray Train or mpirun environment; or a single process
    stats = all_gather_object({"rank": info.rank, "loss": 0.5})
    destroy_distributed()

Environment: TRAINBOX_DEVICE, TRAINBOX_DIST_BACKEND (see trainbox.runtime.device); RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR, MASTER_PORT (torchrun) or the MPI launcher's variables (trainbox.runtime.rankenv).
"""

from __future__ import annotations

import os
import sys

from trainbox.runtime import device as _device
from trainbox.runtime.errors import TrainboxError
from trainbox.runtime.npu import (
    HCCL_HOST_BASE,
    HCCL_IF_BASE,
    HCCL_IF_BASE_WIDTH,
    HCCL_NPU_BASE,
    HCCL_SLOTS,
    HCCL_SOCKET_RANGE_CHIPS_EXCLUDED,
    HCCL_WIDTH,
)
from trainbox.runtime.rankenv import read_rank_env

__all__ = [
    "DistInfo",
    "all_gather_object",
    "broadcast_object_list",
    "clear_bound_device_id",
    "destroy_distributed",
    "device_mesh",
    "gather_object",
    "gloo_worker_threads",
    "hccl_socket_port_env",
    "init_distributed",
    "is_initialized",
    "object_group",
]

# Run-time state, set by init_distributed / object_group and dropped by destroy_distributed. Each entry
# remembers the default group it was made for, so a group torn down behind our back is never reused.
_info_cache: tuple | None = None  # (default process group, DistInfo)
_gloo_cache: tuple | None = None  # (default process group, Gloo group for object collectives)
# The rendezvous store outlives destroy_distributed() so that init_distributed() again talks to the
# same store under a new prefix: ((addr, port, rank, world size), store, generation).
_store_cache: tuple | None = None
_exit_hook = False  # _at_exit registered (once per process)


class DistInfo:
    """What init_distributed set up: rank, world_size, local_rank, device (torch.device), backend."""

    __slots__ = ("rank", "world_size", "local_rank", "device", "backend", "source")

    def __init__(self, rank, world_size, local_rank, device, backend, source):
        self.rank, self.world_size, self.local_rank = rank, world_size, local_rank
        self.device, self.backend, self.source = device, backend, source

    @property
    def device_type(self) -> str:
        return self.device.type

    def as_dict(self) -> dict:
        return {"rank": self.rank, "world_size": self.world_size, "local_rank": self.local_rank,
                "device": str(self.device), "backend": self.backend, "source": self.source}

    def __repr__(self):
        return "DistInfo(" + ", ".join(f"{k}={v!r}" for k, v in self.as_dict().items()) + ")"


def _dist():
    torch = _device._import_torch()
    import torch.distributed as dist

    if not dist.is_available():
        raise TrainboxError(f"torch {torch.__version__} was built without torch.distributed")
    return dist


def is_initialized() -> bool:
    """True when a default process group exists (never imports torch to find out)."""
    if "torch" not in sys.modules:
        return False
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def _world_group(dist):
    return dist.group.WORLD


def hccl_socket_port_env(master_port: int | None = None, environ=None, chip: str | None = None) -> dict:
    """Give a job its own HCCL ports, derived from MASTER_PORT (setdefault: values already set win), so two jobs
    on one host with different MASTER_PORTs do not collide. Returns the HCCL port values in effect (empty when
    there is no MASTER_PORT to derive from).

    Most chips get HCCL_HOST_SOCKET_PORT_RANGE / HCCL_NPU_SOCKET_PORT_RANGE. On Atlas A2 (chip 910b, from the
    argument or the stack manifest) those ranges are not supported with MC2 fused operators and must be set on
    every card of a communicator, so the job gets an HCCL_IF_BASE_PORT block instead."""
    env = os.environ if environ is None else environ
    port = master_port
    if port is None and env.get("MASTER_PORT"):
        try:
            port = int(env["MASTER_PORT"])
        except ValueError:
            raise TrainboxError(f"environment: MASTER_PORT={env['MASTER_PORT']!r}: expected an integer") from None
    chip = (chip if chip is not None else _manifest_chip()) or ""
    if chip.lower() in HCCL_SOCKET_RANGE_CHIPS_EXCLUDED:
        keys: tuple = ("HCCL_IF_BASE_PORT",)
    else:
        keys = ("HCCL_HOST_SOCKET_PORT_RANGE", "HCCL_NPU_SOCKET_PORT_RANGE")
    if port is not None:
        if not 0 < int(port) < 65536:
            raise TrainboxError(f"MASTER_PORT={port}: expected a port number 1-65535")
        slot = int(port) % HCCL_SLOTS
        if keys == ("HCCL_IF_BASE_PORT",):
            env.setdefault("HCCL_IF_BASE_PORT", str(HCCL_IF_BASE + slot * HCCL_IF_BASE_WIDTH))
        else:
            offset = slot * HCCL_WIDTH
            for key, base in zip(keys, (HCCL_HOST_BASE, HCCL_NPU_BASE)):
                env.setdefault(key, f"{base + offset}-{base + offset + HCCL_WIDTH - 1}")
    return {key: env[key] for key in keys if key in env}


def _manifest_chip() -> str | None:
    """The chip of the image's stack (None on a bare host or with an unreadable manifest)."""
    from trainbox.runtime.manifest import ManifestError, load_manifest

    try:
        return ((load_manifest() or {}).get("base") or {}).get("chip")
    except ManifestError:
        return None


def _register_exit_hook() -> None:
    global _exit_hook
    if not _exit_hook:
        import atexit

        atexit.register(_at_exit)
        _exit_hook = True


def _accepts_device_id(init_fn) -> bool:
    import inspect

    try:
        return "device_id" in inspect.signature(init_fn).parameters
    except (TypeError, ValueError):
        return False


def _timeout(value):
    if value is None:
        return None
    from datetime import timedelta

    return value if isinstance(value, timedelta) else timedelta(seconds=float(value))


def _env_store(dist, rank, world_size, timeout):
    """The rendezvous store for MASTER_ADDR/MASTER_PORT, with a fresh key prefix on re-initialisation.

    After destroy + init on the same port, a peer could otherwise reach rank 0's old store (still up
    until rank 0 tears it down) or torchrun's agent store, read the previous group's keys and dial a
    dead Gloo address. Reusing one store with a per-generation prefix removes that race."""
    global _store_cache
    key = (os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"], rank, world_size)
    if timeout is None:
        from torch.distributed import distributed_c10d

        timeout = distributed_c10d.default_pg_timeout
    if _store_cache is not None and _store_cache[0] == key:
        base, generation = _store_cache[1], _store_cache[2] + 1
    else:
        _store_cache = None  # a different rendezvous: let the old store (and its port) go first
        base, _, _ = next(dist.rendezvous("env://", rank, world_size, timeout=timeout))
        generation = 0
    base.set_timeout(timeout)
    _store_cache = (key, base, generation)
    return base if generation == 0 else dist.PrefixStore(f"trainbox/generation-{generation}", base)


def _existing_info(dist, backend):
    current = str(dist.get_backend()).lower()
    if backend is not None and backend.lower() != current:
        raise TrainboxError(
            f"init_distributed(backend={backend!r}): the process group already runs {current!r}; "
            "call destroy_distributed() first to change it"
        )
    if _info_cache is not None and _info_cache[0] is _world_group(dist):
        return _info_cache[1]
    env = read_rank_env()
    dev = _device.get_local_device()
    local_rank = env.local_rank if env.local_rank is not None else (dev.index or 0)
    return DistInfo(dist.get_rank(), dist.get_world_size(), local_rank, dev, current, "existing")


def init_distributed(backend: str | None = None, *, rank: int | None = None, world_size: int | None = None,
                     local_rank: int | None = None, master_addr: str | None = None,
                     master_port: int | None = None, timeout=None, mixed: bool = False,
                     bind_device_id: bool = True) -> DistInfo:
    """Create the default process group on the active device and return a DistInfo.

    Reads torchrun (and Ray Train, which exports the same variables) or MPI environments; arguments
    override them; with nothing set it starts a one-process group on an in-memory store. Binds the
    device before the group (HCCL needs it), passes device_id only where the installed torch accepts it,
    derives HCCL port ranges from MASTER_PORT, and exports RANK / WORLD_SIZE / LOCAL_RANK /
    MASTER_ADDR / MASTER_PORT for code that reads them later. Idempotent: a second call
    returns the existing group's DistInfo. `timeout` is seconds or a timedelta.
    """
    global _info_cache
    dist = _dist()
    if dist.is_initialized():
        return _existing_info(dist, backend)

    env = read_rank_env()
    if (rank is None) != (world_size is None):
        raise TrainboxError("init_distributed: pass rank and world_size together (or neither)")
    source = "arguments" if rank is not None else env.source
    if rank is None:
        rank, world_size = (env.rank, env.world_size) if env.rank is not None else (0, 1)
    if not 0 <= rank < world_size:
        raise TrainboxError(f"init_distributed: rank {rank} is outside world size {world_size}")
    if local_rank is None:
        local_rank = env.local_rank

    device_type = _device.get_device_type()
    backend = backend or _device.get_dist_backend(device_type, mixed=mixed)
    dev = _device.get_local_device(device_type, local_rank=local_rank)
    if device_type != "cpu":
        _device.set_device(dev)  # before the group: HCCL binds its communicator to the current device
    if local_rank is None:
        local_rank = dev.index if dev.index is not None else 0

    kwargs = {"backend": backend, "rank": rank, "world_size": world_size}
    if timeout is not None:
        kwargs["timeout"] = _timeout(timeout)
    addr = master_addr or env.master_addr
    port = master_port or env.master_port
    if addr is None or port is None:
        if world_size > 1:
            raise TrainboxError(
                f"init_distributed: world size {world_size} ({source}) needs MASTER_ADDR and MASTER_PORT "
                "(torchrun sets them; with mpirun pass -x MASTER_ADDR=<rank-0 host> -x MASTER_PORT=<port>, "
                "or call init_distributed(master_addr=..., master_port=...))"
            )
        kwargs["store"] = dist.HashStore()  # one process: no rendezvous, no port to collide on
    else:
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = str(addr), str(port)
        kwargs["store"] = _env_store(dist, rank, world_size, kwargs.get("timeout"))
        if "hccl" in backend.lower():
            hccl_socket_port_env(int(port))
    # What this group really is, for code that reads the torchrun variables later (Megatron, ...).
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(local_rank))
    if bind_device_id and device_type != "cpu" and _accepts_device_id(dist.init_process_group):
        kwargs["device_id"] = dev

    dist.init_process_group(**kwargs)
    _register_exit_hook()
    info = DistInfo(rank, world_size, local_rank, dev, str(dist.get_backend()).lower(), source)
    _info_cache = (_world_group(dist), info)
    return info


def destroy_distributed(synchronize: bool = True) -> bool:
    """Destroy every process group (and the cached Gloo group). Idempotent: False when there was none.

    With `synchronize` (the default) the ranks first meet at a barrier, so that no rank tears its
    connections down while a peer still has a collective in flight. Afterwards groups that only
    reference cycles hold are freed (see _release_groups). A Gloo group that outlives this call (DDP
    keeps it) has worker threads that may still drop tensors with Python references; if that happens
    during interpreter shutdown the thread cannot take the GIL and the process dies with "terminate
    called without an active exception" (SIGABRT), which the exit hook prevents (_at_exit, _drain_gloo_workers).
    The rendezvous store stays open (on rank 0,
    its port stays bound) so that init_distributed() on the same MASTER_ADDR/MASTER_PORT can form a
    new group without racing against stale keys."""
    global _info_cache, _gloo_cache
    _info_cache = _gloo_cache = None
    if not is_initialized():
        return False
    import torch.distributed as dist

    if synchronize and dist.get_world_size() > 1:
        try:
            dist.barrier()
        except RuntimeError as exc:  # a peer already gone: tear down our side anyway
            print(f"trainbox.dist: warning: barrier before destroy failed ({exc}); destroying anyway",
                  file=sys.stderr)
    dist.destroy_process_group()
    _release_groups()
    return True


_GLOO_WORKER = "pt_gloo_runloop"  # the thread name ProcessGroupGloo gives its workers (Linux /proc)


def _gloo_worker_states() -> list[str]:
    """The scheduler state (R running, S sleeping, ...) of each ProcessGroupGloo worker thread; [] where
    /proc cannot tell (not Linux)."""
    states = []
    try:
        tasks = list(os.scandir("/proc/self/task"))
    except OSError:
        return []
    for task in tasks:
        try:
            with open(os.path.join(task.path, "stat")) as fh:
                stat = fh.read()
        except OSError:
            continue  # the thread ended meanwhile
        name, _, rest = stat.partition("(")[2].rpartition(")")
        if name == _GLOO_WORKER:
            states.append(rest.split()[0] if rest.split() else "?")
    return states


def gloo_worker_threads() -> int:
    """How many ProcessGroupGloo worker threads this process still has (0 where /proc cannot tell)."""
    return len(_gloo_worker_states())


def _release_groups() -> None:
    """Free destroyed groups that only reference cycles still hold, so their destructors join the
    Gloo worker threads now, while the interpreter is fully alive."""
    import gc

    gc.collect()


def _drain_gloo_workers(timeout: float = 2.0) -> None:
    """Let Gloo worker threads finish dropping their last work before the interpreter finalises.

    A worker frees a finished collective's work (and its tensors, whose Python objects need the GIL)
    just after the waiting rank has been released. torch keeps the group, and so its workers, alive past
    destroy_process_group() once DistributedDataParallel has used it, so they cannot be joined; what
    can be done is to hand the GIL over (sleep) until no worker is running, seen three times in a row."""
    import time

    deadline = time.monotonic() + timeout
    quiet = 0
    while quiet < 3 and time.monotonic() < deadline:
        time.sleep(0.002)  # releases the GIL: a worker waiting for it to free a tensor gets it now
        states = _gloo_worker_states()
        quiet = quiet + 1 if "R" not in states else 0


def _at_exit() -> None:
    """Registered by init_distributed: runs before interpreter shutdown, when the job's frames are gone.
    A job that never called destroy_distributed is torn down here (without the barrier: its peers may
    be gone); either way the groups are released before the interpreter starts to finalise."""
    try:
        if is_initialized():
            destroy_distributed(synchronize=False)
        elif "torch" in sys.modules:
            _release_groups()
    except Exception as exc:  # noqa: BLE001 - at exit a warning is all that is left to give
        print(f"trainbox.dist: warning: process group teardown at exit failed: {exc}", file=sys.stderr)
    _drain_gloo_workers()


def device_mesh(shape, names=None):
    """torch DeviceMesh of `shape` (int or tuple) with optional dim `names` on the active device type.
    Initialises the process group first when needed."""
    info = init_distributed()
    shape = (int(shape),) if isinstance(shape, int) else tuple(int(s) for s in shape)
    size = 1
    for s in shape:
        size *= s
    if size != info.world_size:
        raise TrainboxError(f"device_mesh: shape {shape} holds {size} ranks but the world size is "
                            f"{info.world_size}")
    if names is not None:
        names = (names,) if isinstance(names, str) else tuple(names)
        if len(names) != len(shape):
            raise TrainboxError(f"device_mesh: {len(names)} names {names} for {len(shape)} dimensions")
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(info.device.type, shape, mesh_dim_names=names)


def clear_bound_device_id(group=None) -> bool:
    """Clear `group`'s (default: the default group's) bound_device_id, which on some torch versions
    is carried into later Gloo subgroups and breaks them. Guarded: the attribute may be missing or
    read-only; returns True only when it was cleared. Call before code that creates Gloo groups."""
    if not is_initialized():
        return False
    import torch.distributed as dist

    try:
        pg = group if group is not None else _world_group(dist)
        if getattr(pg, "bound_device_id", None) is None:
            return False
        pg.bound_device_id = None
    except (AttributeError, TypeError, RuntimeError, ValueError):
        return False
    return getattr(pg, "bound_device_id", None) is None


def _default_backend_name(dist) -> str:
    return str(dist.get_backend()).lower()


def object_group(group=None):
    """The group Python-object collectives should use: `group` when given; with an hccl default
    backend a Gloo group over all ranks (created once, collectively, then cached), because object
    collectives on the default HCCL group can hang; otherwise None (the default group)."""
    global _gloo_cache
    if group is not None:
        return group
    dist = _dist()
    if "hccl" not in _default_backend_name(dist):
        return None
    world = _world_group(dist)
    if _gloo_cache is not None and _gloo_cache[0] is world:
        return _gloo_cache[1]
    clear_bound_device_id()
    gloo = dist.new_group(backend="gloo")
    _gloo_cache = (world, gloo)
    return gloo


def all_gather_object(obj, group=None) -> list:
    """Every rank's `obj`, in rank order (a new list; torch's version fills one in place).
    Without a process group: [obj]."""
    if not is_initialized():
        return [obj]
    import torch.distributed as dist

    g = object_group(group)
    out = [None] * dist.get_world_size(g)
    dist.all_gather_object(out, obj, group=g)
    return out


def gather_object(obj, dst: int = 0, group=None):
    """Every rank's `obj` as a list on global rank `dst`; None on the other ranks. Without a group: [obj]."""
    if not is_initialized():
        return [obj]
    import torch.distributed as dist

    g = object_group(group)
    out = [None] * dist.get_world_size(g) if dist.get_rank() == dst else None
    dist.gather_object(obj, out, dst=dst, group=g)
    return out


def broadcast_object_list(objects: list, src: int = 0, group=None) -> list:
    """Replace `objects` (same length on every rank) with global rank `src`'s, in place; returns it."""
    if not is_initialized():
        return objects
    import torch.distributed as dist

    dist.broadcast_object_list(objects, src=src, group=object_group(group))
    return objects


if __name__ == "__main__":  # `python3 -m` on a library module must fail loudly, not pass silently
    from trainbox.runtime.errors import not_a_command

    raise SystemExit(not_a_command(__spec__.name))
