#!/usr/bin/env python3
"""The CUDA twins' stacks on a real NVIDIA GPU host (not collected by pytest: no GPU, no CUDA base in CI).

    python tests/gpu/check_cuda_twins.py [--specforge DIR] [--swift DIR]     # from the repository root

Run it in the Python environment the twin's image would hold (the pins of build/generated/specforge-cuda or
swift-cuda, e.g. `pip install --require-hashes -r requirements.txt -r deps.txt`, then Transformer Engine's PyTorch
binding from its sdist: `pip install --no-build-isolation --no-deps transformer_engine_torch-2.9.0.tar.gz` with
nvcc on PATH). What only a GPU host can show, one PASS/FAIL/SKIP line each:

  te.binding       transformer_engine.pytorch imports (transformer_engine_torch, built against this torch, loads
                   libcuda) and a te.pytorch.Linear runs forward and backward on cuda:0
  transformers     the installed transformers has Qwen3.5 (transformers.models.qwen3_5)
  args.specforge   the recipe's rendered command through SpecForge's own parser (trainbox.runtime.argcheck, on
                   this host: `launch check --code` needs Docker), after the entry's import closure, nothing
                   stood in (sglang's CUDA build loads)
  args.swift       the same for swift-megatron-qwen35-8gpu (swift.cli._megatron.sft, strict) with an ms-swift
                   4.2.0 tree (its sdist, unpacked): mcore_bridge loads on the real transformer_engine (the substitute base has none)

Exits 0 when nothing failed, 1 when a check failed, 2 when no GPU is usable.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FAILED: list[str] = []


def report(name: str, ok: bool | None, detail: str = "") -> None:
    word = {True: "PASS", False: "FAIL", None: "SKIP"}[ok]
    if ok is False:
        FAILED.append(name)
    print(f"{word} {name}" + (f": {detail}" if detail else ""), flush=True)


def check_te() -> None:
    try:
        import torch
        import transformer_engine.pytorch as te

        layer = te.Linear(64, 64, bias=True).cuda()
        x = torch.randn(8, 64, device="cuda", requires_grad=True)
        layer(x).sum().backward()
        report("te.binding", x.grad is not None and bool(torch.isfinite(x.grad).all()),
               f"transformer_engine {getattr(te, '__version__', '?')}, torch {torch.__version__}")
    except Exception as exc:  # the point is to say what broke, not to stop at it
        report("te.binding", False, f"{type(exc).__name__}: {exc}")


def check_transformers() -> None:
    try:
        import transformers
        import transformers.models.qwen3_5  # noqa: F401

        report("transformers", True, f"{transformers.__version__} has qwen3_5")
    except Exception as exc:
        report("transformers", False, f"{type(exc).__name__}: {exc}")


def rendered(recipe: str, env: dict) -> list[str]:
    """The recipe's command words, inputs at their defaults or stand-in paths (nothing is read from them)."""
    shown = json.loads(subprocess.run([sys.executable, "-m", "trainbox.cli", "launch", "show", recipe, "--json"],
                                      capture_output=True, text=True, check=True, env=env, timeout=120).stdout)
    values = {k: str(v) for k, v in shown["layout"].items()}
    for key, spec in shown["inputs"].items():
        values[key] = str(spec.get("default") if spec.get("default") is not None else f"/stand-in/{key.lower()}")
    return [re.sub(r"\$\{(\w+)\}", lambda m: values[m.group(1)], w) for w in shown["command"]]


def check_args(name: str, recipe: str, code: str | None) -> None:
    if not code:
        report(name, None, f"no checkout given (--{name.split('.', 1)[1]} DIR)")
        return
    env = dict(os.environ, PYTHONPATH=f"{ROOT / 'python'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    words = rendered(recipe, env)
    if words[:2] == ["megatron", "sft"]:  # the recipe's check.replaces: the module the console script runs
        entry, args = ["--module", "swift.cli._megatron.sft", "--strict"], words[2:]
    else:
        entry, args = ["--script", str(Path(code) / words[0])], words[1:]
    base = [sys.executable, "-m", "trainbox.runtime.argcheck", "--json", "--path", code]
    for step, argv in (("imports", base + ["--imports", *entry, "--", *args]), ("args", base + [*entry, "--", *args])):
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=code, timeout=900)
        if proc.returncode != 0:
            tail = (proc.stdout + proc.stderr).strip().splitlines()[-3:]
            report(name, False, f"{step}: " + " | ".join(tail))
            return
    report(name, True, "import closure resolves, the arguments parse")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--specforge", metavar="DIR", help="SpecForge checkout at 61f9cb01 (patches/specforge applied)")
    ap.add_argument("--swift", metavar="DIR", help="ms-swift 4.2.0 tree (the swift stacks' sdist, unpacked)")
    args = ap.parse_args()
    try:
        import torch

        if not torch.cuda.is_available():
            print("no usable GPU (torch.cuda.is_available() is False)", file=sys.stderr)
            return 2
    except ImportError as exc:
        print(f"no torch: {exc}", file=sys.stderr)
        return 2
    check_te()
    check_transformers()
    check_args("args.specforge", "specforge-domino-qwen35-4b-gpu", args.specforge)
    check_args("args.swift", "swift-megatron-qwen35-8gpu", args.swift)
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
