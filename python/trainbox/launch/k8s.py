"""Kubernetes targets: AscendJob (MindCluster ascend-operator), Volcano Job, Kubeflow PyTorchJob, KubeRay RayJob
(host module). Each manifest is two documents: a ConfigMap with the job's launcher script, and the job, whose
pods mount it and run `bash /opt/trainbox/job/job.sh` after the image's entrypoint (`args`, not `command`,
so tini and the trainbox entrypoint stay PID 1). Everything a recipe or user supplies is a YAML value
(yaml.safe_dump quotes it): a recipe cannot add a key.

Facts (shared/k8s-crds/README.md, MindCluster v26.1.0): AscendJob labels `ring-controller.atlas: ascend-910b`
and `framework: pytorch`, container `ascend` with port `ascendjob-port`, cards requested as
`huawei.com/Ascend910` (910B and A3 alike, told apart by the `accelerator-type` node selector, --accelerator-type),
super-pod jobs annotated `sp-block`; NPU pods of every kind (RayJob's too) scheduled by Volcano, labelled
`ring-controller.atlas` and given ASCEND_VISIBLE_DEVICES from Volcano's `huawei.com/Ascend910` pod annotation; the
operator injects MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE/LOCAL_WORLD_SIZE/LOCAL_RANK and HCCL_LOGIC_SUPERPOD_ID and
mounts the rank table. Device pods of one job keep to one node each (pod anti-affinity on the job's label, as
MindCluster's samples do on `job-name`). KubeRay <= 1.7.0 does not map huawei.com/Ascend* to Ray's `NPU`:
rayStartParams say it. The facts with their sources: tests/data/mindcluster_facts.yaml.

Volumes: the recipe's mounted path inputs are PersistentVolumeClaims (`--volume NAME=pvc:CLAIM`; default claim: the
input's name, e.g. output-dir) mounted at the input's path; hostPath only for `--volume NAME=hostpath` and the
NPU driver files every node has. The YAML has no anchors or aliases (each object is written out in full).
"""

from __future__ import annotations

import json
import re

import yaml

from ..image.toolkits import for_device
from ..runtime.errors import TrainboxError
from .job import Job
from .script import job_script, oneline

SCRIPT_DIR = "/opt/trainbox/job"
NPU_RESOURCE = "huawei.com/Ascend910"
GPU_RESOURCE = "nvidia.com/gpu"
# MindCluster's accelerator-type node label: value -> (chip, cards per node). Values from ascend-for-volcano
# common/util/constants.go (Module910bx8AcceleratorType ... Module910A3x8SuperPodAcceleratorType) and the full-NPU
# scheduling guide (card-910b-2: a server with Atlas 300T A2 cards); the first of each chip is its default.
ACCELERATOR_TYPES = {"module-910b-8": ("910b", 8), "module-910b-16": ("910b", 16), "card-910b-2": ("910b", 2),
                     "module-a3-16-super-pod": ("a3", 16), "module-a3-16": ("a3", 16),
                     "module-a3-8-super-pod": ("a3", 8)}
ACCELERATOR_TYPE = {"910b": "module-910b-8", "a3": "module-a3-16-super-pod"}
RING_CONTROLLER = "ascend-910b"  # ring-controller.atlas: "ascend-{xxx}b", xxx = 910 on A2 and A3 alike
# The device plugin finds the cards Volcano chose from this env (ascend-device-plugin GetRealAllocateDevicesFromEnv;
# the fieldPath must be exactly this string), and Ascend Docker Runtime mounts them.
VISIBLE_FROM_ANNOTATION = {"name": "ASCEND_VISIBLE_DEVICES",
                           "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{NPU_RESOURCE}']"}}}
SHM = {"cpu": "8Gi", "cuda": "64Gi", "npu": "64Gi"}  # a memory-backed /dev/shm (the runtime's default is 64 MiB)
ASCEND_PORT, PYTORCH_PORT = 2222, 23456
JOB_LABEL = "trainbox.io/job"  # on every object and pod of a job: `trainbox jobs/status/cancel` select by it
# KubeRay (>= 1.1) runs the container's own command and args when the RayCluster carries this annotation, and
# hands its generated `ray start ...` over in KUBERAY_GEN_RAY_START_CMD (ray-operator utils.IsOverwriteCmd;
# docs.ray.io .../kubernetes/user-guides/pod-command). `eval`: the generated command holds shell quoting
# (--resources="{\"NPU\": 8}") that a bare $VAR expansion would pass on as literal quotes.
RAY_OVERWRITE_CMD = "ray.io/overwrite-container-cmd"
RAY_START_ARGS = ["bash", "-c", 'ulimit -n 65536; eval "exec $KUBERAY_GEN_RAY_START_CMD"']
KINDS = {"ascendjob": ("npu", ("torchrun", "exec")), "volcano": (None, ("torchrun", "exec")),
         "pytorchjob": (None, ("torchrun",)), "rayjob": (None, ("ray",))}


NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")  # a DNS-1123 label


def k8s_name(text: str, limit: int = 50) -> str:
    """A DNS-1123 label from a recipe name (room left for the suffixes operators add)."""
    name = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:limit].strip("-")
    return name or "trainbox-job"


def job_name(job: Job, name: str | None) -> str:
    """`--name` as given (checked), else the recipe's name and a random suffix: a second submission of the same
    recipe is a second job, not a collision with the first's objects."""
    if name is None:
        import secrets

        return f"{k8s_name(job.name, 43)}-{secrets.token_hex(3)}"
    if len(name) > 50 or not NAME_RE.match(name):
        raise TrainboxError(f"--name {name!r}: expected a DNS-1123 label of at most 50 characters (lower-case "
                            "letters, digits and '-'; room is left for the suffixes operators add to pod names)")
    return name


def check_namespace(namespace: str | None) -> str | None:
    if namespace is not None and (len(namespace) > 63 or not NAME_RE.match(namespace)):
        raise TrainboxError(f"--namespace {namespace!r}: expected a DNS-1123 label (lower-case letters, digits, '-')")
    return namespace


def applies(job: Job, kind: str) -> bool:
    """Whether `kind` takes this recipe at all (device type and launcher)."""
    device, launchers = KINDS[kind]
    return (not device or job.device == device) and job.recipe.launcher in launchers


def _check(job: Job, kind: str) -> None:
    device, launchers = KINDS[kind]
    if device and job.device != device:
        raise TrainboxError(f"--target {kind}: recipe {job.name} runs on a {job.device} stack; an AscendJob is for "
                            "NPU recipes (use pytorchjob or volcano)")
    if job.recipe.launcher not in launchers:
        raise TrainboxError(f"--target {kind}: recipe {job.name} uses the {job.recipe.launcher} launcher; "
                            f"{kind} takes {' or '.join(launchers)} recipes"
                            + (" (Ray recipes: --target rayjob)" if job.recipe.launcher == "ray" else ""))
    if kind in ("ascendjob", "pytorchjob") and job.recipe.torchrun.standalone and job.nodes > 1:
        raise TrainboxError(f"--target {kind}: a standalone torchrun recipe is single-node")


def accelerator_type(job: Job, requested: str | None = None) -> str | None:
    """The accelerator-type node selector of an NPU job: `requested` (checked against the chip and the cards a
    pod asks for), else the chip's default."""
    if job.device != "npu" or job.stack.chip not in ACCELERATOR_TYPE:
        if requested:
            raise TrainboxError(f"--accelerator-type {requested}: only for Ascend 910B/A3 stacks "
                                f"(stack {job.stack.name} is {job.device}/{job.stack.chip or '-'})")
        return None
    value = requested or ACCELERATOR_TYPE[job.stack.chip]
    known = [k for k, (chip, _) in ACCELERATOR_TYPES.items() if chip == job.stack.chip]
    if value not in known:
        raise TrainboxError(f"--accelerator-type {value!r}: a {job.stack.chip} stack runs on nodes labelled "
                            f"{', '.join(known)}")
    cards = ACCELERATOR_TYPES[value][1]
    if job.per_node > cards:
        raise TrainboxError(f"--accelerator-type {value}: its nodes have {cards} cards; the job asks for "
                            f"{job.per_node} per pod (--nproc-per-node)")
    return value


def sp_block(job: Job, accelerator: str | None) -> str | None:
    """The `sp-block` annotation (logical super-pod size in cards) on super-pod nodes, per ascend-for-volcano
    internal/npu/ascend910/ascend910a3/superpod/frame.go: one pod: sp-block equals its cards; more pods: each
    requests all its node's cards (CheckTaskNPU) and the total is a multiple of sp-block (checkRequireNPU).
    trainbox makes the whole job one logical super-pod (Volcano's own default when the annotation is absent)."""
    if not accelerator or not accelerator.endswith("-super-pod"):
        return None
    cards = ACCELERATOR_TYPES[accelerator][1]
    if job.nodes > 1 and job.per_node != cards:
        raise TrainboxError(
            f"--accelerator-type {accelerator}: MindCluster schedules a multi-node super-pod job only when each pod "
            f"requests all {cards} cards of its node; this job asks for {job.per_node} per pod. Use "
            f"--nproc-per-node {cards}, or --accelerator-type module-a3-16 (A3 servers outside a super-pod)")
    return str(job.nodes * job.per_node)


# CPU and memory requested per pod by default: per device (NPU/CUDA: data loaders, the host side of the
# collectives, pinned buffers) or per process (CPU jobs). Requests only, no limits: a memory limit turns a
# transient peak (checkpoint save, a dataloader burst) into an OOM kill of the whole job.
DEFAULT_REQUESTS = {"npu": (4, 16), "cuda": (4, 16), "cpu": (1, 2)}  # (cores, GiB) per device or process
CPU_RE = re.compile(r"^([1-9][0-9]{0,4}(\.[0-9]{1,3})?|[1-9][0-9]{0,6}m)$")
MEMORY_RE = re.compile(r"^[1-9][0-9]{0,6}(Ki|Mi|Gi|Ti|k|M|G|T)?$")


def pod_requests(job: Job, cpu: str | None = None, memory: str | None = None) -> dict[str, str]:
    """The pod's cpu/memory requests: --cpu / --memory as given (Kubernetes quantities, checked), else the
    defaults scaled by the devices (processes) per pod."""
    if cpu is not None and not CPU_RE.match(cpu):
        raise TrainboxError(f"--cpu {cpu!r}: expected cores per pod as a Kubernetes quantity, e.g. 32 or 500m")
    if memory is not None and not MEMORY_RE.match(memory):
        raise TrainboxError(f"--memory {memory!r}: expected memory per pod as a Kubernetes quantity, e.g. 128Gi")
    cores, gib = DEFAULT_REQUESTS[job.device]
    return {"cpu": cpu or str(cores * job.per_node), "memory": memory or f"{gib * job.per_node}Gi"}


def _resources(job: Job, asked: dict[str, str]) -> dict:
    if job.device == "npu":
        return {"requests": {NPU_RESOURCE: job.per_node, **asked}, "limits": {NPU_RESOURCE: job.per_node}}
    if job.device == "cuda":
        return {"requests": dict(asked), "limits": {GPU_RESOURCE: job.per_node}}
    return {"requests": dict(asked)}


VOLUME_RE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(hostpath|pvc:([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?)"
                       r"(/([A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*))?)$")


def parse_volumes(job: Job, specs) -> dict[str, tuple[str, str | None, str | None]]:
    """--volume NAME=pvc:CLAIM[/SUBPATH] | NAME=hostpath for the recipe's mounted path inputs ->
    {input: (kind, claim, subPath)}; every mounted input not named gets a claim of its own name (output-dir for
    OUTPUT_DIR)."""
    mounted = mounted_inputs(job)
    out: dict[str, tuple[str, str | None, str | None]] = {}
    for spec in specs or ():
        m = VOLUME_RE.match(spec)
        if not m or ".." in (m.group(6) or "").split("/"):
            raise TrainboxError(f"--volume {spec!r}: expected NAME=pvc:CLAIM[/SUBPATH] (a PersistentVolumeClaim in "
                                "the job's namespace, or a file or directory in it, mounted at the input's path, "
                                "e.g. OUTPUT_DIR=pvc:train-output or DATA_PATH=pvc:datasets/dapo.jsonl) or "
                                "NAME=hostpath (the node's own path)")
        name = m.group(1)
        if name not in mounted:
            raise TrainboxError(f"--volume {spec}: recipe {job.name} mounts no path input {name!r} (its mounted "
                                f"inputs: {', '.join(mounted) or 'none'})")
        if name in out:
            raise TrainboxError(f"--volume {name}: given twice")
        out[name] = ("hostpath", None, None) if m.group(2) == "hostpath" else ("pvc", m.group(3), m.group(6))
    for name in mounted:
        out.setdefault(name, ("pvc", k8s_name(name, 63), None))
    return out


def mounted_inputs(job: Job) -> dict[str, str]:
    """{input: path} of the recipe's path inputs the job mounts, in the recipe's order."""
    return {n: job.sets[n] for n, spec in job.inputs.items()
            if spec.kind == "path" and spec.mount and job.sets.get(n) in job.mounts}


def _volumes(job: Job, configmap: str, volumes: dict | None = None) -> tuple[list[dict], list[dict]]:
    """(volumes, volumeMounts): the script, a memory /dev/shm, NPU driver files (hostPath: every NPU node has
    them), the recipe's path inputs (claims, or hostPath where --volume asks)."""
    vols = [{"name": "trainbox-job", "configMap": {"name": configmap}},
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": SHM[job.device]}}]
    mounts = [{"name": "trainbox-job", "mountPath": SCRIPT_DIR, "readOnly": True},
              {"name": "dshm", "mountPath": "/dev/shm"}]
    toolkit = for_device(job.device)
    host = toolkit.host_mounts(job.nodes) if toolkit else []  # the driver (+ HCCL's NIC tool and config)
    for i, path in enumerate(host):
        vols.append({"name": f"host-{i}", "hostPath": {"path": path}})
        mounts.append({"name": f"host-{i}", "mountPath": path, "readOnly": True})
    volumes = volumes if volumes is not None else parse_volumes(job, ())
    claims: dict[tuple, str] = {}  # one volume per claim (or host path), however many inputs use it
    for name, path in mounted_inputs(job).items():
        kind, claim, sub = volumes[name]
        key = (kind, claim if kind == "pvc" else path)
        if key not in claims:
            claims[key] = vol = f"{kind}-{len(claims)}"
            vols.append({"name": vol, "hostPath": {"path": path}} if kind == "hostpath" else
                        {"name": vol, "persistentVolumeClaim": {"claimName": claim}})
        if not any(m["mountPath"] == path for m in mounts):
            mounts.append({"name": claims[key], "mountPath": path, "readOnly": job.mounts[path],
                           **({"subPath": sub} if sub else {})})
    return vols, mounts


def _env(job: Job, scheduler: str) -> list[dict]:
    env = dict(job.env)
    env.pop("TRAINBOX_DEVICES", None)  # the device plugin picks the cards; the pod sees them as 0..n-1
    env["TRAINBOX_SCHEDULER"] = scheduler
    if scheduler == "kuberay":
        env.update(entrypoint_free_env(job, env))
    return [{"name": k, "value": v} for k, v in sorted(env.items())]


def entrypoint_free_env(job: Job, env: dict[str, str]) -> dict[str, str]:
    """What the image's entrypoint would add to `env`, written into Ray pods' env as well. The RayJob keeps the
    entrypoint (ray.io/overwrite-container-cmd), but KubeRay < 1.1 ignores that annotation and starts
    `/bin/bash -c -- ... ray start` itself (ray-operator common/pod.go BuildPod): there the stack's defaults,
    the CPU-mode rule (computed by the entrypoint's own code) and the raylets' NOSET flags still hold, and the
    CANN environment comes from the image's ENV, which `trainbox image build` bakes (trainbox.image.toolkits.cann)."""
    from ..runtime.entrypoint import apply_defaults

    added = dict(env)
    apply_defaults(added, {"env": dict(job.stack.env)})
    toolkit = for_device(job.device)
    for flag, value in (toolkit.launch_env() if toolkit else {}).items():
        added.setdefault(flag, value)
    return {k: v for k, v in added.items() if k not in env}


def _container(job: Job, name: str, scheduler: str, mounts: list[dict], asked: dict[str, str],
               ports: list[dict] | None = None, args: list[str] | None = None) -> dict:
    env = _env(job, scheduler)
    if job.device == "npu":
        env.append(VISIBLE_FROM_ANNOTATION)
    c = {"name": name, "image": job.image, "imagePullPolicy": "IfNotPresent",
         "args": args if args is not None else ["bash", f"{SCRIPT_DIR}/job.sh"],
         "env": env, "resources": _resources(job, asked), "volumeMounts": mounts}
    if ports:
        c["ports"] = ports
    return c


def _anti_affinity(job: Job, name: str) -> dict:
    """One pod of a job per node (MindCluster's samples: podAntiAffinity on the job's name, topology
    kubernetes.io/hostname): a 16-die module-a3-16 node would otherwise take two 8-card pods of one job."""
    return {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchExpressions": [{"key": JOB_LABEL, "operator": "In", "values": [name]}]},
         "topologyKey": "kubernetes.io/hostname"}]}}


def _pod(job: Job, name: str, container: dict, volumes: list[dict], restart: str = "Never",
         accelerator: str | None = None) -> dict:
    """A pod template of job `name`: its label, and on NPU/CUDA one pod a node; NPU pods are Volcano's (it
    writes the huawei.com/Ascend910 annotation ASCEND_VISIBLE_DEVICES reads) and carry the ring label."""
    spec: dict = {"restartPolicy": restart}
    if job.device == "npu":
        spec["schedulerName"] = "volcano"
    if job.device != "cpu":
        spec["affinity"] = _anti_affinity(job, name)
    if accelerator:
        spec["nodeSelector"] = {"accelerator-type": accelerator}
    spec.update({"containers": [container], "volumes": volumes})
    return {"metadata": {"labels": {JOB_LABEL: name, **_ring(job)}}, "spec": spec}


def _ring(job: Job) -> dict:
    """MindCluster's job-kind label on NPU jobs and their pods (ascend-common api AtlasTaskLabel): the operator,
    the volcano plugin and the device plugin act only on jobs that carry it."""
    return {"ring-controller.atlas": RING_CONTROLLER} if job.device == "npu" else {}


def _meta(job: Job, name: str, labels: dict | None = None, annotations: dict | None = None, job_name: str = "") -> dict:
    ann = {"trainbox.io/recipe": job.name, "trainbox.io/description": oneline(job.recipe.description),
           "trainbox.io/image": job.image, **({"trainbox.io/image-id": job.image_id} if job.image_id else {}),
           **(annotations or {})}
    return {"name": name, "labels": {"app.kubernetes.io/managed-by": "trainbox", "trainbox.io/recipe":
                                     k8s_name(job.name, 63), JOB_LABEL: job_name or name, **(labels or {})},
            "annotations": ann}


def _configmap(job: Job, name: str, job_name: str) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(job, name, job_name=job_name),
            "data": {"job.sh": job_script(job)}}


def _replicas(job: Job, pod_for, restart: str) -> dict:
    """Master (node 0) and, for more nodes, Worker replica specs, the layout Kubeflow and MindCluster share."""
    specs = {"Master": {"replicas": 1, "restartPolicy": restart, "template": pod_for("Master")}}
    if job.nodes > 1:
        specs["Worker"] = {"replicas": job.nodes - 1, "restartPolicy": restart, "template": pod_for("Worker")}
    return specs


def ascendjob(job: Job, name: str, accelerator: str | None, asked: dict, volumes: dict) -> dict:
    labels = {**_ring(job), "framework": "pytorch"}
    vols, mounts = _volumes(job, f"{name}-launcher", volumes)
    ports = [{"name": "ascendjob-port", "containerPort": ASCEND_PORT}]
    block = sp_block(job, accelerator)
    annotations = {"sp-block": block} if block else {}

    def pod(_role):
        return _pod(job, name, _container(job, "ascend", "operator", mounts, asked, ports), vols,
                    accelerator=accelerator)

    return {"apiVersion": "mindxdl.gitee.com/v1", "kind": "AscendJob",
            "metadata": _meta(job, name, labels, annotations),
            "spec": {"schedulerName": "volcano",
                     "runPolicy": {"schedulingPolicy": {"minAvailable": job.nodes, "queue": "default"}},
                     "successPolicy": "AllWorkers", "replicaSpecs": _replicas(job, pod, "Never")}}


# Kubeflow copies a replica's restartPolicy over its pod template's (training-operator common/pod.go
# setRestartPolicy) and warns where they differ: both say the same here
PYTORCHJOB_RESTART = "OnFailure"


def pytorchjob(job: Job, name: str, accelerator: str | None, asked: dict, volumes: dict) -> dict:
    vols, mounts = _volumes(job, f"{name}-launcher", volumes)
    ports = [{"name": "pytorchjob-port", "containerPort": PYTORCH_PORT}]

    def pod(_role):
        return _pod(job, name, _container(job, "pytorch", "operator", mounts, asked, ports), vols,
                    restart=PYTORCHJOB_RESTART, accelerator=accelerator)

    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": _meta(job, name, _ring(job)),
            "spec": {"nprocPerNode": str(job.per_node),
                     "pytorchReplicaSpecs": _replicas(job, pod, PYTORCHJOB_RESTART)}}


def volcano(job: Job, name: str, accelerator: str | None, asked: dict, volumes: dict) -> dict:
    vols, mounts = _volumes(job, f"{name}-launcher", volumes)
    container = _container(job, "main", "volcano", mounts, asked)
    task = "node"
    # the svc plugin writes /etc/volcano/<task>.host (one pod host name a line, index order) and a headless
    # service that resolves them; the env plugin sets VC_TASK_INDEX
    container["env"].append({"name": "TRAINBOX_VC_HOSTFILE", "value": f"/etc/volcano/{task}.host"})
    block = sp_block(job, accelerator)
    meta = _meta(job, name, _ring(job), {"sp-block": block} if block else None)
    return {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "metadata": meta,
            "spec": {"minAvailable": job.nodes, "schedulerName": "volcano", "queue": "default",
                     "plugins": {"svc": [], "env": []},
                     "policies": [{"event": "PodEvicted", "action": "RestartJob"}],
                     "tasks": [{"name": task, "replicas": job.nodes,
                                "template": _pod(job, name, container, vols, accelerator=accelerator)}]}}


def ray_start_params(job: Job) -> dict:
    if job.device == "npu":
        # KubeRay <= 1.7.0 does not turn huawei.com/Ascend910 into Ray's NPU resource: say it by hand. KubeRay
        # writes each param as --KEY=VALUE into a shell command, so the JSON goes in shell quotes of its own
        # (KubeRay's RayCluster docs: resources: '"{\"Custom1\": 1}"')
        return {"resources": json.dumps(json.dumps({"NPU": job.per_node}))}
    if job.device == "cuda":
        return {"num-gpus": str(job.per_node)}
    return {"num-cpus": str(job.per_node)}


RAY_TTL_SECONDS = 600  # the finished job's RayCluster is deleted this long after the job ends (logs: kubectl logs)


def rayjob(job: Job, name: str, accelerator: str | None, asked: dict, volumes: dict) -> dict:
    vols, mounts = _volumes(job, f"{name}-launcher", volumes)
    params = ray_start_params(job)
    # the image's entrypoint (tini, trainbox-entrypoint: CANN's set_env, the stack's defaults) then KubeRay's
    # `ray start`, as RAY_OVERWRITE_CMD lets a pod say
    head = _pod(job, name, _container(job, "ray-head", "kuberay", mounts, asked, args=RAY_START_ARGS), vols,
                restart="Always", accelerator=accelerator)
    worker = _pod(job, name, _container(job, "ray-worker", "kuberay", mounts, asked, args=RAY_START_ARGS), vols,
                  restart="Always", accelerator=accelerator)
    cluster = {"headGroupSpec": {"rayStartParams": {"dashboard-host": "0.0.0.0", **params}, "template": head}}
    if job.nodes > 1:
        cluster["workerGroupSpecs"] = [{"groupName": "workers", "replicas": job.nodes - 1,
                                        "minReplicas": job.nodes - 1, "maxReplicas": job.nodes - 1,
                                        "rayStartParams": params, "template": worker}]
    env_vars = {k: v for k, v in job.env.items() if k != "TRAINBOX_DEVICES"}
    toolkit = for_device(job.device)
    env_vars.update(toolkit.launch_env() if toolkit else {})
    # KubeRay copies a RayJob's labels and annotations to the RayCluster it creates; with its batch scheduler
    # on (--batch-scheduler=volcano) ray.io/scheduler-name makes it a Volcano PodGroup, so the pods start together
    labels = {**_ring(job), **({"ray.io/scheduler-name": "volcano"} if job.device == "npu" else {})}
    return {"apiVersion": "ray.io/v1", "kind": "RayJob",
            "metadata": _meta(job, name, labels, {RAY_OVERWRITE_CMD: "true"}),
            "spec": {"entrypoint": f"TRAINBOX_SCHEDULER=kuberay bash {SCRIPT_DIR}/job.sh",
                     "shutdownAfterJobFinishes": True, "ttlSecondsAfterFinished": RAY_TTL_SECONDS,
                     "runtimeEnvYAML": yaml.safe_dump({"env_vars": env_vars}, sort_keys=True),
                     "rayClusterSpec": cluster}}


BUILDERS = {"ascendjob": ascendjob, "volcano": volcano, "pytorchjob": pytorchjob, "rayjob": rayjob}


def manifests(job: Job, kind: str, name: str | None = None, accelerator: str | None = None,
              namespace: str | None = None, requests: tuple = (None, None), volumes=()) -> list[dict]:
    """[ConfigMap, job] as Python objects (what render_manifest dumps); `requests`: (--cpu, --memory);
    `volumes`: the --volume values."""
    _check(job, kind)
    asked = pod_requests(job, *requests)
    claims = parse_volumes(job, volumes)
    accelerator = accelerator_type(job, accelerator)
    namespace = check_namespace(namespace)
    for owned in ("NODE_RANK", "MASTER_ADDR"):
        if owned in job.sets and kind != "rayjob":
            raise TrainboxError(f"--set {owned}: the {kind} scheduler tells each pod this; leave it out")
    name = job_name(job, name)
    docs = [_configmap(job, f"{name}-launcher", name), BUILDERS[kind](job, name, accelerator, asked, claims)]
    if namespace:  # the ConfigMap must live where the pods that mount it do
        for doc in docs:
            doc["metadata"] = {"name": doc["metadata"]["name"], "namespace": namespace,
                               **{k: v for k, v in doc["metadata"].items() if k != "name"}}
    return docs


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the launcher script) as literal blocks, so the manifest reads like the script;
    PyYAML falls back to a quoted scalar by itself where a block cannot hold the text exactly. No anchors or
    aliases (&id001 / *id001 where two pods share a list): an operator reads and edits each pod as written."""

    def ignore_aliases(self, data):
        return True


def _str(dumper, text):
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style="|" if "\n" in text else None)


_Dumper.add_representer(str, _str)


def render_manifest(job: Job, kind: str, name: str | None = None, accelerator: str | None = None,
                    namespace: str | None = None, requests: tuple = (None, None), volumes=()) -> str:
    head = (f"# GENERATED by trainbox: {kind} for recipe {job.name}, {job.nodes} node(s) x {job.per_node}, "
            f"image {oneline(job.image)}\n# kubectl apply -f THIS_FILE (docs/reference/launch.md, Kubernetes: what "
            "the cluster must provide)\n")
    docs = manifests(job, kind, name, accelerator, namespace, requests, volumes)
    name = docs[1]["metadata"]["name"]
    ns = f" --namespace {namespace}" if namespace else ""
    head += (f"# job {name}: every object and pod is labelled {JOB_LABEL}={name}; `trainbox status|logs|cancel "
             f"{name}{ns}`\n")
    claims = sorted({v["persistentVolumeClaim"]["claimName"] for t in _templates(docs[1]) for v in t["spec"]["volumes"]
                     if "persistentVolumeClaim" in v})
    if claims:
        head += f"# PersistentVolumeClaims it mounts (create them first, or --volume NAME=pvc:CLAIM): {', '.join(claims)}\n"
    return head + yaml.dump_all(docs, Dumper=_Dumper, sort_keys=False, width=1000)


def _templates(obj: dict) -> list[dict]:
    spec = obj["spec"]
    if obj["kind"] == "AscendJob":
        return [r["template"] for r in spec["replicaSpecs"].values()]
    if obj["kind"] == "PyTorchJob":
        return [r["template"] for r in spec["pytorchReplicaSpecs"].values()]
    if obj["kind"] == "Job":
        return [t["template"] for t in spec["tasks"]]
    c = spec["rayClusterSpec"]
    return [c["headGroupSpec"]["template"]] + [g["template"] for g in c.get("workerGroupSpecs", [])]
