"""The job model and its targets, without Docker or a cluster: one resolved job, the sbatch script's
scheduler plumbing, ports derived from the cards, the caller's environment over recipe defaults, the
scale options, and the image choice that never silently takes a substitute-built image."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from trainbox.launch import plan_run, render_script
from trainbox.launch.images import choose_image
from trainbox.launch.job import load_stack_info, resolve
from trainbox.launch.targets import TARGETS, render_target, resolve_for
from trainbox.launch.recipe import load_recipe
from trainbox.runtime.errors import TrainboxError

RELAX = {"CODE_DIR": "/src/Relax", "MODEL_DIR": "/data/m", "REF_LOAD": "/data/r", "DATA_PATH": "/data/d.jsonl",
         "EVAL_DATA_PATH": "/data/e.jsonl", "CKPT_DIR": "/ckpt/run1"}


@pytest.fixture(autouse=True)
def _job_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINBOX_CACHE", str(tmp_path / "cache"))


def test_every_target_is_listed_and_unknown_ones_are_refused():
    assert set(TARGETS) == {"docker", "slurm", "slurm-pyxis", "ascendjob", "volcano", "pytorchjob", "rayjob"}
    with pytest.raises(TrainboxError, match="--target 'nomad': expected one of"):
        resolve_for("nomad", "cpu-ddp")


def test_sbatch_maps_slurm_variables_and_derives_ports():
    job = resolve_for("slurm", "cpu-ddp", nodes=2, nproc_per_node=1, image="img:1")
    text = render_target(job, "slurm")
    assert "#SBATCH --nodes=2" in text and "#SBATCH --ntasks-per-node=1" in text
    assert 'scontrol show hostnames "$SLURM_JOB_NODELIST"' in text and "NodeAddr=" in text
    assert "export MASTER_PORT=${MASTER_PORT:-$(( 13400 + port_slot * 10 ))}" in text
    assert "port_slot=$(( SLURM_JOB_ID % 300 ))" in text
    assert "export NODE_RANK=$SLURM_NODEID" in text and "-e TRAINBOX_SCHEDULER" in text
    assert 'docker stop --time 20 "$name"' in text and "label=trainbox.slurm.job=$SLURM_JOB_ID" in text
    assert "--network host" in text and "img:1 bash /opt/trainbox/job.sh" in text


def test_cluster_targets_refuse_what_the_scheduler_owns():
    with pytest.raises(TrainboxError, match="Slurm tells each node"):
        render_target(resolve_for("slurm", "cpu-ddp", sets={"MASTER_ADDR": "10.0.0.1"}, nodes=2), "slurm")
    with pytest.raises(TrainboxError, match="needs these inputs"):
        resolve_for("slurm", "relax-qwen3-4b-4npu-colocate")


def _two_node_script_with_stub_torchrun(tmp_path, body: str):
    """cpu-ddp's two-node job script and an environment whose torchrun is a stand-in running `body`. The script
    runs on this host, not in an image, so the entry preflight is skipped."""
    script = tmp_path / "job.sh"
    script.write_text(render_script(load_recipe("cpu-ddp", nodes=2, nproc_per_node=1), load_stack_info("cpu"), {}))
    stub = tmp_path / "bin"
    stub.mkdir()
    (stub / "torchrun").write_text(f"#!/bin/sh\n{body}\n")
    (stub / "torchrun").chmod(0o755)
    return script, dict(os.environ, PATH=f"{stub}:{os.environ['PATH']}", TRAINBOX_SKIP_PREFLIGHT="1")


def test_the_job_script_maps_operator_variables(tmp_path):
    """Run the rendered script's scheduler block with a stub torchrun: RANK becomes NODE_RANK, the operator's
    RANK/WORLD_SIZE do not leak to the launcher, a LOCAL_WORLD_SIZE that disagrees is refused."""
    script, env = _two_node_script_with_stub_torchrun(tmp_path, 'echo "torchrun $* RANK=${RANK-unset}"')
    base = dict(env, TRAINBOX_SCHEDULER="operator", MASTER_ADDR="10.1.2.3", MASTER_PORT="23456", WORLD_SIZE="2")
    out = subprocess.run(["bash", str(script)], env=dict(base, RANK="1", LOCAL_WORLD_SIZE="1"),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "--node-rank 1 --master-addr 10.1.2.3 --master-port 23456" in out.stdout and "RANK=unset" in out.stdout
    bad = subprocess.run(["bash", str(script)], env=dict(base, RANK="0", LOCAL_WORLD_SIZE="8"),
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "LOCAL_WORLD_SIZE=8" in bad.stderr


def test_ports_derive_from_the_cards():
    def env_of(devices):
        plan = plan_run("relax-qwen3-4b-4npu-colocate", sets=RELAX, devices=devices, image="img:1", dry_run=True)
        return plan.script, plan.job.sets

    _, low = env_of("0-3")
    script, high = env_of("4-7")
    assert "MASTER_PORT" not in low and high["MASTER_PORT"] == "16440"  # trainbox.launch.ports: 16400 + 10 * 4
    assert high["RAY_PORT"] == "9540" and high["RAY_DASHBOARD_PORT"] == "9840"
    assert "MASTER_PORT=16440" in script


def test_render_takes_devices_and_says_what_the_host_must_provide(tmp_path):
    out = subprocess.run([sys.executable, "-m", "trainbox.cli", "launch", "render", "relax-qwen3-4b-4npu-colocate",
                          "--devices", "4-7"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "MASTER_PORT=16440" in out.stdout
    assert "# The host must provide: Ascend driver" in out.stdout


def test_callers_environment_wins_over_recipe_defaults(tmp_path):
    recipe = load_recipe("cpu-ddp")
    text = render_script(recipe, load_stack_info("cpu"), {})
    assert 'if [[ -z "${OMP_NUM_THREADS+x}" ]]; then export OMP_NUM_THREADS=1; fi' in text
    forced = render_script(recipe, load_stack_info("cpu"), {"OMP_NUM_THREADS": "3"})
    assert "export OMP_NUM_THREADS=3" in forced


def test_cpu_process_count_and_nodes_are_first_class():
    job = resolve("cpu-ddp", nproc_per_node=3, require_inputs=False)
    assert job.per_node == 3 and job.recipe.layout()["DP"] == 3
    with pytest.raises(TrainboxError, match="--nproc-per-node 0"):
        resolve("cpu-ddp", nproc_per_node=0)
    with pytest.raises(TrainboxError, match="--nproc-per-node sets"):
        resolve("cpu-ddp", devices="0-1")
    with pytest.raises(TrainboxError, match="does not divide"):
        resolve("swift-megatron-qwen35-8npu", nproc_per_node=3, require_inputs=False)


class _FakeClient:
    def __init__(self, labels):
        self._labels = labels

    def image_exists(self, ref):
        return self._labels is not None

    def labels(self, ref):
        return self._labels


@pytest.mark.parametrize("device_recipe", ["relax-qwen3-4b-4npu-colocate"])
def test_substitute_built_image_is_never_taken_silently(device_recipe, monkeypatch):
    import trainbox.image.engine as engine

    job = resolve(device_recipe, sets=RELAX, check_paths=False)
    monkeypatch.setattr(engine, "find_client", lambda: _FakeClient({"io.trainbox.base.substituted": "local/debian"}))
    with pytest.raises(TrainboxError, match=f"substitute base local/debian.*--image trainbox/{job.stack.name}:latest"):
        choose_image(job, None)
    image, why = choose_image(job, None, allow_substitute=True)
    assert image == f"trainbox/{job.stack.name}:latest" and "substitute" in why  # the recipe's stack (relax)
    assert choose_image(job, "mine:1") == ("mine:1", "image mine:1 (--image)")
    monkeypatch.setattr(engine, "find_client", lambda: _FakeClient({}))
    assert "without pin overrides" in choose_image(job, None)[1]
    cpu = resolve("cpu-ddp", require_inputs=False)
    monkeypatch.setattr(engine, "find_client", lambda: _FakeClient({"io.trainbox.base.substituted": "local/debian"}))
    assert choose_image(cpu, None)[0] == "trainbox/cpu:latest"  # a CPU job runs fine on the substitute


def test_the_job_script_maps_volcano_and_slurm_variables(tmp_path):
    script, base = _two_node_script_with_stub_torchrun(tmp_path, 'echo "torchrun $*"')
    hosts = tmp_path / "node.host"
    hosts.write_text("job-node-0.job\njob-node-1.job\n")
    for k in ("NODE_RANK", "MASTER_ADDR", "RANK"):
        base.pop(k, None)
    vc = subprocess.run(["bash", str(script)], env=dict(base, TRAINBOX_SCHEDULER="volcano", VC_TASK_INDEX="1",
                                                        TRAINBOX_VC_HOSTFILE=str(hosts)),
                        capture_output=True, text=True, timeout=60)
    assert vc.returncode == 0, vc.stderr
    assert "--node-rank 1 --master-addr job-node-0.job" in vc.stdout
    sl = subprocess.run(["bash", str(script)], env=dict(base, TRAINBOX_SCHEDULER="slurm", SLURM_NODEID="1",
                                                        SLURM_NNODES="3", MASTER_ADDR="10.0.0.1"),
                        capture_output=True, text=True, timeout=60)
    assert sl.returncode == 2 and "Slurm gave 3 node(s)" in sl.stderr
    bad = subprocess.run(["bash", str(script)], env=dict(base, TRAINBOX_SCHEDULER="lsf"),
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "expected slurm, operator, volcano or kuberay" in bad.stderr


def test_recipe_env_beats_the_image_default_but_not_the_caller(tmp_path):
    """The stack's value may be baked in the image as ENV: equal to it means "not the caller's"."""
    recipe = load_recipe("relax-qwen3-4b-4npu-colocate")
    stack = load_stack_info(recipe.stack)
    assert stack.env["HCCL_CONNECT_TIMEOUT"] != recipe.env["HCCL_CONNECT_TIMEOUT"]
    text = render_script(recipe, stack, RELAX)
    start = text.index("# --- environment")
    block = text[start:min(i for i in (text.find(m, start) for m in ("\n# --- preflight", "\ncd -- ")) if i > 0)]
    probe = tmp_path / "env.sh"
    probe.write_text("set -euo pipefail\nCODE_DIR=/src/Relax MASTER_PORT=29500\n" + block + 'echo "T=$HCCL_CONNECT_TIMEOUT"\n')

    def timeout_with(value):
        env = {k: v for k, v in os.environ.items() if not k.startswith("HCCL_")} | {"TRAINBOX_SKIP_PREFLIGHT": "1"}
        if value is not None:
            env["HCCL_CONNECT_TIMEOUT"] = value
        out = subprocess.run(["bash", str(probe)], env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        return out.stdout.split("T=")[1].strip()

    assert timeout_with(None) == recipe.env["HCCL_CONNECT_TIMEOUT"]
    assert timeout_with(stack.env["HCCL_CONNECT_TIMEOUT"]) == recipe.env["HCCL_CONNECT_TIMEOUT"]  # image ENV
    assert timeout_with("3600") == "3600"  # the caller's


@pytest.mark.slow
def test_launch_check_lints_every_target():
    cli = [sys.executable, "-m", "trainbox.cli", "launch", "check"]
    ok = subprocess.run(cli + ["--target", "slurm", "--target", "slurm-pyxis", "--target", "ascendjob",
                               "--target", "rayjob", "cpu-ddp", "ray-cpu", "relax-qwen3-4b-4npu-colocate"],
                        capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr
    bad = subprocess.run(cli + ["--target", "nomad", "cpu-ddp"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--target 'nomad'" in bad.stderr
