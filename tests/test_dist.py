"""trainbox.runtime.dist and trainbox.runtime.rankenv: unit checks, a one-process group, and real multi-process runs
(CPU, Gloo) launched by torchrun and by an MPI-style environment."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from trainbox.runtime import dist as tdist  # noqa: E402
from trainbox.runtime.errors import TrainboxError  # noqa: E402
from trainbox.runtime.rankenv import read_rank_env  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def saved_environ():
    """init_distributed exports RANK/WORLD_SIZE/... on purpose; put the environment back afterwards."""
    saved = dict(os.environ)
    for name in ("TRAINBOX_DEVICE", "TRAINBOX_DIST_BACKEND", "RANK", "WORLD_SIZE", "LOCAL_RANK",
                 "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "HCCL_HOST_SOCKET_PORT_RANGE",
                 "HCCL_NPU_SOCKET_PORT_RANGE"):
        os.environ.pop(name, None)
    for name in [n for n in os.environ if n.startswith(("OMPI_", "PMI_", "MV2_"))]:
        os.environ.pop(name)
    yield os.environ
    tdist.destroy_distributed()
    os.environ.clear()
    os.environ.update(saved)


# ------------------------------------------------------------------------------------------ rankenv


def test_rankenv_torchrun():
    env = read_rank_env({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4",
                         "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"})
    assert (env.source, env.rank, env.world_size, env.local_rank, env.local_world_size) == ("torchrun", 3, 8, 1, 4)
    assert (env.master_addr, env.master_port, env.local_rank_var) == ("10.0.0.1", 29500, "LOCAL_RANK")


@pytest.mark.parametrize("variables, local_var", [
    ({"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "6", "OMPI_COMM_WORLD_LOCAL_RANK": "2"},
     "OMPI_COMM_WORLD_LOCAL_RANK"),
    ({"PMI_RANK": "5", "PMI_SIZE": "6", "MPI_LOCALRANKID": "2"}, "MPI_LOCALRANKID"),
    ({"MV2_COMM_WORLD_RANK": "5", "MV2_COMM_WORLD_SIZE": "6", "MV2_COMM_WORLD_LOCAL_RANK": "2"},
     "MV2_COMM_WORLD_LOCAL_RANK"),
])
def test_rankenv_mpi(variables, local_var):
    env = read_rank_env(variables)
    assert (env.source, env.rank, env.world_size, env.local_rank, env.local_rank_var) == ("mpi", 5, 6, 2, local_var)
    assert env.master_addr is None and env.master_port is None


def test_rankenv_torchrun_wins_over_mpi():
    env = read_rank_env({"RANK": "1", "WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "4"})
    assert (env.source, env.rank, env.world_size) == ("torchrun", 1, 2)


def test_rankenv_single():
    env = read_rank_env({})
    assert (env.source, env.rank, env.world_size, env.local_rank) == ("single", None, None, None)


@pytest.mark.parametrize("variables, message", [
    ({"RANK": "0"}, "WORLD_SIZE is missing"),
    ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK='x': expected an integer"),
    ({"RANK": "2", "WORLD_SIZE": "2"}, "rank 2 is outside world size 2"),
    ({"RANK": "0", "WORLD_SIZE": "0"}, "WORLD_SIZE=0: expected an integer >= 1"),
    ({"MASTER_PORT": "http"}, "MASTER_PORT='http'"),
])
def test_rankenv_errors(variables, message):
    with pytest.raises(TrainboxError, match="environment") as err:
        read_rank_env(variables)
    assert message in str(err.value)


# ------------------------------------------------------------------------------------- HCCL ports


def test_hccl_ports_follow_master_port():
    a, b = {"MASTER_PORT": "29500"}, {"MASTER_PORT": "29501"}
    ra, rb = tdist.hccl_socket_port_env(environ=a), tdist.hccl_socket_port_env(environ=b)
    assert ra == {"HCCL_HOST_SOCKET_PORT_RANGE": "22400-22431", "HCCL_NPU_SOCKET_PORT_RANGE": "26496-26527"}
    assert a["HCCL_HOST_SOCKET_PORT_RANGE"] == "22400-22431"  # written with setdefault semantics

    def span(text):
        lo, hi = map(int, text.split("-"))
        return set(range(lo, hi + 1))

    taken = [span(v) for r in (ra, rb) for v in r.values()]
    assert all(x.isdisjoint(y) for i, x in enumerate(taken) for y in taken[i + 1:])  # no collisions
    assert all(1024 < p < 32768 for s in taken for p in s)  # below the ephemeral range


def test_hccl_ports_keep_explicit_values():
    env = {"MASTER_PORT": "29500", "HCCL_NPU_SOCKET_PORT_RANGE": "auto"}
    result = tdist.hccl_socket_port_env(environ=env)
    assert result == {"HCCL_HOST_SOCKET_PORT_RANGE": "22400-22431", "HCCL_NPU_SOCKET_PORT_RANGE": "auto"}


def test_hccl_ports_without_master_port():
    assert tdist.hccl_socket_port_env(environ={}) == {}
    assert tdist.hccl_socket_port_env(6000, environ={})["HCCL_HOST_SOCKET_PORT_RANGE"] == "24064-24095"
    with pytest.raises(TrainboxError, match="MASTER_PORT=70000"):
        tdist.hccl_socket_port_env(70000, environ={})


# ------------------------------------------------------------------------------- one process, in-process


def test_single_process_group(saved_environ):
    assert tdist.all_gather_object("solo") == ["solo"]  # no group yet: plain answers
    assert tdist.gather_object(1) == [1] and tdist.broadcast_object_list([2]) == [2]
    assert tdist.destroy_distributed() is False

    info = tdist.init_distributed()
    assert info.as_dict() == {"rank": 0, "world_size": 1, "local_rank": 0, "device": "cpu",
                              "backend": "gloo", "source": "single"}
    assert tdist.is_initialized() and torch.distributed.get_world_size() == 1
    assert tdist.init_distributed() is info  # idempotent
    assert saved_environ["RANK"] == "0" and saved_environ["WORLD_SIZE"] == "1"
    with pytest.raises(TrainboxError, match="already runs 'gloo'"):
        tdist.init_distributed(backend="nccl")
    assert tdist.all_gather_object({"a": 1}) == [{"a": 1}]
    assert tdist.object_group() is None  # gloo default group: no extra group
    mesh = tdist.device_mesh(1, "dp")
    assert mesh.device_type == "cpu" and mesh.mesh_dim_names == ("dp",)
    with pytest.raises(TrainboxError, match=r"shape \(2,\) holds 2 ranks but the world size is 1"):
        tdist.device_mesh(2)
    assert tdist.clear_bound_device_id() is False  # nothing bound on the CPU
    assert tdist.destroy_distributed() is True
    assert tdist.destroy_distributed() is False and not tdist.is_initialized()


def test_world_without_master_addr_is_refused(saved_environ):
    saved_environ.update(OMPI_COMM_WORLD_RANK="0", OMPI_COMM_WORLD_SIZE="2")
    with pytest.raises(TrainboxError, match="needs MASTER_ADDR and MASTER_PORT") as err:
        tdist.init_distributed()
    assert "mpirun pass -x MASTER_ADDR" in str(err.value)
    assert not tdist.is_initialized()


def test_rank_and_world_size_go_together(saved_environ):
    with pytest.raises(TrainboxError, match="pass rank and world_size together"):
        tdist.init_distributed(rank=0)


def test_clear_bound_device_id_is_guarded(saved_environ):
    tdist.init_distributed()

    class ReadOnly:  # stand-in for a process group whose attribute cannot be written
        @property
        def bound_device_id(self):
            return torch.device("cuda", 0)

    class Missing:  # stand-in for older torch without the attribute
        pass

    class Writable:
        bound_device_id = torch.device("cuda", 1)

    assert tdist.clear_bound_device_id(ReadOnly()) is False
    assert tdist.clear_bound_device_id(Missing()) is False
    writable = Writable()
    assert tdist.clear_bound_device_id(writable) is True and writable.bound_device_id is None


# ------------------------------------------------------------------------------ real multi-process runs

WORKER = r'''
import json, os, sys
from trainbox.runtime import dist as tdist

out = {}
info = tdist.init_distributed(timeout=60)
out["info"] = info.as_dict()
out["exported"] = [os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK")]
out["idempotent"] = tdist.init_distributed() is info
world = info.world_size

flat = tdist.device_mesh(world, "dp")
out["flat"] = [flat.device_type, list(flat.mesh_dim_names), flat.size()]
grid = tdist.device_mesh((1, world), ("pp", "dp"))
out["grid_dp"] = grid["dp"].size()
out["grid_gather"] = tdist.all_gather_object(info.rank, group=grid.get_group("dp"))

out["all_gather"] = tdist.all_gather_object({"rank": info.rank, "sq": info.rank ** 2})
out["gather"] = tdist.gather_object(f"r{info.rank}", dst=world - 1)
out["broadcast"] = tdist.broadcast_object_list([{"seed": 1234} if info.rank == 0 else None, None], src=0)
out["destroyed"] = [tdist.destroy_distributed(), tdist.destroy_distributed()]

info2 = tdist.init_distributed(timeout=60)
out["again"] = [info2.rank, info2.world_size, tdist.all_gather_object(info2.rank * 2)]
out["destroyed_again"] = tdist.destroy_distributed()
with open(os.path.join(sys.argv[1], f"rank{info.rank}.json"), "w") as f:
    json.dump(out, f)
'''


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TRAINBOX_", "OMPI_", "PMI_", "MV2_"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env["PYTHONPATH"] = str(REPO / "python")
    env["OMP_NUM_THREADS"] = "1"
    env.update({k: str(v) for k, v in extra.items()})
    return env


def _wait(procs, timeout=120):
    """Wait for every process (each in its own session); kill them all when the time is up."""
    try:
        logs = [p.communicate(timeout=timeout)[0] for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            os.killpg(p.pid, signal.SIGKILL)
        logs = [p.communicate()[0] for p in procs]
        pytest.fail("distributed run hung:\n" + "\n".join(logs))
    assert [p.returncode for p in procs] == [0] * len(procs), "\n".join(logs)


def _popen(args, env):
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            cwd=REPO, start_new_session=True)


def _check(outdir: Path, world: int, source: str):
    ranks = [json.loads((outdir / f"rank{r}.json").read_text()) for r in range(world)]
    for r, out in enumerate(ranks):
        assert out["info"] == {"rank": r, "world_size": world, "local_rank": r, "device": "cpu",
                               "backend": "gloo", "source": source}
        assert out["exported"] == [str(r), str(world), str(r)]
        assert out["idempotent"] is True
        assert out["flat"] == ["cpu", ["dp"], world]
        assert out["grid_dp"] == world and out["grid_gather"] == list(range(world))
        assert out["all_gather"] == [{"rank": i, "sq": i * i} for i in range(world)]
        assert out["gather"] == ([f"r{i}" for i in range(world)] if r == world - 1 else None)
        assert out["broadcast"] == [{"seed": 1234}, None]
        assert out["destroyed"] == [True, False]
        assert out["again"] == [r, world, [2 * i for i in range(world)]]
        assert out["destroyed_again"] is True


@pytest.mark.slow
def test_torchrun_two_processes(tmp_path):
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    proc = _popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                   "--max-restarts", "0", str(worker), str(tmp_path)], _env())
    _wait([proc])
    _check(tmp_path, 2, "torchrun")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_mpi_environment_three_processes(tmp_path):
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    port = _free_port()
    # What `mpirun -np 3 -x MASTER_ADDR -x MASTER_PORT` leaves in each process's environment.
    procs = [_popen([sys.executable, str(worker), str(tmp_path)],
                    _env(OMPI_COMM_WORLD_RANK=r, OMPI_COMM_WORLD_SIZE=3, OMPI_COMM_WORLD_LOCAL_RANK=r,
                         OMPI_COMM_WORLD_LOCAL_SIZE=3, MASTER_ADDR="127.0.0.1", MASTER_PORT=port))
             for r in range(3)]
    _wait(procs)
    _check(tmp_path, 3, "mpi")


@pytest.mark.slow
def test_explicit_arguments_override_environment(tmp_path):
    port = _free_port()
    code = textwrap.dedent(f"""
        import sys
        from trainbox.runtime import dist
        rank = int(sys.argv[1])
        info = dist.init_distributed("gloo", rank=rank, world_size=2, master_addr="127.0.0.1",
                                     master_port={port}, timeout=60)
        import os
        print(info.source, info.rank, os.environ["RANK"], os.environ["WORLD_SIZE"], dist.all_gather_object(rank))
        dist.destroy_distributed()
        """)
    procs = [_popen([sys.executable, "-c", code, str(r)], _env(RANK=0, WORLD_SIZE=1)) for r in range(2)]
    try:
        logs = [p.communicate(timeout=120)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    assert [p.returncode for p in procs] == [0, 0], logs
    assert [log.strip().splitlines()[-1] for log in logs] == ["arguments 0 0 2 [0, 1]", "arguments 1 1 2 [0, 1]"]


def test_atlas_a2_gets_an_if_base_port_block_not_socket_ranges():
    """On 910B the socket ranges break MC2 fused operators; a per-job HCCL_IF_BASE_PORT block is used instead."""
    a, b = {"MASTER_PORT": "29500"}, {"MASTER_PORT": "29501"}
    ra = tdist.hccl_socket_port_env(environ=a, chip="910b")
    rb = tdist.hccl_socket_port_env(environ=b, chip="910b")
    assert set(ra) == {"HCCL_IF_BASE_PORT"} and "HCCL_HOST_SOCKET_PORT_RANGE" not in a
    pa, pb = int(ra["HCCL_IF_BASE_PORT"]), int(rb["HCCL_IF_BASE_PORT"])
    assert abs(pa - pb) >= 32 and all(1024 <= p <= 65520 and p + 31 < 32768 for p in (pa, pb))
    assert tdist.hccl_socket_port_env(environ={"MASTER_PORT": "29500"}, chip="a3").keys() == {
        "HCCL_HOST_SOCKET_PORT_RANGE", "HCCL_NPU_SOCKET_PORT_RANGE"}
