"""Rendered NPU manifests against the facts MindCluster, Volcano, Kubeflow and KubeRay write down
(tests/data/mindcluster_facts.yaml, each with its source): one check per fact, every fact checked, and every
manifest valid against the vendored CRDs and the core schema with nothing left over."""

from __future__ import annotations

import functools
import json
import re
import warnings
from pathlib import Path

import pytest
import yaml

from k8s_schema import load_docs
from trainbox.launch.k8s import JOB_LABEL, NPU_RESOURCE
from trainbox.launch.targets import RenderOptions, render_target, resolve_for
from trainbox.launch.recipe import all_inputs, load_recipe

FACTS = yaml.safe_load((Path(__file__).parent / "data" / "mindcluster_facts.yaml").read_text())["facts"]
TORCHRUN, RAY = "specforge-domino-qwen35-4b-npu", "relax-qwen3-4b-4npu-colocate"
CASES = {"ascendjob": TORCHRUN, "volcano": TORCHRUN, "pytorchjob": TORCHRUN, "rayjob": RAY}
OPERATOR_ENV = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "LOCAL_RANK",
                "HCCL_LOGIC_SUPERPOD_ID")


def _inputs(name: str) -> dict[str, str]:
    return {n: f"/data/{n.lower()}" if spec.kind == "path" else "x" for n, spec in all_inputs(load_recipe(name)).items()
            if spec.required and n not in ("MASTER_ADDR", "NODE_RANK")}


@functools.lru_cache(maxsize=None)  # text, read-only: 14 facts check the same few renders (2.7 s of CPU each run)
def render(target: str, **options) -> str:
    name = CASES[target]
    job = resolve_for(target, name, sets=_inputs(name), nodes=2, stack_name="npu-910b",
                      image="registry.example/trainbox/x@sha256:" + "0" * 64)
    return render_target(job, target, RenderOptions(name="tj-1", **options))


def _templates(obj):
    from k8s_schema import pod_templates

    return pod_templates(obj)


def _containers(obj):
    return [c for t in _templates(obj) for c in t["spec"]["containers"]]


def _restart_pairs(obj):
    specs = obj["spec"].get("pytorchReplicaSpecs") or obj["spec"].get("replicaSpecs")
    return [(r["restartPolicy"], r["template"]["spec"]["restartPolicy"]) for r in specs.values()]


def _ray_groups(obj):
    c = obj["spec"]["rayClusterSpec"]
    return [c["headGroupSpec"]] + c.get("workerGroupSpecs", [])


CHECKS = {
    "volcano-scheduler": lambda obj, text: all(t["spec"]["schedulerName"] == "volcano" for t in _templates(obj)),
    "ring-controller-label": lambda obj, text: obj["metadata"]["labels"]["ring-controller.atlas"] == "ascend-910b"
    and all(t["metadata"]["labels"]["ring-controller.atlas"] == "ascend-910b" for t in _templates(obj)),
    "visible-devices-from-annotation": lambda obj, text: all(
        {"name": "ASCEND_VISIBLE_DEVICES", "valueFrom": {"fieldRef": {
            "fieldPath": "metadata.annotations['huawei.com/Ascend910']"}}} in c["env"] for c in _containers(obj)),
    "cards-as-ascend910": lambda obj, text: all(
        c["resources"]["requests"][NPU_RESOURCE] == c["resources"]["limits"][NPU_RESOURCE] == 8
        or c["resources"]["requests"][NPU_RESOURCE] == c["resources"]["limits"][NPU_RESOURCE] == 4
        for c in _containers(obj)),
    "one-pod-per-node": lambda obj, text: all(
        t["metadata"]["labels"][JOB_LABEL] == "tj-1"
        and t["spec"]["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == [
            {"labelSelector": {"matchExpressions": [{"key": JOB_LABEL, "operator": "In", "values": ["tj-1"]}]},
             "topologyKey": "kubernetes.io/hostname"}] for t in _templates(obj)),
    "node-type-selector": lambda obj, text: all(t["spec"]["nodeSelector"] == {"accelerator-type": "module-910b-8"}
                                                for t in _templates(obj)),
    "ascendjob-container": lambda obj, text: obj["metadata"]["labels"]["framework"] == "pytorch"
    and obj["spec"]["runPolicy"]["schedulingPolicy"]["minAvailable"] == 2
    and all(c["name"] == "ascend" and c["ports"] == [{"name": "ascendjob-port", "containerPort": 2222}]
            for c in _containers(obj)),
    "operator-injects-rank-env": lambda obj, text: not {e["name"] for c in _containers(obj) for e in c["env"]}
    & set(OPERATOR_ENV),
    "replica-restart-policy": lambda obj, text: all(a == b for a, b in _restart_pairs(obj)),
    "kuberay-keeps-the-entrypoint": lambda obj, text: obj["metadata"]["annotations"][
        "ray.io/overwrite-container-cmd"] == "true"
    and all("command" not in c and "$KUBERAY_GEN_RAY_START_CMD" in c["args"][-1] for c in _containers(obj)),
    "kuberay-npu-resource": lambda obj, text: all(
        json.loads(json.loads(g["rayStartParams"]["resources"])) == {"NPU": 4} for g in _ray_groups(obj))
    and len(_ray_groups(obj)) == 2,
    "kuberay-volcano": lambda obj, text: obj["metadata"]["labels"]["ray.io/scheduler-name"] == "volcano",
    "rayjob-cleans-up": lambda obj, text: obj["spec"]["shutdownAfterJobFinishes"] is True
    and obj["spec"]["ttlSecondsAfterFinished"] > 0,
    "no-yaml-aliases": lambda obj, text: not re.search(r"(^|\s)[&*]id\d+", text),
}


def test_every_fact_has_a_source_and_a_check():
    ids = [f["id"] for f in FACTS]
    assert len(ids) == len(set(ids))
    assert set(ids) == set(CHECKS), (set(ids) ^ set(CHECKS))
    for f in FACTS:
        assert f["source"] and f["fact"] and set(f["kinds"]) <= set(CASES), f


@pytest.mark.parametrize("fact", FACTS, ids=[f["id"] for f in FACTS])
def test_rendered_npu_manifests_follow_the_fact(fact):
    for target in fact["kinds"]:
        text = render(target)
        _cm, obj = load_docs(text)
        assert CHECKS[fact["id"]](obj, text), f"{target}: {fact['fact']} ({fact['source']})"


def test_a_check_fails_where_the_manifest_breaks_the_fact():
    """The checks can fail: a manifest with the old RayJob pods (no scheduler, no ring label, KubeRay's own
    command) or a PyTorchJob whose template disagrees with its replica is caught."""
    _cm, obj = load_docs(render("rayjob"))
    for t in _templates(obj):
        del t["spec"]["schedulerName"]
        t["metadata"]["labels"].pop("ring-controller.atlas")
        t["spec"]["containers"][0].pop("args")
    for fid in ("volcano-scheduler", "ring-controller-label", "kuberay-keeps-the-entrypoint"):
        with pytest.raises((AssertionError, KeyError, TypeError)):
            assert CHECKS[fid](obj, "")
    _cm, obj = load_docs(render("pytorchjob"))
    obj["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["restartPolicy"] = "Never"
    assert not CHECKS["replica-restart-policy"](obj, "")
    assert not CHECKS["no-yaml-aliases"](obj, yaml.safe_dump({"a": [1], "b": None} | {"c": (x := [1]), "d": x}))


@pytest.mark.parametrize("target", sorted(CASES))
def test_manifests_validate_with_no_warnings(target):
    """Against the vendored CRDs and the core schema (strict: an unknown field is an error), with every Python
    warning an error too, with claims and a hostPath asked for."""
    from k8s_schema import crd_dir, manifest_errors

    if crd_dir() is None:
        pytest.skip("no shared/k8s-crds beside the repository")
    pytest.importorskip("kubernetes_validate")
    text = render(target, volumes=("CKPT_DIR=pvc:ckpts",) if target == "rayjob" else ("OUTPUT_DIR=hostpath",))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert manifest_errors(text) == []


def test_ray_pods_run_kuberays_generated_command_with_its_quoting(tmp_path):
    """The pod's args, run by bash as after the entrypoint, with KUBERAY_GEN_RAY_START_CMD as KubeRay writes it
    (ray-operator common/pod.go: `ray start --head` then ` --KEY=VALUE` per rayStartParams entry, values as
    given): `ray` (a stand-in printing its argv) gets the NPU resource as one JSON word."""
    _cm, obj = load_docs(render("rayjob"))
    (group, _workers) = _ray_groups(obj)
    gen = "ray start --head " + " ".join(f"--{k}={v}" for k, v in group["rayStartParams"].items()) + " --block"
    fake = tmp_path / "ray"
    fake.write_text("#!/usr/bin/env python3\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    fake.chmod(0o755)
    import os
    import subprocess

    (c,) = group["template"]["spec"]["containers"]
    proc = subprocess.run(c["args"], env={"PATH": f"{tmp_path}:{os.environ['PATH']}", "KUBERAY_GEN_RAY_START_CMD": gen},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    argv = json.loads(proc.stdout)
    assert argv[:2] == ["start", "--head"] and argv[-1] == "--block"
    (res,) = [a for a in argv if a.startswith("--resources=")]
    assert json.loads(res.split("=", 1)[1]) == {"NPU": 4}


def test_path_inputs_are_claims_by_name_and_hostpath_only_when_asked():
    _cm, obj = load_docs(render("volcano", volumes=("OUTPUT_DIR=pvc:train-out/run1",
                                                             "TRAIN_DATA_PATH=hostpath")))
    (t,) = _templates(obj)
    vols = {v["name"]: v for v in t["spec"]["volumes"]}
    mounts = {m["mountPath"]: m for m in t["spec"]["containers"][0]["volumeMounts"]}
    out = mounts["/data/output_dir"]
    assert vols[out["name"]]["persistentVolumeClaim"] == {"claimName": "train-out"} and out["subPath"] == "run1"
    assert out["readOnly"] is False
    data = mounts["/data/train_data_path"]
    assert vols[data["name"]]["hostPath"] == {"path": "/data/train_data_path"} and data["readOnly"] is True
    model = mounts["/data/target_model_path"]  # not named: a claim of the input's own name
    assert vols[model["name"]]["persistentVolumeClaim"] == {"claimName": "target-model-path"}
    hostpaths = {v["hostPath"]["path"] for v in vols.values() if "hostPath" in v}
    assert hostpaths - {"/data/train_data_path"} <= {m for m in mounts if m.startswith(("/usr/local", "/etc/"))}
    text = render("volcano")
    assert "# PersistentVolumeClaims it mounts" in text and "output-dir" in text


@pytest.mark.parametrize("spec, message", [
    ("OUTPUT_DIR=/mnt/x", "expected NAME=pvc:CLAIM"), ("OUTPUT_DIR=pvc:Bad_Claim", "expected NAME=pvc:CLAIM"),
    ("OUTPUT_DIR=pvc:c/../etc", "expected NAME=pvc:CLAIM"), ("NUM_EPOCHS=pvc:c", "mounts no path input"),
])
def test_a_bad_volume_is_one_clear_error(spec, message):
    from trainbox.runtime.errors import TrainboxError

    with pytest.raises(TrainboxError, match=message):
        render("volcano", volumes=(spec,))


@pytest.mark.docker
def test_in_the_image_the_entrypoint_runs_then_kuberays_command(cpu_image, tmp_path):
    """A Ray pod as KubeRay >= 1.1 starts it under ray.io/overwrite-container-cmd: the image's ENTRYPOINT (no
    `command` in the pod) with the pod's args, KUBERAY_GEN_RAY_START_CMD in the env. trainbox-entrypoint runs
    first (TRAINBOX_DEBUG=1 has it say what it execs), then the generated `ray start` with its quoting intact
    (`ray` is a stand-in that prints its argv: no Ray cluster starts here)."""
    _cm, obj = load_docs(render("rayjob"))
    (group, _workers) = _ray_groups(obj)
    gen = "ray start --head " + " ".join(f"--{k}={v}" for k, v in group["rayStartParams"].items()) + " --block"
    (c,) = group["template"]["spec"]["containers"]
    assert "command" not in c
    fake = tmp_path / "ray"
    fake.write_text("#!/bin/sh\nexec python3 -c 'import json, sys; print(json.dumps(sys.argv[1:]))' \"$@\"\n")
    fake.chmod(0o755)
    import subprocess

    proc = subprocess.run(["docker", "run", "--rm", "--network", "none", "--label", "trainbox.test=1",
                           "-e", "TRAINBOX_DEBUG=1", "-e", f"KUBERAY_GEN_RAY_START_CMD={gen}",
                           "--mount", f"type=bind,source={fake},target=/usr/local/bin/ray,readonly",
                           cpu_image, *c["args"]], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "exec ['bash', '-c'," in proc.stderr  # the entrypoint ran and handed over to the pod's args
    argv = json.loads(proc.stdout.strip().splitlines()[-1])
    assert argv[:2] == ["start", "--head"] and argv[-1] == "--block"
    (res,) = [a for a in argv if a.startswith("--resources=")]
    assert json.loads(res.split("=", 1)[1]) == {"NPU": 4}
