"""A job is resolved once (issue 38): one `trainbox run`, one `launch render` of each target and one trial compute
a recipe's inputs (`all_inputs`) once per job they resolve; every target reads them from the `Job`."""

from __future__ import annotations

import sys

import pytest

import trainbox.launch.job as job_module
import trainbox.launch.recipe as recipe_module
from trainbox.cli import main

SPECFORGE = ["TARGET_MODEL_PATH=/m", "TRAIN_DATA_PATH=/d", "OUTPUT_DIR=/o"]
RELAX = ["CODE_DIR=/src/Relax", "MODEL_DIR=/data/m", "REF_LOAD=/data/r", "DATA_PATH=/data/d.jsonl",
         "EVAL_DATA_PATH=/data/e.jsonl", "CKPT_DIR=/ckpt/run1"]
IMAGE = "registry.example.com/trainbox/img:1"  # a registry name: a cluster render takes it without a local image


@pytest.fixture
def counts(tmp_path, monkeypatch):
    """How often `all_inputs` ran and how many jobs `resolve` made, through every module that holds the function
    (a module that imported the name keeps its own reference: each one is patched)."""
    monkeypatch.setenv("TRAINBOX_CACHE", str(tmp_path / "cache"))
    import trainbox.launch.docker, trainbox.launch.k8s, trainbox.launch.slurm, trainbox.launch.targets  # noqa: F401
    import trainbox.launch.trial  # noqa: F401

    seen = {"all_inputs": 0, "jobs": 0}
    real_inputs, real_resolve = recipe_module.all_inputs, job_module.resolve

    def all_inputs(recipe):
        seen["all_inputs"] += 1
        return real_inputs(recipe)

    def resolve(*a, **kw):
        seen["jobs"] += 1
        return real_resolve(*a, **kw)

    patched = 0
    for mod in list(sys.modules.values()):
        if not getattr(mod, "__name__", "").startswith("trainbox"):
            continue
        if getattr(mod, "all_inputs", None) is real_inputs:
            monkeypatch.setattr(mod, "all_inputs", all_inputs)
            patched += 1
        if getattr(mod, "resolve", None) is real_resolve:
            monkeypatch.setattr(mod, "resolve", resolve)
    assert patched >= 2  # recipe and job at least: a test that patched nothing could not fail
    return seen


@pytest.mark.parametrize("argv", [
    ["run", "cpu-ddp", "--dry-run", "--image", "img:1"],
    ["run", "relax-qwen3-4b-4npu-colocate", "--dry-run", "--devices", "4-7", "--image", "img:1",
     *(w for s in RELAX for w in ("--set", s))],
    ["run", "specforge-domino-qwen35-4b-npu", "--dry-run", "--devices", "0-1", "--json", "--image", "img:1",
     *(w for s in SPECFORGE for w in ("--set", s))],  # --devices with another count: the recipe loads twice
])
def test_a_run_computes_the_inputs_once(counts, argv, capsys):
    assert main(argv) == 0, capsys.readouterr().err
    assert counts == {"all_inputs": 1, "jobs": 1}


@pytest.mark.parametrize("target,recipe,extra", [
    ("docker", "cpu-ddp", []),
    ("slurm", "cpu-ddp", ["--nodes", "2"]),
    ("slurm-pyxis", "ray-cpu", ["--nodes", "2"]),
    ("ascendjob", "specforge-domino-qwen35-4b-npu", [w for s in SPECFORGE for w in ("--set", s)]),
    ("volcano", "cpu-ddp", ["--nodes", "2"]),
    ("pytorchjob", "cpu-ddp", []),
    ("rayjob", "ray-cpu", []),
])
def test_each_render_computes_the_inputs_once(counts, target, recipe, extra, tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["launch", "render", recipe, "--target", target, "-o", str(out), *extra]
    assert main(argv + ([] if target == "docker" else ["--image", IMAGE])) == 0, capsys.readouterr().err
    assert out.read_text()
    assert counts == {"all_inputs": 1, "jobs": 1}


def test_a_trial_computes_the_inputs_once_per_job(counts, tmp_path):
    """A trial resolves two jobs, the recipe as written (its image, the artifacts' values) and the overlaid recipe
    it runs: two computations, one each."""
    from trainbox.launch.trial import plan_trial

    plan = plan_trial("cpu-ddp", image="img:1", cpu=True, run_dir=tmp_path / "run")
    assert plan.script_path.read_text()
    assert counts == {"all_inputs": 2, "jobs": 2}


def test_the_job_carries_its_inputs_devices_and_ports():
    job = job_module.resolve("relax-qwen3-4b-4npu-colocate", sets=dict(s.split("=", 1) for s in RELAX),
                             devices="4-7", check_paths=False)
    assert set(job.inputs) == set(recipe_module.all_inputs(job.recipe)) and "MODEL_DIR" in job.inputs
    assert job.cards == [4, 5, 6, 7]
    # the cards' slot moves the ports the user did not set (trainbox.launch.ports)
    assert job.ports["MASTER_PORT"] == job.sets["MASTER_PORT"] != str(job.inputs["MASTER_PORT"].default)
    fixed = job_module.resolve("cpu-ddp", sets={"MASTER_PORT": "23456"})
    assert fixed.ports["MASTER_PORT"] == "23456" and fixed.cards is None


def test_the_args_check_plan_reads_the_job_s_inputs(counts):
    """`launch check --args` fills the command's words from the resolved job, not from a second computation."""
    from trainbox.launch.recipecheck import plan

    check = plan(job_module.resolve("cpu-ddp", require_inputs=False, host_paths=False))
    assert check.recipe == "cpu-ddp"
    assert counts == {"all_inputs": 1, "jobs": 1}
