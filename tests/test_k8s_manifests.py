"""Kubernetes targets: every NPU torchrun/exec recipe renders an AscendJob and a Volcano Job, every Ray recipe a
RayJob, every CUDA torchrun recipe a PyTorchJob, each valid against the vendored upstream CRD schema
(../shared/k8s-crds) and its pod templates against the core schema; hostile recipe input stays a value;
and the pod's command, run in two containers with only the variables an operator injects, trains."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from k8s_schema import crd_dir, load_docs, manifest_errors
from trainbox.launch.k8s import ACCELERATOR_TYPE, NPU_RESOURCE, SCRIPT_DIR
from trainbox.launch.targets import RenderOptions, render_target, resolve_for
from trainbox.launch.recipe import all_inputs, list_recipes, load_recipe
from trainbox.launch.job import load_stack_info
from trainbox.runtime.errors import TrainboxError

pytest.importorskip("jsonschema")
pytest.importorskip("kubernetes_validate")
if crd_dir() is None:
    pytest.skip("no shared/k8s-crds beside the repository (set TRAINBOX_K8S_CRDS)", allow_module_level=True)


def _inputs(name: str) -> dict[str, str]:
    """A value for every required input the cluster must be given (paths under /data)."""
    recipe = load_recipe(name)
    return {n: f"/data/{n.lower()}" if spec.kind == "path" else "x"
            for n, spec in all_inputs(recipe).items()
            if spec.required and n not in ("MASTER_ADDR", "NODE_RANK")}


def _cases():
    out = []
    for name in list_recipes():
        recipe = load_recipe(name)
        device = load_stack_info(recipe.stack).device
        if recipe.launcher == "ray":
            out.append((name, "rayjob"))
        elif device == "npu":
            out += [(name, "ascendjob"), (name, "volcano")]
        elif device == "cuda" and recipe.launcher == "torchrun":
            out.append((name, "pytorchjob"))
    return out


CASES = _cases()


def test_every_kind_of_recipe_is_covered():
    targets = {t for _, t in CASES}
    assert targets == {"rayjob", "ascendjob", "volcano", "pytorchjob"}
    assert len(CASES) >= 14


@pytest.mark.parametrize("nodes", [1, 2])
@pytest.mark.parametrize("name,target", CASES)
def test_manifest_is_valid_against_the_upstream_crd(name, target, nodes):
    if nodes > 1 and load_recipe(name).scaling.world_size == "fixed":  # its script's mesh is one node's
        with pytest.raises(TrainboxError, match="world size is fixed"):
            resolve_for(target, name, sets=_inputs(name), nodes=nodes)
        return
    job = resolve_for(target, name, sets=_inputs(name), nodes=nodes, image="registry.example/trainbox/x:1")
    opts = _node_type(job)
    text = render_target(job, target, opts)
    assert manifest_errors(text) == []
    cm, obj = load_docs(text)
    assert cm["kind"] == "ConfigMap" and cm["data"]["job.sh"].startswith("#!/usr/bin/env bash")
    pods = [c for c in _containers(obj)]
    for c in pods:
        assert c["image"] == "registry.example/trainbox/x:1"
        assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]
    vols = _volumes(obj)
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "64Gi"}} in vols or job.device == "cpu"
    if job.device == "npu":
        for c in pods:
            assert c["resources"]["limits"][NPU_RESOURCE] == job.per_node
        assert {"path": "/usr/local/Ascend/driver/lib64"} in [v.get("hostPath") for v in vols]
    if target == "ascendjob":
        _check_ascendjob(obj, job, opts.accelerator_type or ACCELERATOR_TYPE[job.stack.chip])
    if target == "rayjob":
        _check_rayjob(obj, job)


def _containers(obj):
    for t in _templates(obj):
        yield from t["spec"]["containers"]


def _volumes(obj):
    return [v for t in _templates(obj) for v in t["spec"]["volumes"]]


def _templates(obj):
    from k8s_schema import pod_templates

    return pod_templates(obj)


def _node_type(job) -> RenderOptions:
    """The default node type, except where MindCluster would refuse it: a multi-node A3 job of fewer than 16
    cards a pod cannot run on super-pod nodes (test_launch_npu_cluster holds that), so it asks for A3 servers."""
    if job.device == "npu" and job.stack.chip == "a3" and job.nodes > 1 and job.per_node != 16:
        return RenderOptions(accelerator_type="module-a3-16")
    return RenderOptions()


def _check_ascendjob(obj, job, accelerator):
    assert obj["metadata"]["labels"]["ring-controller.atlas"] == "ascend-910b"
    assert obj["metadata"]["labels"]["framework"] == "pytorch"
    assert obj["spec"]["schedulerName"] == "volcano"
    for t in _templates(obj):
        assert t["metadata"]["labels"]["ring-controller.atlas"] == "ascend-910b"
        assert t["spec"]["nodeSelector"] == {"accelerator-type": accelerator}
        (c,) = t["spec"]["containers"]
        assert c["name"] == "ascend" and c["ports"][0]["name"] == "ascendjob-port"
        assert {"name": "TRAINBOX_SCHEDULER", "value": "operator"} in c["env"]
    assert ("sp-block" in obj["metadata"]["annotations"]) == accelerator.endswith("-super-pod")
    assert sum(r["replicas"] for r in obj["spec"]["replicaSpecs"].values()) == job.nodes


def _check_rayjob(obj, job):
    head = obj["spec"]["rayClusterSpec"]["headGroupSpec"]
    if job.device == "npu":
        assert yaml.safe_load(yaml.safe_load(head["rayStartParams"]["resources"])) == {"NPU": job.per_node}
        env = {e["name"]: e["value"] for e in head["template"]["spec"]["containers"][0]["env"] if "value" in e}
        assert env["RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES"] == "1"
        runtime = yaml.safe_load(obj["spec"]["runtimeEnvYAML"])
        assert runtime["env_vars"]["RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES"] == "1"
    assert f"bash {SCRIPT_DIR}/job.sh" in obj["spec"]["entrypoint"]


def test_wrong_kind_for_a_recipe_is_refused():
    from trainbox.runtime.errors import TrainboxError

    with pytest.raises(TrainboxError, match="AscendJob is for NPU recipes"):
        render_target(resolve_for("ascendjob", "cpu-ddp"), "ascendjob")
    with pytest.raises(TrainboxError, match="--target rayjob"):
        render_target(resolve_for("pytorchjob", "ray-cpu"), "pytorchjob")


def test_the_validator_catches_what_it_should():
    """A test that cannot fail is a defect: unknown keys and wrong types are reported."""
    job = resolve_for("pytorchjob", "cpu-ddp", nodes=2)
    cm, obj = load_docs(render_target(job, "pytorchjob"))
    obj["spec"]["surprise"] = 1
    obj["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = "two"
    obj["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["bogus"] = 1
    cm["data"]["job.sh"] = 5
    errors = "\n".join(manifest_errors(yaml.safe_dump_all([cm, obj])))
    assert "'surprise' was unexpected" in errors and "'two' is not of type 'integer'" in errors
    assert "'bogus' was unexpected" in errors and "ConfigMap" in errors


# --- hostile input ------------------------------------------------------------------------------------------
HOSTILE = "x\n---\nkind: Secret\nevil: {a: 1}\n- item # '\" $(touch /tmp/pwned) \\"
HOSTILE_CASES = {"ascendjob": ("npu-910b", "torchrun"), "volcano": ("npu-910b", "torchrun"),
                 "pytorchjob": ("cuda", "torchrun"), "rayjob": ("npu-910b", "ray")}


def _key_paths(node, prefix=""):
    if isinstance(node, dict):
        out = set()
        for k, v in node.items():
            out |= {f"{prefix}/{k}"} | _key_paths(v, f"{prefix}/{k}")
        return out
    if isinstance(node, list):
        return set().union(*(_key_paths(v, f"{prefix}[]") for v in node)) if node else set()
    return set()


def _recipe(tmp_path: Path, stack: str, launcher: str, text: str) -> Path:
    path = tmp_path / "hostile-job.yaml"
    path.write_text(yaml.safe_dump({
        "description": text, "stack": stack, "launcher": launcher, "devices_per_node": 2,
        "inputs": {"NOTE": {"description": text, "default": "plain"}},
        "env": {"TRAINBOX_NOTE": text.replace("$", "$$")},
        "command": [["python3", "-c", text.replace("$", "$$"), "${NOTE}"]]}))
    return path


@pytest.mark.parametrize("target", sorted(HOSTILE_CASES))
def test_hostile_recipe_input_stays_a_value(target, tmp_path):
    stack, launcher = HOSTILE_CASES[target]
    benign = resolve_for(target, str(_recipe(tmp_path, stack, launcher, "plain words")), sets={"NOTE": "ok"})
    b_docs = list(load_docs(render_target(benign, target)))
    hostile = resolve_for(target, str(_recipe(tmp_path, stack, launcher, HOSTILE.replace("\n", " "))),
                          sets={"NOTE": HOSTILE})
    text = render_target(hostile, target)
    docs = list(load_docs(text))
    assert len(docs) == 2 and [d["kind"] for d in docs] == [d["kind"] for d in b_docs]
    assert _key_paths(docs) == _key_paths(b_docs)  # never a new key
    assert manifest_errors(text) == []
    script = docs[0]["data"]["job.sh"]
    assert "NOTE=" + __import__("shlex").quote(HOSTILE) in script  # the value arrives whole, quoted for bash
    env = {e["name"]: e.get("value") for c in _containers(docs[1]) for e in c["env"]}
    assert env["TRAINBOX_NOTE"] == HOSTILE.replace("\n", " ")
    assert docs[1]["metadata"]["annotations"]["trainbox.io/description"] == " ".join(HOSTILE.split())


def test_image_reference_is_checked():
    from trainbox.runtime.errors import TrainboxError

    with pytest.raises(TrainboxError, match="--image"):
        resolve_for("pytorchjob", "cpu-ddp", image="img:1\nevil: key")


# --- the simulated operator ---------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Exactly what each operator documents injecting into a pod of a 2-pod x 1-process job.
OPERATOR_VARS = {
    # MindCluster ascend-operator (PyTorch): RANK is the pod's rank, WORLD_SIZE the job's device count
    "ascend-operator": lambda rank, port: {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
                                           "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1", "LOCAL_RANK": "0"},
    # Kubeflow training-operator v1: RANK is the replica index, WORLD_SIZE the number of pods
    "kubeflow": lambda rank, port: {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
                                    "WORLD_SIZE": "2", "PYTHONUNBUFFERED": "1"},
}


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.parametrize("operator", sorted(OPERATOR_VARS))
def test_pods_train_with_only_the_operator_variables(operator, cpu_image, tmp_path):
    out = subprocess.run([sys.executable, "-m", "trainbox.cli", "launch", "render", "cpu-ddp", "--target",
                          "pytorchjob", "--nodes", "2", "--nproc-per-node", "1", "--image", cpu_image,
                          "--set", "STEPS=20"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    cm, obj = load_docs(out.stdout)
    job_dir = tmp_path / "job"  # what kubelet makes of the ConfigMap volume
    job_dir.mkdir()
    (job_dir / "job.sh").write_text(cm["data"]["job.sh"])
    port, label = _free_port(), f"trainbox.test.operator={os.getpid()}-{operator}"
    names = []
    try:
        for rank, role in enumerate(("Master", "Worker")):
            (c,) = obj["spec"]["pytorchReplicaSpecs"][role]["template"]["spec"]["containers"]
            env = {e["name"]: e["value"] for e in c["env"] if "value" in e} | OPERATOR_VARS[operator](rank, port)
            argv = ["docker", "run", "-d", "--label", label, "--network", "host", "--shm-size", "1g",
                    "--mount", f"type=bind,source={job_dir},target={SCRIPT_DIR},readonly"]
            for k, v in env.items():
                argv += ["-e", f"{k}={v}"]
            proc = subprocess.run(argv + [c["image"], *c["args"]], capture_output=True, text=True, timeout=120)
            assert proc.returncode == 0, proc.stderr
            names.append(proc.stdout.strip())
        codes = [subprocess.run(["docker", "wait", n], capture_output=True, text=True, timeout=300).stdout.strip()
                 for n in names]
        logs = [subprocess.run(["docker", "logs", n], capture_output=True, text=True, timeout=60) for n in names]
    finally:
        for n in names:
            subprocess.run(["docker", "rm", "-f", n], capture_output=True, timeout=60)
    text = logs[0].stdout + logs[0].stderr
    assert codes == ["0", "0"], text + logs[1].stdout + logs[1].stderr
    assert "node 1/2:" in logs[1].stderr and "ranks reporting: [0, 1]" in text
    losses = [float(x) for x in re.findall(r"^step\s+\d+ loss ([0-9.]+)$", text, re.M)]
    assert len(losses) == 20 and losses[-1] < losses[0] * 0.5
