"""TRAINBOX_DEVICE=cpu in the real workload images, built as the smoke profile builds them (ci/smoke-offline.yaml:
the NPU stacks on their Debian substitute base with torch 2.13.0+cpu and torch-npu 2.13.0, whose extension cannot
load there: no CANN). The frameworks' own tests run in them, and the patched SpecForge (patches/specforge) brings up
a 2-rank Gloo group with torchrun.

What the substitute image lacks: SpecForge's package __init__ (specforge -> specforge.modeling -> the target-model
backends) imports sglang at top level. The stack holds sglang 0.5.9 for NPU, but sglang's import needs torchvision
(sglang.srt.multimodal.internvl_utils; with transformers 5.x also for the image processor it registers), and the
only torchvision this runner can install is PyPI's x86_64 CUDA build, which fails beside a CPU torch and breaks
transformers' imports with it: the smoke profile leaves timm (which brings it) out, so the image has none (the CPU
build is on PyTorch's index only). SpecForge's own tests/test_utils/test_dflash_losses.py already loads its module with the `specforge`
packages registered empty; the other test modules and the bring-up below are run the same way (SPECFORGE_HARNESS):
the code under test is SpecForge's, unchanged; only specforge/__init__.py and specforge/modeling/__init__.py
(re-exports) are not executed. test_specforge_package_import_needs_a_cpu_torchvision holds that gap, so it is seen
to close when a CPU torchvision arrives (then drop the harness).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from docker_helpers import docker_client, run_in_image, wheelhouse_dir
from trainbox.paths import REPO_ROOT
from trainbox.smoke import load_profile
from upstream_helpers import find_shared_upstream, git_env, mirror

pytestmark = [pytest.mark.docker, pytest.mark.slow,
              pytest.mark.skipif(find_shared_upstream() is None, reason="../shared/upstream is missing")]
SMOKE_SETS = load_profile(REPO_ROOT / "ci" / "smoke-offline.yaml")["set"]
CPU = {"TRAINBOX_DEVICE": "cpu"}
SPECFORGE_TREE = "/opt/src/specforge"
TWINKLE_TREE = "/opt/src/twinkle"
# SpecForge's test_utils modules that cannot run on a CPU, each with the line of SpecForge's source that says why:
# three build their tensors on "cuda" unconditionally; test_loss runs LogSoftmaxLoss, a Triton kernel, on CPU
# tensors when there is no CUDA, and Triton has no CPU backend (triton-ascend: "0 active drivers" without CANN).
GPU_ONLY = {"test_dflash_mask": ("tests/test_utils/test_dflash_mask.py", 'self.device = torch.device("cuda")'),
            "test_flash_attention": ("tests/test_utils/test_flash_attention.py", '.to("cuda")'),
            "test_flex_attention": ("tests/test_utils/test_flex_attention.py", '.to("cuda")'),
            "test_loss": ("specforge/core/loss.py", "log_softmax_forward_kernel[grid]")}


def smoke_image(stack: str, repos: tuple[str, ...], mirrors_root: Path) -> tuple[str, bool]:
    """`stack`'s image as the smoke profile builds it (reused when its content-hash tag exists)."""
    env = git_env({f"{n}.git": mirror(n, mirrors_root) for n in repos})
    docker_client()
    sets = [a for k, v in SMOKE_SETS[stack].items() for a in ("--set", f"{k}={v}")]
    args = [sys.executable, "-m", "trainbox.cli", "image", "build", stack, "--json", "--base", "local/debian:bookworm",
            "--wheelhouse", str(wheelhouse_dir()), *sets]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=3000, cwd=REPO_ROOT, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    return out["tag"], not out.get("skipped")


def _image(stack, repos, tmp_path_factory):
    tag, built = smoke_image(stack, repos, tmp_path_factory.mktemp("mirrors"))
    yield tag
    if built:  # made by this test: removed again (an image the smoke or a user built stays)
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True)


@pytest.fixture(scope="module")
def specforge_img(tmp_path_factory):
    yield from _image("specforge", ("SpecForge",), tmp_path_factory)


@pytest.fixture(scope="module")
def twinkle_img(tmp_path_factory):
    yield from _image("twinkle", ("twinkle", "MindSpeed", "Megatron-LM"), tmp_path_factory)


def python_in(tag: str, code: str, *args: str, env: dict | None = None, timeout: float = 300):
    """`python -c` with the image's entrypoint bypassed: the .pth hook alone must make it a CPU process."""
    return run_in_image(tag, "-c", code, *args, entrypoint="python", env=env, timeout=timeout)


PROBE = """
import importlib.metadata as md, importlib.util as u, json, os
out = {"torch_npu_installed": md.version("torch-npu"), "spec": u.find_spec("torch_npu") is not None}
if os.environ.get("TRAINBOX_DEVICE") == "cpu":
    import torch
    from transformers.utils import is_torch_npu_available
    from accelerate.utils import is_npu_available
    from trainbox.runtime.device import get_device_type, get_dist_backend
    out.update(torch=torch.__version__, hf=is_torch_npu_available(), accelerate=is_npu_available(),
               trainbox=get_device_type(), backend=get_dist_backend(), npu_attr=hasattr(torch, "npu"),
               autoload=os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"])
print(json.dumps(out))
"""


def test_cpu_mode_hides_torch_npu_in_every_python_process(specforge_img):
    proc = python_in(specforge_img, PROBE)  # the stack's own device: torch_npu is there to be found
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1]) == {"torch_npu_installed": "2.13.0", "spec": True}
    proc = python_in(specforge_img, PROBE, env=CPU)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1]) == {
        "torch_npu_installed": "2.13.0", "spec": False, "torch": "2.13.0+cpu", "hf": False, "accelerate": False,
        "trainbox": "cpu", "backend": "gloo", "npu_attr": False, "autoload": "0"}


def test_cpu_mode_through_the_entrypoint_skips_cann(specforge_img):
    proc = run_in_image(specforge_img, "python", "-c", "import torch, os; print(torch.ones(2).sum().item(), "
                        "os.environ['TORCH_DEVICE_BACKEND_AUTOLOAD'])", env={**CPU, "TRAINBOX_DEBUG": "1"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["2.0", "0"]
    assert "sourced: none;" in proc.stderr


def test_specforge_package_import_needs_a_cpu_torchvision(specforge_img):
    probe = "import importlib.metadata as md; print(md.version('sglang'), md.version('sglang-router')); import specforge"
    proc = python_in(specforge_img, probe, env=CPU)
    assert proc.stdout.split() == ["0.5.9", "0.3.2"], proc.stderr  # sglang is there now, and its router
    assert proc.returncode == 1 and "AutoImageProcessor requires the Torchvision library" in proc.stderr, proc.stderr


# The specforge package registered without running its __init__ (and specforge.modeling's), as SpecForge's own
# tests/test_utils/test_dflash_losses.py does: both only re-export, and reach sglang through the target models.
SPECFORGE_HARNESS = f"""
import sys, types
for name, sub in (("specforge", "specforge"), ("specforge.modeling", "specforge/modeling")):
    pkg = types.ModuleType(name)
    pkg.__path__ = ["{SPECFORGE_TREE}/" + sub]
    sys.modules[name] = pkg
"""


def test_specforges_own_cpu_tests_pass(specforge_img):
    listing = python_in(specforge_img, f"import os; print(*sorted(os.listdir('{SPECFORGE_TREE}/tests/test_utils')))")
    assert listing.returncode == 0, listing.stderr
    modules = sorted(f[:-3] for f in listing.stdout.split() if f.startswith("test_") and f.endswith(".py"))
    assert set(GPU_ONLY) < set(modules) and len(modules) == 7, modules
    run = [f"tests.test_utils.{m}" for m in modules if m not in GPU_ONLY]
    code = SPECFORGE_HARNESS + f"""
import os, unittest
os.chdir("{SPECFORGE_TREE}"); sys.path.insert(0, "{SPECFORGE_TREE}")
suite = unittest.defaultTestLoader.loadTestsFromNames(sys.argv[1:])
result = unittest.TextTestRunner(verbosity=2).run(suite)
print("RESULT", result.testsRun, len(result.failures), len(result.errors), len(result.skipped))
sys.exit(not result.wasSuccessful())
"""
    proc = python_in(specforge_img, code, *run, env=CPU, timeout=900)
    tail = (proc.stdout + proc.stderr)[-4000:]
    assert proc.returncode == 0, tail
    ran, failures, errors, skipped = map(int, proc.stdout.split("RESULT")[-1].split())
    assert failures == errors == 0 and ran - skipped >= 40, tail
    # the modules left out really need a GPU: the line that says so is still in SpecForge's source
    for m, (path, needle) in GPU_ONLY.items():
        src = python_in(specforge_img, f"print(open('{SPECFORGE_TREE}/{path}').read())")
        assert needle in src.stdout, (m, path)


BRINGUP = SPECFORGE_HARNESS + """
import json, os, torch, torch.distributed as dist
from specforge import distributed as sfd
sfd.init_distributed(timeout=2)
t = torch.tensor([dist.get_rank() + 1.0])
dist.all_reduce(t)
row = json.dumps({"rank": dist.get_rank(), "world": dist.get_world_size(), "backend": dist.get_backend(),
                  "sum": t.item(), "mesh": sfd.get_device_mesh().device_type,
                  "tp_mesh": sfd.get_tp_device_mesh().device_type,
                  "draft_sp": dist.get_world_size(sfd.get_draft_sp_group())})
os.write(1, f"BRINGUP {row}\\n".encode())  # one write per rank: the two ranks share the container's stdout
sfd.destroy_distributed()
"""


def test_patched_specforge_brings_up_a_two_rank_gloo_group(specforge_img):
    # static rendezvous on 127.0.0.1: with --network none the container's own hostname does not resolve
    cmd = ("printf '%s' \"$BRINGUP\" > /tmp/bringup.py && torchrun --nnodes 1 --nproc-per-node 2 "
           "--master-addr 127.0.0.1 --master-port 29500 --local-addr 127.0.0.1 /tmp/bringup.py")
    proc = run_in_image(specforge_img, "bash", "-c", cmd, env={**CPU, "BRINGUP": BRINGUP}, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    rows = sorted((json.loads(m) for m in re.findall(r"BRINGUP (\{[^}]*\})", proc.stdout)), key=lambda r: r["rank"])
    assert rows == [{"rank": r, "world": 2, "backend": "gloo", "sum": 3.0, "mesh": "cpu", "tp_mesh": "cpu",
                     "draft_sp": 1} for r in (0, 1)], proc.stdout


@pytest.fixture(scope="module")
def pytest_wheels(tmp_path_factory) -> Path:
    """pytest for the twinkle image (its stack holds no test runner), as wheels from the host's index."""
    dest = tmp_path_factory.mktemp("pytest-wheels")
    proc = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "--python-version",
                           "3.11", "--dest", str(dest), "pytest==9.2.0"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return dest


@pytest.mark.network
def test_twinkles_device_mesh_tests_pass(twinkle_img, pytest_wheels):
    # pytest goes to /tmp/pt, appended to sys.path: the image's own packages (packaging, ...) stay first
    code = f"""
import os, subprocess, sys
subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--find-links", "/wheels", "--no-compile",
                "--disable-pip-version-check", "--target", "/tmp/pt", "pytest"], check=True)
sys.path.append("/tmp/pt")
import pytest
os.chdir("{TWINKLE_TREE}")
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "tests/DeviceMesh"]))
"""
    from docker_helpers import TEST_LABEL

    name = f"trainbox-test-{uuid.uuid4().hex[:10]}"
    args = [docker_client().docker, "run", "--rm", "--name", name, "--label", TEST_LABEL, "--network", "none",
            "-v", f"{pytest_wheels}:/wheels:ro", "-e", "TRAINBOX_DEVICE=cpu", "--entrypoint", "python",
            twinkle_img, "-c", code]
    try:
        proc = subprocess.run(args, capture_output=True, text=True, timeout=900)
    finally:
        subprocess.run([args[0], "rm", "-f", name], capture_output=True)
    tail = (proc.stdout + proc.stderr)[-4000:]
    assert proc.returncode == 0, tail
    assert re.search(r"\n\d+ passed in ", tail) and "failed" not in tail, tail
