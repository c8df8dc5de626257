"""The `docker` target: a job's script written to the job cache and the `docker run` argv per node (host module).

How the script reaches the container: it is written on the host to $TRAINBOX_CACHE/jobs/ (default
~/.cache/trainbox/jobs/) under a name that hashes its content, bind-mounted read-only at
/opt/trainbox/job.sh, and the container's command is `bash /opt/trainbox/job.sh` (after the image's
entrypoint). Path inputs with `mount:` are bind-mounted at the same path as on the host, so a path means
the same thing inside and outside the container.

Device numbering: inside a container that was given /dev/davinci4..7 (or `--gpus device=4,5,6,7`), the
runtime numbers the cards 0..3 (Ascend documents container logical ids; NVIDIA renumbers), so the
visible-devices variable is set to 0..n-1 and the host's card numbers travel as TRAINBOX_DEVICES.
Docker itself is reached only through trainbox.image.engine's client.
"""

from __future__ import annotations

import hashlib
import contextlib
import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from ..paths import cache_dir
from ..image.toolkits import cann, for_device
from ..runtime.errors import TrainboxError, describe_os_error
from .job import Job, resolve
from .script import job_script

JOB_SCRIPT_IN_IMAGE = "/opt/trainbox/job.sh"
# docker run pieces (see DESIGN.md, "Domain facts"): the toolkit's (trainbox.image.toolkits.cann), which the doctor
# checks for too. Jobs over more than one node also need the NIC tool and its configuration (HCCL over RoCE).
# Required, not probed: the plan is made on one host and run on every node.
NPU_CONTROL_DEVICES = cann.facts.NPU_DEVICE_NODES
NPU_DRIVER_MOUNTS = tuple(cann.facts.NPU_DRIVER_MOUNTS)
NPU_MULTINODE_MOUNTS = tuple(cann.facts.NPU_MULTINODE_MOUNTS)
# memlock: HCCL / NCCL and RDMA pin host memory. CPU jobs pin nothing and get only the stack limit: some
# hosts (unprivileged CI sandboxes) cannot raise memlock at all, and docker then refuses to start.
ULIMITS = {"npu": ("memlock=-1", "stack=67108864"), "cuda": ("memlock=-1", "stack=67108864"),
           "cpu": ("stack=67108864",)}
CPU_SHM_SIZE = "8g"  # CPU jobs keep a private IPC namespace; accelerator jobs use --ipc host


def csv_field(text: str) -> str:
    """One field of docker's --mount value (a CSV record): quoted when it holds a comma, quote or newline."""
    if any(c in text for c in ',"\n\r') or text != text.strip():
        return '"' + text.replace('"', '""') + '"'
    return text


def mount_arg(source: str, target: str, readonly: bool) -> str:
    fields = ["type=bind", f"source={source}", f"target={target}"] + (["readonly"] if readonly else [])
    return ",".join(csv_field(f) for f in fields)


def jobs_dir() -> Path:
    return cache_dir() / "jobs"


def logs_dir() -> Path:
    """Where `trainbox run` keeps each run's output ($TRAINBOX_CACHE/logs/, default ~/.cache/trainbox/logs/)."""
    return jobs_dir().parent / "logs"


def kept_logs(recipe: str | None = None) -> list[Path]:
    """Kept run logs, oldest first (of one recipe when given)."""
    d = logs_dir()
    if not d.is_dir():
        return []
    logs = [p for p in d.glob("*.log") if recipe is None or p.name.rsplit("-", 2)[0] == recipe]
    return sorted(logs, key=lambda p: (p.stat().st_mtime, p.name))


#: run logs kept per recipe: each run adds one per node, so older ones go when a run ends
KEEP_LOGS = 20


def prune_logs(recipe: str, keep: int = KEEP_LOGS) -> list[Path]:
    """Remove all but the newest `keep` kept logs of `recipe`; the removed paths."""
    old = kept_logs(recipe)[:-keep] if keep > 0 else kept_logs(recipe)
    for p in old:
        p.unlink(missing_ok=True)
    return old


def write_job_script(name: str, script: str) -> Path:
    digest = hashlib.sha256(script.encode()).hexdigest()[:12]
    d = jobs_dir()
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"{name}-{digest}.sh"
    if not path.exists() or path.read_text() != script:
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            tmp.write_text(script)
            tmp.chmod(0o644)
            tmp.replace(path)
        except OSError as exc:
            raise TrainboxError(f"cannot write the job script: {describe_os_error(exc, str(tmp))}") from None
        finally:  # a full disk: no half-written script stays behind
            tmp.unlink(missing_ok=True)
    return path


def device_args(job: Job) -> list[str]:
    """The device toolkit's flags for the job's cards: --device / -v for NPU cards and their driver (plus
    hccn_tool and hccn.conf on more than one node), --gpus for CUDA, nothing on CPU."""
    toolkit = for_device(job.device)
    if job.cards is None or toolkit is None:
        return []
    return toolkit.docker_args(job.cards, job.nodes, mount_arg)


def doctor_in_image(image: str, doctor_args: list[str]) -> int:
    """`trainbox doctor --image IMAGE`: the doctor in a throwaway container of IMAGE (network off, a CPU job's
    shared memory and ulimits), through the image's own entrypoint, or docker's init in front of it for an image
    of another platform (emulation_args); its output streams through, its exit status is the doctor's."""
    from ..image.engine import find_client
    from .images import emulation_args

    client = find_client()
    client.require_engine()
    if not client.image_exists(image):
        raise TrainboxError(f"--image {image}: the engine has no such image; build it (`trainbox image build STACK`, "
                            "`trainbox image ls` lists what is here) or `docker pull` it")
    emulate, why = emulation_args(image)
    if why:
        print(f"trainbox: {why}", file=sys.stderr)
    argv = ["run", "--rm", "--network", "none", "--shm-size", CPU_SHM_SIZE,
            *(a for u in ULIMITS["cpu"] for a in ("--ulimit", u)), *emulate, image, "trainbox", "doctor", *doctor_args]
    return client.attached(*argv)


def run_args(job: Job, *, shm_size: str | None = None, labels: list[str] | None = None,
             name: str | None = None) -> list[str]:
    """`docker run` options up to (not including) the job script's mount and the image: the same for every
    node and every target that runs containers (the sbatch script adds its own per-node pieces)."""
    base = ["run", "--rm"]
    if name:
        base += ["--name", name, "--label", f"trainbox.job={name}"]
    base += ["--label", f"trainbox.recipe={job.name}"]
    for lab in labels or []:
        base += ["--label", lab]
    base += ["--network", "host"]
    if shm_size:
        base += ["--shm-size", shm_size]
    elif job.device == "cpu":
        base += ["--shm-size", CPU_SHM_SIZE]
    else:
        base += ["--ipc", "host"]
    for u in ULIMITS[job.device]:
        base += ["--ulimit", u]
    base += device_args(job)
    for key in sorted(job.env):
        base += ["-e", f"{key}={job.env[key]}"]
    for target in sorted(job.mounts):
        base += ["--mount", mount_arg(target, target, job.mounts[target])]
    return base


@dataclass
class RunPlan:
    job: Job
    image: str
    script: str
    script_path: Path
    argv_per_node: list[list[str]]
    host_dirs_to_create: list[str]
    notes: list[str]
    name: str | None = None  # the job's name (its container's; None in a dry run without --name)

    @property
    def recipe(self):
        return self.job.recipe

    @property
    def stack(self):
        return self.job.stack


def plan_run(recipe_name: str, *, sets: dict[str, str] | None = None, image: str | None = None,
             devices: str | None = None, stack_name: str | None = None, shm_size: str | None = None,
             labels: list[str] | None = None, name: str | None = None, docker: str | None = None,
             dry_run: bool = False, nodes: int | None = None, nproc_per_node: int | None = None,
             allow_substitute: bool = False) -> RunPlan:
    from .images import choose_image, emulation_args

    job = resolve(recipe_name, sets=sets, stack_name=stack_name, nodes=nodes, nproc_per_node=nproc_per_node,
                  devices=devices, check_paths=not dry_run)
    job.image, job.image_note = choose_image(job, image, allow_substitute=allow_substitute, dry_run=dry_run)
    if not dry_run or name is not None:  # one name per submission (trainbox.launch.lifecycle), the container's
        from .lifecycle import new_name

        name = new_name(job.name, name)
    script = job_script(job)
    script_path = write_job_script(job.name, script)
    exe = docker or os.environ.get("TRAINBOX_DOCKER") or "docker"
    base = run_args(job, shm_size=shm_size, labels=labels, name=name)
    emulated, why = emulation_args(job.image)
    tail = [*emulated, "--mount", mount_arg(str(script_path), JOB_SCRIPT_IN_IMAGE, True), job.image, "bash",
            JOB_SCRIPT_IN_IMAGE]
    argv_per_node = []
    for rank in range(job.nodes):
        node_env = ["-e", f"NODE_RANK={rank}"] if job.nodes > 1 else []
        argv_per_node.append([exe, *base, *node_env, *tail])
    notes = [job.image_note] if job.image_note else []
    notes += [why] if why else []
    if job.nodes > 1:
        notes.append(f"recipe {job.name} spans {job.nodes} nodes: run node r's command on node r "
                     f"(node 0 at MASTER_ADDR); the script is {script_path}, copy it to the same path on every node")
        if job.device == "npu":
            notes.append("every node must have " + " and ".join(NPU_MULTINODE_MOUNTS) + " (HCCL's NIC tool and "
                         "its configuration; mounted read-only, docker refuses to start without them)")
    return RunPlan(job, job.image, script, script_path, argv_per_node, job.create, notes, name)


def format_argv(argv: list[str], image_index: int | None = None) -> str:
    """A command line ready to paste: every word shell-quoted, one option (with its value) per line, and
    the image with its command on a line of their own."""
    words = [shlex.quote(w) for w in argv]
    lines, cur = [], []
    for i, w in enumerate(words):
        if cur and i > 2 and (argv[i].startswith("-") or i == image_index):
            lines.append(" ".join(cur))
            cur = []
        cur.append(w)
    lines.append(" ".join(cur))
    return " \\\n    ".join(lines)


def format_plan(plan: RunPlan) -> str:
    if len(plan.argv_per_node) == 1:
        argv = plan.argv_per_node[0]
        return format_argv(argv, len(argv) - 3) + "\n"
    out = []
    role = {"ray": ("Ray head, submits the job", "joins the Ray head")}.get(
        plan.recipe.launcher, ("master", "worker"))
    for rank, argv in enumerate(plan.argv_per_node):
        out.append(f"# node {rank} of {len(plan.argv_per_node)} ({role[0] if rank == 0 else role[1]})")
        out.append(format_argv(argv, len(argv) - 3))
    return "\n".join(out) + "\n"


def execute(plan: RunPlan, node_rank: int = 0) -> int:
    """Run one node's container in the foreground (logs stream through) and return its exit code."""
    from ..image.engine import find_client

    if not 0 <= node_rank < len(plan.argv_per_node):
        raise TrainboxError(f"--node-rank {node_rank}: recipe {plan.recipe.name} has nodes 0-{plan.recipe.nodes - 1}")
    client = find_client()
    if not client.image_exists(plan.image):
        raise TrainboxError(f"image {plan.image} is not present: build it with `trainbox image build "
                            f"{plan.stack.name}`, or name one with --image")
    for d in plan.host_dirs_to_create:
        os.makedirs(d, exist_ok=True)
    from . import lifecycle

    logs_dir().mkdir(parents=True, exist_ok=True)
    name = plan.name or lifecycle.new_name(plan.recipe.name)
    log = logs_dir() / f"{name}-node{node_rank}.log"
    lifecycle.start(name, "docker", plan.recipe.name, plan.image, container=name, log=str(log), pid=os.getpid(),
                    node_rank=node_rank, nodes=len(plan.argv_per_node))
    print(f"trainbox run {plan.recipe.name}: job {name} ({plan.image}, script {plan.script_path}, log {log}); "
          f"`trainbox status|logs|cancel {name}`", file=sys.stderr)
    from ..image.engine import Interrupted

    rc = 1
    try:
        rc = client.attached(*plan.argv_per_node[node_rank][1:], log=log)
    except Interrupted as exc:  # Ctrl-C: the container stopped; its output after the interrupt is in the log only
        rc = exc.returncode
        with contextlib.suppress(OSError):  # Ctrl-C is a cancel (a full cache disk loses only the record's word)
            lifecycle.save({**lifecycle.load(name), "cancel_requested": lifecycle.now()})
        raise KeyboardInterrupt(f"the {plan.recipe.name} job {name} stopped (container exit {exc.returncode}); its "
                                f"log is kept at {log} (trainbox logs {name})") from None
    finally:  # an interrupted follow still records the end (the container got the same SIGINT)
        try:
            record = lifecycle.finish(name, rc)
        except OSError as exc:  # a full cache disk: the job's own outcome stands, its record is what is lost
            record = {"state": "succeeded" if rc == 0 else "failed"}
            print(f"trainbox run {plan.recipe.name}: job {name}'s record not updated ({describe_os_error(exc)})",
                  file=sys.stderr)
        # the container is gone (--rm), interrupted or not; its output is not (the newest KEEP_LOGS per recipe)
        prune_logs(plan.recipe.name)
    print(f"trainbox run {plan.recipe.name}: job {name} {record['state']}, exit {rc}; log kept at {log} "
          f"(trainbox logs {name})", file=sys.stderr)
    return rc
