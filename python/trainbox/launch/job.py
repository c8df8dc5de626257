"""The resolved job: a recipe, its stack and the user's values, computed once (host module).

`resolve` computes the recipe's inputs (`all_inputs`), the cards and the ports once and the `Job` carries them:
the targets read them from the job instead of computing them again.

Everything a target needs comes from here: the docker script and argv (trainbox.launch.docker), the sbatch
script (.slurm) and the Kubernetes manifests (.k8s). Precedence of the job's environment, lowest first:
the stack's env, the recipe's env, `--set KEY=VALUE`, then what the launcher owns (visible devices).
In generated scripts the caller's environment wins over the stack's and recipe's defaults.
"""

from __future__ import annotations

import contextlib
import os
import stat
from dataclasses import dataclass, field

from ..specs import grammar
from .recipe import VISIBLE_DEVICES_VARS, Input, Recipe, all_inputs, check_value, load_recipe, refs
from ..runtime.errors import TrainboxError
from .ports import RUN_BASES, STRIDE, run_ports
from ..specs.sets import parse_assignments

# Host paths a bind mount must not cover inside the container.
_PROTECTED_TARGETS = {"/", "/bin", "/boot", "/dev", "/etc", "/lib", "/lib64", "/opt", "/proc", "/root", "/run",
                      "/sbin", "/sys", "/tmp", "/usr", "/var", "/usr/local", "/opt/trainbox"}
# Ports a job owns on a host (their slot-0 values, the recipes' defaults), and how far apart two jobs' ports are:
# trainbox.launch.ports, the one plan for `trainbox run` and Slurm.
PORT_INPUTS = dict(RUN_BASES)
PORT_STRIDE = STRIDE
# What a cluster scheduler tells each node (the sbatch script, the Kubernetes operators).
SCHEDULER_PROVIDES = ("NODE_RANK", "MASTER_ADDR", "MASTER_PORT")


@dataclass
class StackInfo:
    name: str
    device: str
    env: dict[str, str] = field(default_factory=dict)
    cann: str | None = None
    chip: str | None = None


def load_stack_info(name: str) -> StackInfo:
    from ..specs.stack import load_stack

    stack = load_stack(name)
    base = getattr(stack, "base", None)
    return StackInfo(stack.name, stack.device, dict(stack.env), getattr(base, "cann", None),
                     getattr(base, "chip", None))


def parse_sets(items: list[str] | None) -> dict[str, str]:
    return parse_assignments(items, "NAME=VALUE", "MODEL_DIR=/data/Qwen3-4B")


@dataclass
class Values:
    inputs: dict[str, str]  # inputs given with --set
    env: dict[str, str]  # env keys overridden with --set (literal values)


def split_sets(recipe: Recipe, stack: StackInfo, sets: dict[str, str],
               inputs: dict[str, Input] | None = None) -> Values:
    """--set values split into inputs and env keys, checked; `inputs`: the recipe's, when already computed."""
    inputs = all_inputs(recipe) if inputs is None else inputs
    vals = Values({}, {})
    for key, value in sets.items():
        if key in inputs:
            problem = check_value(inputs[key].kind, value)
            if problem:
                raise TrainboxError(f"--set {key}: {problem} (recipe {recipe.name}: {inputs[key].description})")
            vals.inputs[key] = value
        elif key in recipe.env or key in stack.env:
            problem = check_value("string", value)  # a NUL: bash would drop it, the job would get another value
            if problem:
                raise TrainboxError(f"--set {key}: {problem} (recipe {recipe.name}: an environment variable)")
            vals.env[key] = value
        else:
            raise TrainboxError(
                f"--set {key}: recipe {recipe.name} has no input or environment variable {key!r} "
                f"(inputs: {', '.join(inputs)}; environment: {', '.join(sorted({**stack.env, **recipe.env}))}; "
                f"`trainbox launch show {recipe.name}` describes them)")
    return vals


def parse_devices(spec: str) -> list[int]:
    """'0-3' / '0,2,4-5' -> sorted card numbers (bounded and checked by trainbox.specs.grammar)."""
    try:
        return grammar.parse_devices(spec)
    except ValueError as exc:
        raise TrainboxError(str(exc)) from None


@dataclass
class Job:
    """A recipe resolved for one run: what every target renders from."""

    recipe: Recipe
    stack: StackInfo
    sets: dict[str, str]  # --set values as the script bakes them (mounted paths made absolute)
    values: Values
    cards: list[int] | None  # host cards per node (None: CPU)
    env: dict[str, str]  # the container's environment (literal values only)
    mounts: dict[str, bool]  # host path -> read-only, bind-mounted at the same path
    create: list[str]  # host directories to create before the run
    inputs: dict[str, Input]  # all_inputs(recipe), computed once: the targets read it from here
    ports: dict[str, str]  # the recipe's port inputs (MASTER_PORT, RAY_PORT ...) -> their value in this job
    image: str = ""
    image_note: str = ""  # why this image
    image_id: str | None = None  # the local image's id, when the engine here has it
    notes: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.recipe.name

    @property
    def device(self) -> str:
        return self.stack.device

    @property
    def nodes(self) -> int:
        return self.recipe.nodes

    @property
    def per_node(self) -> int:
        return self.recipe.devices_per_node

    @property
    def visible_var(self) -> str | None:
        return VISIBLE_DEVICES_VARS.get(self.stack.device)


def _check_stack(recipe: Recipe, stack: StackInfo, override: str | None) -> None:
    if override and override != recipe.stack:
        wanted = load_stack_info(recipe.stack).device
        if wanted != stack.device:
            raise TrainboxError(f"--stack {override}: a {stack.device} stack, but recipe {recipe.name} is written "
                                f"for {recipe.stack} ({wanted})")


def _cards(recipe: Recipe, stack: StackInfo, devices: str | None) -> list[int] | None:
    if stack.device == "cpu":
        if devices is not None:
            raise TrainboxError(f"--devices: recipe {recipe.name} runs on the CPU stack {stack.name}; it has no "
                                f"devices to choose (--nproc-per-node sets its {recipe.devices_per_node} "
                                "processes per node)")
        return None
    cards = parse_devices(devices) if devices is not None else list(range(recipe.devices_per_node))
    if len(cards) != recipe.devices_per_node:
        raise TrainboxError(f"--devices {devices}: names {len(cards)} card(s), but --nproc-per-node asks for "
                            f"{recipe.devices_per_node} per node (give one of them, or the same count)")
    return cards


def _derive_ports(inputs: dict[str, Input], sets: dict[str, str], cards: list[int] | None) -> dict[str, str]:
    """Two jobs on one host with disjoint cards get disjoint ports: each port input the user did not set
    moves by PORT_STRIDE per slot, the slot being the job's first card (0 for cards 0-3, 4 for 4-7).
    Returns the job's port inputs and their values (set, derived or the default)."""
    slot = min(cards) if cards else 0
    moved = run_ports(slot)
    for name, base in PORT_INPUTS.items():
        if slot and name in inputs and name not in sets and str(inputs[name].default) == str(base):
            sets[name] = str(moved[name])
    return {n: str(sets.get(n, spec.default)) for n, spec in inputs.items()
            if spec.kind == "port" and sets.get(n, spec.default) not in (None, "")}


def _mounts(recipe: Recipe, inputs: dict[str, Input], vals: Values, sets: dict[str, str], check_paths: bool):
    """Path inputs that are mounted: absolute, so the same path works on both sides of the mount."""
    mounts: dict[str, bool] = {}
    create: list[str] = []
    for n, spec in inputs.items():
        value = vals.inputs.get(n) or (spec.default if n in recipe.inputs else "")
        if spec.kind != "path" or not spec.mount or not value:
            continue
        if recipe.code and n == recipe.code.input and n not in vals.inputs:
            continue  # the image's own copy of the workload's source (recipe `code:`): nothing to mount
        target = os.path.normpath(os.path.abspath(value))
        given = _given_as(recipe, vals, n, value)
        control = _host_control(target)
        if control:
            raise TrainboxError(_control_message(given, control))
        if target in _PROTECTED_TARGETS or target.startswith(("/proc/", "/sys/", "/dev/", "/opt/trainbox/")):
            raise TrainboxError(f"{given}: refusing to mount over {target} inside the container; "
                                "use a directory of its own")
        sets[n] = target
        mounts[target] = mounts.get(target, True) and spec.mount == "ro"
        if spec.create:
            create.append(target)
        elif check_paths and not os.path.exists(target):
            raise TrainboxError(f"{given}: no such file or directory on this host ({spec.description})")
    return mounts, create


#: Where a host's engines, runtimes and kernel interfaces keep their sockets and state. A mount of one of them, of
#: a path inside one (/var/run/docker.sock) or of a path that holds one (/var/lib holds /var/lib/docker, / holds
#: all) hands the host over to the job, read-only or not. The job script checks the same list when it runs
#: (launchers/templates/job.sh.j2, `refuse_control_path`), since it may run on another host with other values.
HOST_CONTROL_PATHS = ("/run", "/var/run", "/var/lib/docker", "/var/lib/containerd", "/var/lib/containers",
                      "/var/lib/kubelet", "/etc/docker", "/proc", "/sys", "/dev")


def control_conflict(path: str) -> str | None:
    """Why an absolute `path` (as written, normalized) may not be mounted: it is, is inside or holds a host
    control path; None when it is clear."""
    p = "/" + os.path.normpath(path).lstrip("/")
    for c in HOST_CONTROL_PATHS:
        if p == c:
            return f"{p} is a host control path"
        if p.startswith(c + "/"):
            return f"{p} is inside the host control path {c}"
        if p == "/" or c.startswith(p + "/"):
            return f"{p} holds the host control path {c}"
    return None


def _host_control(target: str) -> str | None:
    """Why `target` (or what it resolves to) is a host control path, a socket, inside one or holds one; else None."""
    for p in dict.fromkeys((target, os.path.realpath(target))):
        why = control_conflict(p)
        if why:
            return why
        with contextlib.suppress(OSError):
            if stat.S_ISSOCK(os.stat(p).st_mode):
                return f"{p} is a socket"
    return None


def _given_as(recipe: Recipe, vals: Values, name: str, value: str) -> str:
    """How the user gave an input's value: `--set NAME=VALUE`, or the recipe's default (no --set to blame)."""
    if name in vals.inputs:
        return f"--set {name}={value}"
    return f"recipe {recipe.name}: input {name} (its default {value}; give --set {name}=DIR to choose another)"


def _refuse_control_inputs(recipe: Recipe, inputs: dict[str, Input], vals: Values) -> None:
    """Mounted path inputs that name a host control path, checked as written for every target (a script rendered
    here may run elsewhere: it checks again when it runs); `_mounts` also resolves links and finds sockets."""
    for n, spec in inputs.items():
        value = vals.inputs.get(n) or (spec.default if n in recipe.inputs else "")
        if spec.kind != "path" or not spec.mount or not value or not str(value).startswith("/"):
            continue
        why = control_conflict(str(value))
        if why:
            raise TrainboxError(_control_message(_given_as(recipe, vals, n, str(value)), why))


def _control_message(given: str, why: str) -> str:
    return (f"{given}: {why}; refusing to mount it (a socket, or a host control path of engine sockets, runtime "
            f"state or kernel interfaces: {', '.join(HOST_CONTROL_PATHS)}, mounted into a job hands over the host, "
            "read-only or not). Use a directory of your own")


def _require_inputs(recipe: Recipe, inputs: dict[str, Input], vals: Values, provided: tuple[str, ...]) -> None:
    missing = [n for n, spec in inputs.items()
               if spec.required and not vals.inputs.get(n) and n != "NODE_RANK" and n not in provided]
    if missing:
        lines = "\n".join(f"  --set {n}=...   {inputs[n].kind}: {' '.join(inputs[n].description.split())}"
                          for n in missing)
        raise TrainboxError(f"recipe {recipe.name} needs these inputs:\n{lines}")
    if "NODE_RANK" in vals.inputs:
        raise TrainboxError("--set NODE_RANK: the launcher sets NODE_RANK per node (`trainbox run`: use "
                            "--node-rank; Slurm and Kubernetes give it to each node)")


def container_env(recipe: Recipe, stack: StackInfo, vals: Values, cards: list[int] | None) -> dict[str, str]:
    """stack env < the recipe's literal env < --set env < the visible-devices variables."""
    env: dict[str, str] = dict(stack.env)
    for key, value in recipe.env.items():
        if not refs(value):
            env[key] = value.replace("$$", "$")
    env.update(vals.env)
    if cards is not None:
        env[VISIBLE_DEVICES_VARS[stack.device]] = ",".join(str(i) for i in range(len(cards)))
        env["TRAINBOX_DEVICES"] = ",".join(str(c) for c in cards)
    return env


def resolve(recipe_name: str, *, sets: dict[str, str] | None = None, stack_name: str | None = None,
            nodes: int | None = None, nproc_per_node: int | None = None, devices: str | None = None,
            check_paths: bool = True, require_inputs: bool = True, host_paths: bool = True,
            provided: tuple[str, ...] = ()) -> Job:
    """The recipe with the user's values, checked once. `require_inputs`: every required input is given
    (a run: the container sees only what --set gives); off for rendering a script that reads them later.
    `host_paths`: mounted path inputs are host paths (made absolute, checked); off for a bare script.
    `provided`: inputs the target's scheduler gives each node (Slurm, an operator: MASTER_ADDR)."""
    recipe = load_recipe(recipe_name, nodes=nodes, nproc_per_node=nproc_per_node)
    stack = load_stack_info(stack_name or recipe.stack)
    if devices is not None and nproc_per_node is None and stack.device != "cpu":
        # --devices 4-7 means 4 processes a node (where the recipe's world size may change)
        count = len(parse_devices(devices))
        if count != recipe.devices_per_node:
            recipe = load_recipe(recipe_name, nodes=nodes, nproc_per_node=count)
    _check_stack(recipe, stack, stack_name)
    inputs = all_inputs(recipe)  # the one computation of the job's inputs: everything below reads this
    sets = dict(sets or {})
    vals = split_sets(recipe, stack, sets, inputs)
    if require_inputs:
        _require_inputs(recipe, inputs, vals, provided)
    cards = _cards(recipe, stack, devices)
    ports = _derive_ports(inputs, sets, cards)
    _refuse_control_inputs(recipe, inputs, vals)
    mounts, create = _mounts(recipe, inputs, vals, sets, check_paths) if host_paths else ({}, [])
    vals = split_sets(recipe, stack, sets, inputs)
    return Job(recipe, stack, sets, vals, cards, container_env(recipe, stack, vals, cards), mounts, create,
               inputs, ports)


__all__ = ["Job", "StackInfo", "Values", "load_stack_info", "parse_devices", "parse_sets", "resolve", "split_sets",
           "container_env"]
