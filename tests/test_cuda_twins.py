"""The CUDA twins run on workload stacks that hold their framework: each GPU recipe's stack extends cuda and pins
the same framework source as its NPU twin's image, nothing stands in for it, and the Megatron line fits the GDN
path the recipe takes (host-side: the stack files, their locks and the pinned upstream trees)."""

from __future__ import annotations

import re
import subprocess

import pytest
from packaging.version import Version

from trainbox.launch.recipe import load_recipe
from trainbox.specs.stack import load_stack

from upstream_helpers import find_shared_upstream

# GPU recipe -> (its NPU twin, the components its entry's imports come from: the framework first)
TWINS = {
    "specforge-domino-qwen35-4b-gpu": ("specforge-domino-qwen35-4b-npu",
                                       ["specforge", "sglang", "accelerate", "datasets", "yunchang", "tensorboard"]),
    "swift-megatron-qwen35-8gpu": ("swift-megatron-qwen35-8npu",
                                   ["ms-swift", "mcore-bridge", "megatron-lm", "megatron-core", "transformer-engine",
                                    "transformer-engine-torch", "peft", "modelscope", "datasets", "accelerate"]),
}


@pytest.mark.parametrize("gpu", sorted(TWINS))
def test_a_cuda_twin_runs_on_a_cuda_stack_that_holds_its_framework(gpu):
    npu, needed = TWINS[gpu]
    recipe = load_recipe(gpu)
    stack = load_stack(recipe.stack)
    assert stack.device == "cuda" and stack.extends == "cuda"
    assert [k for k in needed if k not in stack.installed_components] == []
    assert recipe.check.stub == []  # nothing stands in on CUDA
    twin = load_stack(load_recipe(npu).stack)
    fw = needed[0]
    same = lambda c: (c.source, c.commit, c.url, tuple(c.sha256), c.install, tuple(c.build), c.patches)  # noqa: E731
    assert same(stack.components[fw]) == same(twin.components[fw])


def test_the_cuda_line_has_qwen3_5_and_transformer_engines_pytorch_binding():
    cuda = load_stack("cuda")
    # transformers 5.2.0 is the first release with models/qwen3_5 (checked against PyPI's wheels)
    assert Version(cuda.components["transformers"].version) >= Version("5.2")
    te = cuda.components["transformer-engine-torch"]
    assert te.needs == ["cuda-toolkit"] and te.build_isolation is False
    assert te.version == cuda.components["transformer-engine"].version


def test_swift_cuda_is_on_the_megatron_line_with_native_gdn_and_its_tree_is_that_release():
    stack = load_stack("swift-cuda")
    assert Version(stack.components["megatron-core"].version) >= Version("0.16")
    assert stack.env["USE_MCORE_GDN"] == "1" and stack.env["MEGATRON_LM_PATH"] == "/opt/src/megatron-lm"
    assert Version(stack.components["transformers"].version) < Version("5.9")  # ms-swift 4.2.0's cap
    assert "USE_MCORE_GDN" not in load_recipe("swift-megatron-qwen35-8gpu").env
    upstream = find_shared_upstream()
    if upstream is None:
        pytest.skip("no ../shared/upstream here")
    tree = stack.components["megatron-lm"]
    info = subprocess.run(["git", "--git-dir", str(upstream / "Megatron-LM.git"), "show",
                           f"{tree.commit}:megatron/core/package_info.py"],
                          capture_output=True, text=True, check=True, timeout=60).stdout
    parts = [re.search(rf"^{k} = (\d+)", info, re.M).group(1) for k in ("MAJOR", "MINOR", "PATCH")]
    assert ".".join(parts) == stack.components["megatron-core"].version
