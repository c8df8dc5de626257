"""The launcher script (bash) a job runs inside its image: rendered from launchers/templates/job.sh.j2.

Every target runs this script: `docker run` mounts it (trainbox.launch.docker), the sbatch script hands it to
each node's container (.slurm), a pod carries it in its args (.k8s). TRAINBOX_SCHEDULER tells it whose
variables say which node it is (Slurm's, an operator's, Volcano's); it maps them to NODE_RANK / MASTER_ADDR.
"""

from __future__ import annotations

import functools
import json
import shlex
import subprocess
from pathlib import Path

import jinja2

from .. import __version__
from ..paths import LAUNCHERS_DIR, REPO_ROOT
from .ports import RAY_WORKER_PORTS
from .recipe import (
    VISIBLE_DEVICES_VARS,
    Input,
    Recipe,
    all_inputs,
    parse_words,
    refs,
    sh_quote,
    shell_identifier,
    shell_word,
)
from ..image.toolkits import TOOLKITS, cann
from ..runtime.errors import TrainboxError
from ..templating import make_env
from .recipecheck import entry_words
from .job import HOST_CONTROL_PATHS, Job, StackInfo, Values, split_sets

TEMPLATES_DIR = LAUNCHERS_DIR / "templates"
# Ray rewrites the visible-devices variable per actor unless told not to (older Ray reads the second name).
NOSET_VARS = {d: tuple(t.launch_env()) for d, t in TOOLKITS.items() if t.launch_env()}
ALLOC_VARS = ("PYTORCH_NPU_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
# What the host (or cluster) must provide, by device type: said at the top of every script.
HOST_NEEDS = {**{d: t.HOST_NEEDS for d, t in TOOLKITS.items()}, "cpu": "nothing beyond the image"}


def _comment(text: str) -> str:
    return "\n".join(("# " + line).rstrip() for line in text.splitlines())


def oneline(text: str) -> str:
    return " ".join(str(text).split())


def quote(value) -> str:
    return sh_quote(value)


def jinja() -> jinja2.Environment:
    return _jinja_for(str(TEMPLATES_DIR))


@functools.lru_cache(maxsize=4)
def _jinja_for(templates_dir: str) -> jinja2.Environment:
    # one environment per directory: each template compiled once per process (auto_reload sees edits)
    # bash's ${#array[@]} would open a Jinja comment
    # ident: a variable name (stack env keys) is refused unless it is one
    return make_env(templates_dir, {"q": quote, "comment": _comment, "oneline": oneline, "ident": shell_identifier,
                                    "tojson": lambda v: json.dumps(v)},
                    comment_start_string="{##", comment_end_string="##}")


def render_template(name: str, **ctx) -> str:
    try:
        return jinja().get_template(name).render(**ctx)
    except jinja2.TemplateError as exc:
        where = f"{getattr(exc, 'filename', None) or name}:{getattr(exc, 'lineno', '?')}"
        raise TrainboxError(f"{TEMPLATES_DIR}/{where}: template error: {exc}") from None


def unit(device: str) -> str:
    return {"npu": "NPU(s)", "cuda": "GPU(s)", "cpu": "process(es)"}[device]


def rel(path: Path | None) -> str:
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


def _hccl(chip: str | None) -> dict:
    # The same rule trainbox.runtime.dist applies, so a job's script and its processes agree: on Atlas A2
    # (910b) the socket port ranges break MC2 fused operators, so the job gets an HCCL_IF_BASE_PORT block.
    npu = cann.facts
    return {"if_base": (chip or "").lower() in npu.HCCL_SOCKET_RANGE_CHIPS_EXCLUDED, "chip": chip or "",
            "if_base_port": npu.HCCL_IF_BASE, "if_base_width": npu.HCCL_IF_BASE_WIDTH,
            "host": npu.HCCL_HOST_BASE, "npu": npu.HCCL_NPU_BASE, "width": npu.HCCL_WIDTH,
            "slots": npu.HCCL_SLOTS}


def _ray_resources(device: str, n: int) -> str:
    if device == "npu":
        return "--resources " + shlex.quote(json.dumps({"NPU": n}))
    if device == "cuda":
        return f"--num-gpus {n}"
    return f"--num-cpus {n}"


def _input_rows(recipe: Recipe, inputs: dict[str, Input], vals: Values) -> list[dict]:
    order = list(recipe.inputs) + [k for k in inputs if k not in recipe.inputs]
    rows = []
    for name in order:
        spec: Input = inputs[name]
        kind = spec.kind + (f", mounted {spec.mount}" if spec.mount else "")
        rows.append({
            "name": name, "kind": spec.kind, "mount": spec.mount, "create": spec.create,
            "required": spec.required, "description": spec.description,
            "baked": name in vals.inputs, "value": vals.inputs.get(name, ""),
            "default": spec.default or "",
            "help": f"{name} ({kind}): {oneline(spec.description)}",
        })
    return rows


def _env_rows(recipe: Recipe, stack: StackInfo, vals: Values, words_used: list[str]):
    """(stack defaults, recipe env). A recipe value that extends its own key (PYTHONPATH: ...:${PYTHONPATH:-})
    always applies; any other recipe value is a default the caller's environment overrides (a value equal to
    the stack's default is the image's ENV, not the caller's: the recipe's value replaces it); --set wins."""
    recipe_env = []
    for key, value in recipe.env.items():
        if key in vals.env:
            recipe_env.append({"key": key, "word": sh_quote(vals.env[key]), "force": True})
        else:
            recipe_env.append({"key": key, "word": shell_word(value),
                               "force": any(name == key for name, _ in refs(value)),
                               "stack_default": stack.env.get(key) if stack.env.get(key) != value else None})
            words_used.append(value)
    stack_env = []
    for key, value in stack.env.items():
        if key in recipe.env:
            continue
        if key in vals.env:
            recipe_env.append({"key": key, "word": sh_quote(vals.env[key]), "force": True})
        else:
            stack_env.append((key, value))
    return stack_env, recipe_env


def _layout_line(recipe: Recipe, layout: dict[str, int]) -> str:
    p = recipe.parallel
    return (f"tp={p.tp} pp={p.pp} cp={p.cp} ep={p.ep} dp={layout['DP']}"
            + (f", train devices {layout['TRAIN_DEVICES']}, rollout devices {layout['ROLLOUT_DEVICES']}"
               if p.train_devices or p.rollout_devices_per_engine else "")
            + (f" ({p.rollout_devices_per_engine} per rollout engine)" if p.rollout_devices_per_engine else ""))


def _header(recipe: Recipe, stack: StackInfo, in_rows: list[dict], layout: dict[str, int]) -> str:
    return "\n".join([
        f"{recipe.name}: {oneline(recipe.description)}",
        "",
        f"GENERATED by trainbox {__version__} from {rel(recipe.source_file)}: edit the recipe, not this file,",
        f"and render it again with `trainbox launch render {recipe.name} --set NAME=VALUE ...`.",
        f"Stack {stack.name} ({stack.device}); launcher {recipe.launcher}; {recipe.nodes} node(s) x "
        f"{recipe.devices_per_node} {unit(stack.device)}; layout {_layout_line(recipe, layout)}.",
        f"The host must provide: {HOST_NEEDS[stack.device]}; the image of stack {stack.name}.",
        *(f"Upstream: {oneline(u)}" for u in recipe.upstream),
        "",
        "Inputs (fixed here with --set at render time, or taken from the environment when the script runs):",
        *(f"  {r['help']}" + (f" [default: {r['default']}]" if r["default"] else "")
          + ("" if r["required"] or r["default"] else " [optional]") for r in in_rows),
        "Environment: the caller's values win over the stack's and the recipe's defaults (--set values are fixed).",
        "",
        "Run:" if recipe.nodes == 1 else "Run the same script on every node:",
        *(f"  {c}" for c in node_commands(recipe)),
    ])


def render_script(recipe: Recipe, stack: StackInfo, sets: dict[str, str] | None = None) -> str:
    """The launcher script for `recipe`; `sets` fixes inputs (and overrides env keys) at render time.
    A resolved job renders with `job_script`, which reuses what the job computed."""
    inputs = all_inputs(recipe)
    return _render(recipe, stack, split_sets(recipe, stack, sets or {}, inputs), inputs)


def job_script(job: Job) -> str:
    """The launcher script of a resolved job (its inputs and values as `resolve` computed them)."""
    return _render(job.recipe, job.stack, job.values, job.inputs)


def _render(recipe: Recipe, stack: StackInfo, vals: Values, inputs: dict[str, Input]) -> str:
    layout = recipe.layout()
    in_rows = _input_rows(recipe, inputs, vals)
    words_used: list[str] = []
    sources = []
    for src in recipe.source:
        sources.append({"path": shell_word(src.path), "optional": src.optional, "arrays": src.arrays})
        words_used.append(src.path)
    stack_env, recipe_env = _env_rows(recipe, stack, vals, words_used)
    command = []
    for item in recipe.command:
        words = parse_words(item)
        words_used += words
        command.append(" ".join(shell_word(w) for w in words))
    if recipe.workdir:
        words_used.append(recipe.workdir)
    entry = entry_words(recipe)
    referenced = {name for w in words_used for name, _ in refs(w)}
    runtime_env_vars = sorted(
        set(stack.env) | set(recipe.env) | set(recipe.ray.runtime_env_vars) | set(NOSET_VARS.get(stack.device, ()))
        | set(ALLOC_VARS))
    return render_template(
        "job.sh.j2", recipe=recipe, device=stack.device, header=_header(recipe, stack, in_rows, layout),
        inputs=in_rows, layout=layout, sources=sources, stack_env=stack_env, recipe_env=recipe_env,
        layout_used=[(k, v) for k, v in layout.items() if k in referenced and k not in ("NNODES", "NPROC_PER_NODE")],
        visible_var=VISIBLE_DEVICES_VARS.get(stack.device),
        default_visible=",".join(str(i) for i in range(recipe.devices_per_node)),
        hccl=_hccl(stack.chip), preflight=recipe.preflight,
        workdir=shell_word(recipe.workdir) if recipe.workdir else "",
        entry_check=" ".join(shell_word(w) for w in entry) if entry else "", stack_name=stack.name,
        command=command, ray_resources=_ray_resources(stack.device, recipe.devices_per_node),
        ray_worker_ports=RAY_WORKER_PORTS,
        runtime_env_vars=runtime_env_vars, control_paths=HOST_CONTROL_PATHS)


def check_script(script: str, shellcheck: str | None, shell: str = "bash") -> list[str]:
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
            r = subprocess.run([shellcheck, f"--shell={shell}", "--format=gcc", fh.name], capture_output=True,
                               text=True)
            if r.returncode:
                problems += ["shellcheck: " + line.replace(fh.name + ":", "line ", 1)
                             for line in r.stdout.splitlines()]
    return problems
