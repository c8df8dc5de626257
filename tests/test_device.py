"""trainbox.runtime.device on this (CPU-only) host, plus the real torch-npu wheel failing to load for real.

NPU branches with a stand-in torch_npu live in test_runtime_npu.py; real multi-process Gloo runs in
test_dist.py; the CUDA checks in tests/gpu/check_cuda.py.
"""

from __future__ import annotations

import fcntl
import glob
import os
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from trainbox.runtime import device  # noqa: E402
from trainbox.runtime.errors import TrainboxError  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
PYDIR = REPO / "python"
RUNTIME_MODULES = ("trainbox.runtime.device", "trainbox.runtime.dist", "trainbox.runtime.markers", "trainbox.runtime.rankenv")
# everything the image runs besides the helpers: the CLI (for `trainbox doctor`), every command group's
# registration, the entrypoint and the doctor
IMAGE_MODULES = RUNTIME_MODULES + (
    "trainbox.cli", "trainbox.runtime.doctor", "trainbox.runtime.entrypoint", "trainbox.runtime.manifest", "trainbox.runtime.errors",
    "trainbox.paths", "trainbox.commands.stack", "trainbox.commands.render", "trainbox.commands.patches",
    "trainbox.commands.base", "trainbox.commands.image", "trainbox.commands.launch", "trainbox.commands.doctor",
    "trainbox.commands.smoke")
RANK_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _env(**extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("TRAINBOX_") and k not in RANK_VARS and not k.startswith("OMPI_")}
    env["PYTHONPATH"] = str(PYDIR)
    env.update(extra)
    return env


def _run(args, env=None, timeout=120, python=sys.executable):
    return subprocess.run([python, *args], capture_output=True, text=True, timeout=timeout,
                          env=env or _env(), cwd=REPO)


@pytest.fixture
def clean_env(monkeypatch):
    for name in ("TRAINBOX_DEVICE", "TRAINBOX_DIST_BACKEND", *RANK_VARS):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


# -------------------------------------------------------------------------------------------- imports


def test_import_pulls_in_no_torch():
    code = (
        "import sys\n"
        f"for m in {IMAGE_MODULES!r}: __import__(m)\n"
        "from trainbox.cli import build_parser; build_parser()\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('torch', 'torch_npu', 'numpy', 'jinja2', 'pydantic', 'yaml', 'rich', 'docker', 'packaging'))\n"
        "print(heavy)\n"
    )
    proc = _run(["-X", "importtime", "-c", code])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
    imported = [line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if "|" in line]
    assert "trainbox.runtime.device" in imported  # the importtime report is really there
    assert not [m for m in imported if m.split(".")[0] == "torch"]


def _other_python(minor):
    for path in sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/3.{minor}.*/bin/python3.{minor}"))):
        return path
    found = shutil.which(f"python3.{minor}")
    if found and subprocess.run([found, "-c", "pass"], capture_output=True).returncode == 0:
        return found
    return None


@pytest.mark.parametrize("minor", [10, 12])
def test_runtime_modules_work_on_other_pythons_without_torch(minor):
    python = _other_python(minor)
    if python is None:
        pytest.skip(f"no python3.{minor} on this machine")
    if subprocess.run([python, "-c", "import torch"], capture_output=True).returncode == 0:
        pytest.skip(f"{python} has torch installed (this test is about an interpreter without it)")
    code = (
        "import sys\n"
        "from trainbox.runtime import device, dist, markers, rankenv\n"
        "assert 'torch' not in sys.modules\n"
        "print(device.get_device_type(), dist.is_initialized(), dist.all_gather_object('x'),\n"
        "      device.capabilities()['sdpa'].reason, device.optional_import('torch')[0])\n"
    )
    # torch is not installed for that interpreter: the helpers must still answer sensibly.
    proc = _run(["-c", code], python=python)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["cpu", "False", "['x']", "torch", "is", "not", "installed", "None"]


def test_override_answers_without_importing_torch():
    code = "import sys; from trainbox.runtime import device; print(device.get_device_type(), 'torch' in sys.modules)"
    proc = _run(["-c", code], env=_env(TRAINBOX_DEVICE=" NPU "))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["npu", "False"]


# ---------------------------------------------------------------------------------------- device type


def test_cpu_host(clean_env):
    assert device.get_device_type() == "cpu"
    assert device.local_device_index() is None
    assert device.get_local_device() == torch.device("cpu")
    assert device.set_device() == torch.device("cpu")
    assert device.device_count() == 0
    stats = device.memory_stats()
    assert stats["device"] == "cpu" and stats["max_rss"] > 0 and stats["allocated"] is None
    device.empty_cache()
    device.reset_peak_memory_stats()
    device.synchronize()


@pytest.mark.parametrize("value, expected", [("cuda", "cuda"), (" Npu ", "npu"), ("xpu", "xpu"), ("cpu", "cpu")])
def test_trainbox_device_override(clean_env, value, expected):
    clean_env.setenv("TRAINBOX_DEVICE", value)
    assert device.get_device_type() == expected


@pytest.mark.parametrize("value, fragment", [("gpu", "use cuda"), ("cuda:0", "expected a torch device type")])
def test_trainbox_device_rejects_bad_values(clean_env, value, fragment):
    clean_env.setenv("TRAINBOX_DEVICE", value)
    with pytest.raises(TrainboxError, match="TRAINBOX_DEVICE") as err:
        device.get_device_type()
    assert fragment in str(err.value)


def test_answer_is_not_frozen(clean_env):
    assert device.get_device_type() == "cpu"
    clean_env.setenv("TRAINBOX_DEVICE", "npu")
    assert device.get_device_type() == "npu"
    clean_env.delenv("TRAINBOX_DEVICE")
    assert device.get_device_type() == "cpu"


def test_torch_accelerator_is_preferred(clean_env):
    # Stand-in for torch.accelerator on a host with an XPU: whatever it reports wins over probing.
    seen = {}

    def current_accelerator(check_available=False):
        seen["check_available"] = check_available
        return torch.device("xpu")

    clean_env.setattr(torch.accelerator, "current_accelerator", current_accelerator)
    assert device.get_device_type() == "xpu"
    assert seen == {"check_available": True}  # a CUDA build on a GPU-less host must not answer "cuda"


def test_old_torch_accelerator_without_check_available(clean_env):
    # Stand-in for torch 2.6's signature: the build's accelerator is reported even when none is present.
    clean_env.setattr(torch.accelerator, "current_accelerator", lambda: torch.device("cuda"))
    clean_env.setattr(torch.accelerator, "is_available", lambda: False)
    assert device.get_device_type() == "cpu"
    clean_env.setattr(torch.accelerator, "is_available", lambda: True)
    assert device.get_device_type() == "cuda"


def test_cuda_probe_without_torch_accelerator(clean_env):
    clean_env.delattr(torch, "accelerator")
    clean_env.setattr(torch.cuda, "is_available", lambda: True)  # stand-in: pretend a GPU is visible
    assert device.get_device_type() == "cuda"


# -------------------------------------------------------------------------------------------- backend


def test_backends(clean_env):
    assert device.get_dist_backend() == "gloo"
    assert device.get_dist_backend(mixed=True) == "cpu:gloo"
    assert device.get_dist_backend("cuda") == "nccl"  # answered by torch's get_default_backend_for_device
    assert device.get_dist_backend("cuda", mixed=True) == "cpu:gloo,cuda:nccl"
    # torch does not know "npu" until torch_npu registers it: the table answers.
    assert device.get_dist_backend("npu") == "hccl"
    assert device.get_dist_backend("npu", mixed=True) == "cpu:gloo,npu:hccl"
    assert device.get_dist_backend("someday") == "gloo"


def test_backend_override(clean_env):
    clean_env.setenv("TRAINBOX_DIST_BACKEND", "cpu:gloo,cuda:nccl")
    assert device.get_dist_backend("npu") == "cpu:gloo,cuda:nccl"
    assert device.get_dist_backend(mixed=True) == "cpu:gloo,cuda:nccl"


def test_backend_without_torch_lookup(clean_env):
    # Stand-in for torch < 2.6, which has no get_default_backend_for_device.
    clean_env.delattr(torch.distributed, "get_default_backend_for_device")
    assert device.get_dist_backend("cuda") == "nccl"
    assert device.get_dist_backend("npu") == "hccl"


# ------------------------------------------------------------------------------- optional / capability


def test_optional_import():
    mod, why = device.optional_import("json")
    assert mod is not None and why is None
    mod, why = device.optional_import("surely_not_a_module_xyz")
    assert mod is None and "ModuleNotFoundError" in why and "surely_not_a_module_xyz" in why


def test_optional_import_reports_broken_packages(tmp_path, monkeypatch):
    (tmp_path / "broken_native_pkg.py").write_text("raise OSError('libfoo.so: cannot open shared object file')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    mod, why = device.optional_import("broken_native_pkg")
    assert mod is None and why.startswith("OSError: libfoo.so")


def test_capabilities_on_cpu(clean_env):
    caps = device.capabilities()
    assert set(caps) >= {"flex_attention", "bf16_gru", "fused_adam", "sdpa", "bf16", "triton"}
    assert caps["sdpa"] and caps["bf16_gru"] and caps["flex_attention"]
    assert not caps["flash_attn"] and "sdpa" in caps["flash_attn"].alternative
    assert device.require("sdpa").available


def test_capabilities_for_npu_name_the_alternative(clean_env):
    caps = device.capabilities("npu")
    assert not caps["flex_attention"] and not caps["bf16_gru"]
    with pytest.raises(device.CapabilityError) as err:
        device.require("flex_attention", "npu")
    assert "use --attention-backend sdpa" in str(err.value)
    with pytest.raises(device.CapabilityError, match="float16"):
        device.require("bf16_gru", "npu")
    with pytest.raises(TrainboxError, match="unknown capability 'warp_drive'; known: bf16"):
        device.require("warp_drive")


# ------------------------------------------------------- the real torch-npu wheel, without CANN


def _torch_npu_venv():
    """A venv that sees the host's torch plus the real torch-npu wheel of the same version (cached)."""
    from trainbox.paths import cache_dir

    version = metadata.version("torch").split("+")[0]
    name = f"torch-npu-{version}-py{sys.version_info.major}{sys.version_info.minor}"
    root = cache_dir() / "test-venvs"
    root.mkdir(parents=True, exist_ok=True)
    venv = root / name
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # parallel test runs build it once
        if (venv / ".complete").exists():
            return venv
        staging = root / f"{name}.partial"
        shutil.rmtree(staging, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(staging)], check=True,
                       timeout=120)
        pip = subprocess.run([str(staging / "bin" / "python"), "-m", "pip", "install", "--no-deps",
                              f"torch-npu=={version}"], capture_output=True, text=True, timeout=600)
        if pip.returncode != 0:
            shutil.rmtree(staging, ignore_errors=True)
            pytest.skip(f"torch-npu=={version} not installable from PyPI here: {pip.stderr.strip()[-300:]}")
        shutil.rmtree(venv, ignore_errors=True)
        # Only bin/python is used (python -m pip), and it finds its venv through pyvenv.cfg beside it,
        # so the renamed venv works; a half-built one never carries the .complete mark.
        staging.rename(venv)
        (venv / ".complete").write_text(version + "\n")
    return venv


@pytest.mark.network
@pytest.mark.slow
def test_real_torch_npu_without_cann_explains_itself():
    python = str(_torch_npu_venv() / "bin" / "python")
    env = _env()
    env.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)

    # Control: the venv really reproduces the failure (torch's autoload of torch_npu breaks `import torch`).
    control = _run(["-c", "import torch"], env=env, python=python)
    assert control.returncode != 0
    assert "Failed to load the backend extension: torch_npu" in control.stderr

    probe = (
        "import sys\n"
        "from trainbox.runtime import device\n"
        "for attempt in (1, 2):\n"
        "    try:\n"
        "        device.get_device_type()\n"
        "    except device.DeviceUnavailableError as exc:\n"
        "        print(f'--- attempt {attempt}'); print(exc)\n"
        "sys.exit(3)\n"
    )
    proc = _run(["-c", probe], env=env, python=python)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    first, second = proc.stdout.split("--- attempt 2")
    assert "Traceback" not in proc.stdout + proc.stderr
    assert "torch_npu is installed but cannot be loaded" in first
    assert "libhccl.so" in first and "CANN" in first
    assert "TRAINBOX_DEVICE=cpu" in first
    assert second.strip() == first.replace("--- attempt 1", "").strip()  # same diagnosis, no odd re-import

    # The way out named in the message works: a deliberate CPU run, torch imports, a process group forms.
    way_out = (
        "from trainbox.runtime import device, dist\n"
        "info = dist.init_distributed()\n"
        "print(device.get_device_type(), info.backend, info.world_size, dist.all_gather_object(7))\n"
        "dist.destroy_distributed()\n"
    )
    proc = _run(["-c", way_out], env={**env, "TRAINBOX_DEVICE": "cpu"}, python=python)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["cpu", "gloo", "1", "[7]"]
