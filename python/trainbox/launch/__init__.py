"""Recipes -> jobs -> launchers for each target (host package).

One direction: `job.resolve` turns a recipe, its stack and the user's values into a `Job` once; each target
renders that job: `docker` (a bash script and the `docker run` argv, .docker), `slurm` / `slurm-pyxis` (an sbatch
script, .slurm), and `ascendjob`, `volcano`, `pytorchjob`, `rayjob` (Kubernetes manifests, .k8s). The bash
script every target runs inside the image comes from .script.
"""

from __future__ import annotations

from ..runtime.errors import TrainboxError
from .docker import (
    JOB_SCRIPT_IN_IMAGE,
    NPU_CONTROL_DEVICES,
    NPU_DRIVER_MOUNTS,
    RunPlan,
    csv_field,
    execute,
    format_argv,
    format_plan,
    jobs_dir,
    mount_arg,
    plan_run,
    write_job_script,
)
from .job import Job, StackInfo, Values, load_stack_info, parse_devices, parse_sets, resolve, split_sets
from .script import check_script, job_script, node_commands, render_script


def render(recipe_name: str, sets: dict[str, str] | None = None, stack_name: str | None = None,
           nodes: int | None = None, nproc_per_node: int | None = None, devices: str | None = None) -> tuple:
    """(recipe, stack, the docker target's bash script)."""
    job = resolve(recipe_name, sets=sets, stack_name=stack_name, nodes=nodes, nproc_per_node=nproc_per_node,
                  devices=devices, check_paths=False, require_inputs=False, host_paths=False)
    return job.recipe, job.stack, job_script(job)


__all__ = [
    "JOB_SCRIPT_IN_IMAGE", "NPU_CONTROL_DEVICES", "NPU_DRIVER_MOUNTS", "Job", "RunPlan", "StackInfo",
    "TrainboxError", "Values", "check_script", "csv_field", "execute", "format_argv", "format_plan", "job_script",
    "jobs_dir", "load_stack_info", "mount_arg", "node_commands", "parse_devices", "parse_sets", "plan_run", "render",
    "render_script", "resolve", "split_sets", "write_job_script",
]
