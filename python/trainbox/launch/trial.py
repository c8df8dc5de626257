"""`trainbox trial RECIPE`: the recipe's own job, shrunk by its `trial:` overlay, run for its first training steps
in its stack's image (host module).

On a host without the stack's cards it runs in CPU mode: no devices, TRAINBOX_DEVICE=cpu (the image's CPU-mode
hook hides torch_npu and the CUDA extensions, torch sees no accelerator, frameworks choose Gloo), the overlay's
ranks as processes. On a host with the cards (`--devices`), the same tiny job on those cards. Either way:

  1. artifacts  the overlay's tiny model, tokenizer, data and derived files, made in the image by
                trainbox.runtime.trialkit (this checkout's runtime mounted read-only), cached by content hash
                under $TRAINBOX_CACHE/trial/artifacts/HASH and reused
  2. the job    the overlaid recipe (a recipe file in the run's directory) rendered by the same code as
                `trainbox run`, started with `docker run` as `trainbox run` starts it, plus the step monitor
                (trainbox.runtime.trialmon, mounted with a .pth line into the image's site-packages)
  3. result     per step: loss and time (rank 0); then `passed N steps` or `stopped at FILE:LINE: ...`
                (trainbox.launch.trialresult), and the overlay's `verify` checks after a pass
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..image.engine import Client
from ..image.toolkits import TOOLKITS, for_device
from .recipe import Input, list_recipes, load_recipe
from ..runtime.errors import TrainboxError
from .docker import JOB_SCRIPT_IN_IMAGE, jobs_dir, mount_arg, run_args, write_job_script
from .job import Job, StackInfo, resolve
from .script import job_script
from .trialplan import Overlay, artifact_key, expand_tree, overlaid_recipe, overlay_of, refs
from .trialresult import judge, read_monitor

TRIAL_DIR_IN_IMAGE = "/opt/trainbox-trial"
MONITOR_IN_IMAGE = f"{TRIAL_DIR_IN_IMAGE}/trialmon.py"
PYTHON_IN_IMAGE = f"{TRIAL_DIR_IN_IMAGE}/python"
PTH_NAME = "zz_trainbox_trial.pth"
# loads the monitor by path (images built before it existed have no trainbox.runtime.trialmon)
PTH_LINE = ("import os; os.environ.get('TRAINBOX_TRIAL_DIR') and exec(\"import importlib.util as u, sys; "
            f"s = u.spec_from_file_location('trainbox_trial_monitor', '{MONITOR_IN_IMAGE}'); m = "
            "u.module_from_spec(s); sys.modules[s.name] = m; s.loader.exec_module(m)\")\n")
SCHEMA = "trainbox.trial/1"


def trial_root() -> Path:
    return jobs_dir().parent / "trial"


def trial_recipes() -> list[str]:
    out = []
    for name in list_recipes():
        try:
            if load_recipe(name).trial is not None:
                out.append(name)
        except TrainboxError:
            continue
    return out


@dataclass
class TrialPlan:
    recipe: str
    overlay: Overlay
    image: str
    image_note: str
    mode: str  # cpu | device
    spec: dict  # what trialkit makes
    artifacts: Path
    made: dict[str, str]  # @model, @data, @files.NAME -> paths (whether made yet or not)
    run_dir: Path
    recipe_file: Path
    job: Job
    script_path: Path
    argv: list[str] = field(default_factory=list)
    container: str = ""
    port_claim: PortClaim | None = None  # CPU mode's port slot, held until the job has ended


def _made_paths(spec: dict, d: Path) -> dict[str, str]:
    made = {}
    if spec.get("model"):
        made["model"] = str(d / "model")
    if spec.get("data"):
        made["data"] = str(d / "data" / "train.jsonl")
    for name in (spec.get("files") or {}):
        made[f"files.{name}"] = str(d / f"{name}.json")
    return made


def _values(job: Job) -> dict[str, str]:
    values = {**job.stack.env, **job.env}
    for name, spec in job.inputs.items():
        value = job.sets.get(name, spec.default)
        if value is not None:
            values[name] = str(value)
    return values


def _host_has_cards(device: str) -> bool:
    toolkit = for_device(device)
    if toolkit is not None:
        return toolkit.host_has_cards()
    return False


def plan_trial(name: str, *, image: str | None = None, devices: str | None = None, cpu: bool | None = None,
               run_dir: Path | None = None, sets: dict[str, str] | None = None) -> TrialPlan:
    """Everything the trial will do, nothing done yet but the run's directory and recipe file."""
    from .images import choose_image

    # two jobs, each resolved once: the recipe as written (its image, its values for the artifacts) and the
    # overlaid recipe the trial runs
    base = resolve(name, require_inputs=False, host_paths=False)
    recipe = base.recipe
    ov = overlay_of(recipe)
    mode = "cpu" if (cpu or (cpu is None and devices is None and not _host_has_cards(base.device))) else "device"
    if base.device == "cpu":
        mode = "cpu"
    img, note = choose_image(base, image, allow_substitute=True)
    spec = expand_tree(ov.artifacts, _values(base))
    adir = trial_root() / "artifacts" / artifact_key(spec)
    made = _made_paths(spec, adir)
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    rdir = (run_dir or trial_root() / "runs" / f"{recipe.name}-{stamp}-{os.getpid()}").resolve()
    (rdir / "monitor").mkdir(parents=True, exist_ok=True)
    rfile = overlaid_recipe(name, ov, rdir / "recipe", {k: refs(str(v), made, str(rdir)) for k, v in ov.args.items()})
    values = {k: refs(str(v), made, str(rdir)) for k, v in ov.set.items()}
    if ov.code:
        values[recipe.code.input] = str(rdir / "code")  # the overlay's edited copy of the image's tree
    values.update(sets or {})
    claim = None
    if mode == "cpu":
        ports, claim = _free_ports(base.inputs, values)
        values.update(ports)
    job = resolve(str(rfile), sets=values, devices=devices if mode == "device" else None,
                  check_paths=False)
    script = job_script(job)
    script_path = write_job_script(f"{recipe.name}-trial", script)
    plan = TrialPlan(recipe.name, ov, img, note, mode, spec, adir, made, rdir, rfile, job, script_path)
    plan.container = f"trainbox-trial-{recipe.name}-{os.getpid()}"[:120]
    plan.port_claim = claim
    return plan


class PortClaim:
    """A port slot's lock file, held (flock) while the trial's job may listen on the slot's ports. Another trial on
    this host skips a claimed slot: a bind probe alone let two trials that started together (the smoke runs two at
    once) both find a slot free before either job listened, and the second failed with EADDRINUSE."""

    def __init__(self, fd: int | None):
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops its lock
            self._fd = None

    def __del__(self):
        self.release()


def _claim_slot(slot: int) -> PortClaim | None:
    """The slot's claim, None when another trial holds it; a claim of nothing where the lock cannot be kept (a
    read-only cache: the bind probe alone decides, as before)."""
    import fcntl

    try:
        d = trial_root() / "ports"
        d.mkdir(parents=True, exist_ok=True)
        fd = os.open(str(d / f"slot-{slot}.lock"), os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        return PortClaim(None)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return PortClaim(fd)


def _free_ports(inputs: dict[str, Input], values: dict[str, str]) -> tuple[dict[str, str], PortClaim | None]:
    """CPU mode has no card to give the job its port slot (job.py: the first card's), so two trials on one host
    (the smoke runs two stacks at once) took the same MASTER_PORT and the second failed to listen: each port input
    the caller did not set takes the first slot of `trainbox run`'s range that no other trial has claimed and that
    is free here now, starting from one derived from this process. The claim is held until the job has ended."""
    import socket

    from .ports import RUN_BASES, RUN_SLOTS, run_ports

    names = [n for n in RUN_BASES if n in inputs and n not in values]
    if not names:
        return {}, None
    start = os.getpid() % RUN_SLOTS
    for k in range(RUN_SLOTS):
        slot = (start + k) % RUN_SLOTS
        claim = _claim_slot(slot)
        if claim is None:
            continue
        ports = run_ports(slot, names)
        try:
            for port in ports.values():
                with socket.socket() as sock:
                    sock.bind(("", port))  # free now (a bind, not a connect: nothing is sent anywhere)
        except OSError:
            claim.release()
            continue
        return {n: str(v) for n, v in ports.items()}, claim
    return {}, None  # every slot busy: the recipe's defaults, and torchrun says which port it could not take


def _cpu_job(job: Job) -> Job:
    """The job as CPU mode starts it: no cards, no visible-devices variables, the CPU container options."""
    hidden = {"TRAINBOX_DEVICES"} | {t.VISIBLE_DEVICES_VAR for t in TOOLKITS.values()}
    env = {k: v for k, v in job.env.items() if k not in hidden}
    stack = StackInfo(job.stack.name, "cpu", job.stack.env, job.stack.cann, job.stack.chip)
    return dataclasses.replace(job, cards=None, env=env, stack=stack)


def docker_argv(plan: TrialPlan, site: str, docker: str) -> list[str]:
    job = _cpu_job(plan.job) if plan.mode == "cpu" else plan.job
    # the entry's own imports are the check here, with their real frame (the script's preflight would stop first)
    job.env = {**job.env, "TRAINBOX_TRIAL_DIR": str(plan.run_dir / "monitor"), "TRAINBOX_SKIP_PREFLIGHT": "1",
               **{k: str(v) for k, v in plan.overlay.env.items()}}
    if plan.mode == "cpu":
        job.env["TRAINBOX_DEVICE"] = "cpu"
    if plan.overlay.stop_after:
        job.env["TRAINBOX_TRIAL_STOP_AFTER"] = str(plan.overlay.stop_after)
    job.mounts = {**job.mounts, str(plan.run_dir): False}
    if plan.made:
        job.mounts[str(plan.artifacts)] = True
    from ..paths import REPO_ROOT

    pth = plan.run_dir / PTH_NAME
    pth.write_text(PTH_LINE)
    monitor = REPO_ROOT / "python" / "trainbox" / "runtime" / "trialmon.py"
    base = run_args(job, labels=["trainbox.trial=1"], name=plan.container)
    return [docker, *base,
            "--mount", mount_arg(str(monitor), MONITOR_IN_IMAGE, True),
            "--mount", mount_arg(str(pth), f"{site}/{PTH_NAME}", True),
            "--mount", mount_arg(str(plan.script_path), JOB_SCRIPT_IN_IMAGE, True),
            plan.image, "bash", JOB_SCRIPT_IN_IMAGE]


def _in_image(client: Client, image: str, *cmd: str, mounts: list[str] = (), timeout: float = 600,
              env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    from ..paths import REPO_ROOT

    args = ["run", "--rm", "--network", "none", "--label", "trainbox.trial=1",
            "--mount", mount_arg(str(REPO_ROOT / "python"), PYTHON_IN_IMAGE, True),
            "-e", f"PYTHONPATH={PYTHON_IN_IMAGE}", "-e", "TRAINBOX_DEVICE=cpu", "-e", "HF_HUB_OFFLINE=1"]
    for k, v in (env or {}).items():
        args += ["-e", f"{k}={v}"]
    for m in mounts:
        args += ["--mount", m]
    return client.run(*args, image, *cmd, timeout=timeout, check=False)


def site_dir(client: Client, image: str) -> str:
    """The image's site-packages (where the monitor's .pth goes), asked once per image id."""
    iid = (client.image_id(image) or image).replace("sha256:", "")[:16]
    cache = trial_root() / "site" / iid
    if cache.is_file():
        return cache.read_text().strip()
    proc = _in_image(client, image, "python3", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])",
                     timeout=120)
    site = proc.stdout.decode(errors="replace").strip().splitlines()[-1:] if proc.returncode == 0 else []
    if not site or not site[0].startswith("/"):
        raise TrainboxError(f"image {image}: cannot find its site-packages (python3 -c sysconfig ...: exit "
                            f"{proc.returncode}: {proc.stderr.decode(errors='replace').strip()[-300:]})")
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(site[0])
    return site[0]


def copy_code(plan: TrialPlan, client: Client, say) -> list[str]:
    """The image's tree of the workload, copied into the run's directory, with the overlay's edits."""
    from .trialplan import edit_code

    if not plan.overlay.code:
        return []
    src, dest = plan.job.recipe.code.image_path, plan.run_dir / "code"
    dest.mkdir(parents=True, exist_ok=True)
    proc = _in_image(client, plan.image, "cp", "-a", f"{src}/.", str(dest),
                     mounts=[mount_arg(str(plan.run_dir), str(plan.run_dir), False)])
    if proc.returncode != 0:
        raise TrainboxError(f"trial {plan.recipe}: copying {src} out of {plan.image} failed: "
                            f"{proc.stderr.decode(errors='replace').strip()[-300:]}")
    edits = edit_code(dest, plan.overlay.code, lambda v: refs(v, plan.made, str(plan.run_dir)))
    for e in edits:
        say(f"trial code edit: {e}")
    return edits


def make_artifacts(plan: TrialPlan, client: Client, say) -> bool:
    """Make the overlay's artifacts in the image once (cached by content hash); True when made now."""
    if not plan.spec or (plan.artifacts / "made.json").is_file():
        return False
    tmp = plan.artifacts.with_name(plan.artifacts.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    (tmp / "spec.json").write_text(json.dumps(plan.spec, indent=2))
    say(f"making the trial's artifacts in {plan.image} ({', '.join(plan.spec)}) -> {plan.artifacts}")
    t0 = time.monotonic()
    # made at the final path's name inside the container so any path a file records is the one used later
    proc = _in_image(client, plan.image, "python3", "-m", "trainbox.runtime.trialkit", f"{plan.artifacts}/spec.json",
                     str(plan.artifacts), mounts=[mount_arg(str(tmp), str(plan.artifacts), False)])
    if proc.returncode != 0:
        err = proc.stderr.decode(errors="replace").strip().splitlines()
        shutil.rmtree(tmp, ignore_errors=True)
        raise TrainboxError(f"trial {plan.recipe}: making its artifacts in {plan.image} failed: "
                            f"{(err or ['exit %d' % proc.returncode])[-1]}")
    if plan.artifacts.exists():  # another trial made them meanwhile
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        os.replace(tmp, plan.artifacts)
    say(f"artifacts made in {time.monotonic() - t0:.1f}s")
    return True


def _stream(proc: subprocess.Popen, log: Path, echo, verbose: bool, sink: list[str]) -> None:
    with open(log, "a", encoding="utf-8", errors="replace") as fh:
        for line in proc.stdout:
            fh.write(line)
            sink.append(line)
            if verbose or "[trainbox trial]" in line:
                echo(line.rstrip("\n"))


def run_job(plan: TrialPlan, docker: str, say, verbose: bool = False) -> tuple[int, str, bool, float]:
    """Start the container, stream its output to the run's log (monitor lines to the terminal); (rc, output,
    timed out, wall seconds)."""
    log = plan.run_dir / "job.log"
    lines: list[str] = []
    t0 = time.monotonic()
    proc = subprocess.Popen(plan.argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            errors="replace", stdin=subprocess.DEVNULL)
    pump = threading.Thread(target=_stream, args=(proc, log, say, verbose, lines), daemon=True)
    pump.start()
    timed_out = False
    try:
        proc.wait(timeout=plan.overlay.timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        subprocess.run([docker, "kill", plan.container], capture_output=True, timeout=60)
        proc.wait(timeout=60)
    except BaseException:
        subprocess.run([docker, "kill", plan.container], capture_output=True, timeout=60)
        raise
    pump.join(timeout=30)
    return proc.returncode, "".join(lines), timed_out, time.monotonic() - t0


def verify(plan: TrialPlan, client: Client) -> list[dict]:
    """The overlay's checks after a pass, in the image, with the run's directory and artifacts mounted."""
    rows = []
    values = _values(plan.job)
    for v in plan.overlay.verify:
        code = refs(expand_tree(v.python, values), plan.made, str(plan.run_dir))
        mounts = [mount_arg(str(plan.run_dir), str(plan.run_dir), True)]
        if plan.made:
            mounts.append(mount_arg(str(plan.artifacts), str(plan.artifacts), True))
        env = {k: values[k] for k in plan.job.recipe.env if k in values}
        proc = _in_image(client, plan.image, "python3", "-c", code, mounts=mounts, env=env, timeout=300)
        err = proc.stderr.decode(errors="replace").strip().splitlines()
        out = proc.stdout.decode(errors="replace").strip().splitlines()
        # a failure names its exit status: a check killed by a signal (or Ctrl-C) leaves no error line, only
        # whatever it printed last (a progress bar)
        rows.append({"name": v.name, "ok": proc.returncode == 0,
                     "message": (out[-1:] or [""])[0] if proc.returncode == 0
                     else f"exit {proc.returncode}: " + (err[-1:] or ["(nothing on stderr)"])[0]})
    return rows


def peak_mb(mon: dict) -> float | None:
    """The job container's memory high-water mark, as the monitor last read it (steps, exits, exceptions)."""
    recs = [s for rows in mon["steps"].values() for s in rows] + mon["errors"] + mon.get("exits", [])
    peaks = [r.get("cgroup_peak_mb") for r in recs if r.get("cgroup_peak_mb")]
    return round(max(peaks), 1) if peaks else None


#: trial run directories kept per recipe (each holds the job's log, the monitor's records, the job's output)
KEEP_RUNS = 10


def prune_runs(recipe: str, keep: int = KEEP_RUNS) -> None:
    import re

    mine = re.compile(re.escape(recipe) + r"-\d{8}T\d{6}-\d+")
    runs = sorted((p for p in (trial_root() / "runs").glob(f"{recipe}-*") if p.is_dir() and mine.fullmatch(p.name)),
                  key=lambda p: p.stat().st_mtime)
    for old in runs[:-keep] if keep > 0 else runs:
        shutil.rmtree(old, ignore_errors=True)


def run_trial(plan: TrialPlan, say, verbose: bool = False) -> dict:
    from ..image.engine import find_client

    client = find_client()
    if not client.image_exists(plan.image):
        raise TrainboxError(f"image {plan.image} is not present: build it with `trainbox image build "
                            f"{plan.job.stack.name}` (on a substitute base where its own cannot be had), or name one "
                            "with --image")
    t0 = time.monotonic()
    made_now = make_artifacts(plan, client, say)
    edits = copy_code(plan, client, say)
    plan.argv = docker_argv(plan, site_dir(client, plan.image), client.docker)
    for d in plan.job.create:
        os.makedirs(d, exist_ok=True)
    say(f"trial {plan.recipe}: {plan.image} in {plan.mode} mode, {plan.overlay.ranks} rank(s), "
        f"recipe {plan.recipe_file}")
    try:
        rc, output, timed_out, wall = run_job(plan, client.docker, say, verbose)
    finally:
        if plan.port_claim is not None:
            plan.port_claim.release()
    prune_runs(plan.recipe)
    mon = read_monitor(plan.run_dir / "monitor")
    res = judge(mon, rc, plan.overlay.steps, output, timed_out)
    if res["result"] == "passed" and plan.overlay.verify:
        res["verify"] = verify(plan, client)
        bad = [v for v in res["verify"] if not v["ok"]]
        if bad:
            res["result"] = "stopped"
            res["line"] = f"stopped after {len(res['steps'])} steps: verify {bad[0]['name']!r} failed: {bad[0]['message']}"
    return {"schema": SCHEMA, "recipe": plan.recipe, "image": plan.image, "image_note": plan.image_note,
            "mode": plan.mode, "ranks": plan.overlay.ranks, "want_steps": plan.overlay.steps,
            "overlay": plan.overlay.model_dump(), "recipe_file": str(plan.recipe_file),
            "run_dir": str(plan.run_dir), "log": str(plan.run_dir / "job.log"), "artifacts": str(plan.artifacts),
            "artifacts_made_now": made_now, "code_edits": edits, "job_wall_s": round(wall, 1),
            "wall_s": round(time.monotonic() - t0, 1), "peak_mem_mb": peak_mb(mon), **res,
            "ok": res["result"] == "passed", "argv": plan.argv}


__all__ = ["SCHEMA", "TrialPlan", "docker_argv", "make_artifacts", "plan_trial", "run_trial", "trial_recipes"]
