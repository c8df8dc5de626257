"""`trainbox launch check` as a library: each recipe rendered and linted, its cluster targets' output checked, its
trial overlay validated and (with `args`) its command run through its framework's parser (host module).

`check_recipes` returns a `CheckRun` of one `RecipeCheck` per recipe; the command prints it (text or --json).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

from ..runtime.errors import TrainboxError


@dataclass(frozen=True)
class CheckOptions:
    """What `launch check` checks beyond the recipe's own render: a scaled variant (nodes, nproc_per_node,
    devices), cluster targets, and with `args` the command in the image (`image`, `code`, `stub_missing`, `sets`)."""

    targets: tuple[str, ...] = ()
    nodes: int | None = None
    nproc_per_node: int | None = None
    devices: str | None = None
    args: bool = False
    image: str | None = None
    code: str | None = None
    stub_missing: bool = False
    sets: tuple[str, ...] = ()  # NAME=VALUE as given: a bad one fails that recipe's --args check

    @property
    def scaled(self) -> dict:
        return {"nodes": self.nodes, "nproc_per_node": self.nproc_per_node, "devices": self.devices}


@dataclass
class RecipeCheck:
    """One recipe's result: `status` is ok, fail, or `not checked` (--args could not run its command: never ok)."""

    recipe: str
    problems: list[str]
    args: dict | None = None  # the --args result (trainbox.launch.recipecheck), with its one-line summary
    status: str = "ok"

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def summary(self) -> str:
        return self.args["summary"] if self.args else self.recipe

    def as_dict(self) -> dict:
        out: dict = {"recipe": self.recipe, "ok": self.ok, "problems": self.problems}
        if self.args is not None:
            out["args"] = self.args
        out["status"] = self.status
        return out


@dataclass
class CheckRun:
    shellcheck: bool  # whether shellcheck ran beside `bash -n`
    recipes: list[RecipeCheck]

    @property
    def failed(self) -> int:
        return sum(1 for r in self.recipes if r.status == "fail")

    def as_dict(self) -> dict:
        return {"ok": not self.failed, "shellcheck": self.shellcheck, "recipes": [r.as_dict() for r in self.recipes],
                "not_checked": [r.recipe for r in self.recipes if r.status == "not checked"]}


def check_recipes(names: list[str] | None, opts: CheckOptions, shellcheck: str | None,
                  on_result: Callable[[RecipeCheck], None] | None = None) -> CheckRun:
    """Check each named recipe (None: every recipe); `on_result` sees each result as it is made (--args runs a
    container per recipe: the command says each line as it comes)."""
    from .recipe import list_recipes

    run = CheckRun(bool(shellcheck), [])
    for name in names or list_recipes():
        result = check_recipe(name, opts, shellcheck)
        run.recipes.append(result)
        if on_result:
            on_result(result)
    return run


def check_recipe(name: str, opts: CheckOptions, shellcheck: str | None) -> RecipeCheck:
    from . import check_script, render

    problems = []
    for scale in [{}] + ([opts.scaled] if any(v is not None for v in opts.scaled.values()) else []):
        try:
            _recipe, _stack, script = render(name, {"MASTER_ADDR": "node0"} if (scale.get("nodes") or 1) > 1
                                             else None, **scale)
        except TrainboxError as exc:
            problems.append(str(exc))
            continue
        problems += check_script(script, shellcheck)
    for target in opts.targets:
        problems += check_target(name, target, opts, shellcheck)
    problems += check_trial(name)
    result = RecipeCheck(name, problems)
    if opts.args and not problems:
        result.args = check_args(name, opts)
        if result.args.get("status") != "not checked" and not result.args["ok"]:
            problems.append(result.args["summary"])
    result.status = "fail" if problems else (result.args or {}).get("status", "ok")
    return result


def check_trial(name: str) -> list[str]:
    """The recipe's `trial:` overlay, when it has one, validates against the recipe (`trainbox trial` runs it)."""
    from .recipe import load_recipe
    from .trialplan import overlay_of

    try:
        recipe = load_recipe(name)
        if recipe.trial is not None:
            overlay_of(recipe)
    except TrainboxError as exc:
        return [f"trial: {exc}"]
    return []


def check_args(name: str, opts: CheckOptions) -> dict:
    """The recipe's command through its framework's parser (trainbox.launch.recipecheck)."""
    from .images import choose_image
    from .job import parse_sets, resolve
    from .recipecheck import plan, run_in_image, run_with_code, summary

    try:
        job = resolve(name, sets=parse_sets(list(opts.sets)), require_inputs=False, host_paths=False)
        check = plan(job, os.path.abspath(opts.code) if opts.code else None)
        if opts.code:
            result = run_with_code(check, os.path.abspath(opts.code), opts.image, stub_missing=opts.stub_missing)
        else:
            image = choose_image(job, opts.image, dry_run=True)[0]
            if check.parse or check.imports:  # a recipe with nothing to check in the image needs none
                require_image(image, job.stack, given=bool(opts.image))
            result = run_in_image(check, image)
    except TrainboxError as exc:
        result = {"recipe": name, "ok": False, "status": "fail", "imports": {}, "args": {}, "error": str(exc)}
        result["summary"] = f"{name}: {exc}"
        return result
    result["summary"] = summary(result)
    return result


def require_image(image: str, stack, given: bool) -> None:
    """The checks run in the recipe's image: where the engine lacks it, say which image and the command that
    makes it (a docker run of a missing image would only say "See 'docker run --help'")."""
    from ..image.base import cpu_host_profile, profile_names
    from ..image.engine import find_client
    from ..image.inventory import built_images

    client = find_client()
    if client.image_exists(image):
        return
    if given:
        raise TrainboxError(f"--image {image}: the engine has no such image (`docker pull` it, or build it)")
    # a build with pin overrides (the substitute build of an NPU stack) is tagged by its hash only, not :latest
    other = [t for i in built_images([stack.name], client) for t in i.hash_tags]
    if other:
        raise TrainboxError(f"no image {image} here (stack {stack.name}), but {other[0]} is (built with pin overrides "
                            f"or on a substitute base, so not tagged :latest): pass --image {other[0]}")
    how = f"`trainbox image build {stack.name}`"
    if stack.device == "npu" and profile_names(stack.name):
        how += (f" (on a host without the NPU base: `trainbox image build {stack.name} --profile "
                f"{cpu_host_profile()}`, the substitute build `trainbox smoke` checks recipes in)")
    raise TrainboxError(f"no image {image} here (stack {stack.name}): the imports and arguments are checked inside "
                        f"it; build it with {how}, or pass --image IMAGE")


def check_target(name: str, target: str, opts: CheckOptions, shellcheck: str | None) -> list[str]:
    """One recipe's output for a cluster target, inputs left unset (a lint, not a job): on --nodes/--devices/
    --nproc-per-node as given, else on 2 nodes where the recipe's world size may change (its own where it is
    fixed); NPU manifests on the recipe's `check.accelerator_type` when it names one."""
    import yaml

    from . import check_script
    from .recipe import load_recipe
    from .targets import TARGETS, RenderOptions, render_target, resolve_for

    try:
        recipe = load_recipe(name)
        nodes = opts.nodes or (None if recipe.scaling.world_size == "fixed" else 2)
        job = resolve_for(target, name, nodes=nodes, nproc_per_node=opts.nproc_per_node, devices=opts.devices,
                          image="trainbox/check:1", lint=True)
        options = RenderOptions()
        if TARGETS[target][2] == "yaml":
            from .k8s import applies

            if not applies(job, target):
                return []  # e.g. an AscendJob for a CUDA recipe: not a problem of the recipe
            if job.device == "npu":
                options = RenderOptions(accelerator_type=recipe.check.accelerator_type)
        text = render_target(job, target, options)
    except TrainboxError as exc:
        return [f"{target}: {exc}"]
    if TARGETS[target][2] == "yaml":
        try:
            list(yaml.safe_load_all(text))
        except yaml.YAMLError as exc:
            return [f"{target}: {exc}"]
        return []
    return [f"{target}: {p}" for p in check_script(text, shellcheck)]
