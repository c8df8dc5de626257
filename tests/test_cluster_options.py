"""What an administrator expects of a cluster render: a unique default name (a second submission is not a
collision), --name/--namespace on every object, extra #SBATCH lines, and an image the nodes can pull."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from trainbox.launch.targets import RenderOptions, render_target, resolve_for, unpullable
from trainbox.runtime.errors import TrainboxError


def _docs(target="pytorchjob", **opts):
    job = resolve_for(target, "cpu-ddp", nodes=2, image="registry.example/trainbox/cpu@sha256:" + "1" * 64)
    return list(yaml.safe_load_all(render_target(job, target, RenderOptions(**opts))))


def test_default_names_differ_between_renders_and_the_configmap_follows():
    a, b = _docs(), _docs()
    assert a[1]["metadata"]["name"] != b[1]["metadata"]["name"]
    assert a[1]["metadata"]["name"].startswith("cpu-ddp-")
    assert a[0]["metadata"]["name"] == a[1]["metadata"]["name"] + "-launcher"
    mounts = [v["configMap"]["name"] for t in a[1]["spec"]["pytorchReplicaSpecs"].values()
              for v in t["template"]["spec"]["volumes"] if "configMap" in v]
    assert set(mounts) == {a[0]["metadata"]["name"]}


def test_name_and_namespace_go_on_both_objects():
    cm, obj = _docs(name="train-7", namespace="ml-team")
    assert (obj["metadata"]["name"], cm["metadata"]["name"]) == ("train-7", "train-7-launcher")
    assert cm["metadata"]["namespace"] == obj["metadata"]["namespace"] == "ml-team"


@pytest.mark.parametrize("opts,match", [({"name": "Train_7"}, "--name"), ({"namespace": "a b"}, "--namespace"),
                                        ({"name": "x" * 51}, "--name")])
def test_bad_names_are_refused(opts, match):
    with pytest.raises(TrainboxError, match=match):
        _docs(**opts)


def test_kubernetes_options_are_refused_for_slurm_and_sbatch_args_for_kubernetes():
    with pytest.raises(TrainboxError, match="--namespace: an option of the Kubernetes targets"):
        _docs("slurm", namespace="ml")
    with pytest.raises(TrainboxError, match="--sbatch-arg: an option of the slurm targets"):
        _docs("volcano", sbatch_args=("--partition=a",))


def test_sbatch_args_become_sbatch_lines_and_owned_or_odd_ones_are_refused():
    job = resolve_for("slurm", "cpu-ddp", nodes=2, image="r.example/x@sha256:" + "1" * 64)
    text = render_target(job, "slurm", RenderOptions(sbatch_args=("--partition=train", "--time=04:00:00")))
    head = text.split("set -euo pipefail", 1)[0]
    assert "#SBATCH --partition=train\n#SBATCH --time=04:00:00\n" in head
    for bad in ("--nodes=3", "--output=x", "--comment=two words", "-p train", "--x='y'", "--a=b\n#SBATCH --c"):
        with pytest.raises(TrainboxError, match="--sbatch-arg"):
            render_target(job, "slurm", RenderOptions(sbatch_args=(bad,)))


@pytest.mark.slow
def test_a_local_image_on_many_nodes_warns_and_strict_refuses():
    local = resolve_for("slurm", "cpu-ddp", nodes=2, image="trainbox/cpu:latest")
    assert "local tag without a registry" in unpullable(local, "slurm")
    assert unpullable(resolve_for("slurm", "cpu-ddp", nodes=1, image="trainbox/cpu:latest"), "slurm") is None
    assert unpullable(resolve_for("volcano", "cpu-ddp", nodes=1, image="trainbox/cpu:latest"), "volcano")
    for ok in ("registry.example:5000/trainbox/cpu:1", "localhost/x:1", "site#trainbox/cpu:1"):
        assert unpullable(resolve_for("slurm", "cpu-ddp", nodes=2, image=ok), "slurm") is None
    cmd = [sys.executable, "-m", "trainbox.cli", "launch", "render", "cpu-ddp", "--target", "slurm", "--nodes", "2",
           "--image", "trainbox/cpu:latest"]
    warn = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert warn.returncode == 0 and "warning: image trainbox/cpu:latest is a local tag" in warn.stderr
    strict = subprocess.run(cmd + ["--strict"], capture_output=True, text=True, timeout=120)
    assert strict.returncode == 2 and "--strict: image trainbox/cpu:latest" in strict.stderr and not strict.stdout


# --- resource requests: cpu and memory per pod, defaults by device, requests only ---------------------------------
def _requests(target="pytorchjob", name="cpu-ddp", **opts):
    from k8s_schema import pod_templates

    job = resolve_for(target, name, nodes=2, image="registry.example/trainbox/x@sha256:" + "1" * 64,
                      sets={"TARGET_MODEL_PATH": "/m", "TRAIN_DATA_PATH": "/d", "OUTPUT_DIR": "/o"}
                      if name.startswith("specforge") else None)
    obj = list(yaml.safe_load_all(render_target(job, target, RenderOptions(**opts))))[1]
    return [c["resources"] for t in pod_templates(obj) for c in t["spec"]["containers"]]


def test_pods_request_cpu_and_memory_by_default_and_no_limit_on_them():
    for res in _requests():  # cpu-ddp: 2 processes a node -> 1 core and 2Gi each
        assert res["requests"] == {"cpu": "2", "memory": "4Gi"} and "limits" not in res
    for res in _requests("ascendjob", "specforge-domino-qwen35-4b-npu", accelerator_type="module-a3-16"):
        assert res["requests"] == {"huawei.com/Ascend910": 8, "cpu": "32", "memory": "128Gi"}
        assert res["limits"] == {"huawei.com/Ascend910": 8}  # cards only: a memory limit would OOM-kill a peak


@pytest.mark.parametrize("target", ["pytorchjob", "volcano", "rayjob"])
def test_cpu_and_memory_options_set_every_pod(target):
    name = "ray-cpu" if target == "rayjob" else "cpu-ddp"
    for res in _requests(target, name, cpu="500m", memory="96Gi"):
        assert res["requests"]["cpu"] == "500m" and res["requests"]["memory"] == "96Gi"


@pytest.mark.parametrize("opt, bad", [("cpu", "2 cores"), ("cpu", "-1"), ("memory", "1GB"), ("memory", "64gi"),
                                      ("memory", "1e9\nx: y")])
def test_bad_quantities_are_refused_in_one_line(opt, bad):
    with pytest.raises(TrainboxError, match=f"--{opt} .*Kubernetes quantity"):
        _requests(**{opt: bad})
    proc = subprocess.run([sys.executable, "-m", "trainbox.cli", "launch", "render", "cpu-ddp", "--target", "slurm",
                           f"--{opt}", "1"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and f"--{opt}: an option of the Kubernetes targets" in proc.stderr
