"""One lifecycle for every target: the jobs trainbox started, their state, logs and cancellation (host module).

torchx's status / log / cancel is the model. Each submission gets a name of its own (`RECIPE-xxxxxx`, or --name)
and a record, $TRAINBOX_CACHE/runs/NAME.json (default ~/.cache/trainbox/runs/), written when it starts and
again when it ends:
- docker: the container is named NAME; `trainbox run` keeps its output in a host file (logs/NAME-nodeR.log) as it
  streams, so the log outlives the container (--rm) and any log driver; cancel is `docker stop --time 20` (tini
  hands SIGTERM to the job's process group, the launchers' traps stop Ray; SIGKILL after 20 s).
- Slurm: the record holds the Slurm job id and its output file; state comes from squeue, then `scontrol show
  job` (which keeps a finished job MinJobAge, 300 s by default), then the record; cancel is `scancel ID` (each
  node's step stops its container, the batch host sweeps by label).
- Kubernetes: trainbox renders, the cluster runs; every object and pod carries `trainbox.io/job=NAME`, so the
  commands select by that label: run when a kube context exists, printed otherwise.
States: pending, running, succeeded, failed, cancelled, lost (the process that followed the job is gone and the
engine no longer knows the container), unknown.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import time
from pathlib import Path

from ..paths import write_atomic
from ..runtime.errors import TrainboxError

STOP_SECONDS = 20  # docker stop's grace, the same the sbatch steps give their containers
TERMINAL = ("succeeded", "failed", "cancelled", "lost")
SLURM_SETTLE_SECONDS = 20  # how long a job's end waits for Slurm to leave COMPLETING
K8S_KINDS = "ascendjobs.mindxdl.gitee.com,jobs.batch.volcano.sh,pytorchjobs.kubeflow.org,rayjobs.ray.io"
K8S_LABEL = "trainbox.io/job"
NAME_OK = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")


def runs_dir() -> Path:
    """$TRAINBOX_CACHE/runs (the cache trainbox.launch.docker keeps job scripts and logs in)."""
    from ..paths import cache_dir

    return cache_dir() / "runs"


def new_name(recipe: str, name: str | None = None) -> str:
    """`name` as given (checked: a container name, unused), else the recipe's name and a random suffix."""
    from .k8s import k8s_name

    if name is None:
        while True:
            name = f"{k8s_name(Path(recipe).stem, 43)}-{secrets.token_hex(3)}"
            if not (runs_dir() / f"{name}.json").exists():
                return name
    if not name or len(name) > 63 or not set(name) <= NAME_OK or not name[0].isalnum():
        raise TrainboxError(f"--name {name!r}: expected letters, digits, '_', '.', '-' (at most 63, starting with a "
                            "letter or digit)")
    old = load(name, missing_ok=True)
    if old is not None:
        raise TrainboxError(f"--name {name}: a job of that name was already started ({old.get('state')}, "
                            f"{old.get('submitted')}); job names are one per submission: choose another, or leave "
                            "--name out for a fresh one")
    return name


def save(record: dict) -> dict:
    d = runs_dir()
    d.mkdir(parents=True, exist_ok=True)
    write_atomic(d / f"{record['name']}.json", json.dumps(record, indent=2, sort_keys=True) + "\n")
    return record


def load(name: str, missing_ok: bool = False) -> dict | None:
    if not name or "/" in name or name.startswith("."):
        raise TrainboxError(f"JOB {name!r}: expected a job name as `trainbox jobs` lists them")
    path = runs_dir() / f"{name}.json"
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        if missing_ok:
            return None
        raise
    except (OSError, ValueError) as exc:
        raise TrainboxError(f"{path}: unreadable job record ({exc}); remove it") from None


def records() -> list[dict]:
    d = runs_dir()
    out = []
    for p in sorted(d.glob("*.json")) if d.is_dir() else []:
        try:
            out.append(json.loads(p.read_text()))
        except (OSError, ValueError):
            continue
    return sorted(out, key=lambda r: (r.get("submitted", ""), r["name"]))


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def start(name: str, target: str, recipe: str, image: str, **fields) -> dict:
    return save({"name": name, "target": target, "recipe": recipe, "image": image, "submitted": now(),
                 "host": os.uname().nodename, "state": "pending" if target != "docker" else "running", **fields})


def finish(name: str, exit_code: int) -> dict:
    """The job ended with `exit_code` (the container's, or sbatch --wait's): its final state (Slurm's own where
    it still knows the job)."""
    record = load(name)
    if record["target"].startswith("slurm"):
        # sbatch --wait returns while Slurm may still say COMPLETING: wait a little for its last word, so the record
        # does not keep the RUNNING it saw before (its state, from ours, would then contradict Slurm's)
        deadline = time.monotonic() + SLURM_SETTLE_SECONDS
        while True:
            state, raw = slurm_state(record["job_id"])
            if raw:
                record.update(slurm_state=raw)
            if state in TERMINAL:
                record.update(state=state)
            if state in TERMINAL or state is None or time.monotonic() >= deadline:
                break
            time.sleep(0.5)
    if record.get("state") not in TERMINAL:
        record["state"] = "cancelled" if record.get("cancel_requested") else \
            "succeeded" if exit_code == 0 else "failed"
    record.update(exit_code=exit_code, finished=now())
    return save(record)


# --- state ------------------------------------------------------------------------------------------------------
SLURM_STATES = {"PENDING": "pending", "CONFIGURING": "pending", "REQUEUED": "pending", "RUNNING": "running",
                "COMPLETING": "running", "SUSPENDED": "running", "COMPLETED": "succeeded", "CANCELLED": "cancelled",
                "FAILED": "failed", "TIMEOUT": "failed", "NODE_FAIL": "failed", "OUT_OF_MEMORY": "failed",
                "PREEMPTED": "failed", "BOOT_FAIL": "failed", "DEADLINE": "failed"}


def _run(argv: list[str], timeout: float = 30) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None


def _pid_alive(pid) -> bool:
    try:
        os.kill(int(pid), 0)
    except (OSError, TypeError, ValueError):
        return False
    return True


def docker_exe() -> str:
    return os.environ.get("TRAINBOX_DOCKER") or "docker"


def slurm_state(job_id: str) -> tuple[str | None, str | None]:
    """(trainbox state, Slurm's own) from squeue, else scontrol; (None, None) where Slurm no longer knows it."""
    q = _run(["squeue", "-h", "-j", job_id, "-o", "%T"])
    if q is not None and q.returncode == 0 and q.stdout.strip():
        raw = q.stdout.split()[0]
        return SLURM_STATES.get(raw, "unknown"), raw
    s = _run(["scontrol", "show", "job", job_id])
    if s is not None and s.returncode == 0:
        for word in s.stdout.split():
            if word.startswith("JobState="):
                raw = word.split("=", 1)[1]
                return SLURM_STATES.get(raw, "unknown"), raw
    return None, None


def refresh(record: dict) -> dict:
    """The record with its state as the engine or Slurm sees it now (the file is updated where that settled it)."""
    state = record.get("state")
    if record["target"] == "docker" and state not in TERMINAL:
        p = _run([docker_exe(), "inspect", "--format", "{{.State.Status}}", record["container"]])
        status = p.stdout.strip() if p is not None and p.returncode == 0 else None
        if status in ("running", "restarting", "paused"):
            record["state"] = "running"
        elif status == "created":
            record["state"] = "pending"
        elif not _pid_alive(record.get("pid")):  # else the `trainbox run` following it records the end
            record["state"] = "cancelled" if record.get("cancel_requested") else "lost"
            save(record)
    elif record["target"].startswith("slurm") and state not in TERMINAL:
        new, raw = slurm_state(record["job_id"])
        if new:
            record["state"], record["slurm_state"] = new, raw
            if new in TERMINAL:
                save(record)
        elif not _pid_alive(record.get("pid")):  # Slurm forgot it (MinJobAge) and nothing recorded its end;
            record["state"] = "lost"  # not saved: an unreachable slurmctld answers the same way
    elif record["target"].startswith("slurm") and record.get("slurm_state") \
            and SLURM_STATES.get(record["slurm_state"]) not in TERMINAL:
        new, raw = slurm_state(record["job_id"])  # ended while Slurm still said COMPLETING: its last word now
        if new in TERMINAL:
            record.update(state=new, slurm_state=raw)
            save(record)
    return record


# --- what each target runs ------------------------------------------------------------------------------------
def k8s_context() -> bool:
    """Whether a kubectl with a current context is here (then the Kubernetes commands run, else they print)."""
    kubectl = shutil.which("kubectl")
    if not kubectl:
        return False
    p = _run([kubectl, "config", "current-context"], timeout=15)
    return p is not None and p.returncode == 0 and bool(p.stdout.strip())


def k8s_commands(action: str, name: str, namespace: str | None = None, follow: bool = False) -> list[list[str]]:
    ns = ["-n", namespace] if namespace else []
    sel = ["-l", f"{K8S_LABEL}={name}"]
    if action == "status":
        return [["kubectl", "get", K8S_KINDS, *sel, *ns], ["kubectl", "get", "pods", *sel, *ns, "-o", "wide"]]
    if action == "logs":
        return [["kubectl", "logs", *sel, *ns, "--all-containers", "--prefix", "--tail=-1",
                 "--max-log-requests=64", *(["-f"] if follow else [])]]
    if action == "cancel":  # the job, its ConfigMap (and what the operator made of them: owner references)
        return [["kubectl", "delete", f"{K8S_KINDS},configmaps", *sel, *ns, "--wait=false"]]
    if action == "jobs":
        return [["kubectl", "get", K8S_KINDS, "-l", "app.kubernetes.io/managed-by=trainbox", "-L", K8S_LABEL,
                 *(ns or ["--all-namespaces"])]]
    raise ValueError(action)


def docker_cancel_argv(record: dict) -> list[str]:
    return [docker_exe(), "stop", "--time", str(STOP_SECONDS), record["container"]]


def cancel_argv(record: dict) -> list[str]:
    if record["target"] == "docker":
        return docker_cancel_argv(record)
    return ["scancel", record["job_id"]]


def log_path(record: dict) -> Path | None:
    path = record.get("log") or record.get("output")
    return Path(path) if path else None


def cancel(record: dict) -> dict:
    """Stop the job; the record says cancelled once its engine does (docker: when the stop returns)."""
    record = refresh(record)
    if record["state"] in TERMINAL:
        return record
    record["cancel_requested"] = now()
    save(record)
    p = _run(cancel_argv(record), timeout=STOP_SECONDS + 60)
    if p is None or p.returncode != 0:
        why = (p.stderr.strip() if p is not None else "") or "did not answer"
        raise TrainboxError(f"cancel {record['name']}: `{' '.join(cancel_argv(record))}` failed: {why}")
    if record["target"] == "docker":
        record = load(record["name"])
        if record.get("state") not in TERMINAL:
            record["state"] = "cancelled"
            save(record)
    return refresh(record)


def follow(record: dict, out, poll: float = 0.5) -> dict:
    """Copy the job's log to `out` as it grows, until the job is over (the log is read to its end)."""
    path = log_path(record)
    pos = 0
    while True:
        record = refresh(load(record["name"]))
        done = record["state"] in TERMINAL
        if path and path.exists():
            with open(path, "rb") as fh:
                fh.seek(pos)
                chunk = fh.read()
            pos += len(chunk)
            if chunk:
                out.write(chunk.decode(errors="replace"))
                out.flush()
        if done:
            return record
        time.sleep(poll)
