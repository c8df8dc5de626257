"""Rank, world size and rendezvous address as the launcher left them in the environment.

Runtime module: standard library only. Read on every call (never cached), because launchers such as
Ray actors or tests change the environment after import.

Sources, first match wins:
  torchrun  RANK / WORLD_SIZE / LOCAL_RANK / LOCAL_WORLD_SIZE (also what Ray Train, DeepSpeed and
            accelerate export)
  mpi       Open MPI (OMPI_COMM_WORLD_*), MPICH / Intel MPI (PMI_RANK, PMI_SIZE, MPI_LOCALRANKID,
            MPI_LOCALNRANKS), MVAPICH (MV2_COMM_WORLD_*)
  single    nothing set: rank 0 of 1
MASTER_ADDR / MASTER_PORT are read as they are; MPI launchers do not set them (pass them with
`mpirun -x MASTER_ADDR=... -x MASTER_PORT=...`).
"""

from __future__ import annotations

import os

from trainbox.runtime.errors import TrainboxError

# (rank, world size, local rank, local world size) variable names per MPI flavour.
_MPI_FLAVOURS = (
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
    ("MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_SIZE"),
)


class RankEnv:
    """What the launcher says about this process. Fields may be None where the launcher is silent."""

    __slots__ = ("rank", "world_size", "local_rank", "local_world_size", "master_addr", "master_port",
                 "source", "local_rank_var")

    def __init__(self, rank, world_size, local_rank, local_world_size, master_addr, master_port, source,
                 local_rank_var=None):
        self.rank = rank
        self.world_size = world_size
        self.local_rank = local_rank
        self.local_world_size = local_world_size
        self.master_addr = master_addr
        self.master_port = master_port
        self.source = source
        self.local_rank_var = local_rank_var

    def __repr__(self):
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__slots__)
        return f"RankEnv({fields})"


def _int(env, name, minimum=0):
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        raise TrainboxError(f"environment: {name}={raw!r}: expected an integer; fix or unset it") from None
    if value < minimum:
        raise TrainboxError(f"environment: {name}={value}: expected an integer >= {minimum}")
    return value


def read_rank_env(environ=None) -> RankEnv:
    """Read rank information from `environ` (default os.environ)."""
    env = os.environ if environ is None else environ
    master_addr = env.get("MASTER_ADDR") or None
    master_port = _int(env, "MASTER_PORT", minimum=1)

    rank, world = _int(env, "RANK"), _int(env, "WORLD_SIZE", minimum=1)
    if rank is not None or world is not None:
        if rank is None or world is None:
            missing = "WORLD_SIZE" if world is None else "RANK"
            raise TrainboxError(f"environment: RANK and WORLD_SIZE must be set together; {missing} is missing")
        source, lr_names = "torchrun", ("LOCAL_RANK", "LOCAL_WORLD_SIZE")
    else:
        source, lr_names = "single", ("LOCAL_RANK", "LOCAL_WORLD_SIZE")
        for rank_var, size_var, lrank_var, lsize_var in _MPI_FLAVOURS:
            rank, world = _int(env, rank_var), _int(env, size_var, minimum=1)
            if rank is not None and world is not None:
                source, lr_names = "mpi", (lrank_var, lsize_var)
                break
        else:
            rank, world = None, None

    local_rank_var = lr_names[0]
    local_rank = _int(env, lr_names[0])
    if local_rank is None and source == "mpi" and "LOCAL_RANK" in env:
        local_rank_var, local_rank = "LOCAL_RANK", _int(env, "LOCAL_RANK")
    local_world = _int(env, lr_names[1], minimum=1)

    if rank is not None and world is not None and not 0 <= rank < world:
        raise TrainboxError(f"environment ({source}): rank {rank} is outside world size {world}")
    return RankEnv(rank, world, local_rank, local_world, master_addr, master_port, source,
                   local_rank_var if local_rank is not None else None)


if __name__ == "__main__":  # `python3 -m` on a library module must fail loudly, not pass silently
    from trainbox.runtime.errors import not_a_command

    raise SystemExit(not_a_command(__spec__.name))
