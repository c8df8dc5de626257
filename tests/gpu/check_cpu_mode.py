#!/usr/bin/env python3
"""TRAINBOX_DEVICE=cpu on a host with a real NVIDIA GPU (not collected by pytest: no GPU in CI).

    python tests/gpu/check_cpu_mode.py        # from the repository root; needs torch with CUDA

Lays out what an image's venv holds (a venv over this interpreter's packages with the package's .pth and the
CPU-mode .pth that `python -m trainbox.runtime.cpu_mode --write-pth` writes at build time), then checks, in fresh
interpreters of that venv:
- without the variable: torch sees the GPU, trainbox says cuda / nccl (the hook does nothing);
- with TRAINBOX_DEVICE=cpu: torch sees no GPU, find_spec hides the device-only modules, trainbox says cpu / gloo,
  and a 2-rank Gloo group (torchrun) all-reduces on CPU tensors.
Prints one PASS/FAIL line per check; exits 0 when all pass, 1 when any fails, 2 when no GPU is usable.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

PROBE = r"""
import importlib.util, json, os, torch
from trainbox.runtime import device
print(json.dumps({
    "cuda": torch.cuda.is_available(), "count": torch.cuda.device_count(),
    "device": device.get_device_type(), "backend": device.get_dist_backend(),
    "hidden": sorted(n for n in ("transformer_engine", "transformer_engine_torch", "torch_npu", "sgl_kernel")
                     if importlib.util.find_spec(n) is None),
    "autoload": os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD"),
}))
"""

WORKER = r"""
import os, torch, torch.distributed as dist
from trainbox.runtime import dist as tdist
info = tdist.init_distributed(timeout=60)
t = torch.full((3,), float(info.rank + 1))
dist.all_reduce(t)
print(f"RANK{info.rank} backend={info.backend} world={info.world_size} sum={t.tolist()} cuda={torch.cuda.is_available()}",
      flush=True)
tdist.destroy_distributed()
"""

RESULTS: list[bool] = []


def report(name: str, ok: bool, detail: str) -> None:
    RESULTS.append(ok)
    print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)


def make_venv(root: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(root)], check=True)
    py = root / "bin" / "python"
    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    # this interpreter may itself be a venv, whose packages --system-site-packages does not reach: name them
    parent = [p for p in sys.path if p.endswith(("site-packages", "dist-packages")) and os.path.isdir(p)]
    (Path(purelib) / "00parent.pth").write_text("".join(f"{p}\n" for p in parent))
    (Path(purelib) / "trainbox.pth").write_text(str(REPO / "python") + "\n")  # as the image's venv holds it
    subprocess.run([str(py), "-m", "trainbox.runtime.cpu_mode", "--write-pth"], check=True, capture_output=True)
    return py


def probe(py: Path, env: dict) -> dict:
    out = subprocess.run([str(py), "-c", PROBE], env=env, capture_output=True, text=True, timeout=300)
    if out.returncode:
        raise RuntimeError(out.stderr.strip()[-800:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    base = {k: v for k, v in os.environ.items() if k not in ("TRAINBOX_DEVICE", "PYTHONPATH")}
    with tempfile.TemporaryDirectory() as tmp:
        py = make_venv(Path(tmp) / "venv")
        plain = probe(py, base)
        if not plain["cuda"]:
            print(f"no usable GPU here: {plain}")
            return 2
        report("hook idle without the variable", plain["device"] == "cuda" and plain["backend"] == "nccl"
               and plain["autoload"] is None, json.dumps(plain))
        cpu = probe(py, dict(base, TRAINBOX_DEVICE="cpu"))
        report("GPU hidden under TRAINBOX_DEVICE=cpu", not cpu["cuda"] and cpu["count"] == 0, json.dumps(cpu))
        report("trainbox says cpu / gloo", cpu["device"] == "cpu" and cpu["backend"] == "gloo", json.dumps(cpu))
        report("device-only modules hidden", {"transformer_engine", "transformer_engine_torch", "torch_npu",
                                              "sgl_kernel"} <= set(cpu["hidden"]) and cpu["autoload"] == "0",
               json.dumps(cpu))
        script = Path(tmp) / "worker.py"
        script.write_text(WORKER)
        run = subprocess.run([str(py), "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr",
                              "127.0.0.1", "--master-port", "29531", str(script)],
                             env=dict(base, TRAINBOX_DEVICE="cpu"), capture_output=True, text=True, timeout=300)
        rows = sorted(line for line in run.stdout.splitlines() if line.startswith("RANK"))
        want = [f"RANK{r} backend=gloo world=2 sum=[3.0, 3.0, 3.0] cuda=False" for r in (0, 1)]
        report("2-rank Gloo group under CPU mode", run.returncode == 0 and rows == want,
               f"rc={run.returncode} {rows} {run.stderr.strip()[-400:] if run.returncode else ''}")
    print(f"{sum(RESULTS)} passed, {len(RESULTS) - sum(RESULTS)} failed")
    return 0 if all(RESULTS) else 1


if __name__ == "__main__":
    sys.exit(main())
