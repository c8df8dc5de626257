"""A tiny model trained for a few steps with DDP over Gloo, through trainbox.runtime.dist (the `cpu-ddp` recipe).

Run by torchrun (`torchrun --standalone --nproc-per-node 2 cpu_ddp.py`). Every rank draws its own shard of
a fixed linear-regression problem; rank 0 prints the world-averaged loss per step and the job fails unless
the loss fell. It also gathers a Python object from every rank through trainbox.runtime.dist.all_gather_object,
the collective that routes through a Gloo group on accelerators.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from trainbox.runtime.dist import all_gather_object, destroy_distributed, init_distributed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=int(os.environ.get("CPU_DDP_STEPS", "30")))
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--output-dir", default="", help="rank 0 writes metrics.json here (empty: nowhere)")
    ap.add_argument("--min-drop", type=float, default=0.5,
                    help="fail unless the final loss is at most this fraction of the first")
    args = ap.parse_args(argv)
    if args.steps < 2:
        ap.error("--steps: at least 2 (the loss has to have somewhere to fall)")

    info = init_distributed()
    torch.manual_seed(0)  # the same model on every rank (DDP also broadcasts rank 0's weights)
    true_w = torch.randn(16, 1)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr)
    gen = torch.Generator().manual_seed(1000 + info.rank)  # each rank its own data shard

    losses = []
    for step in range(args.steps):
        x = torch.randn(args.batch, 16, generator=gen)
        y = x @ true_w + 0.01 * torch.randn(args.batch, 1, generator=gen)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad()
        loss.backward()  # DDP all-reduces the gradients over Gloo here
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        mean /= info.world_size
        losses.append(mean.item())
        if info.rank == 0:
            print(f"step {step:3d} loss {losses[-1]:.6f}", flush=True)

    ranks = all_gather_object({"rank": info.rank, "host": socket.gethostname(), "pid": os.getpid(),
                               "final_loss": losses[-1], "backend": info.backend})
    ok = losses[-1] <= args.min_drop * losses[0]
    if info.rank == 0:
        print(f"cpu-ddp: world size {info.world_size}, backend {info.backend}, device {info.device}; "
              f"ranks reporting: {sorted(r['rank'] for r in ranks)}", flush=True)
        verdict = "fell" if ok else "did NOT fall enough"
        print(f"cpu-ddp: loss {verdict}: {losses[0]:.6f} -> {losses[-1]:.6f} over {args.steps} steps", flush=True)
        if args.output_dir:
            os.makedirs(args.output_dir, exist_ok=True)
            with open(os.path.join(args.output_dir, "metrics.json"), "w") as fh:
                json.dump({"world_size": info.world_size, "backend": info.backend, "losses": losses,
                           "ranks": ranks, "ok": ok}, fh, indent=2)
    destroy_distributed()
    if len(ranks) != info.world_size:
        print(f"cpu-ddp: all_gather_object returned {len(ranks)} objects for {info.world_size} ranks",
              file=sys.stderr)
        return 1
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
