"""Recipes -> launcher scripts and `docker run` argv (host module).

`render_script` turns a recipe (launchers/recipes/*.yaml) and the user's `--set NAME=VALUE` values into a
self-contained bash script (templates in launchers/templates/). `docker_argv` builds the `docker run` that
runs that script in the stack's image with the right devices, driver mounts, volumes and environment;
`run` executes it, streaming the logs, and returns the job's exit code.

How the script reaches the container: it is written on the host to $TRAINBOX_CACHE/jobs/ (default
~/.cache/trainbox/jobs/) under a name that hashes its content, bind-mounted read-only at
/opt/trainbox/job.sh, and the container's command is `bash /opt/trainbox/job.sh` (after the image's
entrypoint). Path inputs with `mount:` are bind-mounted at the same path as on the host, so a path means
the same thing inside and outside the container.

Device numbering: inside a container that was given /dev/davinci4..7 (or `--gpus device=4,5,6,7`), the
runtime numbers the cards 0..3 (Ascend documents container logical ids; NVIDIA renumbers), so the
visible-devices variable is set to 0..n-1 and the host's card numbers travel as TRAINBOX_DEVICES.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import jinja2

from . import __version__, grammar
from .runtime import npu
from .runtime.errors import TrainboxError
from .paths import CACHE_DIR, LAUNCHERS_DIR, REPO_ROOT
from .recipe import (
    VISIBLE_DEVICES_VARS,
    Input,
    Recipe,
    all_inputs,
    check_value,
    load_recipe,
    parse_words,
    refs,
    sh_quote,
    shell_identifier,
    shell_word,
)

TEMPLATES_DIR = LAUNCHERS_DIR / "templates"
JOB_SCRIPT_IN_IMAGE = "/opt/trainbox/job.sh"

# docker run pieces (see DESIGN.md, "Domain facts")
# the doctor checks for exactly these, so both come from one list
NPU_CONTROL_DEVICES = npu.NPU_DEVICE_NODES
NPU_DRIVER_MOUNTS = tuple(npu.NPU_DRIVER_MOUNTS)
# memlock: HCCL / NCCL and RDMA pin host memory. CPU jobs pin nothing and get only the stack limit: some
# hosts (unprivileged CI sandboxes) cannot raise memlock at all, and docker then refuses to start.
ULIMITS = {"npu": ("memlock=-1", "stack=67108864"), "cuda": ("memlock=-1", "stack=67108864"),
           "cpu": ("stack=67108864",)}
CPU_SHM_SIZE = "8g"  # CPU jobs keep a private IPC namespace; accelerator jobs use --ipc host
# Ray rewrites the visible-devices variable per actor unless told not to (older Ray reads the second name).
NOSET_VARS = {"npu": npu.NPU_NOSET}
ALLOC_VARS = ("PYTORCH_NPU_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
# Host paths a bind mount must not cover inside the container.
_PROTECTED_TARGETS = {"/", "/bin", "/boot", "/dev", "/etc", "/lib", "/lib64", "/opt", "/proc", "/root", "/run",
                      "/sbin", "/sys", "/tmp", "/usr", "/var", "/usr/local", "/opt/trainbox"}


@dataclass
class StackInfo:
    name: str
    device: str
    env: dict[str, str] = field(default_factory=dict)


def load_stack_info(name: str) -> StackInfo:
    from .stack import load_stack

    stack = load_stack(name)
    return StackInfo(stack.name, stack.device, dict(stack.env))


# ---------------------------------------------------------------------------------------------------------
# --set values

def parse_sets(items: list[str] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise TrainboxError(f"--set {item!r}: expected NAME=VALUE, e.g. --set MODEL_DIR=/data/Qwen3-4B")
        out[key] = value
    return out


@dataclass
class Values:
    inputs: dict[str, str]  # inputs given with --set
    env: dict[str, str]  # env keys overridden with --set (literal values)


def split_sets(recipe: Recipe, stack: StackInfo, sets: dict[str, str]) -> Values:
    inputs = all_inputs(recipe)
    vals = Values({}, {})
    for key, value in sets.items():
        if key in inputs:
            problem = check_value(inputs[key].kind, value)
            if problem:
                raise TrainboxError(f"--set {key}: {problem} (recipe {recipe.name}: {inputs[key].description})")
            vals.inputs[key] = value
        elif key in recipe.env or key in stack.env:
            vals.env[key] = value
        else:
            raise TrainboxError(
                f"--set {key}: recipe {recipe.name} has no input or environment variable {key!r} "
                f"(inputs: {', '.join(inputs)}; environment: {', '.join(sorted({**stack.env, **recipe.env}))}; "
                f"`trainbox launch show {recipe.name}` describes them)")
    return vals


# ---------------------------------------------------------------------------------------------------------
# rendering

def _comment(text: str) -> str:
    return "\n".join(("# " + line).rstrip() for line in text.splitlines())


def _oneline(text: str) -> str:
    return " ".join(str(text).split())


def _jinja() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES_DIR)),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        # bash's ${#array[@]} would open a Jinja comment
        comment_start_string="{##",
        comment_end_string="##}",
    )
    env.filters["q"] = sh_quote
    env.filters["comment"] = _comment
    env.filters["oneline"] = _oneline
    env.filters["ident"] = shell_identifier  # a variable name (stack env keys): refused unless one
    return env


def _unit(device: str) -> str:
    return {"npu": "NPU(s)", "cuda": "GPU(s)", "cpu": "process(es)"}[device]


def _rel(path: Path | None) -> str:
    if path is None:
        return "(recipe)"
    try:
        return str(path.resolve().relative_to(REPO_ROOT.resolve()))
    except ValueError:
        return str(path)


def node_commands(recipe: Recipe, script: str = "job.sh") -> list[str]:
    """How to start the rendered script on each node (printed in the header and by `render`)."""
    if recipe.nodes == 1:
        return [f"bash {script}"]
    roles = {"ray": ("starts the Ray head and submits the job", "joins the Ray head"),
             "torchrun": ("rendezvous master (MASTER_ADDR must be this node)", "joins the rendezvous"),
             "exec": ("master (MASTER_ADDR must be this node)", "worker")}[recipe.launcher]
    return [f"NODE_RANK={r} bash {script}    # node {r}: {roles[0] if r == 0 else roles[1]}"
            for r in range(recipe.nodes)]


def _hccl() -> dict[str, int]:
    # The same rule trainbox.runtime.dist applies, so a job's script and its processes agree.
    return {"host": npu.HCCL_HOST_BASE, "npu": npu.HCCL_NPU_BASE, "width": npu.HCCL_WIDTH,
            "slots": npu.HCCL_SLOTS}


def _ray_resources(device: str, n: int) -> str:
    if device == "npu":
        return "--resources " + shlex.quote(json.dumps({"NPU": n}))
    if device == "cuda":
        return f"--num-gpus {n}"
    return f"--num-cpus {n}"


def render_script(recipe: Recipe, stack: StackInfo, sets: dict[str, str] | None = None) -> str:
    """The launcher script for `recipe`; `sets` fixes inputs (and overrides env keys) at render time."""
    vals = split_sets(recipe, stack, sets or {})
    inputs = all_inputs(recipe)
    order = list(recipe.inputs) + [k for k in inputs if k not in recipe.inputs]
    layout = recipe.layout()

    in_rows = []
    for name in order:
        spec: Input = inputs[name]
        kind = spec.kind + (f", mounted {spec.mount}" if spec.mount else "")
        in_rows.append({
            "name": name, "kind": spec.kind, "mount": spec.mount, "create": spec.create,
            "required": spec.required, "description": spec.description,
            "baked": name in vals.inputs, "value": vals.inputs.get(name, ""),
            "default": spec.default or "",
            "help": f"{name} ({kind}): {_oneline(spec.description)}",
        })

    words_used: list[str] = []
    sources = []
    for src in recipe.source:
        sources.append({"path": shell_word(src.path), "optional": src.optional, "arrays": src.arrays})
        words_used.append(src.path)

    recipe_env = []
    for key, value in recipe.env.items():
        if key in vals.env:
            recipe_env.append((key, sh_quote(vals.env[key])))
        else:
            recipe_env.append((key, shell_word(value)))
            words_used.append(value)
    stack_env = []
    for key, value in stack.env.items():
        if key in recipe.env:
            continue
        if key in vals.env:
            recipe_env.append((key, sh_quote(vals.env[key])))
        else:
            stack_env.append((key, value))

    command = []
    for item in recipe.command:
        words = parse_words(item)
        words_used += words
        command.append(" ".join(shell_word(w) for w in words))
    if recipe.workdir:
        words_used.append(recipe.workdir)

    referenced = {name for w in words_used for name, _ in refs(w)}
    layout_used = [(k, v) for k, v in layout.items()
                   if k in referenced and k not in ("NNODES", "NPROC_PER_NODE")]

    visible_var = VISIBLE_DEVICES_VARS.get(stack.device)
    runtime_env_vars = sorted(
        set(stack.env) | set(recipe.env) | set(recipe.ray.runtime_env_vars) | set(NOSET_VARS.get(stack.device, ()))
        | set(ALLOC_VARS))

    p = recipe.parallel
    layout_line = (f"tp={p.tp} pp={p.pp} cp={p.cp} ep={p.ep} dp={layout['DP']}"
                   + (f", train devices {layout['TRAIN_DEVICES']}, rollout devices {layout['ROLLOUT_DEVICES']}"
                      if p.train_devices or p.rollout_devices_per_engine else "")
                   + (f" ({p.rollout_devices_per_engine} per rollout engine)" if p.rollout_devices_per_engine else ""))
    header = "\n".join([
        f"{recipe.name}: {_oneline(recipe.description)}",
        "",
        f"GENERATED by trainbox {__version__} from {_rel(recipe.source_file)}: edit the recipe, not this file,",
        f"and render it again with `trainbox launch render {recipe.name} --set NAME=VALUE ...`.",
        f"Stack {stack.name} ({stack.device}); launcher {recipe.launcher}; {recipe.nodes} node(s) x "
        f"{recipe.devices_per_node} {_unit(stack.device)}; layout {layout_line}.",
        *(f"Upstream: {_oneline(u)}" for u in recipe.upstream),
        "",
        "Inputs (fixed here with --set at render time, or taken from the environment when the script runs):",
        *(f"  {r['help']}" + (f" [default: {r['default']}]" if r["default"] else "")
          + ("" if r["required"] or r["default"] else " [optional]") for r in in_rows),
        "",
        "Run:" if recipe.nodes == 1 else "Run the same script on every node:",
        *(f"  {c}" for c in node_commands(recipe)),
    ])

    ctx = {
        "recipe": recipe, "device": stack.device, "header": header, "inputs": in_rows, "layout": layout,
        "layout_used": layout_used, "sources": sources, "stack_env": stack_env, "recipe_env": recipe_env,
        "visible_var": visible_var, "default_visible": ",".join(str(i) for i in range(recipe.devices_per_node)),
        "hccl": _hccl(), "preflight": recipe.preflight,
        "workdir": shell_word(recipe.workdir) if recipe.workdir else "",
        "command": command, "ray_resources": _ray_resources(stack.device, recipe.devices_per_node),
        "runtime_env_vars": runtime_env_vars,
    }
    try:
        return _jinja().get_template("job.sh.j2").render(**ctx)
    except jinja2.TemplateError as exc:
        where = f"{getattr(exc, 'filename', None) or 'job.sh.j2'}:{getattr(exc, 'lineno', '?')}"
        raise TrainboxError(f"{TEMPLATES_DIR}/{where}: template error: {exc}") from None


def render(recipe_name: str, sets: dict[str, str] | None = None, stack_name: str | None = None,
           nodes: int | None = None) -> tuple[Recipe, StackInfo, str]:
    recipe = load_recipe(recipe_name, nodes=nodes)
    stack = load_stack_info(stack_name or recipe.stack)
    _check_stack(recipe, stack, stack_name)
    return recipe, stack, render_script(recipe, stack, sets)


def _check_stack(recipe: Recipe, stack: StackInfo, override: str | None) -> None:
    if override and override != recipe.stack:
        wanted = load_stack_info(recipe.stack).device
        if wanted != stack.device:
            raise TrainboxError(f"--stack {override}: a {stack.device} stack, but recipe {recipe.name} is written "
                                f"for {recipe.stack} ({wanted})")


def check_script(script: str, shellcheck: str | None) -> list[str]:
    """Problems `bash -n` and shellcheck find in a rendered script (shellcheck skipped when None)."""
    import tempfile

    problems = []
    with tempfile.NamedTemporaryFile("w", suffix=".sh", prefix="trainbox-check-") as fh:
        fh.write(script)
        fh.flush()
        r = subprocess.run(["bash", "-n", fh.name], capture_output=True, text=True)
        if r.returncode:
            problems.append("bash -n: " + r.stderr.strip())
        if shellcheck:
            r = subprocess.run([shellcheck, "--shell=bash", "--format=gcc", fh.name], capture_output=True, text=True)
            if r.returncode:
                problems += ["shellcheck: " + line.replace(fh.name + ":", "line ", 1)
                             for line in r.stdout.splitlines()]
    return problems


# ---------------------------------------------------------------------------------------------------------
# docker run

def parse_devices(spec: str) -> list[int]:
    """'0-3' / '0,2,4-5' -> sorted card numbers (bounded and checked by trainbox.grammar)."""
    try:
        return grammar.parse_devices(spec)
    except ValueError as exc:
        raise TrainboxError(str(exc)) from None


def csv_field(text: str) -> str:
    """One field of docker's --mount value (a CSV record): quoted when it holds a comma, quote or newline."""
    if any(c in text for c in ',"\n\r') or text != text.strip():
        return '"' + text.replace('"', '""') + '"'
    return text


def mount_arg(source: str, target: str, readonly: bool) -> str:
    fields = ["type=bind", f"source={source}", f"target={target}"] + (["readonly"] if readonly else [])
    return ",".join(csv_field(f) for f in fields)


@dataclass
class RunPlan:
    recipe: Recipe
    stack: StackInfo
    image: str
    script: str
    script_path: Path
    argv_per_node: list[list[str]]
    host_dirs_to_create: list[str]
    notes: list[str]


def jobs_dir() -> Path:
    env = os.environ.get("TRAINBOX_CACHE")
    return (Path(env) if env else CACHE_DIR) / "jobs"


def write_job_script(recipe: Recipe, script: str) -> Path:
    digest = hashlib.sha256(script.encode()).hexdigest()[:12]
    d = jobs_dir()
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"{recipe.name}-{digest}.sh"
    if not path.exists() or path.read_text() != script:
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(script)
        tmp.chmod(0o644)
        tmp.replace(path)
    return path


def default_image(stack: str, docker: str | None = None) -> str:
    """trainbox/<stack>:latest when it exists, else the newest trainbox/<stack>:* image, else the :latest name."""
    latest = f"trainbox/{stack}:latest"
    exe = docker or _docker_exe(required=False)
    if not exe:
        return latest
    try:
        out = subprocess.run([exe, "images", f"trainbox/{stack}", "--format", "{{.Repository}}:{{.Tag}}"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return latest
    tags = [t for t in out.stdout.split() if not t.endswith(":<none>")] if out.returncode == 0 else []
    if latest in tags or not tags:
        return latest
    return tags[0]  # `docker images` lists the newest first


def _docker_exe(required: bool = True) -> str | None:
    """TRAINBOX_DOCKER, else `docker` from PATH (kept as the bare name, so a printed command pastes anywhere)."""
    exe = os.environ.get("TRAINBOX_DOCKER") or ("docker" if shutil.which("docker") else None)
    if not exe and required:
        raise TrainboxError("docker: command not found (install Docker, or point TRAINBOX_DOCKER at the client)")
    return exe


def plan_run(recipe_name: str, *, sets: dict[str, str] | None = None, image: str | None = None,
             devices: str | None = None, stack_name: str | None = None, shm_size: str | None = None,
             labels: list[str] | None = None, name: str | None = None, docker: str | None = None,
             dry_run: bool = False, nodes: int | None = None) -> RunPlan:
    recipe = load_recipe(recipe_name, nodes=nodes)
    stack = load_stack_info(stack_name or recipe.stack)
    _check_stack(recipe, stack, stack_name)
    sets = dict(sets or {})
    inputs = all_inputs(recipe)
    notes: list[str] = []

    # The container sees only what --set gives: check required inputs now, before anything starts.
    vals = split_sets(recipe, stack, sets)
    missing = [n for n, spec in inputs.items() if spec.required and not vals.inputs.get(n) and n != "NODE_RANK"]
    if missing:
        lines = "\n".join(f"  --set {n}=...   {inputs[n].kind}: {_oneline(inputs[n].description)}" for n in missing)
        raise TrainboxError(f"recipe {recipe.name} needs these inputs:\n{lines}")
    if "NODE_RANK" in vals.inputs:
        raise TrainboxError("--set NODE_RANK: `trainbox run` sets NODE_RANK per node (use --node-rank)")

    # Path inputs that are mounted: absolute, so the same path works on both sides of the mount.
    mounts: dict[str, bool] = {}  # target -> readonly
    create: list[str] = []
    for n, spec in inputs.items():
        value = vals.inputs.get(n) or (spec.default if n in recipe.inputs else "")
        if spec.kind != "path" or not spec.mount or not value:
            continue
        target = os.path.normpath(os.path.abspath(value))
        if target in _PROTECTED_TARGETS or target.startswith(("/proc/", "/sys/", "/dev/", "/opt/trainbox/")):
            raise TrainboxError(f"--set {n}={value}: refusing to mount over {target} inside the container; "
                                "use a directory of its own")
        sets[n] = target
        readonly = spec.mount == "ro"
        mounts[target] = mounts.get(target, True) and readonly
        if spec.create:
            create.append(target)
        elif not dry_run and not os.path.exists(target):
            raise TrainboxError(f"--set {n}={value}: no such file or directory on this host ({spec.description})")

    script = render_script(recipe, stack, sets)
    script_path = write_job_script(recipe, script)

    device_env: dict[str, str] = {}
    device_args: list[str] = []
    visible_var = VISIBLE_DEVICES_VARS.get(stack.device)
    if stack.device == "cpu":
        if devices is not None:
            raise TrainboxError(f"--devices: recipe {recipe.name} runs on the CPU stack {stack.name}; it has no "
                                f"devices to choose (it starts {recipe.devices_per_node} processes per node)")
    else:
        cards = parse_devices(devices) if devices is not None else list(range(recipe.devices_per_node))
        if len(cards) != recipe.devices_per_node:
            raise TrainboxError(f"--devices {devices}: names {len(cards)} card(s), but recipe {recipe.name} uses "
                                f"{recipe.devices_per_node} per node")
        device_env[visible_var] = ",".join(str(i) for i in range(len(cards)))
        device_env["TRAINBOX_DEVICES"] = ",".join(str(c) for c in cards)
        if stack.device == "npu":
            for c in cards:
                device_args += ["--device", f"/dev/davinci{c}"]
            for d in NPU_CONTROL_DEVICES:
                device_args += ["--device", d]
            for m in NPU_DRIVER_MOUNTS:
                device_args += ["-v", f"{m}:{m}:ro"]
        else:
            device_args += ["--gpus", '"device=' + ",".join(str(c) for c in cards) + '"']

    image = image or default_image(stack.name, docker)
    env: dict[str, str] = dict(stack.env)
    for key, value in recipe.env.items():
        if not refs(value):
            env[key] = value.replace("$$", "$")
    env.update(split_sets(recipe, stack, sets).env)
    env.update(device_env)

    base = ["run", "--rm"]
    if name:
        base += ["--name", name]
    base += ["--label", f"trainbox.recipe={recipe.name}"]
    for lab in labels or []:
        base += ["--label", lab]
    base += ["--network", "host"]
    if shm_size:
        base += ["--shm-size", shm_size]
    elif stack.device == "cpu":
        base += ["--shm-size", CPU_SHM_SIZE]
    else:
        base += ["--ipc", "host"]
    for u in ULIMITS[stack.device]:
        base += ["--ulimit", u]
    base += device_args
    for key in sorted(env):
        base += ["-e", f"{key}={env[key]}"]
    tail = []
    for target in sorted(mounts):
        tail += ["--mount", mount_arg(target, target, mounts[target])]
    tail += ["--mount", mount_arg(str(script_path), JOB_SCRIPT_IN_IMAGE, True)]
    tail += [image, "bash", JOB_SCRIPT_IN_IMAGE]

    exe = docker or _docker_exe(required=not dry_run) or "docker"
    argv_per_node = []
    for rank in range(recipe.nodes):
        node_env = ["-e", f"NODE_RANK={rank}"] if recipe.nodes > 1 else []
        argv_per_node.append([exe, *base, *node_env, *tail])
    if recipe.nodes > 1:
        notes.append(f"recipe {recipe.name} spans {recipe.nodes} nodes: run node r's command on node r "
                     f"(node 0 at MASTER_ADDR); the script is {script_path}, copy it to the same path on every node")
    return RunPlan(recipe, stack, image, script, script_path, argv_per_node, create, notes)


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


def image_exists(docker: str, image: str) -> bool:
    try:
        r = subprocess.run([docker, "image", "inspect", image], capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


def execute(plan: RunPlan, node_rank: int = 0) -> int:
    """Run one node's container in the foreground (logs stream through) and return its exit code."""
    if not 0 <= node_rank < len(plan.argv_per_node):
        raise TrainboxError(f"--node-rank {node_rank}: recipe {plan.recipe.name} has nodes 0-{plan.recipe.nodes - 1}")
    argv = plan.argv_per_node[node_rank]
    if not image_exists(argv[0], plan.image):
        raise TrainboxError(f"image {plan.image} is not present: build it with `trainbox image build "
                            f"{plan.stack.name}`, or name one with --image")
    for d in plan.host_dirs_to_create:
        os.makedirs(d, exist_ok=True)
    print(f"trainbox run {plan.recipe.name}: {plan.image}, script {plan.script_path}", file=sys.stderr)
    proc = subprocess.Popen(argv)
    while True:
        try:
            return proc.wait()
        except KeyboardInterrupt:
            # docker's CLI got the same SIGINT and forwards it to the container; wait for it to stop
            continue
