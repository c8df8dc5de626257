"""Checked scaling: a recipe says whether its world size may change. Where it scales (dp absorbs it),
`--devices 4-7` alone means 4 processes a node; where the workload fixes its own layout (Twinkle's cookbook
scripts build their DeviceMesh in the script), another world size is refused in one line naming that mesh;
`launch check` takes the same --nodes/--devices/--nproc-per-node as `run`."""

from __future__ import annotations

import subprocess
import sys

import pytest

from trainbox.launch.targets import resolve_for
from trainbox.launch.recipe import RecipeError, load_recipe
from trainbox.runtime.errors import TrainboxError

SCALES = "swift-megatron-qwen35-8npu"  # ms-swift: dp absorbs another device count
FIXED = {  # recipe -> the script's mesh as twinkle@2f01c452 writes it
    "twinkle-megatron-tp-8npu": "DeviceMesh.from_sizes(dp_size=2, tp_size=2, pp_size=2)",
    "twinkle-megatron-moe-8npu": "DeviceMesh.from_sizes(dp_size=2, tp_size=2, pp_size=2, cp_size=1, ep_size=2)",
    "twinkle-megatron-moe-cp-8npu": "DeviceMesh.from_sizes(dp_size=1, tp_size=2, pp_size=2, cp_size=2, ep_size=2)",
    "twinkle-fsdp-ulysses-qwen35-4b-4a3": "sp_fsdp_dense.py fixes its DeviceMesh",
}


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainbox.cli", *args], capture_output=True, text=True, timeout=120)


def test_devices_alone_sets_the_processes_per_node_where_the_recipe_scales():
    job = resolve_for("docker", SCALES, devices="4-7")
    assert job.per_node == 4 and job.cards == [4, 5, 6, 7]
    assert job.env["ASCEND_RT_VISIBLE_DEVICES"] == "0,1,2,3" and job.env["TRAINBOX_DEVICES"] == "4,5,6,7"
    assert job.recipe.layout()["DP"] == 4 // (job.recipe.parallel.tp * job.recipe.parallel.pp)


def test_devices_and_a_different_nproc_per_node_disagree():
    with pytest.raises(TrainboxError, match="names 4 card.*--nproc-per-node asks for 2"):
        resolve_for("docker", SCALES, devices="4-7", nproc_per_node=2)


@pytest.mark.parametrize("name", sorted(FIXED))
def test_a_fixed_layout_refuses_another_world_size_naming_its_mesh(name):
    own = load_recipe(name)
    assert own.scaling.world_size == "fixed"
    n = own.devices_per_node
    other = 4 if n != 4 else 2
    for kw in ({"nodes": 2}, {"nproc_per_node": other}):
        with pytest.raises(RecipeError) as err:
            load_recipe(name, **kw)
        msg = str(err.value)
        assert "\n" not in msg and "fixed" in msg and FIXED[name] in msg, msg
    with pytest.raises(TrainboxError, match="fixed at 1 node"):
        resolve_for("docker", name, devices=f"{n}-{n + other - 1}")
    # the recipe's own size is no change
    assert resolve_for("docker", name, devices=f"{n}-{2 * n - 1}").cards == list(range(n, 2 * n))
    assert load_recipe(name, nodes=1, nproc_per_node=n).devices_per_node == n


def test_fixed_needs_the_mesh_named(tmp_path):
    import yaml

    from trainbox.paths import REPO_ROOT

    data = yaml.safe_load((REPO_ROOT / "launchers/recipes/twinkle-megatron-tp-8npu.yaml").read_text())
    data["scaling"] = {"world_size": "fixed"}
    path = tmp_path / "fixed-without-mesh.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(RecipeError, match="mesh"):
        load_recipe(str(path))


def test_run_and_check_refuse_the_same_way():
    run = _cli("run", "twinkle-megatron-tp-8npu", "--nodes", "2", "--dry-run")
    assert run.returncode == 2 and FIXED["twinkle-megatron-tp-8npu"] in run.stderr
    check = _cli("launch", "check", "twinkle-megatron-tp-8npu", "--devices", "0-3")
    assert check.returncode == 1 and "fixed at 1 node(s) x 8" in check.stderr, check.stderr


@pytest.mark.slow
def test_check_renders_the_scaled_variant():
    proc = _cli("launch", "check", SCALES, "--devices", "4-7", "--target", "ascendjob", "--json")
    assert proc.returncode == 0, proc.stderr
    bad = _cli("launch", "check", SCALES, "--devices", "0-2")  # 3 cards: tp 2 does not divide them
    assert bad.returncode == 1 and SCALES in bad.stderr
