"""The shipped cpu-ddp job, rendered and run on this host with its real torch (no Docker): two processes
over Gloo through trainbox.runtime.dist, a loss that falls, metrics written where OUTPUT_DIR says."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from trainbox.launch import load_stack_info, render_script
from trainbox.paths import LAUNCHERS_DIR
from trainbox.launch.recipe import load_recipe

pytest.importorskip("torch")


@pytest.mark.slow
def test_cpu_ddp_script_trains_on_the_host(tmp_path):
    recipe = load_recipe("cpu-ddp")
    out_dir = tmp_path / "metrics dir $(touch pwned)"
    script = tmp_path / "job.sh"
    script.write_text(render_script(recipe, load_stack_info("cpu"), {"STEPS": "12", "OUTPUT_DIR": str(out_dir)}))
    env = dict(os.environ, TRAINBOX_LAUNCHERS=str(LAUNCHERS_DIR),
               PATH=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}")  # this Python's torchrun
    proc = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, timeout=300,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    losses = [float(x) for x in re.findall(r"^step\s+\d+ loss ([0-9.]+)$", proc.stdout, re.M)]
    assert len(losses) == 12 and losses[-1] < losses[0] * 0.5
    assert "torchrun --standalone --nnodes 1 --nproc-per-node 2" in proc.stderr
    metrics = json.loads((out_dir / "metrics.json").read_text())
    assert metrics["world_size"] == 2 and metrics["backend"] == "gloo"
    assert [round(x, 6) for x in metrics["losses"]] == losses
    assert not list(tmp_path.rglob("pwned"))
