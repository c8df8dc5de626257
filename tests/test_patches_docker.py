"""The patch series in real image builds: applied in the NPU template image, and a moved pin fails the build
at the patch step, naming the patch and the hunk."""

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


def test_moved_pin_fails_the_image_build_at_the_patch_step():
    from docker_helpers import NPU_OVERRIDES, build_options, ensure_base, wheelhouse_dir

    from trainbox.image.build import build

    sets = dict(NPU_OVERRIDES, **{"megatron-core.version": "0.16.0"})
    with pytest.raises(BuildFailed) as ei:
        build(build_options(stack="npu-910b", base=ensure_base(), sets=sets, wheelhouse=str(wheelhouse_dir()),
                            labels={"trainbox.test": "1"}))
    msg = str(ei.value)
    assert "apply_patches.py" in msg  # the failing step is the patch step
    assert "0002-tensor_parallel-random-track-the-RNG-of-the-current-.patch does not apply" in msg
    assert "megatron/core/tensor_parallel/random.py hunk 5" in msg
