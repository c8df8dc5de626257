"""`trainbox doctor` inside the real images, check by check, with each failure provoked through docker.

Needs the `cpu_image` and `npu_image` fixtures (tests/conftest.py): tags of the built cpu image and of
the image built from the NPU template (torch_npu installed, no CANN). Containers run with --network none,
are labelled trainbox.test=1 and removed. Device nodes for the NPU/GPU checks are stand-ins: /dev/null
mapped to /dev/davinciN etc. with --device.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

pytestmark = pytest.mark.docker

DOCKER = os.environ.get("TRAINBOX_DOCKER") or shutil.which("docker") or "/usr/bin/docker"
RUN = [DOCKER, "run", "--rm", "--network", "none", "--label", "trainbox.test=1"]
ROOMY = ("--shm-size", "8g", "-e", "TRAINBOX_MIN_FREE_GB=0")  # so shm/disk never decide a test by accident
NPU_NODES = ("--device", "/dev/null:/dev/davinci0", "--device", "/dev/null:/dev/davinci1",
             "--device", "/dev/null:/dev/davinci_manager", "--device", "/dev/null:/dev/devmm_svm",
             "--device", "/dev/null:/dev/hisi_hdc")


def drun(image, *cmd, opts=(), timeout=300):
    return subprocess.run([*RUN, *opts, image, *cmd], capture_output=True, text=True, timeout=timeout)


def doctor(image, *args, opts=()):
    """Run `trainbox doctor --json` in the image; return (exit code, {check id: check}, report)."""
    proc = drun(image, "trainbox", "doctor", "--json", *args, opts=opts)
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    rep = json.loads(proc.stdout)
    for c in rep["checks"]:  # a child's traceback may sit in data (for CI logs), never in what people read
        assert "Traceback" not in c["message"] + (c["fix"] or ""), c
    return proc.returncode, {c["id"]: c for c in rep["checks"]}, rep


def image_manifest(image) -> dict:
    return json.loads(drun(image, "cat", "/etc/trainbox/stack.json").stdout)


@pytest.mark.parametrize("fixture", ["cpu_image", "cpu_ray_image", "npu_image"])
def test_image_ls_and_doctor_agree_on_the_substitute(fixture, request):
    """One fact, read twice: `image ls` (the io.trainbox.base.substituted label, which `run` reads too) and the
    doctor in the image (the manifest). The npu image is built with an explicit --base local/debian:bookworm."""
    from trainbox.image.inventory import built_images

    tag = request.getfixturevalue(fixture)
    [img] = [i for i in built_images() if tag in i.tags]
    _code, c, _rep = doctor(tag, opts=ROOMY)
    substituted = c["manifest"]["data"]["substituted"]
    assert img.substitute == bool(substituted), (img.labels, c["manifest"])
    assert img.labels.get("io.trainbox.base.substituted") == substituted
    assert ("built on substitute base" in c["manifest"]["message"]) == img.substitute
    if fixture == "npu_image":
        assert img.substitute  # Debian standing in for the CANN base


# ----------------------------------------------------------------------------------------------- cpu image


def test_cpu_image_report(cpu_image):
    man = image_manifest(cpu_image)
    code, c, rep = doctor(cpu_image, opts=ROOMY)
    assert rep["context"]["stack"] == man["stack"] and rep["context"]["device"] == "cpu"
    assert c["manifest"]["status"] == "PASS"
    assert c["python.version"]["status"] == "PASS"
    pinned = [k for k, v in (man.get("components") or {}).items() if v.get("version") and v.get("install", True)]
    assert c["packages.versions"]["status"] == ("PASS" if pinned else "SKIP"), c["packages.versions"]
    assert c["packages.torch_npu"]["status"] == "SKIP"
    assert c["packages.sbom"]["status"] == "PASS", c["packages.sbom"]  # the image carries its SBOM, matching
    assert c["device.selection"]["status"] == "PASS"
    for cid in ("cann.toolkit", "cann.env", "cann.libs", "npu.devices", "npu.driver", "npu.visible_devices",
                "cuda.driver", "cuda.visible_devices", "ray.visible_devices"):
        assert c[cid]["status"] == "SKIP", c[cid]
    has_torch = "torch" in (man.get("components") or {})
    assert c["torch.import"]["status"] == ("PASS" if has_torch else "SKIP"), c["torch.import"]
    for cid in ("hccl.timeouts", "hccl.options", "hccl.ports", "npu.alloc_conf", "npu.streams_per_device",
                "npu.task_queue"):
        assert c[cid]["status"] in ("SKIP", "PASS"), c[cid]
    assert c["system.shm"]["status"] == "PASS"
    assert c["system.memlock"]["status"] == "PASS"
    assert c["system.disk"]["status"] == "PASS"
    assert code == 0 and rep["summary"]["fail"] == 0


def test_cpu_image_default_shm_fails_with_fix(cpu_image):
    proc = drun(cpu_image, "trainbox", "doctor", "--quick", opts=("--shm-size", "64m"))
    assert proc.returncode == 1
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("FAIL system.shm"))
    assert "/dev/shm is 64 MiB" in line and "-> fix: run with --shm-size=16g" in line


def test_drifted_package_fails(cpu_image):
    man = image_manifest(cpu_image)
    pinned = [v for v in (man.get("components") or {}).values() if v.get("version") and v.get("install", True)]
    if not pinned:
        pytest.skip("the cpu stack pins no component versions")
    name, want = pinned[0]["name"], pinned[0]["version"]
    # A user's `pip install --user` puts another version first on sys.path; a dist-info on PYTHONPATH is the
    # same thing for importlib.metadata (stand-in, no network in the container).
    dist = f"/tmp/site/{name.replace('-', '_')}-0.0.1.dist-info"
    script = (f"mkdir -p {dist} && printf 'Metadata-Version: 2.1\\nName: {name}\\nVersion: 0.0.1\\n' > {dist}/METADATA"
              " && PYTHONPATH=/tmp/site trainbox doctor --json --quick")
    proc = drun(cpu_image, "sh", "-c", script, opts=ROOMY)
    assert proc.returncode == 1
    check = {c["id"]: c for c in json.loads(proc.stdout)["checks"]}["packages.versions"]
    assert check["status"] == "FAIL"
    assert f"{name} 0.0.1 installed, stack pins {want}" in check["message"]
    assert f"'{name}=={want}'" in check["fix"]


def test_env_settings_fail_with_messages(cpu_image):
    opts = (*ROOMY, "-e", "HCCL_CONNECT_TIMEOUT=60", "-e", "STREAMS_PER_DEVICE=16",
            "-e", "PYTORCH_NPU_ALLOC_CONF=expandable_segments:True,max_split_size_mb:128",
            "-e", "HCCL_HOST_SOCKET_PORT_RANGE=61000-61100,61050-61200", "-e", "TASK_QUEUE_ENABLE=5")
    code, c, _ = doctor(cpu_image, "--quick", opts=opts)
    assert code == 1
    assert "outside HCCL's range [120, 7200]" in c["hccl.timeouts"]["message"]
    assert "only 8 or 32" in c["npu.streams_per_device"]["message"]
    assert "together with max_split_size_mb" in c["npu.alloc_conf"]["message"]
    assert "overlap" in c["hccl.ports"]["message"]
    assert c["npu.task_queue"]["status"] == "FAIL"


def test_memlock_limit(cpu_image):
    _, c, _ = doctor(cpu_image, "--quick", opts=(*ROOMY, "-e", "TRAINBOX_DEVICE=cuda",
                                                 "--ulimit", "memlock=65536:65536"))
    assert c["system.memlock"]["status"] == "WARN" and "64 KiB" in c["system.memlock"]["message"]
    unlimited = drun(cpu_image, "trainbox", "doctor", "--json", "--quick",
                     opts=(*ROOMY, "-e", "TRAINBOX_DEVICE=cuda", "--ulimit", "memlock=-1:-1"))
    if unlimited.returncode == 125 and "rlimit" in unlimited.stderr:
        pytest.skip("this engine may not raise RLIMIT_MEMLOCK (no CAP_SYS_RESOURCE)")
    c = {x["id"]: x for x in json.loads(unlimited.stdout)["checks"]}
    assert c["system.memlock"]["status"] == "PASS" and c["system.memlock"]["message"] == "memlock unlimited"


def test_read_only_checkpoint_dir(cpu_image, tmp_path):
    _, c, _ = doctor(cpu_image, "--quick", opts=(*ROOMY, "-v", f"{tmp_path}:/ckpt:ro",
                                                 "-e", "TRAINBOX_CHECKPOINT_DIR=/ckpt"))
    assert c["system.disk"]["status"] == "FAIL" and "/ckpt is not writable" in c["system.disk"]["message"]


def test_cuda_checks_with_stand_in_nodes(cpu_image):
    opts = (*ROOMY, "-e", "TRAINBOX_DEVICE=cuda", "--device", "/dev/null:/dev/nvidia0",
            "--device", "/dev/null:/dev/nvidiactl", "-e", "CUDA_VISIBLE_DEVICES=3")
    _, c, _ = doctor(cpu_image, "--quick", opts=opts)
    assert c["cuda.driver"]["status"] == "FAIL" and "libcuda.so.1" in c["cuda.driver"]["message"]
    assert c["cuda.visible_devices"]["status"] == "FAIL"
    assert "names device 3, but this container has 1 GPU(s)" in c["cuda.visible_devices"]["message"]
    _, c, _ = doctor(cpu_image, "--quick", opts=(*ROOMY, "-e", "TRAINBOX_DEVICE=cuda"))
    assert c["cuda.driver"]["status"] == "FAIL" and "--gpus all" in c["cuda.driver"]["fix"]


# ----------------------------------------------------------------------------------------------- npu image


def test_npu_image_explains_missing_cann(npu_image):
    """torch_npu installed, no CANN: `import torch` crashes, the doctor explains it check by check."""
    crash = drun(npu_image, "python3", "-c", "import torch")
    assert crash.returncode != 0 and "Failed to load the backend extension: torch_npu" in crash.stderr

    man = image_manifest(npu_image)
    code, c, rep = doctor(npu_image, opts=ROOMY)
    assert code == 1 and rep["context"]["device"] == "npu"
    assert c["manifest"]["status"] == "PASS"
    assert c["packages.versions"]["status"] == "PASS", c["packages.versions"]
    assert c["packages.torch_npu"]["status"] == "PASS", c["packages.torch_npu"]
    assert c["packages.sbom"]["status"] == "PASS", c["packages.sbom"]
    assert c["cann.toolkit"]["status"] == "FAIL" and "no CANN toolkit found" in c["cann.toolkit"]["message"]
    if (man.get("base") or {}).get("substituted"):
        assert man["base"]["substituted"] in c["cann.toolkit"]["message"]
    assert c["cann.env"]["status"] == "SKIP"
    libs = c["cann.libs"]
    assert libs["status"] == "FAIL" and "libascendcl.so" in libs["message"] and "libhccl.so" in libs["message"]
    assert "TRAINBOX_DEVICE=cpu" in libs["fix"]
    assert c["npu.devices"]["status"] == "FAIL" and "--device /dev/davinci_manager" in c["npu.devices"]["fix"]
    assert c["npu.driver"]["status"] == "FAIL" and "/usr/local/Ascend/driver/lib64" in c["npu.driver"]["fix"]
    imp = c["torch.import"]
    assert imp["status"] == "FAIL"
    assert "torch_npu (which torch auto-loads) cannot load lib" in imp["message"]
    assert "TORCH_DEVICE_BACKEND_AUTOLOAD=0" in imp["fix"] and "set_env.sh" in imp["fix"]


def test_npu_image_text_report_has_no_traceback(npu_image):
    proc = drun(npu_image, "trainbox", "doctor", opts=ROOMY)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stdout + proc.stderr
    assert any(ln.startswith("FAIL torch.import: `import torch` fails: torch_npu") and "-> fix:" in ln
               for ln in proc.stdout.splitlines())


def test_npu_image_on_purpose_cpu(npu_image):
    code, c, rep = doctor(npu_image, opts=(*ROOMY, "-e", "TRAINBOX_DEVICE=cpu"))
    assert rep["context"]["device"] == "cpu" and rep["context"]["device_source"] == "TRAINBOX_DEVICE"
    assert c["torch.import"]["status"] == "PASS", c["torch.import"]  # entrypoint set TORCH_DEVICE_BACKEND_AUTOLOAD=0
    assert c["device.selection"]["status"] == "PASS"
    assert c["cann.libs"]["status"] == "SKIP" and c["npu.devices"]["status"] == "SKIP"
    assert code == 0


def test_npu_visible_devices_with_stand_in_nodes(npu_image):
    _, c, _ = doctor(npu_image, "--quick", opts=(*ROOMY, *NPU_NODES, "-e", "ASCEND_RT_VISIBLE_DEVICES=4,5"))
    assert c["npu.devices"]["status"] == "PASS" and "2 NPU(s)" in c["npu.devices"]["message"]
    vis = c["npu.visible_devices"]
    assert vis["status"] == "FAIL" and "names device 4, but this container has 2 NPU(s)" in vis["message"]
    assert "ASCEND_RT_VISIBLE_DEVICES=0,1" in vis["fix"]
    _, c, _ = doctor(npu_image, "--quick", opts=(*ROOMY, *NPU_NODES, "-e", "ASCEND_RT_VISIBLE_DEVICES=0-1"))
    assert "'0-1' is not a device id" in c["npu.visible_devices"]["message"]
    _, c, _ = doctor(npu_image, "--quick", opts=(*ROOMY, *NPU_NODES, "-e", "ASCEND_RT_VISIBLE_DEVICES=1"))
    assert c["npu.visible_devices"]["status"] == "PASS"


def test_npu_image_strict_entrypoint_refuses(npu_image):
    proc = drun(npu_image, "sh", "-c", "echo started", opts=(*ROOMY, "-e", "TRAINBOX_CHECK=strict"))
    assert proc.returncode == 78 and "started" not in proc.stdout
    assert "FAIL cann.libs" in proc.stderr and "refusing to start" in proc.stderr
