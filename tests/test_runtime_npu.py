"""NPU branches of trainbox.runtime.device / trainbox.runtime.dist with a STAND-IN torch_npu.

No NPU exists on this machine. Each test writes a stand-in `torch_npu` package (clearly not the real
one) into a temporary directory and runs a child process with it on PYTHONPATH. The stand-in does what
the real package does to torch, with the real torch APIs: renames the privateuse1 backend to "npu",
registers a `torch.npu` device module, and registers an "hccl" process-group backend for the "npu"
device (built on Gloo underneath, so several CPU processes can really talk). Environment variables make
it fail the way the real one fails (libhccl.so missing, driver missing, symbol mismatch) or see no
device. The real torch-npu wheel failing for real is tested in test_device.py.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[1]

STANDIN_TORCH_NPU = '''
"""STAND-IN for torch_npu, written by tests/test_runtime_npu.py. Not the real package."""
import os
import types

MODE = os.environ.get("STANDIN_NPU_MODE", "ok")
if MODE == "cann-missing":
    raise ImportError("libhccl.so: cannot open shared object file: No such file or directory")
if MODE == "driver-missing":
    raise ImportError("libascend_hal.so: cannot open shared object file: No such file or directory")
if MODE == "mismatch":
    raise ImportError("torch_npu/_C.cpython-311-x86_64-linux-gnu.so: undefined symbol: _ZN3c104impl3cow")

import torch
import torch.distributed as dist

calls = []
_current = [0]


def _count():
    return int(os.environ.get("STANDIN_NPU_COUNT", "2"))


def _set_device(index):
    calls.append(["set_device", int(index)])
    _current[0] = int(index)


npu = types.ModuleType("torch.npu")
npu.is_available = lambda: _count() > 0
npu.device_count = _count
npu.set_device = _set_device
npu.current_device = lambda: _current[0]
npu.is_bf16_supported = lambda: True
npu.empty_cache = lambda: calls.append(["empty_cache"])
npu.synchronize = lambda device=None: calls.append(["synchronize", str(device)])
npu.memory_allocated = lambda device=None: 1 << 20
npu.memory_reserved = lambda device=None: 2 << 20
npu.max_memory_allocated = lambda device=None: 3 << 20
npu.max_memory_reserved = lambda device=None: 4 << 20
npu.reset_peak_memory_stats = lambda device=None: calls.append(["reset_peak_memory_stats", str(device)])

torch.utils.rename_privateuse1_backend("npu")
torch._register_device_module("npu", npu)


def _hccl(store, rank, size, timeout):
    return dist.ProcessGroupGloo(store, rank, size, timeout)  # "hccl" by name, Gloo underneath


dist.Backend.register_backend("hccl", _hccl, devices=["npu"])


def npu_fusion_attention(*args, **kwargs):
    raise NotImplementedError("stand-in")


npu_rms_norm = npu_rotary_mul = npu_fusion_attention
'''


def _write_standin(root: Path, autoload: bool = False) -> Path:
    pkg = root / "standin" / "torch_npu"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(STANDIN_TORCH_NPU)
    if autoload:
        # Registers the stand-in for torch's backend autoload, as the real wheel's entry point does.
        info = root / "standin" / "torch_npu-0.0.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch_npu\nVersion: 0.0.0\n")
        (info / "entry_points.txt").write_text("[torch.backends]\ntorch_npu = torch_npu:npu_fusion_attention\n")
    return root / "standin"


def _env(standin: Path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TRAINBOX_", "STANDIN_", "ASCEND_", "OMPI_", "HCCL_"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                         "TORCH_DEVICE_BACKEND_AUTOLOAD")}
    env["PYTHONPATH"] = os.pathsep.join([str(standin), str(REPO / "python")])
    env.update({k: str(v) for k, v in extra.items()})
    return env


def _python(code: str, env: dict, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=env, timeout=timeout, cwd=REPO)


SCENARIOS = r'''
import json, os, sys, types
import torch
from trainbox.runtime import device as d

out = {}

def attempt(name, fn):
    try:
        out[name] = {"value": fn()}
    except Exception as exc:
        out[name] = {"error": type(exc).__name__, "message": str(exc)}

# torch_npu cannot load: every failure is explained, none falls back to the CPU.
for mode in ("cann-missing", "driver-missing", "mismatch"):
    os.environ["STANDIN_NPU_MODE"] = mode
    attempt(mode, d.get_device_type)
os.environ["STANDIN_NPU_MODE"] = "cann-missing"
os.environ["ASCEND_TOOLKIT_HOME"] = os.environ["FAKE_CANN_DIR"]
attempt("cann-not-sourced", d.get_device_type)
del os.environ["ASCEND_TOOLKIT_HOME"]
os.environ["TRAINBOX_DEVICE"] = "cpu"
attempt("forced-cpu", d.get_device_type)
del os.environ["TRAINBOX_DEVICE"]
out["torch_npu_loaded_so_far"] = "torch_npu" in sys.modules

# torch_npu loads but sees no device (driver or /dev/davinci* not mounted).
os.environ["STANDIN_NPU_MODE"] = "ok"
os.environ["STANDIN_NPU_COUNT"] = "0"
attempt("no-device", d.get_device_type)

os.environ["STANDIN_NPU_COUNT"] = "2"
import torch_npu
attempt("type", d.get_device_type)
attempt("backend", d.get_dist_backend)
attempt("mixed", lambda: d.get_dist_backend(mixed=True))
attempt("count", d.device_count)
os.environ["LOCAL_RANK"] = "1"
attempt("local", lambda: str(d.get_local_device()))
attempt("set_device", lambda: str(d.set_device()))
os.environ["LOCAL_RANK"] = "2"
os.environ["ASCEND_RT_VISIBLE_DEVICES"] = "4,5"
attempt("local-out-of-range", d.get_local_device)
del os.environ["LOCAL_RANK"]
os.environ.update(RANK="3", WORLD_SIZE="4")
attempt("rank-mod-count", lambda: str(d.get_local_device()))
del os.environ["RANK"], os.environ["WORLD_SIZE"]

# Stand-in for a Ray worker: Ray hands out physical NPU ids; torch wants logical indices.
assigned = {"NPU": ["5"]}
ray = types.ModuleType("ray")
ray.is_initialized = lambda: True
ray.get_runtime_context = lambda: types.SimpleNamespace(get_accelerator_ids=lambda: assigned)
sys.modules["ray"] = ray
attempt("ray-visible", lambda: str(d.get_local_device()))
del os.environ["ASCEND_RT_VISIBLE_DEVICES"]
assigned["NPU"] = ["1"]
attempt("ray-noset", lambda: str(d.get_local_device()))
assigned["NPU"] = ["5"]
attempt("ray-noset-out-of-range", d.get_local_device)
del sys.modules["ray"]

attempt("memory", lambda: d.memory_stats("npu:1"))
attempt("reset", lambda: d.reset_peak_memory_stats("npu:1"))
attempt("empty", lambda: d.empty_cache("npu:0"))
attempt("caps", lambda: {k: [bool(c), c.reason, c.alternative] for k, c in d.capabilities().items()})
attempt("require-flex", lambda: d.require("flex_attention"))
attempt("require-fused-ops", lambda: d.require("npu_fused_ops").available)
out["calls"] = torch_npu.calls
print(json.dumps(out))
'''


@pytest.fixture(scope="module")
def scenarios(tmp_path_factory):
    root = tmp_path_factory.mktemp("npu")
    standin = _write_standin(root)
    cann = root / "Ascend" / "ascend-toolkit" / "latest"
    cann.mkdir(parents=True)
    proc = _python(SCENARIOS, _env(standin, FAKE_CANN_DIR=cann))
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("mode, fragments", [
    ("cann-missing", ["libhccl.so", "no CANN toolkit is installed", "quay.io/ascend/cann"]),
    ("cann-not-sourced", ["libhccl.so", "CANN is present", "set_env.sh"]),
    ("driver-missing", ["libascend_hal.so", "Ascend driver", "/usr/local/Ascend/driver/lib64"]),
    ("mismatch", ["undefined symbol", "do not match", "major.minor"]),
    ("no-device", ["sees no NPU", "/dev/davinci"]),
])
def test_npu_that_cannot_be_used_is_explained(scenarios, mode, fragments):
    result = scenarios[mode]
    assert result.get("error") == "DeviceUnavailableError", result
    for fragment in fragments + ["TRAINBOX_DEVICE=cpu", "refusing to fall back to the CPU"]:
        assert fragment in result["message"], (fragment, result["message"])


def test_forced_cpu_does_not_touch_torch_npu(scenarios):
    assert scenarios["forced-cpu"] == {"value": "cpu"}
    assert scenarios["torch_npu_loaded_so_far"] is False


def test_npu_device_and_backend(scenarios):
    assert scenarios["type"] == {"value": "npu"}
    assert scenarios["backend"] == {"value": "hccl"}  # from torch's registry, as torch_npu registers it
    assert scenarios["mixed"] == {"value": "cpu:gloo,npu:hccl"}
    assert scenarios["count"] == {"value": 2}


def test_npu_local_device(scenarios):
    assert scenarios["local"] == {"value": "npu:1"}
    assert scenarios["set_device"] == {"value": "npu:1"}
    assert ["set_device", 1] in scenarios["calls"]
    assert scenarios["rank-mod-count"] == {"value": "npu:1"}  # RANK 3 % 2 devices
    err = scenarios["local-out-of-range"]
    assert err["error"] == "TrainboxError"
    assert "LOCAL_RANK=2" in err["message"] and "only 2 npu device(s)" in err["message"]
    assert "ASCEND_RT_VISIBLE_DEVICES='4,5'" in err["message"]


def test_npu_local_device_under_ray(scenarios):
    assert scenarios["ray-visible"] == {"value": "npu:1"}  # physical 5 is the 2nd of "4,5"
    assert scenarios["ray-noset"] == {"value": "npu:1"}  # NOSET, no list: physical id = index
    assert "Ray NPU id 5" in scenarios["ray-noset-out-of-range"]["message"]


def test_npu_memory_helpers(scenarios):
    assert scenarios["memory"]["value"] == {"device": "npu:1", "allocated": 1 << 20, "reserved": 2 << 20,
                                            "max_allocated": 3 << 20, "max_reserved": 4 << 20}
    assert ["reset_peak_memory_stats", "npu:1"] in scenarios["calls"]
    assert ["empty_cache"] in scenarios["calls"]


def test_npu_capabilities(scenarios):
    caps = scenarios["caps"]["value"]
    assert caps["flex_attention"][0] is False and "sdpa" in caps["flex_attention"][2]
    assert caps["bf16_gru"][0] is False and "DynamicGRU" in caps["bf16_gru"][1]
    assert caps["npu_fused_ops"][0] is True and caps["flash_attn"][0] is True
    assert caps["bf16"][0] is True and caps["sdpa"][0] is True
    assert caps["triton"][0] is False and "triton-ascend" in caps["triton"][1]
    assert scenarios["require-flex"]["error"] == "CapabilityError"
    assert "use --attention-backend sdpa" in scenarios["require-flex"]["message"]
    assert scenarios["require-fused-ops"] == {"value": True}


@pytest.mark.slow
def test_torch_autoload_failure_is_explained(tmp_path):
    # torch imports the stand-in through the torch.backends entry point, as with the real wheel.
    standin = _write_standin(tmp_path, autoload=True)
    env = _env(standin, STANDIN_NPU_MODE="cann-missing")
    control = _python("import torch", env)
    assert "Failed to load the backend extension: torch_npu" in control.stderr

    proc = _python("""
        from trainbox.runtime import device
        for _ in range(2):
            try:
                device.get_device_type()
            except device.DeviceUnavailableError as exc:
                print(repr(str(exc)))
        """, env)
    assert proc.returncode == 0, proc.stderr
    first, second = proc.stdout.strip().splitlines()
    assert first == second
    assert "libhccl.so" in first and "TRAINBOX_DEVICE=cpu" in first

    proc = _python("""
        from trainbox.runtime import dist
        info = dist.init_distributed()
        print(info.device, info.backend)
        dist.destroy_distributed()
        """, {**env, "TRAINBOX_DEVICE": "cpu"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["cpu", "gloo"]


HCCL_WORKER = r'''
import functools, json, os, sys
import torch, torch_npu
import torch.distributed as dist
from trainbox.runtime import dist as tdist

out = {}
orig_init = dist.init_process_group
@functools.wraps(orig_init)  # keeps the signature that trainbox inspects for device_id
def recording_init(*args, **kwargs):
    # Record what init_process_group saw: the device must already be bound when it runs.
    out.setdefault("calls_before_init", list(torch_npu.calls))
    out.setdefault("init_kwargs", {k: str(v) for k, v in kwargs.items() if k != "store"})
    return orig_init(*args, **kwargs)
dist.init_process_group = recording_init

info = tdist.init_distributed(timeout=60)
out["info"] = info.as_dict()
out["hccl_env"] = {k: os.environ.get(k) for k in ("HCCL_HOST_SOCKET_PORT_RANGE", "HCCL_NPU_SOCKET_PORT_RANGE")}
out["bound_before"] = str(dist.group.WORLD.bound_device_id)

# Control: without trainbox's guard, a Gloo group under a default group bound to an NPU breaks.
try:
    dist.new_group(backend="gloo")
    out["raw_new_group"] = "ok"
except RuntimeError as exc:
    out["raw_new_group"] = str(exc)

out["gathered"] = tdist.all_gather_object({"rank": info.rank})
group = tdist.object_group()
out["object_backend"] = dist.get_backend(group)
out["object_group_cached"] = tdist.object_group() is group
out["bound_after"] = str(dist.group.WORLD.bound_device_id)
out["gather"] = tdist.gather_object(info.rank * 10, dst=1)
out["broadcast"] = tdist.broadcast_object_list(["from-0" if info.rank == 0 else None], src=0)
tdist.destroy_distributed()
info2 = tdist.init_distributed(timeout=60)
out["regroup_is_new"] = tdist.object_group() is not group
out["gathered_again"] = tdist.all_gather_object(info2.rank)
tdist.destroy_distributed()
with open(os.path.join(sys.argv[1], f"rank{info.rank}.json"), "w") as f:
    json.dump(out, f)
'''


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_hccl_backend_routes_objects_through_gloo(tmp_path):
    standin = _write_standin(tmp_path)
    worker = tmp_path / "worker.py"
    worker.write_text(HCCL_WORKER)
    port = _free_port()
    procs = [
        subprocess.Popen([sys.executable, str(worker), str(tmp_path)], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, cwd=REPO,
                         env=_env(standin, RANK=r, WORLD_SIZE=2, LOCAL_RANK=r, MASTER_ADDR="127.0.0.1",
                                  MASTER_PORT=port))
        for r in range(2)
    ]
    try:
        logs = [p.communicate(timeout=90)[0] for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        logs = [p.communicate()[0] for p in procs]
        pytest.fail("workers hung:\n" + "\n".join(logs))
    assert [p.returncode for p in procs] == [0, 0], "\n".join(logs)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for r, out in enumerate(ranks):
        assert out["info"] == {"rank": r, "world_size": 2, "local_rank": r, "device": f"npu:{r}",
                               "backend": "hccl", "source": "torchrun"}
        assert out["calls_before_init"] == [["set_device", r]]  # bound before the group exists
        assert out["init_kwargs"]["device_id"] == f"npu:{r}"  # this torch accepts device_id
        assert out["init_kwargs"]["backend"] == "hccl"
        slot = (port % 128) * 32
        assert out["hccl_env"] == {"HCCL_HOST_SOCKET_PORT_RANGE": f"{20480 + slot}-{20480 + slot + 31}",
                                   "HCCL_NPU_SOCKET_PORT_RANGE": f"{24576 + slot}-{24576 + slot + 31}"}
        assert out["bound_before"] == f"npu:{r}"
        assert "No backend type associated with device type npu" in out["raw_new_group"]
        assert out["bound_after"] == "None"
        assert out["object_backend"] == "gloo" and out["object_group_cached"] is True
        assert out["gathered"] == [{"rank": 0}, {"rank": 1}]
        assert out["broadcast"] == ["from-0"]
        assert out["regroup_is_new"] is True and out["gathered_again"] == [0, 1]
    assert ranks[0]["gather"] is None and ranks[1]["gather"] == [0, 10]
