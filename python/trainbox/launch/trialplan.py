"""`trainbox trial`: the recipe's `trial:` overlay and the job it makes (host module).

A trial runs the recipe's own rendered job in its stack's image, changed only by the overlay the recipe declares:
a named, reviewable set of overrides (model size, sequence length, steps, ranks, paths), everything else exactly
as the recipe renders it. The overlay, in the recipe:

    trial:
      why: one line: what the overlay shrinks and why the rest stays
      ranks: 2                       # processes (CPU) or cards per node; the recipe's parallel layout rescales
      steps: 2                       # optimizer steps the trial must see (rank 0) to pass
      stop_after: 2                  # optional: the step monitor ends the job after this many steps, for a
                                     # workload with no step limit of its own (then no checkpoint is written)
      timeout: 900                   # seconds for the job
      artifacts: {tokenizer: {...}, model: {...}, data: {...}, files: {...}}   # trainbox.runtime.trialkit
      set: {TARGET_MODEL_PATH: "@model", NUM_EPOCHS: "1", OUTPUT_DIR: "@run/out"}  # inputs / env keys
      args: {--draft-config-path: "@files.draft_config", --max-length: "256"}   # options already in the command
      env: {SPECFORGE_DATA_NUM_PROC: "1"}     # extra environment of the container
      code:                          # for a workload whose sizes are constants in its script: exact text
        cookbook/x.py: {"MODEL_ID = 'ms://Qwen/Qwen3.5-4B'": "MODEL_ID = '@model'"}   # replacements, each found
                                     # exactly once, in a copy of the image's tree (the recipe's `code:` input)
      remesh: "..."                  # a fixed-world workload (scaling.world_size: fixed) at other `ranks`: how
                                     # the `code` edits re-mesh it for them (without it such ranks are refused)
      verify:                        # after a pass, in the image: e.g. the checkpoint loads again
        - {name: checkpoint loads, python: "..."}

`@model`, `@data`, `@files.NAME` are the artifacts made for the trial (cached by content hash), `@run` the trial's
own fresh directory; `${NAME}` in artifacts and verify are the recipe's inputs (CODE_DIR: the image's tree). An
`args` key must be an option the command already has (the overlay changes values, it adds no code path).
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .recipe import Recipe, RecipeError, load_recipe, merged_yaml, parse_words, recipe_path
from ..runtime.errors import TrainboxError

REF = re.compile(r"@(model|data|run|files\.[A-Za-z0-9_]+)(/[^\s]*)?")
ARTIFACT_KEYS = ("tokenizer", "model", "data", "files")


class Verify(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    python: str


class Overlay(BaseModel):
    model_config = ConfigDict(extra="forbid")
    why: str
    ranks: int = Field(2, ge=1, le=16)
    steps: int = Field(2, ge=1, le=1000)
    stop_after: int | None = Field(None, ge=1)
    timeout: int = Field(900, ge=30, le=7200)
    artifacts: dict = Field(default_factory=dict)
    set: dict[str, str | int] = Field(default_factory=dict)
    args: dict[str, str | int] = Field(default_factory=dict)
    env: dict[str, str | int] = Field(default_factory=dict)
    verify: list[Verify] = Field(default_factory=list)
    code: dict[str, dict[str, str]] = Field(default_factory=dict)
    # a fixed-world workload run at other `ranks`: how the overlay's code edits re-mesh it (said, reviewable)
    remesh: str | None = None

    @field_validator("artifacts")
    @classmethod
    def _artifacts(cls, v: dict) -> dict:
        unknown = [k for k in v if k not in ARTIFACT_KEYS]
        if unknown:
            raise ValueError(f"{unknown[0]!r}: artifacts are {', '.join(ARTIFACT_KEYS)}")
        if "model" in v and "arch" not in (v["model"] or {}):
            raise ValueError("model: needs arch (a transformers model_type such as qwen3 or qwen3_5)")
        return v

    @field_validator("args")
    @classmethod
    def _args(cls, v: dict) -> dict:
        for flag in v:
            if not flag.startswith("-"):
                raise ValueError(f"{flag!r}: expected an option of the command, e.g. --max-length")
        return v


def overlay_of(recipe: Recipe) -> Overlay:
    """The recipe's validated overlay; a recipe without one, or a bad one, is one clear line."""
    raw = recipe.trial
    where = recipe.source_file or recipe.name
    if raw is None:
        raise TrainboxError(f"recipe {recipe.name} declares no trial (a `trial:` overlay in {where}): nothing to "
                            "run; recipes with one: `trainbox trial --list`")
    try:
        ov = Overlay.model_validate(raw)
    except ValidationError as exc:
        from ..specs.documents import format_validation

        raise RecipeError(format_validation(Path(str(where)), exc).replace(": ", ": trial.", 1)) from None
    if ov.code and not recipe.code:
        raise RecipeError(f"{where}: trial.code: the recipe has no `code:` input (the tree whose copy it edits)")
    world_fixed = recipe.scaling.world_size == "fixed"
    if world_fixed and ov.ranks * recipe.nodes != recipe.world_size and not (ov.remesh and ov.code):
        raise RecipeError(f"{where}: trial.ranks: {ov.ranks}, but the workload fixes its world size at "
                          f"{recipe.world_size} ({recipe.scaling.mesh}); run it at that size, or edit its mesh "
                          "with trial.code and say how in trial.remesh")
    words = {w for item in recipe.command for w in parse_words(item)}
    missing = [f for f in ov.args if f not in words]
    if missing:
        raise RecipeError(f"{where}: trial.args: {missing[0]} is not an option of the recipe's command: the overlay "
                          "changes values the command already passes, it adds no code path")
    return ov


def replace_args(command: list, args: dict[str, str]) -> list:
    """The command with the value after each overlay option replaced (items become word lists)."""
    out = []
    for item in command:
        words = parse_words(item)
        for i, w in enumerate(words[:-1]):
            if w in args:
                words[i + 1] = str(args[w])
        out.append(words)
    return out


def overlaid_recipe(name: str, ov: Overlay, dest: Path, args: dict[str, str]) -> Path:
    """The recipe with the overlay applied (`args`: its option values, @references resolved), as a recipe file of
    its own (reviewable: `trial --dry-run` names it)."""
    path = recipe_path(name)
    data = copy.deepcopy(merged_yaml(path))
    data.pop("trial", None)
    data["name"] = path.stem
    data["devices_per_node"] = ov.ranks
    if isinstance(data.get("parallel"), dict):
        data["parallel"].pop("dp", None)
    data["command"] = replace_args(data["command"], args)
    dest.mkdir(parents=True, exist_ok=True)
    out = dest / f"{path.stem}.yaml"
    import yaml

    out.write_text("# trainbox trial: " + name + " with its trial overlay applied (generated)\n"
                   + yaml.safe_dump(data, sort_keys=False, width=120))
    load_recipe(out)  # the overlaid recipe must still be a valid recipe
    return out


def refs(value: str, made: dict[str, str], run_dir: str) -> str:
    """`@model`, `@data`, `@files.NAME`, `@run` (with an optional /suffix) -> paths."""
    def one(m: re.Match) -> str:
        key, suffix = m.group(1), m.group(2) or ""
        base = run_dir if key == "run" else made.get(key)
        if base is None:
            raise TrainboxError(f"trial: {m.group(0)}: the overlay's artifacts make no {key} "
                                f"(made: {', '.join(sorted(made)) or 'nothing'})")
        return base + suffix

    return REF.sub(one, str(value))


def edit_code(tree: Path, code: dict[str, dict[str, str]], resolve) -> list[str]:
    """Apply the overlay's exact text replacements to a copy of the workload's tree; each must be found exactly
    once (a drifted script fails here, naming the file and text). Returns what changed, one line each."""
    done = []
    for rel, pairs in code.items():
        path = (tree / rel).resolve()
        if tree.resolve() not in path.parents or not path.is_file():
            raise TrainboxError(f"trial.code: {rel}: no such file in the workload's tree ({tree})")
        text = path.read_text()
        for old, new in pairs.items():
            count = text.count(old)
            if count != 1:
                raise TrainboxError(f"trial.code: {rel}: {old!r} found {count} times (expected exactly once): the "
                                    "script changed; update the recipe's trial overlay")
            text = text.replace(old, resolve(new))
            done.append(f"{rel}: {old} -> {resolve(new)}")
        path.write_text(text)
    return done


def artifact_key(spec: dict) -> str:
    """Content hash of what the artifacts are made from: the spec and the maker's own source."""
    from ..runtime import trialkit

    h = hashlib.sha256(json.dumps(spec, sort_keys=True).encode())
    h.update(Path(trialkit.__file__).read_bytes())
    return h.hexdigest()[:16]


def expand_tree(value, values: dict[str, str]):
    """${NAME} in every string of a nested spec, from the recipe's values (inputs with their defaults)."""
    from .recipecheck import expand

    if isinstance(value, dict):
        return {k: expand_tree(v, values) for k, v in value.items()}
    if isinstance(value, list):
        return [expand_tree(v, values) for v in value]
    return expand(value, values) if isinstance(value, str) else value


__all__ = ["Overlay", "Verify", "artifact_key", "edit_code", "expand_tree", "overlaid_recipe", "overlay_of", "refs",
           "replace_args"]
