"""The patch series in real image builds: applied in the NPU template image, and a moved pin fails the build
at the patch step, naming the patch and the hunk (on a test stack that extends cpu: see MOVED_PIN_STACK)."""

from __future__ import annotations

import hashlib
import json

import pytest

from trainbox.image.run import BuildFailed
from trainbox.supply.patches import applied_patches
from trainbox.paths import PATCHES_DIR

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def test_npu_template_image_carries_the_patched_megatron(npu_image):
    from docker_helpers import run_in_image

    proc = run_in_image(npu_image, "cat", "/etc/trainbox/stack.json")
    assert proc.returncode == 0, proc.stderr
    manifest = json.loads(proc.stdout)
    expected = applied_patches("megatron-core")
    assert len(expected) == 5
    assert all(p["sha256"] == hashlib.sha256((PATCHES_DIR / "megatron-core" / p["file"]).read_bytes()).hexdigest()
               for p in expected)
    assert manifest["patches"]["megatron-core"] == expected
    # the code of patch 0001 is in the installed tree, and the patched module imports and runs on the CPU
    code = ("import megatron.core.utils as u, inspect; "
            "print(u.get_current_device_type(), 'device=get_current_device()' in inspect.getsource(u.GlobalMemoryBuffer))")
    proc = run_in_image(npu_image, "python3", "-c", code, env={"TRAINBOX_DEVICE": "cpu",
                                                              "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.split() == ["cpu", "True"]


#: the stack the moved pin is tried on: cpu and megatron-core with npu-910b's patch series. On cpu's torch layer (the
#: cpu image's, cached), so the build reaches the patch step after installing megatron-core alone; on npu-910b the
#: moved pin reinstalls torch_npu, triton-ascend, transformers and the rest first (5 minutes of a cold CI run), and
#: the patch step it then fails at is the same partial (templates/partials) with the same series.
MOVED_PIN_STACK = """name: megatron-on-cpu
description: the cpu stack with megatron-core and npu-910b's patch series (a test stack)
extends: cpu
components:
  megatron-core:
    source: pypi
    version: 0.15.3
    patches: megatron-core
"""


def test_moved_pin_fails_the_image_build_at_the_patch_step(tmp_path):
    from docker_helpers import build_options, ensure_base, wheelhouse_dir

    from trainbox.image.build import build

    stack = tmp_path / "megatron-on-cpu.yaml"
    stack.write_text(MOVED_PIN_STACK)
    with pytest.raises(BuildFailed) as ei:
        build(build_options(stack=str(stack), base=ensure_base(), sets={"megatron-core.version": "0.16.0"},
                            wheelhouse=str(wheelhouse_dir()), labels={"trainbox.test": "1"}))
    msg = str(ei.value)
    assert "apply_patches.py" in msg  # the failing step is the patch step
    assert "0002-tensor_parallel-random-track-the-RNG-of-the-current-.patch does not apply" in msg
    assert "megatron/core/tensor_parallel/random.py hunk 5" in msg
