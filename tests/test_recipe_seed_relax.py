"""The Relax NPU recipes against the seed's launchers (Relax PR #52; tests/data/relax-pr52-seed.yaml holds every flag
and variable of its three scripts, with the commit they were read at): every flag of the seed must be in the recipe
with the seed's values, and every difference is one of the few listed below, each with its reason. Relax's own parser
takes the recipes in the relax image (`launch check --args`, tests/test_relax_image.py and the smoke)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from trainbox.launch import load_stack_info
from trainbox.launch.recipe import all_inputs, list_recipes, load_recipe, parse_words

SEED = yaml.safe_load((Path(__file__).parent / "data" / "relax-pr52-seed.yaml").read_text())
RECIPES = sorted(SEED["scripts"])

# flags whose value the recipe takes from an input (a path on the user's host, a name): the flag must be there,
# its value an input reference
INPUT_VALUED = {"--hf-checkpoint", "--ref-load", "--load", "--save", "--prompt-data", "--tb-project-name",
                "--tb-experiment-name", "--num-rollout", "--eval-interval", "--eval-prompt-data"}
# the seed's flags a recipe leaves out, with why
LEFT_OUT = {"--use-clearml": "needs a ClearML server and credentials"}
# flags a recipe adds, with why
ADDED = {"--num-gpus-per-node": "Relax's default is 8; its help: set it when colocating on fewer cards per node"}
# the seed's variables a recipe does not set, with why
ENV_LEFT_OUT = {
    "ASCEND_RT_VISIBLE_DEVICES": "the launcher sets it from --devices",
    "HCCL_HOST_SOCKET_PORT_RANGE": "the launcher derives it per job from MASTER_PORT",
    "HCCL_NPU_SOCKET_PORT_RANGE": "the launcher derives it per job from MASTER_PORT",
}
# variables a recipe adds, with why
ENV_ADDED = {
    "PYTHONPATH": "CODE_DIR: the image's Relax (93e989e) or a mounted checkout",
    "HCCL_CONNECT_TIMEOUT": "ours: the first collective of a Ray job waits for every actor's model load",
    "MINDSPEED_BRIDGE_GDN_USE_TORCH_CONV": "Qwen3.5's GDN conv through torch (Relax main's NPU launcher, 9abc67f)",
}


def words_to_flags(words: list[str]) -> dict[str, list[str]]:
    """--flag value... pairs in order; a JSON value (one shell word in the recipe, spaces inside in the data file) is
    joined back into one value."""
    flags: dict[str, list[str]] = {}
    current = None
    i = 0
    while i < len(words):
        word = words[i]
        if word.startswith("{") and word.count("{") > word.count("}"):
            while word.count("{") > word.count("}"):  # the data file's JSON, split on its spaces
                i += 1
                word += " " + words[i]
        if word.startswith("--"):
            assert word not in flags, f"{word} given twice"
            current = flags.setdefault(word, [])
        elif current is not None:
            current.append(word)
        i += 1
    return flags


def recipe_flags(name: str) -> tuple[dict[str, list[str]], dict]:
    """The recipe's flags, layout values (TP, NNODES, ...) filled in, inputs left as ${NAME}; and its inputs."""
    recipe = load_recipe(name)
    shown = {"inputs": {n: {"default": i.default} for n, i in all_inputs(recipe).items()}}
    layout = {k: str(v) for k, v in recipe.layout().items()}
    words = []
    for word in [w for item in recipe.command for w in parse_words(item)][3:]:
        for key, value in layout.items():
            word = word.replace("${%s}" % key, value)
        words.append(word)
    return words_to_flags(words), shown


def seed_flags(name: str) -> dict[str, list[str]]:
    return words_to_flags(SEED["scripts"][name]["args"].split())


def same_value(flag: str, ours: list[str], theirs: list[str]) -> bool:
    if len(ours) == 1 and len(theirs) == 1 and ours[0].startswith("{"):
        return json.loads(ours[0]) == json.loads(theirs[0])
    return ours == theirs


@pytest.mark.parametrize("name", RECIPES)
def test_every_seed_flag_is_in_the_recipe_with_the_seed_s_value(name):
    ours, shown = recipe_flags(name)
    theirs = seed_flags(name)
    drifts = []
    for flag, value in theirs.items():
        if flag in LEFT_OUT:
            assert flag not in ours, f"{flag} is listed as left out ({LEFT_OUT[flag]}) but the recipe has it"
            continue
        if flag not in ours:
            drifts.append(f"missing {flag} {' '.join(value)}")
        elif flag in INPUT_VALUED:
            refs = [v for v in ours[flag] if v.startswith("${")]
            assert refs, f"{flag}: expected an input, got {ours[flag]}"
            for ref in refs:  # an input with a default carries the seed's value (NUM_ROLLOUT 3000, ...)
                spec = shown["inputs"][ref[2:-1]]
                default = spec.get("default")
                if default is not None and not value[-1].startswith("$") and flag not in ("--tb-experiment-name",):
                    assert str(default) == value[-1], f"{flag}: input {ref} defaults to {default}, the seed {value}"
        elif not same_value(flag, ours[flag], value):
            if ours[flag] == ["${ATTENTION_BACKEND}"] and shown["inputs"]["ATTENTION_BACKEND"]["default"] == value[0]:
                continue
            drifts.append(f"{flag}: recipe {' '.join(ours[flag])!r}, seed {' '.join(value)!r}")
    for flag in ours:
        if flag not in theirs and flag not in ADDED:
            drifts.append(f"extra {flag} {' '.join(ours[flag])} (not in {SEED['scripts'][name]['path']})")
    assert not drifts, f"{name} drifts from {SEED['repo']}@{SEED['commit'][:8]}:\n  " + "\n  ".join(drifts)


@pytest.mark.parametrize("name", RECIPES)
def test_the_recipe_environment_is_the_seed_s(name):
    recipe = load_recipe(name)
    stack = load_stack_info(recipe.stack)
    effective = {**stack.env, **{k: str(v) for k, v in recipe.env.items()}}
    seed_env = {**SEED["runtime_env"], **SEED["scripts"][name]["env"]}
    drifts = []
    for key, value in seed_env.items():
        if key in ENV_LEFT_OUT:
            assert key not in recipe.env, f"{key} is listed as left out ({ENV_LEFT_OUT[key]})"
        elif effective.get(key) != str(value):
            drifts.append(f"{key}: recipe {effective.get(key)!r}, seed {value!r}")
    for key in recipe.env:
        if key not in seed_env and key not in ENV_ADDED:
            drifts.append(f"extra {key}={recipe.env[key]} (not the seed's)")
    assert not drifts, f"{name}:\n  " + "\n  ".join(drifts)


def test_the_qwen35_recipes_keep_packing_off():
    """Qwen3.5's Gated-DeltaNet cannot pack sequences (the seed: "Packing is not supported for GDN currently")."""
    for name in ("relax-qwen35-9b-4npu-colocate", "relax-qwen35-9b-8npu-async"):
        ours, _ = recipe_flags(name)
        assert ours["--qkv-format"] == ["bshd"] and "--use-dynamic-batch-size" not in ours, name


def test_the_async_recipe_places_the_advantages_actor_and_a_reference_config():
    ours, _ = recipe_flags("relax-qwen35-9b-8npu-async")
    assert json.loads(ours["--resource"][0])["advantages"] == [1, 0]
    ref = json.loads(ours["--ref-actor-config"][0])
    assert ref["only_load_weight"] is True and ref["max_tokens_per_gpu"] == 10240


def test_flag_parsing_joins_a_json_value_split_on_its_spaces():
    assert words_to_flags(["--resource", '{"a": [1,', "2]}", "--x", "--y", "1", "2"]) == {
        "--resource": ['{"a": [1, 2]}'], "--x": [], "--y": ["1", "2"]}


@pytest.mark.parametrize("name", ["specforge-domino-qwen35-4b-npu", "specforge-domino-qwen35-4b-gpu"])
def test_specforge_caches_outside_its_read_only_checkout(name):
    """SpecForge writes its processed dataset to --cache-dir (default ./cache, under the workdir): the recipe's
    workdir is the checkout, mounted read-only, so the flag must name a writable input's path."""
    recipe = load_recipe(name)
    inputs = all_inputs(recipe)
    assert recipe.workdir == "${CODE_DIR}" and inputs["CODE_DIR"].mount == "ro"
    flags = words_to_flags([w for item in recipe.command for w in parse_words(item)][1:])
    assert "--cache-dir" in flags, "SpecForge would cache under the read-only checkout (./cache)"
    root = flags["--cache-dir"][0].split("/")[0]
    assert root.startswith("${") and inputs[root[2:-1]].mount == "rw", flags["--cache-dir"]


# sgl-kernel-npu commits known to carry upstream 23519771 ("support torch_memory_saver preload hook_mode", #463):
# the commit and the first tags after it (2026.05.01.post3, 2026.6.0), checked in sgl-kernel-npu's history
PRELOAD_SGL_KERNEL_NPU = {"23519771d347a0422885d34b807076d56e122104", "607b00025e9a8ec7aa488be1844e4a890430236c",
                          "87df718a2f15161d3120e4e1dfd19b30afca7cbf"}


def _tms_preload_problem(name: str, env: dict, stack_name: str, kernel: tuple | None) -> str | None:
    """Why a recipe may not ask for torch-memory-saver's preload hook mode (TMS_HOOK_MODE=preload), or None.
    `kernel`: the stack's sgl-kernel-npu as (commit, patch series), None off NPU."""
    if str(env.get("TMS_HOOK_MODE", "")) != "preload" or kernel is None:
        return None  # no preload asked, or not torch_memory_saver's NPU build (CUDA's upstream one has preload)
    commit, series = kernel
    if commit in PRELOAD_SGL_KERNEL_NPU or PRELOAD_BACKPORT in backports(series):
        return None
    return (f"{name} sets TMS_HOOK_MODE=preload, but stack {stack_name} pins sgl-kernel-npu {commit[:12]} "
            "(not known to carry 23519771, the NPU preload hook mode), and its patch series does not backport it")


def _kernel(recipe) -> tuple | None:
    from trainbox.specs.stack import load_stack

    kernel = load_stack(recipe.stack).components.get("sgl-kernel-npu")
    return (kernel.commit, kernel.patches) if kernel is not None else None


@pytest.mark.parametrize("name", sorted(list_recipes()))
def test_no_recipe_sets_tms_preload_on_an_sgl_kernel_npu_without_it(name):
    """torch-memory-saver's preload mode on NPU arrived with sgl-kernel-npu 23519771; before it the README calls it
    unsupported with torch_npu and TMS_HOOK_MODE is not even read. A recipe may ask for it only on a stack whose
    sgl-kernel-npu has it."""
    recipe = load_recipe(name)
    problem = _tms_preload_problem(name, recipe.env, recipe.stack, _kernel(recipe))
    assert problem is None, problem


def test_the_tms_preload_check_refuses_preload_on_each_pinned_sgl_kernel_npu_without_it():
    """The check above can fail (issue 37: while no recipe set preload, it returned before its assert): each recipe
    on a stack with sgl-kernel-npu, given TMS_HOOK_MODE=preload, is taken where its stack's kernel carries 23519771
    (a commit that has it, or a series that backports it, as relax's rc3 does) and refused on the same kernel
    without that backport; off NPU (no sgl-kernel-npu) preload is fine."""
    on_npu = [r for r in map(load_recipe, sorted(list_recipes())) if _kernel(r)]
    assert len(on_npu) >= 4, [r.name for r in on_npu]  # the relax and specforge NPU recipes
    for recipe in on_npu:
        env = {**recipe.env, "TMS_HOOK_MODE": "preload"}
        commit, series = _kernel(recipe)
        if commit in PRELOAD_SGL_KERNEL_NPU or PRELOAD_BACKPORT in backports(series):
            assert _tms_preload_problem(recipe.name, env, recipe.stack, (commit, series)) is None
        assert "not known to carry 23519771" in _tms_preload_problem(recipe.name, env, recipe.stack, (commit, None)) \
            if commit not in PRELOAD_SGL_KERNEL_NPU else True
        for good in PRELOAD_SGL_KERNEL_NPU:
            assert _tms_preload_problem(recipe.name, env, recipe.stack, (good, None)) is None
    cuda = load_recipe("relax-qwen35-9b-8gpu-async")
    assert _tms_preload_problem(cuda.name, {"TMS_HOOK_MODE": "preload"}, cuda.stack, _kernel(cuda)) is None


# the Upstream-Status a series entry taken from 23519771 carries (Relax's image cherry-picks it onto rc3)
PRELOAD_BACKPORT = "Backport https://github.com/sgl-project/sgl-kernel-npu/commit/23519771d347a0422885d34b807076d56e122104"


def backports(series: str | None) -> set[str]:
    from trainbox.paths import REPO_ROOT
    from trainbox.runtime.apply_patches import load_series

    return {p.upstream_status for p in load_series(REPO_ROOT / "patches" / series)} if series else set()


def test_the_relax_stack_backports_23519771_whole_and_then_relax_s_patch():
    """The relax stack's sgl-kernel-npu is Relax's: rc3, every file of 23519771 (against its parent, in the mirror),
    then Relax's torch-memory-saver.patch last."""
    import subprocess

    from trainbox.paths import REPO_ROOT
    from trainbox.runtime.apply_patches import load_series
    from trainbox.specs.stack import load_stack
    from upstream_helpers import find_shared_upstream

    kernel = load_stack("relax").components["sgl-kernel-npu"]
    assert kernel.commit == "06d738f01d3bc6b9f638f01f2a293cec83ccd91c" and kernel.ref == "2026.04.15.rc3"
    series = load_series(REPO_ROOT / "patches" / kernel.patches)
    taken = [p for p in series if p.upstream_status == PRELOAD_BACKPORT]
    assert series[-1].subject.endswith("from torch-memory-saver.patch") and "93e989e" in series[-1].message
    upstream = find_shared_upstream()
    if upstream is None:
        pytest.skip("../shared/upstream is missing")
    files = subprocess.run(["git", f"--git-dir={upstream / 'sgl-kernel-npu.git'}", "show", "--format=", "--name-only",
                            "23519771d347a0422885d34b807076d56e122104"], capture_output=True, text=True, check=True)
    assert sorted(f for p in taken for f in p.touched()) == sorted(files.stdout.split())
