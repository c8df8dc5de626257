"""Launcher recipes: one YAML per workload in launchers/recipes/ (host module).

A recipe names its stack, devices per node, nodes, the parallel layout, the command, its environment and
the inputs the user must give. trainbox.launch renders it into a bash script and a `docker run` argv.

Words in `command`, `env` values, `workdir` and `source` paths are literal text except for `${NAME}`
(an input, a layout value or an earlier env key), `${NAME:-}` (any environment variable, empty when unset)
and, as a whole command word, `${NAME[@]}` (an array a `source` script defines). `$$` is a literal `$`.
Everything else is quoted when rendered, so a recipe cannot smuggle shell syntax into the script either.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ..image.toolkits import TOOLKITS
from ..runtime.errors import TrainboxError
from ..paths import LAUNCHERS_DIR
from ..specs.grammar import ENV_NAME_RE, MAX_DEVICES_PER_NODE, MAX_NODES, check_name, check_text
from ..specs.documents import MAX_EXTENDS_DEPTH, extends_too_deep, format_validation, merge, named_file, read_yaml
from .ports import RUN_BASES

RECIPES_DIR = LAUNCHERS_DIR / "recipes"
NAME_RE = re.compile(r"^[A-Z][A-Z0-9_]*\Z")
RECIPE_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{0,99}\Z")
# ${NAME}, ${NAME:-}, ${NAME[@]}, $$ -- and a lone `$` that is none of them (an error)
REF_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(:-|\[@\])?\}|\$\$|\$")

# The in-image directory the image build copies launchers/ to (jobs/ scripts live under it).
IMAGE_LAUNCHERS_DIR = "/opt/trainbox/launchers"

LAYOUT_VARS = ("TP", "PP", "CP", "EP", "DP", "TRAIN_DEVICES", "ROLLOUT_DEVICES", "ROLLOUT_DEVICES_PER_ENGINE",
               "NNODES", "NPROC_PER_NODE", "WORLD_SIZE")
# Names the launcher owns: a recipe input or env key may not take them over.
VISIBLE_DEVICES_VARS = {d: t.VISIBLE_DEVICES_VAR for d, t in TOOLKITS.items()}


class RecipeError(TrainboxError):
    """A recipe that cannot be used as it is."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Input(_Strict):
    """A value the user gives: `--set NAME=VALUE` at render/run time, or NAME in the environment."""

    description: str
    kind: Literal["path", "string", "host", "port", "int"] = "string"
    default: str | int | None = None
    required: bool | None = None  # default: required when there is no default
    # path inputs: `trainbox run` bind-mounts them at the same path inside the container
    mount: Literal["ro", "rw"] | None = None
    create: bool = False  # rw paths: the host directory is created before the run, the script mkdirs it too

    @field_validator("description")
    @classmethod
    def _description(cls, v: str) -> str:
        return check_text(v, "description")

    @model_validator(mode="after")
    def _check(self):
        if self.default is not None:
            self.default = str(self.default)
            if "\n" in self.default:
                raise ValueError("default: must be one line")
        if self.required is None:
            self.required = self.default is None
        if self.mount and self.kind != "path":
            raise ValueError(f"mount: only path inputs can be mounted (kind is {self.kind!r})")
        if self.create and self.mount != "rw":
            raise ValueError("create: needs mount: rw (only a writable mount is created)")
        if self.default is not None:
            problem = check_value(self.kind, self.default)
            if problem:
                raise ValueError(f"default: {problem}")
        return self


class SourceScript(_Strict):
    """A vendor environment script sourced with strict mode relaxed (they break under `set -u`)."""

    path: str
    optional: bool = False  # source it when present, skip it silently when not
    arrays: list[str] = Field(default_factory=list)  # bash arrays it must define, usable as ${NAME[@]}

    @field_validator("path")
    @classmethod
    def _path(cls, v: str) -> str:
        return check_text(v, "path")

    @field_validator("arrays")
    @classmethod
    def _arrays(cls, v):
        for name in v:
            if not NAME_RE.match(name):
                raise ValueError(f"{name!r}: expected an UPPER_CASE shell identifier")
        return v


class Preflight(_Strict):
    """A check run inside the image before the job: `python3 -c CODE`; on failure the hint is printed."""

    name: str
    python: str
    hint: str

    @field_validator("name", "hint")
    @classmethod
    def _line(cls, v: str, info) -> str:
        return check_text(v, info.field_name)

    @field_validator("python")
    @classmethod
    def _code(cls, v: str) -> str:
        if "\x00" in v:
            raise ValueError("python: holds a NUL character")
        return v


class Code(_Strict):
    """The workload's own source, when a component of the stack holds it (`source: git`, `install: tree`): the
    input that points at a checkout defaults to the image's copy, which is then used without a mount."""

    input: str
    component: str

    @field_validator("input")
    @classmethod
    def _input(cls, v: str) -> str:
        if not NAME_RE.match(v):
            raise ValueError(f"{v!r}: expected the UPPER_CASE name of a path input")
        return v

    @field_validator("component")
    @classmethod
    def _component(cls, v: str) -> str:
        return check_name(v, "component")

    @property
    def image_path(self) -> str:
        from ..specs.kinds import TREE_ROOT

        return f"{TREE_ROOT}/{self.component}"


MODULE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*\Z")


class Check(_Strict):
    """How `trainbox launch check --args` checks the command in the image, without starting the job."""

    # modules replaced by inert stand-ins in the args check because they need a real device host (torch_npu
    # without CANN): only names of trainbox.runtime.deviceonly.DEVICE_ONLY; what the stack should hold is installed
    stub: list[str] = Field(default_factory=list)
    # parse: the rendered command goes through the framework's own parser; none: the entry takes no arguments
    args: Literal["parse", "none"] = "parse"
    # entry: the entry's import closure must resolve in the image; none: the entry is not in the image (the
    # workload's source is mounted at run time and not pinned by the stack, e.g. Relax's CODE_DIR): the recipe is
    # then `not checked`, never ok, and `why` says why
    imports: Literal["entry", "none"] = "entry"
    # the entry whose parser reads the arguments, when the command's own first word is a console script that
    # hands them on (ms-swift's `megatron`): `-m MODULE` or a script path under workdir
    entry: str | None = None
    replaces: str | None = None  # the command's leading words the entry stands for (default: the first)
    # true: arguments the parser leaves over (parse_known_args) fail too, for frameworks that reject them
    # themselves after the parse (ms-swift raises on `remaining_argv`)
    strict: bool = False
    why: str | None = None  # one line, required with args: none
    # the MindCluster node type (accelerator-type label) `launch check --target ascendjob|volcano` renders this
    # recipe's multi-node manifests for, where the chip's default does not fit its layout (8 cards a pod cannot
    # span A3 super-pod nodes); `launch render` takes the same value as --accelerator-type
    accelerator_type: str | None = None

    @field_validator("stub")
    @classmethod
    def _stub(cls, v: list[str]) -> list[str]:
        from ..runtime.deviceonly import DEVICE_ONLY, device_only

        for mod in v:
            if not MODULE_RE.match(mod):
                raise ValueError(f"{mod!r}: expected a module name such as torch_npu")
            if not device_only(mod):
                raise ValueError(f"{mod!r} is not a device-only module: a stand-in may replace only what needs the "
                                 f"device to load ({', '.join(DEVICE_ONLY)}, trainbox.runtime.deviceonly); a "
                                 "module the image lacks must be added to the recipe's stack, not stood in for")
        return v

    @field_validator("entry", "replaces", "why")
    @classmethod
    def _line(cls, v: str | None, info) -> str | None:
        return v if v is None else check_text(v, info.field_name)

    @model_validator(mode="after")
    def _need_why(self):
        if self.args == "none" and not self.why:
            raise ValueError("why: say in one line why the entry takes no arguments (args: none)")
        if self.imports == "none" and (self.args != "none" or not self.why):
            raise ValueError("imports: none means the entry is not in the image, so nothing can parse its arguments "
                             "either: set args: none and say why in one line")
        if self.entry and self.entry.startswith("-m ") and not MODULE_RE.match(self.entry[3:]):
            raise ValueError(f"entry: {self.entry!r}: expected `-m MODULE` or a script path")
        return self


class Parallel(_Strict):
    """The parallel layout. Validated against the devices; available to commands as ${TP}, ${DP}, ..."""

    tp: int = Field(1, ge=1)
    pp: int = Field(1, ge=1)
    cp: int = Field(1, ge=1)
    ep: int = Field(1, ge=1)
    dp: int | None = Field(None, ge=1)  # derived from the devices when omitted
    # RL post-training: devices the trainer uses (default: all, i.e. colocated with rollout)
    train_devices: int | None = Field(None, ge=1)
    rollout_devices_per_engine: int | None = Field(None, ge=1)


class Torchrun(_Strict):
    # --standalone: a private rendezvous on a free local port (single node only). Otherwise the
    # rendezvous is MASTER_ADDR:MASTER_PORT with NODE_RANK from the inputs.
    standalone: bool = False


class Scaling(_Strict):
    """Whether the job's world size may change (`--nodes`, `--nproc-per-node`, `--devices`). `scales`: dp
    absorbs it; `fixed`: the workload fixes its own layout (a script's hard-coded DeviceMesh), and `mesh` says
    where, in one line, for the refusal."""

    world_size: Literal["scales", "fixed"] = "scales"
    mesh: str | None = None

    @model_validator(mode="after")
    def _why(self):
        if self.world_size == "fixed" and not (self.mesh and self.mesh.strip()):
            raise ValueError("world_size: fixed needs mesh: where the workload fixes its layout, in one line")
        return self


class Ray(_Strict):
    # Extra environment variables carried in the job's runtime env (the recipe's and the stack's env, the
    # NOSET flags and allocator settings are always carried).
    runtime_env_vars: list[str] = Field(default_factory=list)
    wait_seconds: int = Field(180, ge=10)  # for the head, its dashboard and (multi-node) the workers


class Recipe(_Strict):
    name: str = ""  # from the file name
    description: str
    stack: str
    launcher: Literal["torchrun", "ray", "exec"]
    nodes: int = Field(1, ge=1, le=MAX_NODES)
    devices_per_node: int = Field(ge=1, le=MAX_DEVICES_PER_NODE)  # NPUs / GPUs per node; processes on CPU
    parallel: Parallel = Field(default_factory=Parallel)
    upstream: list[str] = Field(default_factory=list)  # where the workload's own launcher lives; informational
    inputs: dict[str, Input] = Field(default_factory=dict)
    env: dict[str, str | int | float] = Field(default_factory=dict)
    source: list[SourceScript] = Field(default_factory=list)
    preflight: list[Preflight] = Field(default_factory=list)
    code: Code | None = None
    check: Check = Field(default_factory=Check)
    scaling: Scaling = Field(default_factory=Scaling)
    workdir: str | None = None
    command: list[str | list[str]]
    torchrun: Torchrun = Field(default_factory=Torchrun)
    ray: Ray = Field(default_factory=Ray)
    # `trainbox trial`'s overlay (trainbox.launch.trialplan validates it: only `trial` reads it)
    trial: dict | None = None
    source_file: Path | None = None

    @field_validator("inputs", "env")
    @classmethod
    def _names(cls, v):
        for name in v:
            if not NAME_RE.match(name):
                raise ValueError(f"{name!r}: expected an UPPER_CASE shell identifier")
            if name in LAYOUT_VARS:
                raise ValueError(f"{name!r}: reserved for the parallel layout ({', '.join(LAYOUT_VARS)})")
        return v

    @field_validator("env", mode="before")
    @classmethod
    def _env(cls, v):
        if not isinstance(v, dict):
            return v
        out = {}
        for key, value in v.items():
            if key in VISIBLE_DEVICES_VARS.values():
                raise ValueError(f"{key}: set by the launcher from devices_per_node / `trainbox run --devices`")
            if isinstance(value, bool):
                raise ValueError(f"{key}: write {str(value).lower()!r} in quotes (an environment value is text)")
            try:
                out[key] = check_text(str(value), "value")
            except ValueError as exc:
                raise ValueError(f"{key}: {exc}") from None
        return out

    @field_validator("command")
    @classmethod
    def _command(cls, v):
        if not v:
            raise ValueError("expected at least one word")
        for i, item in enumerate(v):
            try:
                words = parse_words(item)
            except ValueError:
                continue  # check_references names the item and the quoting problem
            for word in words:
                try:
                    check_text(word, "word")
                except ValueError as exc:
                    raise ValueError(f"[{i}]: {exc}") from None
        return v

    @field_validator("description")
    @classmethod
    def _description(cls, v: str) -> str:
        return check_text(v, "description")

    @field_validator("stack")
    @classmethod
    def _stack(cls, v: str) -> str:
        return check_name(v, "stack")

    @field_validator("upstream")
    @classmethod
    def _upstream(cls, v: list[str]) -> list[str]:
        return [check_text(u, "upstream") for u in v]

    @field_validator("workdir")
    @classmethod
    def _workdir(cls, v: str | None) -> str | None:
        return v if v is None else check_text(v, "workdir")

    @model_validator(mode="after")
    def _code_input(self):
        if self.code is None:
            return self
        spec = self.inputs.get(self.code.input)
        if spec is None or spec.kind != "path":
            raise ValueError(f"code.input: {self.code.input!r} is not a path input of this recipe")
        if spec.default is None:  # the image's copy, used without a mount (trainbox.launch.job)
            spec.default, spec.required = self.code.image_path, False
        return self

    @model_validator(mode="after")
    def _layout(self):
        if self.torchrun.standalone and self.nodes > 1:
            raise ValueError("torchrun.standalone: only for a single node (nodes is %d)" % self.nodes)
        self.layout()  # raises ValueError on an impossible layout
        return self

    # -- derived ------------------------------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        return self.nodes * self.devices_per_node

    def layout(self) -> dict[str, int]:
        p = self.parallel
        world = self.world_size
        train = p.train_devices or world
        if train > world:
            raise ValueError(f"parallel.train_devices: {train} is more than the {world} devices of the job")
        model = p.tp * p.pp * p.cp
        if train % model:
            raise ValueError(f"parallel: tp*pp*cp = {p.tp}*{p.pp}*{p.cp} = {model} does not divide the "
                             f"{train} training devices")
        dp = train // model
        if p.dp is not None and p.dp != dp:
            raise ValueError(f"parallel.dp: {p.dp}, but {train} devices / (tp*pp*cp = {model}) gives dp = {dp}")
        if (train // p.pp) % p.ep:
            raise ValueError(f"parallel.ep: {p.ep} does not divide the {train // p.pp} devices of a pipeline stage")
        rollout = world - train if train < world else world
        out = {"TP": p.tp, "PP": p.pp, "CP": p.cp, "EP": p.ep, "DP": dp, "TRAIN_DEVICES": train,
               "ROLLOUT_DEVICES": rollout, "NNODES": self.nodes, "NPROC_PER_NODE": self.devices_per_node,
               "WORLD_SIZE": world}
        if p.rollout_devices_per_engine:
            if rollout % p.rollout_devices_per_engine:
                raise ValueError(f"parallel.rollout_devices_per_engine: {p.rollout_devices_per_engine} does not "
                                 f"divide the {rollout} rollout devices")
            out["ROLLOUT_DEVICES_PER_ENGINE"] = p.rollout_devices_per_engine
        return out


# ---------------------------------------------------------------------------------------------------------
# values

_HOST_RE = re.compile(r"^[A-Za-z0-9_.:][A-Za-z0-9_.:-]*\Z")


def check_value(kind: str, value: str) -> str | None:
    """Why `value` is not a valid `kind` input, or None. Mirrors the checks the rendered script runs."""
    if "\x00" in value:  # everything else is quoted where it lands; a NUL cannot travel in argv or bash
        return f"{value[:60]!r}: holds a NUL character"
    if kind in ("port", "int"):
        if not re.fullmatch(r"[0-9]+", value):
            return f"{value!r}: expected {'a port number' if kind == 'port' else 'a non-negative integer'}"
        if kind == "port" and not 1 <= int(value) <= 65535:
            return f"{value!r}: expected a port number 1-65535"
    elif kind == "host":
        if value and not _HOST_RE.match(value):
            return f"{value!r}: expected a host name or IP address"
    return None


def builtin_inputs(recipe: Recipe) -> dict[str, Input]:
    """Inputs every recipe of a launcher kind has; a recipe may redeclare one to change its default."""
    single = recipe.nodes == 1
    out = {
        "NODE_RANK": Input(description="this node's rank, 0 .. nodes-1 (node 0 is the master / Ray head)",
                           kind="int", default=0),
        "MASTER_ADDR": Input(description="address of node 0, reachable from every node",
                             kind="host", default="127.0.0.1" if single else None),
        "MASTER_PORT": Input(description="rendezvous port on node 0; also the job's identity on the host "
                                         "(HCCL port ranges are derived from it)", kind="port",
                             default=RUN_BASES["MASTER_PORT"]),
        "TRAINBOX_LAUNCHERS": Input(description="the launchers/ directory (jobs/ scripts live under it)",
                                    kind="path", default=IMAGE_LAUNCHERS_DIR),
    }
    if recipe.launcher == "ray":
        out["RAY_PORT"] = Input(description="Ray head (GCS) port; the Ray agents' ports are RAY_PORT+1 .. "
                                            "RAY_PORT+7", kind="port", default=RUN_BASES["RAY_PORT"])
        out["RAY_DASHBOARD_PORT"] = Input(description="Ray dashboard / job API port, bound to 127.0.0.1 on "
                                                      "the head", kind="port",
                                              default=RUN_BASES["RAY_DASHBOARD_PORT"])
        out["NODE_IP"] = Input(description="this node's address for Ray (empty: Ray picks one)", kind="host",
                               default="", required=False)
    return out


def all_inputs(recipe: Recipe) -> dict[str, Input]:
    out = builtin_inputs(recipe)
    out.update(recipe.inputs)
    return out


# ---------------------------------------------------------------------------------------------------------
# words

def parse_words(item: str | list[str]) -> list[str]:
    """A command line item: a string is split like a shell would split it (quotes group words, nothing is
    expanded); a list is taken word for word."""
    if isinstance(item, list):
        return [str(w) for w in item]
    try:
        return shlex.split(item, comments=False, posix=True)
    except ValueError as exc:
        raise ValueError(f"{item!r}: {exc}") from None


def refs(word: str) -> list[tuple[str, str]]:
    """The (name, form) references in a word; form is '', ':-' or '[@]'. Raises ValueError on a lone `$`."""
    out = []
    for m in REF_RE.finditer(word):
        if m.group(0) == "$$":
            continue
        if m.group(0) == "$":
            raise ValueError(f"{word!r}: a `$` must start ${{NAME}}, ${{NAME:-}} or ${{NAME[@]}}; write $$ for a "
                             "literal dollar sign")
        out.append((m.group(1), m.group(2) or ""))
    return out


def sh_quote(value) -> str:
    """shlex.quote, except that a word holding `=` or `,` is quoted too: `NAME==x`, `( =x )` and `( a,b )` are
    valid bash but read as mistakes (shellcheck SC1097/SC2191/SC2054); quoted, the word is plainly data."""
    text = str(value)
    quoted = shlex.quote(text)
    return f"'{text}'" if quoted == text and ("=" in text or "," in text) else quoted


def shell_identifier(name) -> str:
    """`name` when it is a shell variable name; anything else would be shell syntax in the script."""
    text = str(name)
    if not ENV_NAME_RE.match(text):
        raise RecipeError(f"refusing to render {text[:60]!r} as a shell variable name: expected "
                          "[A-Za-z_][A-Za-z0-9_]*")
    return text


def shell_word(word: str) -> str:
    """Render one word: literal text single-quoted, references double-quoted, so the result is exactly one
    shell word whose only expansions are the references."""
    if re.fullmatch(r"\$\{[A-Za-z_][A-Za-z0-9_]*\[@\]\}", word):
        return f'"{word}"'
    parts, pos, lit = [], 0, []
    for m in REF_RE.finditer(word):
        lit.append(word[pos:m.start()])
        pos = m.end()
        if m.group(0) == "$$":
            lit.append("$")
            continue
        if m.group(2) == "[@]":
            raise ValueError(f"{word!r}: ${{{m.group(1)}[@]}} must be a whole word")
        if "".join(lit):
            parts.append(sh_quote("".join(lit)))
        lit = []
        parts.append('"${%s%s}"' % (m.group(1), m.group(2) or ""))
    lit.append(word[pos:])
    if "".join(lit) or not parts:
        parts.append(sh_quote("".join(lit)))
    return "".join(parts)


# ---------------------------------------------------------------------------------------------------------
# loading

def list_recipes(recipes_dir: Path | None = None) -> list[str]:
    d = recipes_dir or RECIPES_DIR
    return sorted(p.stem for p in d.glob("*.yaml"))


def recipe_path(name_or_path: str | Path, recipes_dir: Path | None = None) -> Path:
    if "/" not in str(name_or_path) and Path(str(name_or_path)).suffix not in (".yaml", ".yml") and \
            not RECIPE_NAME_RE.match(str(name_or_path)):
        raise RecipeError(f"recipe {str(name_or_path)[:80]!r}: not a recipe name (lower-case words joined by '-', "
                          "at most 100 characters; `trainbox launch list` shows them)")
    return named_file(name_or_path, recipes_dir or RECIPES_DIR, "recipe", RecipeError,
                      hint="; `trainbox launch list` shows them")


def _drop_nulls(merged: dict, child: dict) -> None:
    """`KEY: null` in a child's mapping removes the parent's KEY (an NPU-only env variable, say)."""
    for key, value in child.items():
        if value is None and isinstance(merged, dict):
            merged.pop(key, None)
        elif isinstance(value, dict) and isinstance(merged.get(key), dict):
            _drop_nulls(merged[key], value)


def merged_yaml(path: Path, recipes_dir: Path | None = None, seen: tuple[Path, ...] = ()) -> dict:
    """The recipe's mapping with `extends: PARENT` applied like stacks do: mappings (inputs, env, parallel,
    ...) merge key by key, anything else (command, source, preflight, upstream) is replaced whole. The chain is
    walked without recursion, at most MAX_EXTENDS_DEPTH files deep."""
    chain: list[dict] = []
    visited = list(seen)
    here: Path | None = path
    while here is not None:
        if here.resolve() in visited:
            looped = " -> ".join(p.name for p in visited + [here.resolve()])
            raise RecipeError(f"{here}: `extends` loops: {looped}")
        visited.append(here.resolve())
        if len(visited) > MAX_EXTENDS_DEPTH:
            raise extends_too_deep(path, visited, RecipeError)
        data = read_yaml(here, RecipeError, "recipe")
        chain.append(data)
        parent = data.pop("extends", None)
        if parent is None:
            break
        if not isinstance(parent, str) or not RECIPE_NAME_RE.match(parent):
            raise RecipeError(f"{here}: extends: expected a recipe name, got {parent!r}")
        sibling = here.parent / f"{parent}.yaml"
        here = sibling if sibling.is_file() else recipe_path(parent, recipes_dir)
    merged = chain[-1]
    for data in reversed(chain[:-1]):
        merged.pop("name", None)
        merged = merge(merged, data)
        _drop_nulls(merged, data)
    return merged


def load_recipe(name_or_path: str | Path, recipes_dir: Path | None = None, nodes: int | None = None,
                nproc_per_node: int | None = None) -> Recipe:
    """Load and validate a recipe. `nodes` / `nproc_per_node` run it on another node count or another
    number of devices (processes on CPU) per node: the layout's dp scales, everything else must still fit."""
    path = recipe_path(name_or_path, recipes_dir)
    data = merged_yaml(path, recipes_dir)
    if "name" in data and data["name"] != path.stem:
        raise RecipeError(f"{path}: name: expected {path.stem!r} (the file name), got {data['name']!r}")
    data["name"] = path.stem
    own = (data.get("nodes", 1), data.get("devices_per_node"))
    if nodes is not None:
        if not 1 <= nodes <= MAX_NODES:
            raise RecipeError(f"--nodes {nodes}: expected 1 to {MAX_NODES}")
        data["nodes"] = nodes
        if isinstance(data.get("parallel"), dict):
            data["parallel"] = {k: v for k, v in data["parallel"].items() if k != "dp"}
        if nodes > 1 and isinstance(data.get("torchrun"), dict):
            data["torchrun"] = {k: v for k, v in data["torchrun"].items() if k != "standalone"}
    if nproc_per_node is not None:
        if nproc_per_node < 1:
            raise RecipeError(f"--nproc-per-node {nproc_per_node}: expected 1 or more")
        data["devices_per_node"] = nproc_per_node
        if isinstance(data.get("parallel"), dict):
            data["parallel"] = {k: v for k, v in data["parallel"].items() if k != "dp"}
    _check_scaling(path.stem, data.get("scaling"), own, (nodes, nproc_per_node))
    if not RECIPE_NAME_RE.match(path.stem):
        raise RecipeError(f"{path}: recipe file names are lower-case words joined by '-' (got {path.stem!r})")
    try:
        recipe = Recipe.model_validate(data)
    except ValidationError as exc:
        raise RecipeError(format_validation(path, exc, unknown="unknown keys are rejected")) from None
    recipe.source_file = path
    check_references(recipe, path)
    return recipe


def _check_scaling(name: str, scaling, own: tuple, given: tuple) -> None:
    """A recipe whose workload fixes its own layout refuses another world size, in one line naming where."""
    if not isinstance(scaling, dict) or scaling.get("world_size") != "fixed":
        return
    (own_nodes, own_per_node), (nodes, nproc_per_node) = own, given
    asked = []
    if nodes is not None and nodes != own_nodes:
        asked.append(f"{nodes} node(s) (--nodes)")
    if nproc_per_node is not None and nproc_per_node != own_per_node:
        asked.append(f"{nproc_per_node} per node (--nproc-per-node/--devices)")
    if asked:
        raise RecipeError(f"recipe {name}: its world size is fixed at {own_nodes} node(s) x {own_per_node}, not "
                          f"{' and '.join(asked)}: {' '.join(str(scaling.get('mesh')).split())}")


def check_references(recipe: Recipe, path: Path) -> None:
    """Every ${NAME} must name something the script defines by the time it is used."""
    inputs = set(builtin_inputs(recipe)) | set(recipe.inputs)  # names only: the job merges the specs once
    layout = set(recipe.layout())
    arrays = {a for s in recipe.source for a in s.arrays}

    def check(where: str, word: str, known: set[str], allow_arrays: bool = False) -> None:
        try:
            found = refs(word)
            shell_word(word)
        except ValueError as exc:
            raise RecipeError(f"{path}: {where}: {exc}") from None
        for name, form in found:
            if form == ":-":
                continue
            if form == "[@]":
                if not allow_arrays or name not in arrays:
                    raise RecipeError(f"{path}: {where}: ${{{name}[@]}}: not an array a `source` entry declares "
                                      f"(declare it under source[].arrays)")
                continue
            if name not in known:
                raise RecipeError(
                    f"{path}: {where}: ${{{name}}} is not defined here (known: inputs "
                    f"{', '.join(sorted(inputs))}; layout {', '.join(sorted(layout))}; earlier env keys). "
                    f"Use ${{{name}:-}} for an optional environment variable")

    known = inputs | layout
    for i, src in enumerate(recipe.source):
        check(f"source[{i}].path", src.path, known)
    for key, value in recipe.env.items():
        check(f"env.{key}", value, known)
        known = known | {key}
    if recipe.workdir:
        check("workdir", recipe.workdir, known)
    for i, item in enumerate(recipe.command):
        try:
            words = parse_words(item)
        except ValueError as exc:
            raise RecipeError(f"{path}: command[{i}]: {exc}") from None
        for word in words:
            check(f"command[{i}]", word, known, allow_arrays=True)
    for name in recipe.ray.runtime_env_vars:
        if not NAME_RE.match(name):
            raise RecipeError(f"{path}: ray.runtime_env_vars: {name!r}: expected an UPPER_CASE identifier")
