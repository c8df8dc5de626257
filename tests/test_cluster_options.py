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
    for ok in ("registry.example:5000/trainbox/cpu:1", "site#trainbox/cpu:1", "localhost.example/x:1"):
        assert unpullable(resolve_for("slurm", "cpu-ddp", nodes=2, image=ok), "slurm") is None
    cmd = [sys.executable, "-m", "trainbox.cli", "launch", "render", "cpu-ddp", "--target", "slurm", "--nodes", "2",
           "--image", "trainbox/cpu:latest"]
    warn = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert warn.returncode == 0 and "warning: image trainbox/cpu:latest is a local tag" in warn.stderr
    strict = subprocess.run(cmd + ["--strict"], capture_output=True, text=True, timeout=120)
    assert strict.returncode == 2 and "--strict: image trainbox/cpu:latest" in strict.stderr and not strict.stdout


DIGEST = "sha256:" + "ab" * 32


@pytest.mark.slow
def test_a_loopback_registry_on_many_nodes_warns_and_strict_refuses():
    """Issue 37: a registry on 127.0.0.1 / localhost / ::1 is, on every other node, that node itself: a multi-node
    Slurm job or a pod gets a warning, --strict refuses it. One Slurm node may run where the registry is: nothing
    to say (nor for the docker target, whose script names no image)."""
    from trainbox.launch.images import loopback_problem

    loopbacks = (f"127.0.0.1:5000/trainbox/cpu@{DIGEST}", "localhost:5000/trainbox/cpu:1", "localhost/x:1",
                 "127.0.0.2:5000/trainbox/cpu:1", f"127.0.0.1:5000#trainbox/cpu@{DIGEST}")
    assert "a loopback address" in loopback_problem("[::1]:5000/trainbox/cpu:1")  # --image refuses brackets
    assert loopback_problem("10.0.0.1:5000/trainbox/cpu:1") is None and loopback_problem("trainbox/cpu:1") is None
    for image in loopbacks:
        for target, nodes in (("slurm", 2), ("slurm-pyxis", 2), ("volcano", 1)):
            problem = unpullable(resolve_for(target, "cpu-ddp", nodes=nodes, image=image), target)
            assert problem and "a loopback address" in problem, (image, target, problem)
        assert unpullable(resolve_for("slurm", "cpu-ddp", nodes=1, image=image), "slurm") is None, image
    cmd = [sys.executable, "-m", "trainbox.cli", "launch", "render", "cpu-ddp", "--target", "slurm", "--nodes", "2",
           "--image", loopbacks[0]]
    warn = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert warn.returncode == 0 and f"warning: image {loopbacks[0]} names the registry 127.0.0.1:5000, a loopback" \
        in warn.stderr, warn.stderr
    strict = subprocess.run(cmd + ["--strict"], capture_output=True, text=True, timeout=120)
    assert strict.returncode == 2 and strict.stderr.startswith(f"trainbox: error: --strict: image {loopbacks[0]}")
    assert not strict.stdout and len(strict.stderr.splitlines()) == 1


@pytest.mark.parametrize("bad", ["trainbox/cpu@sha256:abc", "trainbox/cpu@sha256:" + "A" * 64,
                                 "trainbox/cpu@md5:" + "a" * 32, "trainbox/cpu@" + DIGEST + "@" + DIGEST,
                                 "reg.example/x@sha256:" + "a" * 63, "reg.example#x@sha256:abc"])
def test_an_invalid_digest_is_refused_in_one_line(bad, capsys):
    """Issue 37: `--image X@sha256:abc` no node can pull: refused (2, one line) before anything is written, with
    --strict or without, for every target; a well-formed digest is taken."""
    from trainbox.cli import main

    for target in ("slurm", "docker", "pytorchjob"):
        for strict in ([], ["--strict"]):
            assert main(["launch", "render", "cpu-ddp", "--target", target, "--image", bad, *strict]) == 2
            out, err = capsys.readouterr()
            assert not out and err.startswith(f"trainbox: error: --image {bad!r}: expected an image reference") \
                and len(err.splitlines()) == 1, err
    job = resolve_for("slurm", "cpu-ddp", nodes=2, image=f"reg.example/trainbox/cpu@{DIGEST}")
    assert job.image == f"reg.example/trainbox/cpu@{DIGEST}"


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
def test_bad_quantities_are_refused_in_one_line(opt, bad, capsys):
    from trainbox.cli import main

    with pytest.raises(TrainboxError, match=f"--{opt} .*Kubernetes quantity"):
        _requests(**{opt: bad})
    # in-process: the exit status and the line are main()'s (test_hardening_crash runs the real entry point)
    assert main(["launch", "render", "cpu-ddp", "--target", "slurm", f"--{opt}", "1"]) == 2
    assert f"--{opt}: an option of the Kubernetes targets" in capsys.readouterr().err
