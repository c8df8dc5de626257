#!/usr/bin/env python3
"""trainbox.runtime.device / trainbox.runtime.dist on a real NVIDIA GPU (not collected by pytest: no GPU in CI).

    python tests/gpu/check_cuda.py            # from the repository root; needs torch with CUDA

Runs two processes (ranks 0 and 1 on cuda:0 and cuda:1) when at least two GPUs are visible, else one.
Prints one PASS/FAIL line per check; exits 0 when all pass, 1 when any fails, 2 when no GPU is usable.
Checks: device type, nccl backend, init_distributed with device_id, device mesh, object collectives,
memory helpers, capabilities, destroy and init again.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))

RESULTS: list[bool] = []


def check(name, fn):
    prefix = f"[rank {os.environ.get('RANK', '-')}]"
    try:
        detail = fn()
    except Exception as exc:
        RESULTS.append(False)
        print(f"{prefix} FAIL {name}: {type(exc).__name__}: {exc}", flush=True)
        if os.environ.get("CHECK_CUDA_TRACEBACK"):
            traceback.print_exc()
        return None
    RESULTS.append(True)
    print(f"{prefix} PASS {name}" + (f" ({detail})" if detail not in (None, True) else ""), flush=True)
    return detail


def expect(condition, message):
    if not condition:
        raise AssertionError(message)


def worker() -> int:
    import torch
    import torch.distributed as dist

    from trainbox.runtime import device as tdev
    from trainbox.runtime import dist as tdist

    rank, world, local = (int(os.environ[k]) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
    want = torch.device("cuda", local)

    def device_type():
        expect(tdev.get_device_type() == "cuda", f"got {tdev.get_device_type()!r}")
        return f"torch {torch.__version__}, {torch.cuda.get_device_name(local)}"

    def override():
        os.environ["TRAINBOX_DEVICE"] = "cpu"
        try:
            expect(tdev.get_device_type() == "cpu", "TRAINBOX_DEVICE=cpu ignored")
        finally:
            del os.environ["TRAINBOX_DEVICE"]
        expect(tdev.get_device_type() == "cuda", "answer frozen after the override was removed")

    def backend():
        expect(tdev.get_dist_backend() == "nccl", tdev.get_dist_backend())
        expect(tdev.get_dist_backend(mixed=True) == "cpu:gloo,cuda:nccl", tdev.get_dist_backend(mixed=True))

    def local_device():
        expect(tdev.get_local_device() == want, f"{tdev.get_local_device()} != {want}")

    def capabilities():
        caps = tdev.capabilities()
        tdev.require("sdpa")
        tdev.require("bf16_gru")
        expect(caps["fused_adam"], "fused Adam should be available on CUDA")
        return ", ".join(f"{k}={'yes' if v else 'no'}" for k, v in caps.items())

    info_box = {}

    def init():
        info = tdist.init_distributed(timeout=120)
        info_box["info"] = info
        expect((info.rank, info.world_size, info.local_rank) == (rank, world, local), repr(info))
        expect(info.backend == "nccl" and info.device == want, repr(info))
        expect(torch.cuda.current_device() == local, f"current device {torch.cuda.current_device()}")
        expect(tdist.init_distributed() is info, "second init_distributed() is not idempotent")
        return repr(info)

    def device_id_bound():
        if not tdist._accepts_device_id(dist.init_process_group):
            return "this torch has no device_id parameter: not passed (as intended)"
        bound = getattr(dist.group.WORLD, "bound_device_id", None)
        expect(bound == want, f"bound_device_id {bound} != {want}")
        return f"bound_device_id={bound}"

    def all_reduce():
        t = torch.full((4,), float(rank + 1), device=want)
        dist.all_reduce(t)
        expect(t.tolist() == [world * (world + 1) / 2] * 4, t.tolist())

    def mesh():
        flat = tdist.device_mesh(world, "dp")
        expect(flat.device_type == "cuda" and flat.mesh_dim_names == ("dp",), repr(flat))
        grid = tdist.device_mesh((1, world), ("pp", "dp"))
        expect(grid["dp"].size() == world, repr(grid))
        t = torch.ones(2, device=want)
        dist.all_reduce(t, group=grid.get_group("dp"))
        expect(t.tolist() == [float(world)] * 2, t.tolist())

    def objects():
        expect(tdist.object_group() is None, "nccl should use the default group for objects")
        got = tdist.all_gather_object({"rank": rank})
        expect(got == [{"rank": r} for r in range(world)], got)
        gathered = tdist.gather_object(rank * 10, dst=0)
        expect(gathered == ([r * 10 for r in range(world)] if rank == 0 else None), gathered)
        box = tdist.broadcast_object_list([{"seed": 7} if rank == 0 else None], src=0)
        expect(box == [{"seed": 7}], box)

    def memory():
        tdev.synchronize()
        tdev.empty_cache()
        tdev.reset_peak_memory_stats()
        before = tdev.memory_stats()
        block = torch.empty(64 << 20, dtype=torch.uint8, device=want)
        during = tdev.memory_stats()
        expect(during["allocated"] - before["allocated"] >= 64 << 20, (before, during))
        expect(during["max_allocated"] >= during["allocated"], during)
        del block
        tdev.empty_cache()
        tdev.reset_peak_memory_stats()
        after = tdev.memory_stats()
        expect(after["max_allocated"] < during["max_allocated"], (during, after))
        expect(after["reserved"] <= during["reserved"], (during, after))
        return f"64 MiB seen: allocated {during['allocated']} B, peak reset to {after['max_allocated']} B"

    def gloo_after_clearing():
        cleared = tdist.clear_bound_device_id()
        group = dist.new_group(backend="gloo")
        out = [None] * world
        dist.all_gather_object(out, rank, group=group)
        expect(out == list(range(world)), out)
        return f"bound_device_id cleared: {cleared}"

    def destroy_and_again():
        expect(tdist.destroy_distributed() is True, "destroy returned False")
        expect(tdist.destroy_distributed() is False, "second destroy not idempotent")
        info = tdist.init_distributed(timeout=120)
        expect(info.backend == "nccl", repr(info))
        got = tdist.all_gather_object(rank)
        expect(got == list(range(world)), got)
        expect(tdist.destroy_distributed() is True, "destroy after re-init returned False")

    for name, fn in [("device type", device_type), ("TRAINBOX_DEVICE override", override),
                     ("dist backend", backend), ("local device", local_device), ("capabilities", capabilities),
                     ("init_distributed", init)]:
        check(name, fn)
    if "info" in info_box:
        for name, fn in [("init_distributed device_id", device_id_bound), ("all_reduce", all_reduce),
                         ("device mesh", mesh), ("object collectives", objects), ("memory helpers", memory),
                         ("gloo group after clear_bound_device_id", gloo_after_clearing),
                         ("destroy and init again", destroy_and_again)]:
            check(name, fn)
    tdist.destroy_distributed()
    return 0 if all(RESULTS) else 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    if "--worker" in sys.argv:
        return worker()
    try:
        import torch
    except Exception as exc:
        print(f"FAIL import torch: {type(exc).__name__}: {exc}")
        return 2
    if not torch.cuda.is_available():
        print(f"FAIL no usable CUDA device (torch {torch.__version__}, CUDA build {torch.version.cuda})")
        return 2
    world = 2 if torch.cuda.device_count() >= 2 else 1
    print(f"torch {torch.__version__} CUDA {torch.version.cuda}; {torch.cuda.device_count()} GPU(s); "
          f"running {world} process(es)", flush=True)
    port = _free_port()
    env_base = {k: v for k, v in os.environ.items() if not k.startswith("TRAINBOX_")}
    procs = [
        subprocess.Popen([sys.executable, __file__, "--worker"],
                         env={**env_base, "RANK": str(r), "WORLD_SIZE": str(world), "LOCAL_RANK": str(r),
                              "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
                              "MASTER_PORT": str(port)})
        for r in range(world)
    ]
    deadline = time.monotonic() + 300
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=max(1, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            print("FAIL timeout: workers did not finish within 300 s")
            return 1
    ok = all(c == 0 for c in codes)
    print(("PASS" if ok else "FAIL") + f" overall: worker exit codes {codes}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
