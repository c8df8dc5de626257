"""RayJob pods keep the image's entrypoint: the RayJob carries `ray.io/overwrite-container-cmd: "true"` (KubeRay
>= 1.1 then leaves the container's command and args alone and hands its `ray start ...` over in
KUBERAY_GEN_RAY_START_CMD), no `command` (the image's ENTRYPOINT, tini + trainbox-entrypoint, runs) and args
that run the generated command. A KubeRay older than 1.1 ignores the annotation and writes `/bin/bash -c --
ulimit ...; ray start ...` itself (ray-operator common/pod.go BuildPod), skipping the entrypoint: for those the pod
spec still carries what the entrypoint would give a Ray pod (the stack's defaults, the NOSET flags, the visible
devices) and the CANN environment comes from the image's ENV (baked by `trainbox image build`)."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from trainbox.launch.targets import RenderOptions, render_target, resolve_for
from trainbox.paths import REPO_ROOT
from trainbox.launch.recipe import all_inputs, list_recipes, load_recipe
from trainbox.runtime.entrypoint import apply_defaults
from trainbox.runtime.npu import NPU_NOSET

RAY = [n for n in list_recipes() if load_recipe(n).launcher == "ray"]
NPU_RAY = "relax-qwen3-4b-4npu-colocate"
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # a base image's PATH, for ${PATH}


def _inputs(name: str) -> dict[str, str]:
    return {n: f"/data/{n.lower()}" for n, spec in all_inputs(load_recipe(name)).items()
            if spec.required and spec.kind == "path"}


def _image_env(stack: str) -> dict[str, str]:
    """The ENV of the final stage of the stack's rendered Dockerfile (what `docker build` bakes; the CANN
    record is baked after the build by trainbox.image.toolkits.cann and is not in it)."""
    text = (REPO_ROOT / "build/generated" / stack / "Dockerfile").read_text()
    final = text[text.rindex("\nFROM "):]
    env = {"PATH": BASE_PATH}
    for block in re.findall(r"^ENV ((?:.*\\\n)*.*)$", final, re.M):
        for key, value in re.findall(r'(\w+)=("(?:[^"\\]|\\.)*"|\S+)', block.replace("\\\n", " ")):
            value = value[1:-1] if value.startswith('"') else value
            env[key] = re.sub(r"\$\{(\w+)\}", lambda m: env.get(m.group(1), ""), value)
    return env


def _rayjob(name: str, nodes: int = 2, **kw) -> tuple:
    job = resolve_for("rayjob", name, sets=_inputs(name), nodes=nodes,
                      image="registry.example/trainbox/x@sha256:" + "0" * 64)
    for key, value in kw.items():
        job.env[key] = value
    _cm, obj = yaml.safe_load_all(render_target(job, "rayjob", RenderOptions(name="rj")))
    return job, obj


def _pods(obj: dict) -> list[dict]:
    spec = obj["spec"]["rayClusterSpec"]
    return [spec["headGroupSpec"]["template"]] + [g["template"] for g in spec.get("workerGroupSpecs", [])]


@pytest.mark.parametrize("name", RAY)
def test_ray_pods_have_what_the_entrypoint_would_give_them(name):
    job, obj = _rayjob(name)
    manifest = json.loads((REPO_ROOT / "build/generated" / job.stack.name / "stack.json").read_text())
    runtime_env = yaml.safe_load(obj["spec"]["runtimeEnvYAML"])["env_vars"]
    for pod in _pods(obj):
        (c,) = pod["spec"]["containers"]
        # the image's ENTRYPOINT runs (no command), then KubeRay's generated `ray start`
        assert "command" not in c and "KUBERAY_GEN_RAY_START_CMD" in c["args"][-1]
        assert obj["metadata"]["annotations"]["ray.io/overwrite-container-cmd"] == "true"
        pod_env = {e["name"]: e["value"] for e in c["env"] if "value" in e}
        effective = {**_image_env(job.stack.name), **pod_env}  # a pod's env wins over the image's ENV
        # the entrypoint's own defaults step would change nothing: the stack's env is all there
        assert apply_defaults(dict(effective), manifest) == []
        assert effective["TRAINBOX_SCHEDULER"] == "kuberay"
        assert effective["PATH"].startswith("/opt/venv/bin:")  # KubeRay's bare `ray start` finds the venv's ray
        if job.device == "npu":
            assert all(effective[f] == "1" for f in NPU_NOSET), {f: effective.get(f) for f in NPU_NOSET}
            assert effective["ASCEND_RT_VISIBLE_DEVICES"] == ",".join(map(str, range(job.per_node)))
            assert "TRAINBOX_DEVICES" not in effective  # the device plugin picks the cards
            assert all(runtime_env[f] == "1" for f in NPU_NOSET)


def test_a_cpu_mode_ray_pod_gets_the_autoload_switch_the_entrypoint_would_set():
    # entrypoint.apply_defaults: TRAINBOX_DEVICE=cpu also sets TORCH_DEVICE_BACKEND_AUTOLOAD=0 (torch must not
    # auto-load torch_npu without CANN); in a Ray pod nothing else would
    name = NPU_RAY
    _job, obj = _rayjob(name, TRAINBOX_DEVICE="cpu")
    for pod in _pods(obj):
        env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
        assert env["TRAINBOX_DEVICE"] == "cpu" and env.get("TORCH_DEVICE_BACKEND_AUTOLOAD") == "0", env


class _Client:
    def __init__(self, labels):
        self._labels = labels

    def image_exists(self, ref):
        return self._labels is not None

    def labels(self, ref):
        return self._labels


def test_an_npu_rayjob_on_an_image_without_the_baked_cann_env_is_flagged(monkeypatch):
    import trainbox.image.engine as engine
    from trainbox.commands.launch import _image_reachable
    from trainbox.launch.images import entrypoint_free_problem
    from trainbox.runtime.errors import TrainboxError

    npu_name = NPU_RAY
    job, _ = _rayjob(npu_name)
    monkeypatch.setattr(engine, "find_client", lambda: _Client({}))  # built by plain `docker build`
    problem = entrypoint_free_problem(job)
    assert problem and "io.trainbox.cann-env" in problem and "/bin/bash -c" in problem
    with pytest.raises(TrainboxError, match="--strict: .*no baked CANN environment"):
        _image_reachable(job, "rayjob", strict=True)
    monkeypatch.setattr(engine, "find_client", lambda: _Client({"io.trainbox.base.substituted": "local/debian"}))
    assert "substitute base local/debian" in entrypoint_free_problem(job)
    monkeypatch.setattr(engine, "find_client", lambda: _Client({"io.trainbox.cann-env": "14"}))
    assert entrypoint_free_problem(job) is None
    monkeypatch.setattr(engine, "find_client", lambda: _Client(None))  # not on this engine: not checked
    assert entrypoint_free_problem(job) is None
    cpu, _ = _rayjob("ray-cpu")
    monkeypatch.setattr(engine, "find_client", lambda: _Client({}))
    assert entrypoint_free_problem(cpu) is None
    _image_reachable(job, "volcano", strict=False)  # only RayJob pods skip the entrypoint
