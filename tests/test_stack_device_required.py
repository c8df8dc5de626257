"""Issue 14, item 9: an image whose manifest says cuda, started without GPUs, trained on the CPU with Gloo
without a word; only NPU raised. Now the stack's device is required unless TRAINBOX_DEVICE says otherwise,
and the error carries the doctor's explanation. Real torch (CPU build) on a host without GPUs."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from trainbox.paths import REPO_ROOT

pytest.importorskip("torch")

PROBE = "from trainbox.runtime import device, dist; print(device.get_device_type()); print(dist.init_distributed().backend)"


def _manifest(tmp_path, device: str) -> str:
    path = tmp_path / "stack.json"
    path.write_text(json.dumps({"schema": 1, "stack": f"demo-{device}", "device": device, "env": {},
                                "components": {}, "base": {}}))
    return str(path)


def _run(tmp_path, device: str, **env):
    e = {k: v for k, v in os.environ.items() if not k.startswith("TRAINBOX_")
         and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    e.update(PYTHONPATH=str(REPO_ROOT / "python"), TRAINBOX_MANIFEST=_manifest(tmp_path, device),
             TRAINBOX_DOCTOR_ROOT=str(tmp_path / "root"), **env)
    return subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=e, timeout=120)


@pytest.mark.slow
@pytest.mark.parametrize("device, words", [("cuda", "no NVIDIA GPU visible"), ("npu", "npu")])
def test_accelerator_stack_without_its_device_refuses_the_cpu(tmp_path, device, words):
    proc = _run(tmp_path, device)
    assert proc.returncode != 0, proc.stdout
    assert f"is built for {device}" in proc.stderr and "refusing to fall back to the CPU" in proc.stderr
    assert "doctor:" in proc.stderr and words in proc.stderr
    assert "TRAINBOX_DEVICE=cpu" in proc.stderr
    assert "gloo" not in proc.stdout


@pytest.mark.slow
def test_trainbox_device_cpu_is_the_deliberate_way(tmp_path):
    proc = _run(tmp_path, "cuda", TRAINBOX_DEVICE="cpu")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["cpu", "gloo"]


@pytest.mark.slow
def test_cpu_stack_still_runs_on_the_cpu(tmp_path):
    proc = _run(tmp_path, "cpu")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["cpu", "gloo"]
