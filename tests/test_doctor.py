"""Unit tests for trainbox.runtime.doctor: every check made to fail on purpose, and to pass.

Fake filesystem trees (device nodes as plain files, a CANN toolkit of empty files, dist-info folders)
are stand-ins built under tmp_path and handed to the doctor through Context(root=..., sys_path=...).
"""

from __future__ import annotations

import ctypes.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from trainbox.runtime import doctor
from trainbox.runtime.doctor import FAIL, PASS, SKIP, WARN, Context, versions_match

REPO = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------------------------- helpers


def add_dist(site: Path, name: str, version: str) -> None:
    """Stand-in installed distribution: a dist-info folder with METADATA only."""
    d = site / f"{name.replace('-', '_')}-{version}.dist-info"
    d.mkdir(parents=True, exist_ok=True)
    (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def touch(root: Path, path: str, text: str = "") -> Path:
    p = root / path.lstrip("/")
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    return p


def manifest(device="cpu", components=None, cann=None, substituted=None, python=None, chip=None, env=None):
    return {
        "schema": 1, "trainbox_version": "0.1.0", "stack": f"test-{device}", "device": device,
        "python": python or f"{sys.version_info[0]}.{sys.version_info[1]}",
        "base": {"image": "quay.io/ascend/cann:8.5.1-910b-ubuntu22.04-py3.11", "cann": cann,
                 "substituted": substituted, **({"chip": chip} if chip else {})},
        "components": components or {}, "env": env or {}, "patches": {}, "overrides": {},
    }


def comp(name, version):
    return {"name": name, "source": "pypi", "version": version}


@pytest.fixture
def site(tmp_path) -> Path:
    s = tmp_path / "site"
    s.mkdir()
    return s


@pytest.fixture
def root(tmp_path) -> Path:
    r = tmp_path / "root"
    (r / "dev" / "shm").mkdir(parents=True)
    return r


@pytest.fixture
def make(root, site):
    """Build a Context over the stand-in root and site; env starts nearly empty so the host cannot leak in."""

    def _make(env=None, man=None, quick=True, **kw):
        base_env = {"PATH": "/usr/local/bin:/usr/bin:/bin"}
        base_env.update(env or {})
        return Context(env=base_env, root=str(root), manifest=man, manifest_file="/etc/trainbox/stack.json"
                       if man else None, sys_path=[str(site)], quick=quick, **kw)

    return _make


def run(ctx, check_id):
    (res,) = doctor.run_checks(ctx, only=[check_id])
    assert res.id == check_id
    return res


def npu_tree(root: Path, cards=2, hal=True, smi=True, toolkit="8.5.1", libs=True):
    """Stand-in NPU host mounts and CANN toolkit (plain files in place of device nodes and libraries)."""
    for i in range(cards):
        touch(root, f"/dev/davinci{i}")
    for node in ("/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc"):
        touch(root, node)
    if hal:
        touch(root, "/usr/local/Ascend/driver/lib64/driver/libascend_hal.so")
        touch(root, "/usr/local/Ascend/driver/version.info", "Version=24.1.rc3\n")
        touch(root, "/etc/ascend_install.info", "Driver_Install_Path_Param=/usr/local/Ascend\n")
        (root / "usr/local/dcmi").mkdir(parents=True, exist_ok=True)
    if smi:
        touch(root, "/usr/local/bin/npu-smi").chmod(0o755)
    if toolkit:
        home = "/usr/local/Ascend/ascend-toolkit/latest"
        touch(root, f"{home}/x86_64-linux/ascend_toolkit_install.info",
              f"package_name=Ascend-cann-toolkit\nversion={toolkit}\n")
        touch(root, "/usr/local/Ascend/ascend-toolkit/set_env.sh", "")
        if libs:
            touch(root, f"{home}/lib64/libascendcl.so")
            touch(root, f"{home}/lib64/libhccl.so")


CANN_ENV = {"ASCEND_TOOLKIT_HOME": "/usr/local/Ascend/ascend-toolkit/latest",
            "LD_LIBRARY_PATH": "/usr/local/Ascend/ascend-toolkit/latest/lib64:/usr/local/Ascend/driver/lib64"}


# ----------------------------------------------------------------------------------------------- registry


def test_registry_ids_are_unique_and_documented():
    ids = [c.id for c in doctor.CHECKS]
    assert len(ids) == len(set(ids))
    assert tuple(ids) == doctor.CHECK_IDS
    for c in doctor.CHECKS:
        assert c.doc, f"check {c.id} has no docstring"
    # the slow checks are the ones that start child processes
    assert {c.id for c in doctor.CHECKS if not c.quick} == {"torch.import"}


def test_the_parser_imports_no_check_and_the_report_keeps_its_order_whichever_area_comes_first():
    """Every trainbox command builds a parser that holds `doctor`'s arguments: that must not import the checks
    (they cost ~0.1 s a process). A host module imports an area (npu, hccl) before the others: the report keeps
    the areas' order (core.AREAS) all the same."""
    code = """if True:
        import sys, trainbox.cli as cli
        cli._parser()
        print(sorted(m for m in sys.modules if m.startswith("trainbox.runtime.doctor")))
        import trainbox.runtime.doctor.hccl, trainbox.runtime.doctor.npu
        from trainbox.runtime import doctor
        print(list(doctor.CHECK_IDS))
    """
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    loaded, ids = proc.stdout.splitlines()
    assert eval(loaded) == ["trainbox.runtime.doctor", "trainbox.runtime.doctor.cli"]
    assert eval(ids) == list(doctor.CHECK_IDS)
    areas = [doctor.core.AREAS.index(c.func.__module__.rpartition(".")[2]) for c in doctor.CHECKS]
    assert areas == sorted(areas) and len(set(areas)) == len(doctor.core.AREAS)


def test_crashing_check_becomes_a_fail(make, monkeypatch):
    def boom(ctx):
        raise KeyError("nope")

    chk = doctor.Check("test.boom", boom, True, "boom")
    monkeypatch.setattr(doctor.core, "CHECKS", doctor.CHECKS + [chk])
    res = run(make(), "test.boom")
    assert res.status == FAIL and "KeyError" in res.message and res.fix


def test_json_report_schema(make):
    ctx = make(man=manifest())
    results = doctor.run_checks(ctx)
    rep = doctor.report(ctx, results)
    json.dumps(rep)  # serializable
    assert rep["schema"] == 1
    assert set(rep) == {"schema", "trainbox_version", "context", "summary", "checks"}
    assert set(rep["context"]) == {"stack", "device", "device_source", "manifest", "python", "root", "quick",
                                   "platform", "machine", "emulated", "child_timeout_s"}
    assert set(rep["summary"]) == {"status", "exit_code", "pass", "warn", "fail", "skip"}
    assert sum(rep["summary"][k] for k in ("pass", "warn", "fail", "skip")) == len(results)
    for c in rep["checks"]:
        assert set(c) == {"id", "status", "message", "fix", "data"}
        assert c["status"] in (PASS, WARN, FAIL, SKIP)
        assert (c["fix"] is None) == (c["status"] in (PASS, SKIP))


def test_summary_exit_codes():
    r = [doctor.Result(PASS, "a"), doctor.Result(WARN, "b", "f")]
    assert doctor.summarize(r)["exit_code"] == 0
    assert doctor.summarize(r, strict=True)["exit_code"] == 1
    assert doctor.summarize(r + [doctor.Result(FAIL, "c", "f")])["status"] == FAIL


# ----------------------------------------------------------------------------------------------- manifest


def test_manifest_missing_is_skip(make):
    res = run(make(), "manifest")
    assert res.status == SKIP and "--manifest" in res.message


def test_manifest_invalid_json_fails(tmp_path):
    bad = tmp_path / "stack.json"
    bad.write_text("{not json")
    ctx = Context.from_environment(manifest=str(bad), env={"PATH": "/usr/bin"}, quick=True)
    res = run(ctx, "manifest")
    assert res.status == FAIL and "not valid JSON" in res.message and str(bad) in res.message


def test_manifest_wrong_schema_fails(tmp_path):
    bad = tmp_path / "stack.json"
    bad.write_text(json.dumps({**manifest(), "schema": 7}))
    ctx = Context.from_environment(env={"PATH": "/usr/bin", "TRAINBOX_MANIFEST": str(bad)}, quick=True)
    res = run(ctx, "manifest")
    assert res.status == FAIL and "'schema' is 7" in res.message


def test_manifest_pass_mentions_substitute(make):
    res = run(make(man=manifest("npu", substituted="local/debian:bookworm")), "manifest")
    assert res.status == PASS and "substitute base local/debian:bookworm" in res.message


def test_python_version(make):
    assert run(make(man=manifest()), "python.version").status == PASS
    res = run(make(man=manifest(python="3.9")), "python.version")
    assert res.status == FAIL and "installed for python 3.9" in res.message


# ----------------------------------------------------------------------------------------------- packages


@pytest.mark.parametrize("pinned,installed,ok", [
    ("2.9.0", "2.9.0", True),
    ("2.9", "2.9.0", True),
    ("2.9.0", "2.9.0+cpu", True),          # pip: a pin without a local label matches any local label
    ("2.9.0+cpu", "2.9.0+cpu", True),
    ("2.9.0+cpu", "2.9.0+cu128", False),
    ("2.9.0.post2", "2.9.0-post2", True),
    ("2.9.0.post2", "2.9.0.post3", False),
    ("2.9.0", "2.10.0", False),
    ("0.15.3", "0.15.3rc1", False),
])
def test_versions_match(pinned, installed, ok):
    assert versions_match(pinned, installed) is ok


def test_versions_drift_fails_with_pip_fix(make, site):
    add_dist(site, "foo", "1.0")
    add_dist(site, "bar-baz", "2.0")
    man = manifest(components={"foo": comp("foo", "1.1"), "bar": comp("bar_baz", "2.0"),
                               "gone": comp("gone", "3.0"), "src": {"name": "src", "source": "git"},
                               "skipped": {**comp("skipped", "9"), "install": False}})
    res = run(make(man=man), "packages.versions")
    assert res.status == FAIL
    assert "foo 1.0 installed, stack pins 1.1" in res.message
    assert "gone not installed, stack pins 3.0" in res.message
    assert "bar" not in res.message and "skipped" not in res.message
    assert "pip install --no-deps 'foo==1.1' 'gone==3.0'" in res.fix
    assert res.data["unversioned"] == ["src"]


def test_versions_git_commit_drift(make, site):
    add_dist(site, "megatron-core", "0.15.3")
    (site / "megatron_core-0.15.3.dist-info" / "direct_url.json").write_text(json.dumps(
        {"url": "https://example.invalid/Megatron-LM.git", "vcs_info": {"vcs": "git", "commit_id": "b" * 40}}))
    pinned = {"name": "megatron-core", "source": "git", "version": "0.15.3", "commit": "a" * 40,
              "git": "https://example.invalid/Megatron-LM.git"}
    res = run(make(man=manifest(components={"megatron": pinned})), "packages.versions")
    assert res.status == FAIL and "megatron-core 0.15.3 @ bbbbbbbbbbbb installed, stack pins 0.15.3 @ aaaaaaaaaaaa" \
        in res.message
    assert "'megatron-core @ git+https://example.invalid/Megatron-LM.git@" + "a" * 40 + "'" in res.fix
    same = {**pinned, "commit": "b" * 40}
    assert run(make(man=manifest(components={"megatron": same})), "packages.versions").status == PASS


def test_versions_match_passes(make, site):
    add_dist(site, "foo", "1.0+cpu")
    res = run(make(man=manifest(components={"foo": comp("foo", "1.0")})), "packages.versions")
    assert res.status == PASS and "1 packages match" in res.message


def test_versions_without_manifest_skip(make):
    assert run(make(), "packages.versions").status == SKIP


@pytest.mark.parametrize("torch,npu,status,text", [
    ("2.9.0+cpu", "2.9.0.post2", PASS, "match"),
    ("2.10.0", "2.9.0", FAIL, "differ in major.minor"),
    ("2.9.0+cu128", "2.9.0", FAIL, "cu128 build"),
])
def test_torch_npu_pairing(make, site, torch, npu, status, text):
    add_dist(site, "torch", torch)
    add_dist(site, "torch_npu", npu)
    res = run(make(), "packages.torch_npu")
    assert res.status == status and text in res.message


def test_torch_npu_pairing_skips_without_torch_npu(make, site):
    add_dist(site, "torch", "2.9.0")
    assert run(make(), "packages.torch_npu").status == SKIP


def test_torch_npu_without_torch_fails(make, site):
    add_dist(site, "torch_npu", "2.9.0.post2")
    res = run(make(), "packages.torch_npu")
    assert res.status == FAIL and "torch==2.9.0" in res.fix


# ----------------------------------------------------------------------------------------------- device selection


def test_device_selection_bad_value_fails(make):
    res = run(make(env={"TRAINBOX_DEVICE": "gpu"}), "device.selection")
    assert res.status == FAIL and "'gpu'" in res.message


def test_device_selection_cpu_with_torch_npu_autoload_warns(make, site):
    add_dist(site, "torch_npu", "2.9.0")
    res = run(make(env={"TRAINBOX_DEVICE": "cpu"}, man=manifest("npu")), "device.selection")
    assert res.status == WARN and "TORCH_DEVICE_BACKEND_AUTOLOAD=0" in res.fix
    ok = run(make(env={"TRAINBOX_DEVICE": "cpu", "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}, man=manifest("npu")),
             "device.selection")
    assert ok.status == PASS and "overrides the stack's npu" in ok.message


def test_device_selection_npu_without_autoload_warns(make):
    res = run(make(env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}, man=manifest("npu")), "device.selection")
    assert res.status == WARN and "import torch_npu" in res.fix


def test_device_detected_on_bare_host(make, root):
    assert make().device == "cpu"
    touch(root, "/dev/davinci_manager")
    ctx = make()
    assert (ctx.device, ctx.device_source) == ("npu", "detected")


# ----------------------------------------------------------------------------------------------- CANN


def test_cann_checks_skip_on_cpu(make):
    for cid in ("cann.toolkit", "cann.env", "cann.libs", "npu.devices", "npu.driver", "npu.visible_devices",
                "cuda.driver", "cuda.visible_devices"):
        res = run(make(man=manifest("cpu")), cid)
        assert res.status == SKIP and "device is cpu" in res.message, cid


def test_cann_toolkit_missing_fails_and_names_substitute(make):
    res = run(make(man=manifest("npu", cann="8.5.1", substituted="local/debian:bookworm")), "cann.toolkit")
    assert res.status == FAIL and "no CANN toolkit found" in res.message
    assert "substitute base local/debian:bookworm" in res.message
    assert "TRAINBOX_DEVICE=cpu" in res.fix


def test_cann_toolkit_version(make, root):
    npu_tree(root, toolkit="8.5.1")
    assert run(make(man=manifest("npu", cann="8.5.1")), "cann.toolkit").status == PASS
    res = run(make(man=manifest("npu", cann="8.3.RC1")), "cann.toolkit")
    assert res.status == FAIL and "CANN toolkit 8.5.1" in res.message and "built for CANN 8.3.RC1" in res.message


def test_cann_toolkit_found_under_versioned_dir(make, root):
    touch(root, "/usr/local/Ascend/cann-8.5.1/aarch64-linux/ascend_toolkit_install.info", "version=8.5.1\n")
    res = run(make(man=manifest("npu", cann="8.5.1")), "cann.toolkit")
    assert res.status == PASS and res.data["home"] == "/usr/local/Ascend/cann-8.5.1"


def test_cann_env_not_sourced_fails(make, root):
    npu_tree(root)
    res = run(make(man=manifest("npu")), "cann.env")
    assert res.status == FAIL and "ASCEND_TOOLKIT_HOME is unset" in res.message
    assert "/usr/local/Ascend/ascend-toolkit/set_env.sh" in res.fix
    half = run(make(env={"ASCEND_TOOLKIT_HOME": CANN_ENV["ASCEND_TOOLKIT_HOME"]}, man=manifest("npu")), "cann.env")
    assert half.status == FAIL and "LD_LIBRARY_PATH" in half.message
    assert run(make(env=CANN_ENV, man=manifest("npu")), "cann.env").status == PASS


def test_cann_env_nnal_not_sourced_warns(make, root):
    npu_tree(root)
    touch(root, "/usr/local/Ascend/nnal/atb/set_env.sh")
    res = run(make(env=CANN_ENV, man=manifest("npu")), "cann.env")
    assert res.status == WARN and "ATB_HOME_PATH" in res.message
    assert run(make(env={**CANN_ENV, "ATB_HOME_PATH": "/x"}, man=manifest("npu")), "cann.env").status == PASS


def test_cann_libs_quick(make, root):
    npu_tree(root)
    assert run(make(env=CANN_ENV, man=manifest("npu")), "cann.libs").status == PASS
    res = run(make(man=manifest("npu")), "cann.libs")  # LD_LIBRARY_PATH without the CANN dirs
    assert res.status == FAIL and "libascendcl.so" in res.message and "libhccl.so" in res.message
    assert "source /usr/local/Ascend/ascend-toolkit/set_env.sh" in res.fix


def _real_shared_library() -> str:
    name = ctypes.util.find_library("z") or ctypes.util.find_library("m")
    for d in ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib/aarch64-linux-gnu",
              "/usr/lib/aarch64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib"):
        if name and os.path.exists(os.path.join(d, name)):
            return os.path.join(d, name)
    pytest.skip("no shared library to copy as a stand-in")


def test_cann_libs_dlopen_in_child(make, root):
    npu_tree(root)  # empty files: found, but the loader rejects them
    res = run(make(env=CANN_ENV, man=manifest("npu"), quick=False), "cann.libs")
    assert res.status == FAIL and "cannot be loaded" in res.message
    assert "libascendcl.so" in res.message and ("too short" in res.message or "ELF" in res.message)
    # Stand-ins that really load: copies of a system library under the CANN names.
    lib = _real_shared_library()
    lib64 = root / "usr/local/Ascend/ascend-toolkit/latest/lib64"
    for name in ("libascendcl.so", "libhccl.so"):
        shutil.copy(lib, lib64 / name)
    ok = run(make(env=CANN_ENV, man=manifest("npu"), quick=False), "cann.libs")
    assert ok.status == PASS, ok.line()


def test_cann_libs_without_toolkit_names_the_image(make):
    res = run(make(man=manifest("npu", substituted="local/debian:bookworm")), "cann.libs")
    assert res.status == FAIL and "no CANN toolkit" in res.fix and "local/debian:bookworm" in res.fix


# ----------------------------------------------------------------------------------------------- devices


def test_npu_devices_missing_fail_with_docker_flags(make, root):
    res = run(make(man=manifest("npu")), "npu.devices")
    assert res.status == FAIL and "no /dev/davinciN card" in res.message
    assert "--device /dev/davinci_manager" in res.fix
    npu_tree(root, cards=2)
    (root / "dev/hisi_hdc").unlink()
    res = run(make(man=manifest("npu")), "npu.devices")
    assert res.status == FAIL and "/dev/hisi_hdc" in res.message and "davinciN card" not in res.message
    touch(root, "/dev/hisi_hdc")
    ok = run(make(man=manifest("npu")), "npu.devices")
    assert ok.status == PASS and "2 NPU(s)" in ok.message


def test_npu_driver(make, root):
    npu_tree(root, hal=False, smi=False)
    res = run(make(man=manifest("npu")), "npu.driver")
    assert res.status == FAIL and "libascend_hal.so" in res.message
    assert "-v /usr/local/Ascend/driver/lib64:/usr/local/Ascend/driver/lib64:ro" in res.fix
    npu_tree(root, hal=True, smi=False)
    res = run(make(man=manifest("npu")), "npu.driver")
    assert res.status == WARN and "/usr/local/bin/npu-smi" in res.message and "24.1.rc3" in res.message
    npu_tree(root)
    assert run(make(man=manifest("npu")), "npu.driver").status == PASS


@pytest.mark.parametrize("value,status,text", [
    (None, PASS, "all 2 NPU(s) visible"),
    ("0,1", PASS, "2 of 2"),
    ("1", PASS, "1 of 2"),
    ("4,5", FAIL, "names device 4, but this container has 2 NPU(s)"),
    ("0-3", FAIL, "'0-3' is not a device id"),
    ("0,0", FAIL, "repeats id 0"),
    ("", FAIL, "hides every NPU"),
])
def test_npu_visible_devices(make, root, value, status, text):
    npu_tree(root, cards=2)
    env = {} if value is None else {"ASCEND_RT_VISIBLE_DEVICES": value}
    res = run(make(env=env, man=manifest("npu")), "npu.visible_devices")
    assert res.status == status and text in res.message, res.line()
    if status == FAIL:
        assert "ASCEND_RT_VISIBLE_DEVICES" in res.fix


def test_cuda_driver(make, root):
    man = manifest("cuda")
    res = run(make(man=man), "cuda.driver")
    assert res.status == FAIL and "no NVIDIA GPU visible" in res.message and "--gpus" in res.fix
    touch(root, "/dev/nvidia0")
    touch(root, "/dev/nvidiactl")
    res = run(make(man=man), "cuda.driver")
    assert res.status == FAIL and "libcuda.so.1" in res.message
    touch(root, "/usr/lib/x86_64-linux-gnu/libcuda.so.1")
    res = run(make(man=man), "cuda.driver")
    assert res.status == WARN and "nvidia-smi" in res.message
    touch(root, "/usr/bin/nvidia-smi").chmod(0o755)
    assert run(make(man=man), "cuda.driver").status == PASS


@pytest.mark.parametrize("value,status", [("GPU-1234-abcd", PASS), ("0", PASS), ("3", FAIL), ("-1", FAIL)])
def test_cuda_visible_devices(make, root, value, status):
    touch(root, "/dev/nvidia0")
    touch(root, "/dev/nvidia1")
    res = run(make(env={"CUDA_VISIBLE_DEVICES": value}, man=manifest("cuda")), "cuda.visible_devices")
    assert res.status == status, res.line()


# ----------------------------------------------------------------------------------------------- torch import


def fake_torch(tmp_path: Path, body: str) -> dict:
    """A stand-in `torch` package whose import runs `body`; returns env putting it first on sys.path."""
    pkg = tmp_path / "fake_torch" / "torch"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(body)
    return {"PYTHONPATH": str(pkg.parent)}


# The shape of the real failure (captured from torch 2.13 + torch_npu 2.13.0 from PyPI with no CANN).
AUTOLOAD_FAILURE = '''
class _E(ImportError):
    pass
try:
    raise ImportError("libhccl.so: cannot open shared object file: No such file or directory")
except ImportError as exc:
    raise RuntimeError("Failed to load the backend extension: torch_npu. You can disable extension "
                       "auto-loading with TORCH_DEVICE_BACKEND_AUTOLOAD=0.") from exc
'''


def test_torch_import_autoload_failure_explained(make, tmp_path):
    env = fake_torch(tmp_path, AUTOLOAD_FAILURE)
    res = run(make(env=env, man=manifest("npu", substituted="local/debian:bookworm"), quick=False), "torch.import")
    assert res.status == FAIL
    assert "torch_npu (which torch auto-loads) cannot load libhccl.so" in res.message
    assert "no CANN toolkit" in res.message and "local/debian:bookworm" in res.message
    assert "TORCH_DEVICE_BACKEND_AUTOLOAD=0" in res.fix and "set_env.sh" in res.fix
    assert "Traceback" not in res.message


def test_torch_import_autoload_failure_with_unsourced_cann(make, tmp_path, root):
    npu_tree(root)
    env = fake_torch(tmp_path, AUTOLOAD_FAILURE)
    res = run(make(env=env, man=manifest("npu"), quick=False), "torch.import")
    assert res.status == FAIL and "CANN is at /usr/local/Ascend/ascend-toolkit/latest but its lib64 dirs are not " \
                                  "on LD_LIBRARY_PATH" in res.message


def test_torch_import_undefined_symbol(make, tmp_path):
    env = fake_torch(tmp_path, 'raise ImportError("/x/torch_npu/lib/libtorch_npu.so: undefined symbol: '
                               '_ZN3c104cuda9SetDeviceEa")')
    res = run(make(env=env, quick=False), "torch.import")
    assert res.status == FAIL and "undefined symbol _ZN3c104cuda9SetDeviceEa" in res.message
    assert "same major.minor" in res.fix


def test_torch_import_crash(make, tmp_path):
    env = fake_torch(tmp_path, "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n")
    res = run(make(env=env, quick=False), "torch.import")
    assert res.status == FAIL and "crashed with SIGSEGV" in res.message


def test_torch_import_ok_and_device_count(make, tmp_path):
    env = fake_torch(tmp_path, "__version__ = '2.9.0'\n"
                               "class _Dev:\n    def __init__(s, n): s.n = n\n"
                               "    def is_available(s): return s.n > 0\n    def device_count(s): return s.n\n"
                               "cuda = _Dev(0)\nnpu = _Dev(2)\n")
    assert run(make(env=env, quick=False), "torch.import").status == PASS
    res = run(make(env=env, man=manifest("npu"), quick=False), "torch.import")
    assert res.status == PASS and "sees 2 NPU(s)" in res.message
    res = run(make(env=env, man=manifest("cuda"), quick=False), "torch.import")
    assert res.status == FAIL and "torch.cuda sees no device" in res.message


def test_torch_import_missing(make, tmp_path):
    # The host has torch installed: a stand-in raises ModuleNotFoundError exactly as a missing torch does.
    env = fake_torch(tmp_path, "raise ModuleNotFoundError(\"No module named 'torch'\")")
    res = run(make(env=env, quick=False), "torch.import")
    assert res.status == SKIP
    res = run(make(env=env, man=manifest(components={"torch": comp("torch", "2.9.0")}), quick=False),
              "torch.import")
    assert res.status == FAIL and "torch==2.9.0" in res.fix


def test_torch_import_not_run_in_quick_mode(make):
    assert doctor.run_checks(make(quick=True), only=["torch.import"]) == []


def test_explain_real_autoload_stderr():
    # Tail of the real stderr of `import torch` with torch_npu installed and no CANN.
    stderr = (
        '  File "/venv/lib/python3.11/site-packages/torch_npu/npu/utils.py", line 8, in <module>\n'
        "    import torch_npu._C\n"
        "ImportError: libhccl.so: cannot open shared object file: No such file or directory\n\n"
        "The above exception was the direct cause of the following exception:\n\n"
        "Traceback (most recent call last):\n"
        '  File "<string>", line 1, in <module>\n'
        "RuntimeError: Failed to load the backend extension: torch_npu. You can disable extension auto-loading "
        "with TORCH_DEVICE_BACKEND_AUTOLOAD=0.\n")
    msg, fix = doctor.explain_import_failure(stderr)
    assert msg == "`import torch` fails: torch_npu (which torch auto-loads) cannot load libhccl.so"
    assert "TRAINBOX_DEVICE=cpu" in fix


@pytest.mark.slow
def test_torch_import_real_host_torch(make):
    pytest.importorskip("torch")  # importing here is fine: this test process is not the doctor
    res = run(make(env={"PATH": os.environ.get("PATH", "")}, quick=False), "torch.import")
    assert res.status == PASS and res.data["torch"]


@pytest.mark.slow
@pytest.mark.network
def test_torch_import_real_torch_npu_without_cann(tmp_path_factory, make):
    """The real failure: torch_npu from PyPI (matching the host's torch) in a venv, no CANN anywhere."""
    torch_version = doctor.Context(env={}).dist_version("torch")
    if not torch_version:
        pytest.skip("torch is not installed on this host")
    venv = tmp_path_factory.mktemp("npuvenv")
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    py = str(venv / "bin" / "python")
    want = torch_version.split("+")[0]
    # --no-compile: nothing here imports torch_npu far enough to use its bytecode (pip would compile it all)
    pip = subprocess.run([py, "-m", "pip", "install", "-q", "--no-deps", "--no-compile", f"torch-npu=={want}"],
                         capture_output=True, text=True, timeout=600)
    if pip.returncode != 0:
        pytest.skip(f"torch-npu=={want} not installable here: {pip.stderr[-300:]}")
    crash = subprocess.run([py, "-c", "import torch"], capture_output=True, text=True, timeout=300)
    assert crash.returncode != 0 and "torch_npu" in crash.stderr  # the environment really is broken
    res = run(make(env={"PATH": os.environ.get("PATH", "")}, man=manifest("npu"), quick=False, python=py),
              "torch.import")
    assert res.status == FAIL, res.line()
    assert "torch_npu (which torch auto-loads) cannot load lib" in res.message
    assert "TORCH_DEVICE_BACKEND_AUTOLOAD=0" in res.fix
    ok = run(make(env={"PATH": os.environ.get("PATH", ""), "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}, quick=False,
                  python=py), "torch.import")
    assert ok.status == PASS, ok.line()


# ----------------------------------------------------------------------------------------------- Ray


def fake_ray(site: Path, version="2.40.0", noset="RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES"):
    """Stand-in Ray: dist-info plus the one source file the doctor reads for the NOSET name."""
    add_dist(site, "ray", version)
    touch(site, "/ray/__init__.py")
    touch(site, "/ray/_private/accelerators/npu.py", f'NOSET_ASCEND_RT_VISIBLE_DEVICES_ENV_VAR = "{noset}"\n')


def test_ray_skips(make, site):
    assert run(make(man=manifest("cpu")), "ray.visible_devices").status == SKIP
    assert run(make(man=manifest("npu")), "ray.visible_devices").message == "ray is not installed"


def test_ray_without_noset_passes(make, site):
    fake_ray(site)
    res = run(make(man=manifest("npu")), "ray.visible_devices")
    assert res.status == PASS and "sets ASCEND_RT_VISIBLE_DEVICES per actor" in res.message


def test_ray_old_noset_name_is_ignored_by_new_ray(make, site):
    fake_ray(site)
    res = run(make(env={"RAY_EXPERIMENTAL_NOSET_ASCEND_VISIBLE_DEVICES": "1"}, man=manifest("npu")),
              "ray.visible_devices")
    assert res.status == WARN and "reads RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES" in res.message
    # An old Ray reads the old name: the same setting is then right.
    site2 = site.parent / "site2"
    fake_ray(site2, "2.9.0", noset="RAY_EXPERIMENTAL_NOSET_ASCEND_VISIBLE_DEVICES")
    ctx = Context(env={"RAY_EXPERIMENTAL_NOSET_ASCEND_VISIBLE_DEVICES": "1"}, root=str(site.parent / "root"),
                  manifest=manifest("npu"), sys_path=[str(site2)], quick=True)
    assert run(ctx, "ray.visible_devices").status == PASS


def test_ray_noset_with_subset_warns_about_physical_ids(make, site):
    fake_ray(site)
    env = {"RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES": "1", "ASCEND_RT_VISIBLE_DEVICES": "4,5,6,7"}
    res = run(make(env=env, man=manifest("npu")), "ray.visible_devices")
    assert res.status == WARN and "physical ids 4,5,6,7" in res.message and ".index(" in res.fix
    ok = run(make(env={"RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES": "1"}, man=manifest("npu")),
             "ray.visible_devices")
    assert ok.status == PASS and "physical ids" in ok.message


def test_ray_noset_zero_still_counts(make, site):
    fake_ray(site)
    res = run(make(env={"RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES": "0"}, man=manifest("npu")),
              "ray.visible_devices")
    assert res.status == WARN and "still turns NOSET on" in res.message


def test_ray_cuda(make, site):
    fake_ray(site)
    env = {"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1", "CUDA_VISIBLE_DEVICES": "2,3"}
    res = run(make(env=env, man=manifest("cuda")), "ray.visible_devices")
    assert res.status == WARN and "CUDA_VISIBLE_DEVICES=2,3" in res.message


# ----------------------------------------------------------------------------------------------- HCCL and NPU env


@pytest.mark.parametrize("env,status,text", [
    ({}, SKIP, "unset"),
    ({"HCCL_CONNECT_TIMEOUT": "60"}, FAIL, "outside HCCL's range [120, 7200]"),
    ({"HCCL_CONNECT_TIMEOUT": "9000"}, FAIL, "HCCL_CONNECT_TIMEOUT='9000'"),
    ({"HCCL_CONNECT_TIMEOUT": "1200", "HCCL_EXEC_TIMEOUT": "7200"}, PASS, "within range"),
    ({"HCCL_EXEC_TIMEOUT": "soon"}, FAIL, "HCCL_EXEC_TIMEOUT='soon'"),
    ({"HCCL_EXEC_TIMEOUT": "-5"}, FAIL, "outside"),
    ({"HCCL_EXEC_TIMEOUT": "3600", "HCCL_OP_EXPANSION_MODE": "AIV"}, WARN, "caps the timeout at 1091"),
])
def test_hccl_timeouts(make, env, status, text):
    res = run(make(env=env, man=manifest("npu")), "hccl.timeouts")
    assert res.status == status and text in res.message, res.line()


def test_hccl_exec_timeout_old_chip_limit(make):
    res = run(make(env={"HCCL_EXEC_TIMEOUT": "20000"}, man=manifest("npu", chip="910")), "hccl.timeouts")
    assert res.status == FAIL and "(0, 17340]" in res.message
    assert run(make(env={"HCCL_EXEC_TIMEOUT": "20000"}, man=manifest("npu", chip="910b")),
               "hccl.timeouts").status == PASS


@pytest.mark.parametrize("env,status,text", [
    ({}, SKIP, "no HCCL options"),
    ({"HCCL_BUFFSIZE": "0"}, FAIL, "HCCL_BUFFSIZE='0'"),
    ({"HCCL_BUFFSIZE": "200MB"}, FAIL, "not a positive number"),
    ({"HCCL_OP_EXPANSION_MODE": "GPU"}, WARN, "'GPU' is not a mode"),
    ({"HCCL_IF_IP": "eth0"}, FAIL, "not an IP address"),
    ({"HCCL_IF_IP": "10.0.0.2", "HCCL_SOCKET_IFNAME": "eth0"}, WARN, "HCCL_IF_IP wins"),
    ({"HCCL_BUFFSIZE": "400", "HCCL_OP_EXPANSION_MODE": "AIV", "HCCL_IF_IP": "10.0.0.2"}, PASS, "HCCL_BUFFSIZE=400"),
])
def test_hccl_options(make, env, status, text):
    res = run(make(env=env), "hccl.options")
    assert res.status == status and text in res.message, res.line()


@pytest.mark.parametrize("env,status,text", [
    ({}, SKIP, "no HCCL port"),
    ({"HCCL_HOST_SOCKET_PORT_RANGE": "61000-61050"}, PASS, "61000-61050"),
    ({"HCCL_HOST_SOCKET_PORT_RANGE": "auto"}, PASS, "auto"),
    ({"HCCL_HOST_SOCKET_PORT_RANGE": "61050-61000"}, FAIL, "reversed"),
    ({"HCCL_NPU_SOCKET_PORT_RANGE": "61000-61100,61050-61200"}, FAIL, "overlap"),
    ({"HCCL_NPU_SOCKET_PORT_RANGE": "61000:61100"}, FAIL, "not a port or a range"),
    ({"HCCL_HOST_SOCKET_PORT_RANGE": "70000"}, FAIL, "outside 1-65535"),
    ({"HCCL_HOST_SOCKET_PORT_RANGE": "500-600"}, WARN, "below 1024"),
    ({"HCCL_HOST_SOCKET_PORT_RANGE": "60000-60050"}, WARN, "overlaps the ephemeral range 32768-60999"),
    ({"HCCL_HOST_SOCKET_PORT_RANGE": "61000-61050", "MASTER_PORT": "61010"}, WARN, "MASTER_PORT=61010 lies inside"),
    ({"HCCL_IF_BASE_PORT": "80"}, FAIL, "HCCL_IF_BASE_PORT='80'"),
    ({"HCCL_IF_BASE_PORT": "65521"}, FAIL, "1024-65520"),
    ({"HCCL_IF_BASE_PORT": "65520"}, PASS, "HCCL_IF_BASE_PORT=65520"),
])
def test_hccl_ports(make, root, env, status, text):
    touch(root, "/proc/sys/net/ipv4/ip_local_port_range", "32768\t60999\n")
    touch(root, "/proc/sys/net/ipv4/ip_local_reserved_ports", "\n")
    res = run(make(env=env), "hccl.ports")
    assert res.status == status and text in res.message, res.line()


def test_hccl_ports_reserved_range_is_fine(make, root):
    touch(root, "/proc/sys/net/ipv4/ip_local_port_range", "32768\t60999\n")
    touch(root, "/proc/sys/net/ipv4/ip_local_reserved_ports", "60000-60100\n")
    res = run(make(env={"HCCL_HOST_SOCKET_PORT_RANGE": "60000-60050"}), "hccl.ports")
    assert res.status == PASS, res.line()


@pytest.mark.parametrize("value,status,text", [
    ("expandable_segments:True", PASS, "expandable_segments:True"),
    ("max_split_size_mb:128,garbage_collection_threshold:0.6", PASS, "max_split_size_mb:128"),
    ("expandable_segments:True,max_split_size_mb:128", FAIL, "together with max_split_size_mb"),
    ("garbage_collection_threshold:0.8,expandable_segments:True", FAIL, "garbage_collection_threshold"),
    ("max_split_size_mb:16", FAIL, "above 20"),
    ("garbage_collection_threshold:1.5", FAIL, "(0.0, 1.0)"),
    ("expandable_segments:yes", FAIL, "True or False"),
    ("expandable_segment:True", FAIL, "unknown option 'expandable_segment'"),
    ("expandable_segments", FAIL, "is not option:value"),
    ("base_addr_aligned_kb:16", WARN, "only act with expandable_segments:True"),
    ("expandable_segments:True,base_addr_aligned_kb:32", FAIL, "0-16"),
    ("page_size:2m", FAIL, "only 1g"),
    ("max_split_size_mb:64,max_split_size_mb:128", WARN, "twice"),
])
def test_alloc_conf(make, value, status, text):
    res = run(make(env={"PYTORCH_NPU_ALLOC_CONF": value}), "npu.alloc_conf")
    assert res.status == status and text in res.message, res.line()


def test_alloc_conf_unset_skips(make):
    assert run(make(), "npu.alloc_conf").status == SKIP
    empty = run(make(env={"PYTORCH_NPU_ALLOC_CONF": ""}), "npu.alloc_conf")
    assert empty.status == SKIP and "empty" in empty.message


@pytest.mark.parametrize("value,status", [(None, SKIP), ("8", PASS), ("32", PASS), ("16", FAIL), ("x", FAIL)])
def test_streams_per_device(make, value, status):
    res = run(make(env={} if value is None else {"STREAMS_PER_DEVICE": value}), "npu.streams_per_device")
    assert res.status == status
    if status == FAIL:
        assert "only 8 or 32" in res.message


@pytest.mark.parametrize("value,status", [(None, SKIP), ("0", PASS), ("2", PASS), ("3", FAIL)])
def test_task_queue(make, value, status):
    res = run(make(env={} if value is None else {"TASK_QUEUE_ENABLE": value}), "npu.task_queue")
    assert res.status == status


# ----------------------------------------------------------------------------------------------- system


def test_shm_thresholds(make, root):
    assert run(make(), "system.shm").status in (PASS, WARN)  # a tmp dir on the host disk
    res = run(make(env={"TRAINBOX_MIN_SHM_GB": "1000000"}), "system.shm")
    assert res.status == FAIL and "--shm-size" in res.fix and "Bus error" in res.message


def test_shm_missing_fails(make, root):
    (root / "dev" / "shm").rmdir()
    res = run(make(), "system.shm")
    assert res.status == FAIL and "not usable" in res.message


def _doctor_json_in_child(env: dict, preexec=None) -> dict:
    proc = subprocess.run([sys.executable, "-m", "trainbox.cli", "doctor", "--json", "--quick"], env=env,
                          capture_output=True, text=True, preexec_fn=preexec, timeout=120)
    assert proc.returncode in (0, 1), proc.stderr
    return {c["id"]: c for c in json.loads(proc.stdout)["checks"]}


def test_memlock_low_warns_on_accelerator_stacks():
    import resource

    def lower():
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (65536, 65536))

    env = {**os.environ, "TRAINBOX_DEVICE": "npu", "TRAINBOX_MANIFEST": "/nonexistent/stack.json"}
    checks = _doctor_json_in_child(env, lower)
    assert checks["system.memlock"]["status"] == WARN
    assert "64 KiB" in checks["system.memlock"]["message"] and "memlock=-1:-1" in checks["system.memlock"]["fix"]
    env["TRAINBOX_DEVICE"] = "cpu"
    assert _doctor_json_in_child(env, lower)["system.memlock"]["status"] == PASS


def test_memlock_unlimited_passes():
    import resource

    def unlimited():
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))

    try:
        subprocess.run(["true"], preexec_fn=unlimited, check=True)
    except subprocess.SubprocessError:
        pytest.skip("cannot raise RLIMIT_MEMLOCK here (needs CAP_SYS_RESOURCE)")
    env = {**os.environ, "TRAINBOX_DEVICE": "npu", "TRAINBOX_MANIFEST": "/nonexistent/stack.json"}
    res = _doctor_json_in_child(env, unlimited)["system.memlock"]
    assert res["status"] == PASS and res["message"] == "memlock unlimited"


def test_disk_threshold(make, root):
    (root / "ckpt").mkdir()
    ok = run(make(env={"TRAINBOX_CHECKPOINT_DIR": "/ckpt", "TRAINBOX_MIN_FREE_GB": "0.001"}), "system.disk")
    assert ok.status == PASS and "/ckpt" in ok.message
    res = run(make(env={"TRAINBOX_CHECKPOINT_DIR": "/ckpt", "TRAINBOX_MIN_FREE_GB": "1000000"}), "system.disk")
    assert res.status == WARN and "TRAINBOX_CHECKPOINT_DIR" in res.fix
    # A directory that does not exist yet is judged by the filesystem that will hold it.
    later = run(make(env={"TRAINBOX_CHECKPOINT_DIR": "/ckpt/run1/step100", "TRAINBOX_MIN_FREE_GB": "0.001"}),
                "system.disk")
    assert later.status == PASS


# ----------------------------------------------------------------------------------------------- CLI


def _cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "trainbox.cli", "doctor", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=300)


def test_cli_text_and_exit_codes(tmp_path):
    man = tmp_path / "stack.json"
    man.write_text(json.dumps(manifest(env={})))
    ok = _cli("--quick", "--manifest", str(man), env={"TRAINBOX_MIN_SHM_GB": "0", "TRAINBOX_MIN_FREE_GB": "0"})
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert ok.stdout.splitlines()[0].startswith("trainbox doctor ") and "stack test-cpu" in ok.stdout
    assert "PASS manifest: stack test-cpu" in ok.stdout and ok.stdout.rstrip().splitlines()[-1].startswith("summary:")
    bad = _cli("--quick", "--manifest", str(man), env={"STREAMS_PER_DEVICE": "16"})
    assert bad.returncode == 1 and "FAIL npu.streams_per_device: STREAMS_PER_DEVICE='16'" in bad.stdout
    assert " -> fix: set STREAMS_PER_DEVICE=8 or 32" in bad.stdout
    warn = _cli("--quick", "--manifest", str(man), env={"PYTORCH_NPU_ALLOC_CONF": "base_addr_aligned_kb:16",
                                                          "TRAINBOX_MIN_SHM_GB": "0", "TRAINBOX_MIN_FREE_GB": "0"})
    assert warn.returncode == 0
    strict = _cli("--quick", "--strict", "--manifest", str(man),
                  env={"PYTORCH_NPU_ALLOC_CONF": "base_addr_aligned_kb:16", "TRAINBOX_MIN_FREE_GB": "0"})
    assert strict.returncode == 1


def test_cli_json_and_missing_manifest(tmp_path):
    out = _cli("--quick", "--json", env={"TRAINBOX_MANIFEST": str(tmp_path / "none.json")})
    rep = json.loads(out.stdout)
    assert rep["schema"] == 1 and rep["context"]["manifest"] is None
    assert [c["id"] for c in rep["checks"]] == [c for c in doctor.CHECK_IDS if c != "torch.import"]
    missing = _cli("--manifest", str(tmp_path / "none.json"))
    assert missing.returncode == 2 and "trainbox: error: --manifest" in missing.stderr


@pytest.mark.slow
def test_doctor_does_not_import_torch_in_process():
    code = ("import sys, trainbox.runtime.doctor as d\n"
            "ctx = d.Context.from_environment(quick=False)\n"
            "d.run_checks(ctx)\n"
            "bad = [m for m in ('torch', 'torch_npu', 'ray', 'numpy') if m in sys.modules]\n"
            "print(bad)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_hccl_ports_explain_socket_ranges_on_atlas_a2(make, root):
    touch(root, "/proc/sys/net/ipv4/ip_local_port_range", "32768\t60999\n")
    touch(root, "/proc/sys/net/ipv4/ip_local_reserved_ports", "\n")
    man = {"stack": "npu-910b", "device": "npu", "base": {"chip": "910b"}}
    res = run(make(env={"HCCL_HOST_SOCKET_PORT_RANGE": "21000-21031"}, man=man), "hccl.ports")
    assert res.status == WARN and "MC2" in res.message and "HCCL_IF_BASE_PORT" in res.fix, res.line()
    man["base"]["chip"] = "a3"
    assert run(make(env={"HCCL_HOST_SOCKET_PORT_RANGE": "21000-21031"}, man=man), "hccl.ports").status == PASS
    man["base"]["chip"] = "910b"
    res = run(make(env={"HCCL_IF_BASE_PORT": "29120", "MASTER_PORT": "29500"}, man=man), "hccl.ports")
    assert res.status == PASS and "Atlas A2" in res.message and "MC2" in res.message, res.line()


def test_cann_env_baked_names_what_the_image_env_lacks(make, root):
    record = {"schema": 1, "sourced": ["/usr/local/Ascend/ascend-toolkit/set_env.sh"],
              "env": {"ASCEND_OPP_PATH": "/o", "ATB_HOME_PATH": "/a"}}
    assert run(make(man=manifest("npu")), "cann.env_baked").status == SKIP  # no record: not a trainbox image
    touch(root, "/etc/trainbox/cann-env.json", json.dumps({**record, "sourced": []}))
    assert "no CANN set_env script" in run(make(man=manifest("npu")), "cann.env_baked").message
    touch(root, "/etc/trainbox/cann-env.json", json.dumps(record))
    bypassed = run(make(env={"ATB_HOME_PATH": "/a"}, man=manifest("npu")), "cann.env_baked")
    assert bypassed.status == WARN and "ASCEND_OPP_PATH" in bypassed.message and "ATB" not in bypassed.message
    assert "trainbox image build" in bypassed.fix
    plain = run(make(env={**record["env"], "TRAINBOX_CANN_ENV_APPLIED": "ATB_HOME_PATH"}, man=manifest("npu")),
                "cann.env_baked")
    assert plain.status == WARN and "lacks ATB_HOME_PATH" in plain.message and "command:" in plain.message
    assert run(make(env=record["env"], man=manifest("npu")), "cann.env_baked").status == PASS
    assert run(make(env=record["env"], man=manifest("cpu")), "cann.env_baked").status == SKIP


def test_text_report_folds_skips_that_say_the_same():
    """A CPU host: the NPU/CUDA checks that do not apply, and the NPU settings left unset, are a few lines, not 18;
    every other line stays as it is and --json keeps each check."""
    from trainbox.runtime.doctor.core import Result, _folded_lines

    results = [Result(SKIP, "applies to npu only; device is cpu", id="cann.toolkit"),
               Result(SKIP, "applies to npu only; device is cpu", id="npu.devices"),
               Result(FAIL, "/dev/shm is 64 MiB", "run with --shm-size=16g", id="system.shm"),
               Result(SKIP, "no HCCL port settings", id="hccl.ports"),
               Result(SKIP, "TASK_QUEUE_ENABLE unset", id="npu.task_queue"),
               Result(SKIP, "no accelerator", id="ray.visible_devices")]
    assert _folded_lines(results, "cpu") == [
        "SKIP cann.toolkit, npu.devices: applies to npu only; device is cpu",
        "FAIL system.shm: /dev/shm is 64 MiB -> fix: run with --shm-size=16g",
        "SKIP hccl.ports, npu.task_queue: NPU/HCCL settings unset (their defaults); they do not apply to a cpu device",
        "SKIP ray.visible_devices: no accelerator"]
    on_npu = _folded_lines(results, "npu")
    assert "SKIP hccl.ports: no HCCL port settings" in on_npu and len(on_npu) == 5
