"""NPU specifics of the launch side: HCCL ports per chip (Atlas A2 gets HCCL_IF_BASE_PORT, not socket ranges),
and the multi-node mounts (hccn_tool, hccn.conf) on every target that starts containers."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess

import pytest

from trainbox.launch import plan_run, render_script
from trainbox.launch.job import load_stack_info
from trainbox.launch.targets import render_target, resolve_for
from trainbox.launch.recipe import load_recipe
from trainbox.runtime.dist import hccl_socket_port_env
from trainbox.runtime.npu import NPU_MULTINODE_MOUNTS

RECIPE = "twinkle-megatron-tp-8npu"  # stack twinkle, on the 910b line
HCCL_KEYS = ("HCCL_IF_BASE_PORT", "HCCL_HOST_SOCKET_PORT_RANGE", "HCCL_NPU_SOCKET_PORT_RANGE")


@pytest.fixture(autouse=True)
def _job_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINBOX_CACHE", str(tmp_path / "cache"))


def _hccl_env(tmp_path, chip: str, master_port: int, **preset) -> dict:
    """Run the rendered script's environment block for a stack on `chip`; the HCCL variables it leaves."""
    recipe = load_recipe(RECIPE)
    stack = dataclasses.replace(load_stack_info(recipe.stack), chip=chip)
    text = render_script(recipe, stack)  # inputs left to the environment: only the env block runs here
    start = text.index("# --- environment")
    block = text[start:min(i for i in (text.find(m, start) for m in ("\n# --- preflight", "\ncd -- ")) if i > 0)]
    probe = tmp_path / f"env-{chip}.sh"
    probe.write_text(f"set -eo pipefail\nMASTER_PORT={master_port}\n{block}\n"
                     "python3 -c 'import json, os; print(json.dumps({k: v for k, v in os.environ.items() "
                     "if k.startswith(\"HCCL_\") and \"PORT\" in k}))'\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("HCCL_")} | preset
    out = subprocess.run(["bash", str(probe)], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_atlas_a2_gets_an_if_base_port_and_no_socket_ranges(tmp_path):
    got = _hccl_env(tmp_path, "910b", 29611)
    assert set(got) == {"HCCL_IF_BASE_PORT"}, got
    assert got == hccl_socket_port_env(29611, environ={}, chip="910b")  # the script and the runtime agree
    port = int(got["HCCL_IF_BASE_PORT"])
    assert 1024 <= port and port + 31 <= 32767  # 32 ports, below the ephemeral range
    other = int(_hccl_env(tmp_path, "910b", 29612)["HCCL_IF_BASE_PORT"])
    assert abs(other - port) >= 32  # two jobs on one host do not share a block
    assert _hccl_env(tmp_path, "910b", 29611, HCCL_IF_BASE_PORT="40000") == {"HCCL_IF_BASE_PORT": "40000"}


def test_a3_keeps_the_socket_ranges(tmp_path):
    got = _hccl_env(tmp_path, "a3", 29611)
    assert set(got) == {"HCCL_HOST_SOCKET_PORT_RANGE", "HCCL_NPU_SOCKET_PORT_RANGE"}, got
    assert got == hccl_socket_port_env(29611, environ={}, chip="a3")


def test_the_shipped_910b_stack_renders_the_if_base_block():
    recipe = load_recipe(RECIPE)
    stack = load_stack_info(recipe.stack)
    assert stack.chip == "910b"
    text = render_script(recipe, stack)
    assert "export HCCL_IF_BASE_PORT=" in text and "HCCL_HOST_SOCKET_PORT_RANGE=" not in text
    assert "MC2" in text


def _mounts(argv: list[str]) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == "--mount"]


# a 910B recipe whose world size scales (the Twinkle cookbook recipes fix theirs to one node)
MULTI, MULTI_SETS = "swift-megatron-qwen35-8npu", {"MODEL_DIR": "/s", "DATASET": "/m", "OUTPUT_DIR": "/o"}


def test_multi_node_npu_docker_runs_mount_hccn_tool_and_conf():
    for path in NPU_MULTINODE_MOUNTS:
        want = f"type=bind,source={path},target={path},readonly"
        two = plan_run(MULTI, sets={**MULTI_SETS, "MASTER_ADDR": "10.1.2.3"}, nodes=2, image="i", dry_run=True)
        for argv in two.argv_per_node:
            assert want in _mounts(argv), argv
        assert any("hccn.conf" in n for n in two.notes)
        one = plan_run(MULTI, sets=MULTI_SETS, image="i", dry_run=True)
        assert not any(path in m for m in _mounts(one.argv_per_node[0]))
    cpu = plan_run("cpu-ddp", sets={"MASTER_ADDR": "10.1.2.3"}, nodes=2, image="i", dry_run=True)
    assert not any("hccn" in m for m in _mounts(cpu.argv_per_node[0]))


@pytest.mark.parametrize("target", ["slurm", "slurm-pyxis", "ascendjob"])
def test_multi_node_npu_cluster_targets_mount_hccn_tool_and_conf(target):
    two = render_target(resolve_for(target, MULTI, sets=MULTI_SETS, nodes=2, image="img:1"), target)
    one = render_target(resolve_for(target, MULTI, sets=MULTI_SETS, nodes=1, image="img:1"), target)
    for path in NPU_MULTINODE_MOUNTS:
        assert path in two and path not in one, target
