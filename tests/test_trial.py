"""`trainbox trial` without an engine: the overlay (validated, applied to the recipe as a recipe of its own), the
container it would start (CPU mode: no cards, the monitor mounted), the step monitor in a real torch process, the
artifacts' data formats, and how a run's records become one line (passed N steps / stopped at file:line)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainbox.launch.trial import MONITOR_IN_IMAGE, PTH_NAME, docker_argv, plan_trial
from trainbox.launch.trialplan import edit_code, overlay_of, refs, replace_args
from trainbox.launch.trialresult import judge, meaning, read_monitor, traceback_in
from trainbox.paths import REPO_ROOT
from trainbox.launch.recipe import RecipeError, load_recipe
from trainbox.runtime import trialkit
from trainbox.runtime.errors import TrainboxError

SPECFORGE = "specforge-domino-qwen35-4b-npu"
TWINKLE_SP = "twinkle-fsdp-ulysses-qwen35-4b-4a3"
MONITOR = REPO_ROOT / "python" / "trainbox" / "runtime" / "trialmon.py"


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINBOX_CACHE", str(tmp_path / "cache"))


def _recipe(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / f"{name}.yaml"
    p.write_text(text)
    return p


BASE = """description: a test recipe
stack: cpu
launcher: torchrun
devices_per_node: 2
inputs:
  STEPS: {description: steps, kind: int, default: 30}
command:
  - ${TRAINBOX_LAUNCHERS}/jobs/cpu_ddp.py --steps ${STEPS} --lr 0.05
"""


@pytest.mark.parametrize("name", ["cpu-ddp", SPECFORGE, TWINKLE_SP])
def test_the_seed_overlays_validate(name):
    ov = overlay_of(load_recipe(name))
    assert ov.why and ov.steps >= 2 and ov.ranks >= 2


def test_a_recipe_without_an_overlay_is_one_clear_line():
    with pytest.raises(TrainboxError, match="declares no trial"):
        overlay_of(load_recipe("ray-cpu"))


def test_an_overlay_option_must_be_one_the_command_has(tmp_path):
    path = _recipe(tmp_path, "t-args", BASE + "trial: {why: x, args: {--batch: '4'}}\n")
    with pytest.raises(RecipeError, match=r"trial.args: --batch is not an option of the recipe's command"):
        overlay_of(load_recipe(path))
    ok = _recipe(tmp_path, "t-args-ok", BASE + "trial: {why: x, args: {--lr: '0.1'}}\n")
    assert overlay_of(load_recipe(ok)).args == {"--lr": "0.1"}


def test_unknown_overlay_keys_and_artifacts_are_refused(tmp_path):
    with pytest.raises(RecipeError, match="trial"):
        overlay_of(load_recipe(_recipe(tmp_path, "t-key", BASE + "trial: {why: x, stepz: 2}\n")))
    with pytest.raises(RecipeError, match="artifacts are"):
        overlay_of(load_recipe(_recipe(tmp_path, "t-art", BASE + "trial: {why: x, artifacts: {weights: {}}}\n")))


def test_a_fixed_world_size_is_kept(tmp_path):
    text = BASE.replace("devices_per_node: 2", "devices_per_node: 4") + \
        "scaling: {world_size: fixed, mesh: the script's DeviceMesh}\ntrial: {why: x, ranks: 2}\n"
    with pytest.raises(RecipeError, match="fixes its world size at 4"):
        overlay_of(load_recipe(_recipe(tmp_path, "t-fixed", text)))
    # a remesh said without code edits that would make it is refused too
    with pytest.raises(RecipeError, match="say how in trial.remesh"):
        overlay_of(load_recipe(_recipe(tmp_path, "t-said", text.replace("ranks: 2}", "ranks: 2, remesh: m}"))))


def test_a_fixed_world_size_is_remeshed_by_code_edits_that_say_so():
    """Twinkle's SP script fixes a 4-rank mesh; its overlay re-cuts it for 2 ranks in the script's own constants."""
    recipe = load_recipe(TWINKLE_SP)
    ov = overlay_of(recipe)
    assert recipe.scaling.world_size == "fixed" and recipe.world_size == 4 and ov.ranks == 2
    edits = ov.code["cookbook/transformers/sp_fsdp_dense.py"]
    assert ov.remesh and edits["nproc_per_node=4,"] == "nproc_per_node=2,"
    assert edits["mesh=np.arange(4).reshape(2, 2),"] == "mesh=np.arange(2).reshape(1, 2),"


def test_replace_args_changes_values_only():
    out = replace_args(["a.py --x 1 --y 2", ["--z", "3"]], {"--y": "20", "--z": "30"})
    assert out == [["a.py", "--x", "1", "--y", "20"], ["--z", "30"]]


def test_references_to_artifacts_and_the_run():
    made = {"model": "/c/a/model", "files.draft": "/c/a/draft.json"}
    assert refs("@model", made, "/r") == "/c/a/model"
    assert refs("@run/out/x", made, "/r") == "/r/out/x"
    assert refs('glob("@run/out/e*")', made, "/r") == 'glob("/r/out/e*")'
    assert refs("@files.draft", made, "/r") == "/c/a/draft.json"
    with pytest.raises(TrainboxError, match="make no data"):
        refs("@data", made, "/r")


def test_code_edits_must_match_exactly_once(tmp_path):
    tree = tmp_path / "tree"
    (tree / "cookbook").mkdir(parents=True)
    script = tree / "cookbook" / "x.py"
    script.write_text("MODEL = 'ms://big'\nN = 4\nM = 4\n")
    done = edit_code(tree, {"cookbook/x.py": {"MODEL = 'ms://big'": "MODEL = '@model'"}},
                     lambda v: v.replace("@model", "/tiny"))
    assert script.read_text().startswith("MODEL = '/tiny'") and len(done) == 1
    with pytest.raises(TrainboxError, match=r"'= 4' found 2 times"):
        edit_code(tree, {"cookbook/x.py": {"= 4": "= 2"}}, str)
    with pytest.raises(TrainboxError, match="found 0 times"):
        edit_code(tree, {"cookbook/x.py": {"nothing": "x"}}, str)
    with pytest.raises(TrainboxError, match="no such file"):
        edit_code(tree, {"../escape.py": {"a": "b"}}, str)


def test_the_overlaid_recipe_and_its_cpu_mode_container(tmp_path):
    """SpecForge's NPU recipe on a host without cards: 2 ranks, its options changed by the overlay only, no
    device or memlock option, TRAINBOX_DEVICE=cpu, the monitor and its .pth mounted, artifacts read-only."""
    plan = plan_trial(SPECFORGE, image="trainbox/specforge:any", cpu=True, run_dir=tmp_path / "run")
    recipe = load_recipe(plan.recipe_file)
    assert recipe.devices_per_node == 2 and recipe.trial is None
    words = [w for item in recipe.command for w in item]
    assert words[words.index("--max-length") + 1] == "256"
    assert words[words.index("--draft-config-path") + 1] == plan.made["files.draft_config"]
    assert words[words.index("--accumulation-steps") + 1] == "4"  # the recipe's own, untouched
    argv = docker_argv(plan, "/opt/venv/lib/python3.11/site-packages", "docker")
    text = " ".join(argv)
    assert "--device" not in argv and "memlock" not in text and "--shm-size" in argv
    for env in ("TRAINBOX_DEVICE=cpu", "TRAINBOX_SKIP_PREFLIGHT=1", "SPECFORGE_DATA_NUM_PROC=1",
                f"TRAINBOX_TRIAL_DIR={tmp_path / 'run' / 'monitor'}"):
        assert env in argv, env
    assert not any(a.startswith(("ASCEND_RT_VISIBLE_DEVICES=", "TRAINBOX_DEVICES=")) for a in argv)
    assert f"target={MONITOR_IN_IMAGE},readonly" in text
    assert f"target=/opt/venv/lib/python3.11/site-packages/{PTH_NAME},readonly" in text
    assert f"source={plan.artifacts},target={plan.artifacts},readonly" in text
    assert f"target={tmp_path / 'run' / 'out'}" in text or str(tmp_path / "run") in text
    assert argv[-3:] == ["trainbox/specforge:any", "bash", "/opt/trainbox/job.sh"]
    script = plan.script_path.read_text()
    assert "--nproc-per-node" in script and "--max-length 256" in script


def _monitored(tmp_path: Path, code: str, **env) -> subprocess.CompletedProcess:
    pth_like = ("import importlib.util as u, sys; s = u.spec_from_file_location('trainbox_trial_monitor', "
                f"{str(MONITOR)!r}); m = u.module_from_spec(s); sys.modules[s.name] = m; s.loader.exec_module(m)\n")
    return subprocess.run([sys.executable, "-c", pth_like + code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TRAINBOX_TRIAL_DIR": str(tmp_path), "RANK": "0", **env})


TRAIN = """
import torch
m = torch.nn.Linear(4, 1); opt = torch.optim.SGD(m.parameters(), lr=0.1)
for i in range(3):
    for j in range(2):
        loss = m(torch.ones(2, 4)).pow(2).mean(); loss.backward()
    opt.step(); opt.zero_grad()
"""


def test_the_monitor_records_steps_losses_and_the_exception(tmp_path):
    pytest.importorskip("torch")
    proc = _monitored(tmp_path, TRAIN + "raise KeyError('conversations')\n")
    assert proc.returncode == 1 and "[trainbox trial] step 3 loss" in proc.stderr, proc.stderr[-2000:]
    mon = read_monitor(tmp_path)
    steps = mon["steps"]["0"]
    assert [s["step"] for s in steps] == [1, 2, 3] and all(s["backward_calls"] == 2 for s in steps)
    assert all(isinstance(s["loss"], float) and s["finite"] for s in steps)
    err = mon["errors"][0]
    assert err["type"] == "KeyError" and err["after_steps"] == 3
    res = judge(mon, 1, 2, proc.stderr, False)
    assert res["result"] == "stopped" and res["line"].startswith("stopped at <string>:")
    assert "a field the code reads is missing" in res["line"] and "conversations" in res["line"]


def test_the_monitor_stops_the_job_after_its_steps(tmp_path):
    pytest.importorskip("torch")
    proc = _monitored(tmp_path, TRAIN + "raise SystemExit('never reached')\n", TRAINBOX_TRIAL_STOP_AFTER="2")
    assert proc.returncode == 0, proc.stderr[-2000:]
    mon = read_monitor(tmp_path)
    assert len(mon["steps"]["0"]) == 2 and mon["stopped"] == [{"rank": "0", "step": 2}]
    assert judge(mon, 0, 2, "", False)["line"].endswith("(stopped by the trial after its last step)")


def _mon(tmp_path: Path, steps: dict[str, list], errors: dict[str, dict] | None = None) -> dict:
    for rank, rows in steps.items():
        (tmp_path / f"steps-{rank}.jsonl").write_text("".join(json.dumps({"rank": rank, **r}) + "\n" for r in rows))
    for rank, err in (errors or {}).items():
        (tmp_path / f"error-{rank}.json").write_text(json.dumps({"rank": rank, **err}))
    return read_monitor(tmp_path)


def test_judge_passes_finite_steps_and_stops_at_nan(tmp_path):
    ok = _mon(tmp_path / "a" if (tmp_path / "a").mkdir() is None else tmp_path,
              {"0": [{"step": 1, "loss": 2.0, "finite": True}, {"step": 2, "loss": 1.5, "finite": True}]})
    assert judge(ok, 0, 2, "", False)["line"] == "passed 2 steps (loss 2 -> 1.5, finite)"
    assert judge(ok, 0, 3, "", False)["line"].startswith("stopped: the job ended after 2 of 3 steps")
    (tmp_path / "b").mkdir()
    nan = _mon(tmp_path / "b", {"1": [{"step": 1, "loss": float("nan"), "finite": False}]})
    assert "loss is nan (not finite)" in judge(nan, 0, 1, "", False)["line"]


def test_judge_names_the_workload_frame_not_torch_s(tmp_path):
    frames = [{"file": "/opt/src/megatron/training.py", "line": 10, "function": "main"},
              {"file": "/opt/venv/lib/python3.11/site-packages/megatron/core/utils.py", "line": 42, "function": "f"},
              {"file": "/opt/venv/lib/python3.11/site-packages/torch/cuda/__init__.py", "line": 300,
               "function": "_lazy_init"}]
    mon = _mon(tmp_path, {}, {"0": {"type": "AssertionError", "message": "Torch not compiled with CUDA enabled",
                                    "frames": frames}})
    res = judge(mon, 1, 2, "", False)
    assert res["line"].startswith("stopped at megatron/core/utils.py:42: AssertionError: Torch not compiled")
    assert "asks for a CUDA device" in res["line"] and "raised in torch/cuda/__init__.py:300" in res["line"]
    assert res["stopped_at"]["line"] == 42


def test_a_worker_that_exits_without_an_exception_is_named(tmp_path):
    agent = {"type": "ChildFailedError", "frames": [{"file": "/opt/venv/bin/torchrun", "line": 8, "function": "m"}],
             "message": "Failures:\n[1]:\n rank : 1 (local_rank: 1)\n exitcode : 1\nRoot Cause (first observed "
                        "failure):\n[0]:\n  rank      : 0 (local_rank: 0)\n  exitcode  : 1 (pid: 12)"}
    mon = _mon(tmp_path, {"0": [{"step": 1, "loss": 1.0, "finite": True}]}, {"pid7": agent})
    out = "step 0 loss 1.0\ncpu-ddp: loss did NOT fall enough\n[trainbox trial] step 1 loss 1\nE1127 x failed (exitcode"
    line = judge(mon, 1, 2, out, False)["line"]
    assert line == ("stopped: rank 0 exited with status 1 after 1 step(s), no Python exception (its last words: "
                    "cpu-ddp: loss did NOT fall enough)")


def test_a_traceback_in_the_output_is_the_fallback():
    out = ("[default0]:Traceback (most recent call last):\n"
           '[default0]:  File "/opt/src/relax/train.py", line 7, in <module>\n'
           "[default0]:    import ray\n[default0]:ModuleNotFoundError: No module named 'ray'\n")
    err = traceback_in(out)
    assert err["type"] == "ModuleNotFoundError" and err["frames"][-1]["line"] == 7
    assert meaning(err["type"], err["message"]).startswith("the image lacks the Python module ray")
    assert meaning("ModuleNotFoundError", "No module named 'torch_npu'").startswith("Ascend's device-only stack")
    assert meaning("ModuleNotFoundError", "import of transformer_engine halted; None in sys.modules") == (
        "CPU mode hides transformer_engine (it needs CANN or a GPU driver to load): this code imports it without a "
        "CPU fallback")


def test_trialkit_writes_each_data_format_and_can_drop_a_field(tmp_path):
    path = trialkit.make_data({"format": "sharegpt-jsonl", "samples": 4, "words": 8}, str(tmp_path / "a"))
    rows = [json.loads(x) for x in Path(path).read_text().splitlines()]
    assert len(rows) == 4 and [m["role"] for m in rows[0]["conversations"]] == ["user", "assistant"]
    path = trialkit.make_data({"format": "query-response-jsonl", "samples": 2}, str(tmp_path / "b"))
    assert set(json.loads(Path(path).read_text().splitlines()[0])) == {"query", "response"}
    path = trialkit.make_data({"samples": 2, "drop_fields": ["conversations"]}, str(tmp_path / "c"))
    assert set(json.loads(Path(path).read_text().splitlines()[0])) == {"id"}
    with pytest.raises(ValueError, match="known formats"):
        trialkit.make_data({"format": "parquet"}, str(tmp_path / "d"))


def test_launch_check_validates_a_trial_overlay(tmp_path, capsys):
    from trainbox.cli import main

    bad = _recipe(tmp_path, "t-check", BASE + "trial: {why: x, args: {--nope: '1'}}\n")
    assert main(["launch", "check", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "trial: " in err and "trial.args: --nope is not an option of the recipe's command" in err


def test_old_runs_of_a_recipe_are_pruned(tmp_path):
    from trainbox.launch.trial import prune_runs, trial_root

    runs = trial_root() / "runs"
    for i in range(4):
        d = runs / f"cpu-ddp-2026010{i}T000000-1"
        d.mkdir(parents=True)
        os.utime(d, (i, i))
    (runs / "cpu-ddp-broken-20260101T000000-1").mkdir()
    prune_runs("cpu-ddp", keep=2)
    assert sorted(p.name for p in runs.iterdir()) == ["cpu-ddp-20260102T000000-1", "cpu-ddp-20260103T000000-1",
                                                      "cpu-ddp-broken-20260101T000000-1"]


def test_a_cpu_trial_takes_a_port_slot_that_is_free(tmp_path, monkeypatch):
    """CPU mode has no card to derive the port slot from: two trials at once (the smoke runs two stacks at a time)
    took MASTER_PORT 16400 both, and the second failed to listen. A trial takes the first free slot of `trainbox
    run`'s range from one derived from its process; here that slot's port is held, so it must move on."""
    import socket

    from trainbox.launch.ports import RUN_BASES, RUN_SLOTS, STRIDE

    monkeypatch.setenv("TRAINBOX_CACHE", str(tmp_path / "cache"))
    held = RUN_BASES["MASTER_PORT"] + STRIDE * (os.getpid() % RUN_SLOTS)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", held))
        sock.listen(1)
        port = int(plan_trial("cpu-ddp").job.sets["MASTER_PORT"])
    assert port != held and (port - RUN_BASES["MASTER_PORT"]) % STRIDE == 0
    assert plan_trial("cpu-ddp", sets={"MASTER_PORT": "16555"}).job.sets["MASTER_PORT"] == "16555"  # the caller's


def test_two_cpu_trials_planned_before_either_job_listens_take_different_slots():
    """The smoke's swift trial failed with EADDRINUSE on 16460: two trials found the same slot free, since neither
    job listened yet when the other probed. A trial holds its slot's claim until its job has ended; here both plans
    come from one process (the same first slot) with nothing listening, and the second must move on. Once the
    first's claim is let go (its job ended), its slot is free again."""
    first = plan_trial("cpu-ddp")
    second = plan_trial("cpu-ddp")
    a, b = first.job.sets["MASTER_PORT"], second.job.sets["MASTER_PORT"]
    assert a != b, (a, b)
    first.port_claim.release()
    assert plan_trial("cpu-ddp").job.sets["MASTER_PORT"] == a
    second.port_claim.release()
