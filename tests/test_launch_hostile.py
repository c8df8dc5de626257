"""Rendered launcher scripts run for real under bash, with hostile values in every user value.

The programs a job starts (torchrun, ray, megatron, the workload's python3) are stand-ins on PATH that
record their argv, environment and working directory; `python3 -c` / `python3 -` still run the real
interpreter (the script uses it for preflight checks and to JSON-encode the Ray runtime env). The stand-in
`ray` runs the submitted entrypoint like Ray's job supervisor does. Nothing may execute, every value must
arrive intact, and errors must be clear.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from trainbox.runtime.dist import hccl_socket_port_env
from trainbox.launch import StackInfo, load_stack_info, render_script
from trainbox.launch.recipe import all_inputs, list_recipes, load_recipe

# Stand-ins for the programs a job runs (see the module docstring). Standard library only, so `-S`: no site
# (its .pth imports were half of each stand-in's start-up CPU, and a job starts several).
STUB = """\
#!{python} -S
import json, os, signal, subprocess, sys, time
name = os.path.basename(sys.argv[0])
if name == "python3" and len(sys.argv) > 1 and sys.argv[1] in ("-c", "-"):
    os.execv({python!r}, [{python!r}] + sys.argv[1:])
log = os.environ["STUB_LOG"]

def record(kind, **extra):
    rec = {{"name": name, "kind": kind, "argv": sys.argv[1:], "cwd": os.getcwd(), "env": dict(os.environ), **extra}}
    path = os.path.join(log, f"{{time.time_ns()}}-{{os.getpid()}}-{{name}}.json")
    with open(path + ".part", "w") as fh:  # whole or not at all: a test may read it while the stub runs on
        json.dump(rec, fh)
    os.replace(path + ".part", path)

if name == "ray" and sys.argv[1:3] == ["job", "list"]:
    sys.exit(1 if os.environ.get("STUB_RAY_START_FAIL") else 0)  # no head, no job API
record("call")
if name == "ray" and sys.argv[1:2] == ["start"] and "--block" in sys.argv:
    if os.environ.get("STUB_RAY_START_FAIL"):
        sys.exit(1)
    signal.signal(signal.SIGTERM, lambda *a: (record("terminated"), sys.exit(0)))
    time.sleep(3600)  # until the job script terminates it (a test waits at most its hang guard)
    sys.exit(0)
if name == "ray" and sys.argv[1:3] == ["job", "submit"]:
    rc = subprocess.call(sys.argv[sys.argv.index("--") + 1:])
    sys.exit(int(os.environ.get("STUB_JOB_RC", rc)))
sys.exit(0)
"""
WORKLOAD_STUBS = ("torchrun", "ray", "megatron", "python3")


@pytest.fixture
def stubs(tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name in WORKLOAD_STUBS:
        p = bindir / name
        p.write_text(STUB.format(python=sys.executable))
        p.chmod(0o755)
    log = tmp_path / "log"
    log.mkdir()
    return bindir, log


def run_script(script: str, tmp_path: Path, stubs, env: dict[str, str] | None = None, timeout: int = 300):
    bindir, log = stubs
    path = tmp_path / "job.sh"
    path.write_text(script)
    base = {"PATH": f"{bindir}:/usr/bin:/bin", "HOME": str(tmp_path), "STUB_LOG": str(log),
            "TRAINBOX_SKIP_PREFLIGHT": "1", "LANG": "C.UTF-8"}
    proc = subprocess.run(["bash", str(path)], env={**base, **(env or {})}, capture_output=True, text=True,
                          timeout=timeout, cwd=tmp_path)
    records = [json.loads(p.read_text()) for p in sorted(log.glob("*.json"))]
    return proc, records


def hostile(name: str, marker: Path) -> str:
    return f"{name} sp ace'q\"d$(touch {marker})`touch {marker}`;x*\nline2 $HOME"


def prepare_values(recipe, tmp_path: Path, marker: Path) -> dict[str, str]:
    """A hostile value for every path / string input (created on disk where the script checks for it)."""
    values: dict[str, str] = {}
    inputs = all_inputs(recipe)
    for name, spec in inputs.items():
        if spec.kind == "path":
            values[name] = str(tmp_path / "in" / hostile(name, marker))
        elif spec.kind == "string":
            values[name] = f"args dir/{hostile(name, marker)}.sh"
    values["MASTER_PORT"] = "29611"
    for name, spec in inputs.items():
        if spec.kind == "path" and spec.mount == "ro":
            Path(values[name]).mkdir(parents=True, exist_ok=True)
    if recipe.workdir and recipe.workdir.startswith("${CODE_DIR}/"):  # a folder of the checkout (Twinkle cookbook)
        (Path(values["CODE_DIR"]) / recipe.workdir.removeprefix("${CODE_DIR}/")).mkdir(parents=True, exist_ok=True)
    for src in recipe.source:  # the model-args file a Relax recipe sources from its code directory
        if src.path == "${CODE_DIR}/${MODEL_ARGS_FILE}":
            f = Path(values["CODE_DIR"]) / values["MODEL_ARGS_FILE"]
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text("MODEL_ARGS=(--num-layers 2 --swiglu)\n")
    return values


def workload(recipe, records):
    if recipe.launcher == "torchrun":
        return [r for r in records if r["name"] == "torchrun"]
    if recipe.launcher == "exec":
        first = str(recipe.command[0]).split()[0]
        return [r for r in records if r["name"] == first]
    return [r for r in records if r["name"] == "python3"]


@pytest.mark.parametrize("mode", ["set", "env"])
@pytest.mark.parametrize("name", list_recipes())
def test_hostile_values_arrive_intact_and_nothing_executes(name, mode, tmp_path, stubs):
    recipe = load_recipe(name)
    stack = load_stack_info(recipe.stack)
    marker = tmp_path / "pwned"
    values = prepare_values(recipe, tmp_path, marker)
    if mode == "set":
        script, env = render_script(recipe, stack, values), {}
    else:
        script, env = render_script(recipe, stack), values
    proc, records = run_script(script, tmp_path, stubs, env)
    assert proc.returncode == 0, proc.stderr
    assert not marker.exists(), "a value was executed"

    runs = workload(recipe, records)
    assert len(runs) == 1, [r["name"] for r in records]
    job = runs[0]
    inputs = all_inputs(recipe)
    for key, value in values.items():
        assert job["env"][key] == value, key  # every input is exported, byte for byte
    words = [w for item in recipe.command for w in (item if isinstance(item, list) else [item])]
    for key in values:
        if f"${{{key}}}" in " ".join(words):
            assert any(value_in(values[key], arg) for arg in job["argv"]), (key, job["argv"])
    if recipe.workdir == "${CODE_DIR}":
        assert os.path.realpath(job["cwd"]) == os.path.realpath(values["CODE_DIR"])
    for key, spec in inputs.items():
        if spec.create:
            assert Path(values[key]).is_dir(), f"{key} was not created"
    if any(s.arrays for s in recipe.source):
        assert "--swiglu" in job["argv"]  # the sourced array reached the command

    visible = {"npu": "ASCEND_RT_VISIBLE_DEVICES", "cuda": "CUDA_VISIBLE_DEVICES"}.get(stack.device)
    if visible:
        assert job["env"][visible] == ",".join(str(i) for i in range(recipe.devices_per_node))
    if stack.device == "npu":
        # the launcher and trainbox.runtime.dist derive the same per-job HCCL ports from MASTER_PORT, per chip
        want = hccl_socket_port_env(29611, environ={}, chip=stack.chip or "")
        for k, v in want.items():
            assert job["env"][k] == v
    for key, value in recipe.env.items():
        if "$" not in value:
            assert job["env"][key] == value, key

    if recipe.launcher == "ray":
        head = [r for r in records
                if r["name"] == "ray" and r["kind"] == "call" and r["argv"][:2] == ["start", "--head"]]
        assert len(head) == 1
        argv = head[0]["argv"]
        assert argv[argv.index("--dashboard-host") + 1] == "127.0.0.1"
        assert argv[argv.index("--port") + 1] == "9500"  # trainbox.launch.ports RUN_BASES
        assert [r for r in records if r["kind"] == "terminated"], "our Ray head was not stopped"
        submit = [r for r in records if r["argv"][:2] == ["job", "submit"]][0]
        renv = json.loads(submit["argv"][submit["argv"].index("--runtime-env-json") + 1])["env_vars"]
        for key, value in recipe.env.items():
            if "$" not in value:
                assert renv[key] == value
        if stack.device == "npu":
            assert renv["RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES"] == "1"
            assert head[0]["env"]["RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES"] == "1"
            # carried when the stack or the recipe sets one; the relax stack empties it (the seed's colocated runs
            # have none), its async recipe sets the seed's expandable segments
            wanted = recipe.env.get("PYTORCH_NPU_ALLOC_CONF") or stack.env.get("PYTORCH_NPU_ALLOC_CONF")
            assert ("PYTORCH_NPU_ALLOC_CONF" in renv) == bool(wanted), name
        # our Ray temp dir (it held the entrypoint script) is gone
        assert not any(Path(a).exists() for a in submit["argv"] if a.startswith("/tmp/trainbox-ray."))


def value_in(value: str, arg: str) -> bool:
    return arg == value or arg.startswith(value + "/") or value in arg


def test_missing_inputs_are_all_named_and_nothing_runs(tmp_path, stubs):
    recipe = load_recipe("relax-qwen3-4b-4npu-colocate")
    proc, records = run_script(render_script(recipe, load_stack_info(recipe.stack)), tmp_path, stubs)
    assert proc.returncode == 2
    for name in ("MODEL_DIR", "REF_LOAD", "DATA_PATH", "CKPT_DIR"):
        assert f"  {name} (path, mounted " in proc.stderr
    assert "CODE_DIR" not in proc.stderr  # Relax is in the image: CODE_DIR defaults to its tree
    assert "--set NAME=VALUE" in proc.stderr
    assert records == []


@pytest.mark.parametrize("key,value,needle", [
    ("MASTER_PORT", "1; touch {marker}", "expected a port number"),
    ("MASTER_PORT", "a[$(touch {marker})]", "expected a port number"),
    ("MASTER_PORT", "70000", "expected a port number"),
    ("NODE_RANK", "x[$(touch {marker})]", "expected a non-negative integer"),
    ("NODE_RANK", "3", "this job has 1 node(s)"),
    ("MASTER_ADDR", "$(touch {marker})", "expected a host name"),
    ("STEPS", "1e3", "expected a non-negative integer"),
])
def test_typed_inputs_from_the_environment_are_checked(key, value, needle, tmp_path, stubs):
    marker = tmp_path / "pwned"
    recipe = load_recipe("cpu-ddp")
    proc, records = run_script(render_script(recipe, load_stack_info("cpu")), tmp_path, stubs,
                               {key: value.format(marker=marker)})
    assert proc.returncode == 2
    assert needle in proc.stderr
    assert not marker.exists()
    assert records == []


def custom(tmp_path: Path, body: str):
    p = tmp_path / "custom.yaml"
    p.write_text(textwrap.dedent(body))
    return load_recipe(p)


def test_preflight_failure_stops_the_job_with_its_hint(tmp_path, stubs):
    recipe = custom(tmp_path, """\
        description: t
        stack: cpu
        launcher: exec
        devices_per_node: 1
        preflight:
          - {name: widget, python: "import sys; sys.exit('no widget here')", hint: install the widget}
        command: [python3 work.py]
        """)
    proc, records = run_script(render_script(recipe, StackInfo("cpu", "cpu")), tmp_path, stubs,
                               {"TRAINBOX_SKIP_PREFLIGHT": "0"})
    assert proc.returncode == 2
    assert "no widget here" in proc.stderr and "preflight widget failed: install the widget" in proc.stderr
    assert records == []


def test_vendor_scripts_run_without_strict_mode_and_missing_ones_are_named(tmp_path, stubs):
    vendor = tmp_path / "set_env.sh"
    # what CANN's set_env.sh does: reads unset variables, runs commands that fail
    vendor.write_text('export VENDOR_HOME="${ASCEND_UNSET_THING}/x"\nfalse\nexport VENDOR_OK=1\n')
    recipe = custom(tmp_path, f"""\
        description: t
        stack: cpu
        launcher: exec
        devices_per_node: 1
        inputs:
          VENDOR: {{description: the vendor script, kind: path, default: {vendor}}}
        source:
          - {{path: "${{VENDOR}}"}}
          - {{path: /nonexistent/optional.sh, optional: true}}
        command:
          - python3 work.py --unset-after "${{STILL_UNSET:-}}"
        """)
    script = render_script(recipe, StackInfo("cpu", "cpu"))
    proc, records = run_script(script, tmp_path, stubs)
    assert proc.returncode == 0, proc.stderr
    assert records[0]["env"]["VENDOR_OK"] == "1" and records[0]["env"]["VENDOR_HOME"] == "/x"
    proc, records = run_script(script, tmp_path, stubs, {"VENDOR": str(tmp_path / "gone.sh")})
    assert proc.returncode == 2 and "no such file to source: " + str(tmp_path / "gone.sh") in proc.stderr


def test_ray_head_that_dies_is_reported(tmp_path, stubs):
    recipe = load_recipe("ray-cpu")
    proc, records = run_script(render_script(recipe, load_stack_info("cpu")), tmp_path, stubs,
                               {"STUB_RAY_START_FAIL": "1"})
    assert proc.returncode == 2
    assert "the Ray head exited before its job API came up" in proc.stderr
    assert not [r for r in records if r["argv"][:2] == ["job", "submit"]]


def test_ray_job_exit_code_is_the_script_s_and_the_head_is_stopped(tmp_path, stubs):
    recipe = load_recipe("ray-cpu")
    proc, records = run_script(render_script(recipe, load_stack_info("cpu")), tmp_path, stubs,
                               {"STUB_JOB_RC": "3"})
    assert proc.returncode == 3
    assert [r for r in records if r["kind"] == "terminated"]


def test_ray_worker_node_joins_the_head(tmp_path, stubs):
    recipe = load_recipe("relax-qwen3-4b-4npu-colocate", nodes=2)
    values = prepare_values(recipe, tmp_path, tmp_path / "pwned")
    values.update({"MASTER_ADDR": "10.0.0.1", "NODE_RANK": "1", "RAY_PORT": "7000"})
    env = {"STUB_LOG": str(stubs[1])}
    script = render_script(recipe, load_stack_info(recipe.stack), {k: v for k, v in values.items() if k != "NODE_RANK"})
    bindir, log = stubs
    # the worker's `ray start --block` would wait for the head: the stand-in returns when terminated,
    # so run it in the background and stop it once it recorded its call
    path = tmp_path / "job.sh"
    path.write_text(script)
    proc = subprocess.Popen(["bash", str(path)], env={"PATH": f"{bindir}:/usr/bin:/bin", "NODE_RANK": "1",
                                                      "TRAINBOX_SKIP_PREFLIGHT": "1", **env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        import time

        deadline = time.monotonic() + 120  # a hang guard: the (whole) record is the event
        while not list(log.glob("*.json")) and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        proc.terminate()
        proc.communicate(timeout=120)
    rec = json.loads(sorted(log.glob("*.json"))[0].read_text())
    assert rec["name"] == "ray" and rec["argv"][:3] == ["start", "--address", "10.0.0.1:7000"]
    assert rec["argv"][rec["argv"].index("--node-manager-port") + 1] == "7002"
    assert "--head" not in rec["argv"]
    assert rec["env"]["RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES"] == "1"
