"""Targets: what `trainbox launch render --target T` writes for a resolved job (host module)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

from ..runtime.errors import TrainboxError
from .job import Job

IMAGE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@+#-]*\Z")  # "#": enroot's REGISTRY#IMAGE form


# what may follow '@' in a reference: a digest as the OCI image spec writes it (anything else no node can pull)
DIGEST_RE = re.compile(r"^(sha256:[0-9a-f]{64}|sha512:[0-9a-f]{128})$")


def _digest_ok(image: str) -> bool:
    return "@" not in image or (image.count("@") == 1 and bool(DIGEST_RE.match(image.split("@", 1)[1])))


@dataclass(frozen=True)
class RenderOptions:
    """What a cluster render takes beyond the job: for Kubernetes the NPU node type, the objects' name (default:
    the recipe's and a random suffix) and namespace; for Slurm extra #SBATCH options."""
    accelerator_type: str | None = None
    name: str | None = None
    namespace: str | None = None
    sbatch_args: tuple[str, ...] = ()
    cpu: str | None = None  # Kubernetes: CPU request per pod (default by device and processes, k8s.requests)
    memory: str | None = None  # Kubernetes: memory request per pod
    volumes: tuple[str, ...] = ()  # Kubernetes: --volume NAME=pvc:CLAIM | NAME=hostpath


def _docker(job: Job, _opts: RenderOptions) -> str:
    from .script import job_script

    return job_script(job)


def _slurm(job: Job, opts: RenderOptions) -> str:
    from .slurm import render_sbatch

    return render_sbatch(job, sbatch_args=opts.sbatch_args)


def _slurm_pyxis(job: Job, opts: RenderOptions) -> str:
    from .slurm import render_sbatch

    return render_sbatch(job, pyxis=True, sbatch_args=opts.sbatch_args)


def _k8s(kind: str) -> Callable[[Job, RenderOptions], str]:
    def render(job: Job, opts: RenderOptions) -> str:
        from .k8s import render_manifest

        return render_manifest(job, kind, opts.name, opts.accelerator_type, opts.namespace,
                               requests=(opts.cpu, opts.memory), volumes=opts.volumes)

    return render


# name -> (renderer, what it writes, the kind of file)
TARGETS: dict[str, tuple[Callable[[Job, RenderOptions], str], str, str]] = {
    "docker": (_docker, "the bash launcher script `trainbox run` mounts into the container", "sh"),
    "slurm": (_slurm, "an sbatch script: one docker container per node", "sbatch"),
    "slurm-pyxis": (_slurm_pyxis, "an sbatch script for pyxis/enroot (srun --container-image)", "sbatch"),
    "ascendjob": (_k8s("ascendjob"), "a MindCluster AscendJob (mindxdl.gitee.com/v1), NPU torchrun/exec recipes",
                  "yaml"),
    "volcano": (_k8s("volcano"), "a Volcano Job (batch.volcano.sh/v1alpha1)", "yaml"),
    "pytorchjob": (_k8s("pytorchjob"), "a Kubeflow PyTorchJob (kubeflow.org/v1), torchrun recipes", "yaml"),
    "rayjob": (_k8s("rayjob"), "a KubeRay RayJob (ray.io/v1), Ray recipes", "yaml"),
}


K8S_TARGETS = ("ascendjob", "volcano", "pytorchjob", "rayjob")


def unpullable(job: Job, target: str) -> str | None:
    """Why the nodes of this render cannot pull its image, or None: a Kubernetes pod, or a node of a multi-node
    job, is another machine than the one that built the image: neither a local tag nor a registry on a loopback
    address reaches it. (The docker target's script names no image: `trainbox run` chooses it where it runs.)"""
    from .images import loopback_problem, pull_problem

    if target == "docker" or (target not in K8S_TARGETS and job.nodes < 2):
        return None
    return loopback_problem(job.image) or pull_problem(job.image)


def render_target(job: Job, target: str, options: RenderOptions | None = None) -> str:
    if target not in TARGETS:
        raise TrainboxError(f"--target {target!r}: expected one of {', '.join(TARGETS)}")
    options = options or RenderOptions()
    k8s_only = {"--accelerator-type": options.accelerator_type, "--name": options.name,
                "--namespace": options.namespace, "--cpu": options.cpu, "--memory": options.memory}
    for flag, value in k8s_only.items():
        if value is not None and target not in K8S_TARGETS:
            raise TrainboxError(f"{flag}: an option of the Kubernetes targets, not of --target {target}")
    if options.volumes and target not in K8S_TARGETS:
        raise TrainboxError(f"--volume: an option of the Kubernetes targets, not of --target {target} (docker and "
                            "Slurm bind-mount each path input at its own path)")
    if options.sbatch_args and not target.startswith("slurm"):
        raise TrainboxError(f"--sbatch-arg: an option of the slurm targets, not of --target {target}")
    return TARGETS[target][0](job, options)


def resolve_for(target: str, recipe_name: str, *, sets: dict[str, str] | None = None, image: str | None = None,
                stack_name: str | None = None, nodes: int | None = None, nproc_per_node: int | None = None,
                devices: str | None = None, lint: bool = False) -> Job:
    """The job as `target` needs it. The docker script may leave inputs to the environment it runs in; a
    cluster target bakes them (its nodes see only what the job carries), and its scheduler gives each node
    NODE_RANK / MASTER_ADDR / MASTER_PORT. Paths are the cluster's: they are not checked here. `lint`: inputs
    may stay unset (`launch check` renders every recipe to lint the output, not to run it)."""
    from .images import choose_image, pinned
    from .job import SCHEDULER_PROVIDES, resolve

    if target not in TARGETS:
        raise TrainboxError(f"--target {target!r}: expected one of {', '.join(TARGETS)}")
    cluster = target != "docker"
    job = resolve(recipe_name, sets=sets, stack_name=stack_name, nodes=nodes, nproc_per_node=nproc_per_node,
                  devices=devices, check_paths=False, require_inputs=cluster and not lint, host_paths=cluster,
                  provided=SCHEDULER_PROVIDES if cluster else ())
    if image is not None and not (IMAGE_RE.match(image) and _digest_ok(image)):
        raise TrainboxError(f"--image {image!r}: expected an image reference like registry/name:tag or "
                            "name@sha256:<64 hex digits>")
    if cluster:
        job.image, job.image_note = choose_image(job, image, dry_run=True)
        ref, image_id = pinned(job.image)
        if ref != job.image:
            job.image_note += f"; pinned to {ref}"
        job.image, job.image_id = ref, image_id
    return job
