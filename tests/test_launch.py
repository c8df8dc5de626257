"""`trainbox run` argv and `trainbox launch` commands: devices and driver mounts, volumes, environment,
quoting that pastes, multi-node plans. Nothing here needs Docker (dry runs only)."""

from __future__ import annotations

import csv
import io
import os
import shlex
import stat
import subprocess

import pytest

from trainbox.cli import main
from trainbox.runtime.errors import TrainboxError
from trainbox.launch import (
    NPU_CONTROL_DEVICES,
    NPU_DRIVER_MOUNTS,
    csv_field,
    format_plan,
    mount_arg,
    parse_devices,
    plan_run,
)

RELAX_INPUTS = {"CODE_DIR": "/src/Relax", "MODEL_DIR": "/data/Qwen3-4B", "REF_LOAD": "/data/Qwen3-4B_torch_dist",
                "DATA_PATH": "/data/dapo.jsonl", "EVAL_DATA_PATH": "/data/aime-2024.jsonl", "CKPT_DIR": "/ckpt/run1"}


@pytest.fixture(autouse=True)
def _job_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINBOX_CACHE", str(tmp_path / "cache"))


def pairs(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == flag]


def envs(argv: list[str]) -> dict[str, str]:
    return dict(e.split("=", 1) for e in pairs(argv, "-e"))


def mounts(argv: list[str]) -> list[dict[str, str]]:
    out = []
    for value in pairs(argv, "--mount"):
        fields = next(csv.reader(io.StringIO(value)))  # the record format docker's --mount parser reads
        out.append(dict(f.split("=", 1) if "=" in f else (f, "true") for f in fields))
    return out


def npu_plan(devices=None, **kw):
    return plan_run("relax-qwen3-4b-4npu-colocate", sets=dict(RELAX_INPUTS, **kw.pop("sets", {})),
                    devices=devices, image="img:1", dry_run=True, **kw)


@pytest.mark.parametrize("devices,cards", [(None, [0, 1, 2, 3]), ("4-7", [4, 5, 6, 7]), ("0,2,5-6", [0, 2, 5, 6])])
def test_npu_argv_has_every_device_and_driver_mount(devices, cards):
    argv = npu_plan(devices).argv_per_node[0]
    devs = pairs(argv, "--device")
    assert devs == [f"/dev/davinci{c}" for c in cards] + list(NPU_CONTROL_DEVICES)
    assert set(NPU_CONTROL_DEVICES) == {"/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc"}
    vols = pairs(argv, "-v")
    for m in ("/usr/local/dcmi", "/usr/local/bin/npu-smi", "/usr/local/Ascend/driver/lib64",
              "/usr/local/Ascend/driver/version.info", "/etc/ascend_install.info"):
        assert f"{m}:{m}:ro" in vols
    assert len(vols) == len(NPU_DRIVER_MOUNTS)
    env = envs(argv)
    # the container numbers its cards 0..n-1; the host's numbers travel as TRAINBOX_DEVICES
    assert env["ASCEND_RT_VISIBLE_DEVICES"] == "0,1,2,3"
    assert env["TRAINBOX_DEVICES"] == ",".join(map(str, cards))
    assert env["RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES"] == "1"  # from the stack
    assert env["HCCL_CONNECT_TIMEOUT"] == "1800"  # the recipe's value beats the stack's
    assert "PYTHONPATH" not in env  # it references an input: the script sets it, not docker
    assert argv[argv.index("--network") + 1] == "host"
    assert argv[argv.index("--ipc") + 1] == "host"
    assert pairs(argv, "--ulimit") == ["memlock=-1", "stack=67108864"]
    for absent in ("--init", "-p", "--publish", "--privileged", "--gpus"):
        assert absent not in argv
    assert argv[-3:] == ["img:1", "bash", "/opt/trainbox/job.sh"]


def test_npu_volumes_and_job_script_mount():
    plan = npu_plan()
    ms = {m["target"]: m for m in mounts(plan.argv_per_node[0])}
    for name, path in RELAX_INPUTS.items():
        assert ms[path]["source"] == path
        assert ("readonly" in ms[path]) == (name != "CKPT_DIR")  # checkpoints are written
    job = ms["/opt/trainbox/job.sh"]
    assert job["source"] == str(plan.script_path) and "readonly" in job
    assert plan.script_path.read_text() == plan.script
    assert plan.host_dirs_to_create == ["/ckpt/run1"]
    # values given with --set are fixed in the script, quoted
    assert "MODEL_DIR=/data/Qwen3-4B\n" in plan.script


def test_cuda_argv_uses_gpus_and_cuda_visible_devices():
    argv = plan_run("specforge-domino-qwen35-4b-gpu", sets={"CODE_DIR": "/s", "TARGET_MODEL_PATH": "/m",
                                                             "TRAIN_DATA_PATH": "/d", "OUTPUT_DIR": "/o"},
                    devices="8-15", image="img", dry_run=True).argv_per_node[0]
    # CSV-quoted: docker reads --gpus as a CSV record, and device=8,9,... holds commas
    assert pairs(argv, "--gpus") == ['"device=8,9,10,11,12,13,14,15"']
    assert envs(argv)["CUDA_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7"
    assert "--device" not in argv and "-v" not in argv


def test_cpu_argv_has_no_devices_and_a_private_shm():
    plan = plan_run("cpu-ddp", image="img", dry_run=True)
    argv = plan.argv_per_node[0]
    assert "--device" not in argv and "--gpus" not in argv and "--ipc" not in argv
    assert pairs(argv, "--shm-size") == ["8g"]
    assert pairs(argv, "--ulimit") == ["stack=67108864"]  # nothing to pin on the CPU
    assert envs(argv)["OMP_NUM_THREADS"] == "1"
    with pytest.raises(TrainboxError, match="no devices to choose"):
        plan_run("cpu-ddp", devices="0-1", dry_run=True)


def test_device_count_must_match_the_recipe():
    # --devices alone sets the count (test_scaling.py); 2 cards cannot hold this recipe's tp 4
    with pytest.raises(TrainboxError, match="does not divide the 2 training devices"):
        npu_plan("0-1")


@pytest.mark.parametrize("spec,message", [
    ("3-1", "runs backwards"), ("a", "expected card numbers"), ("", "empty"), ("  ", "empty"),
    ("-1", "expected card numbers"), ("1,1,2", "card 1 is given twice"), ("0-3,2", "card 2 is given twice"),
    ("16", "card 16 does not exist"), ("0-1000000000", "expected card numbers"), ("0-99", "card 99 does not exist"),
])
def test_parse_devices_refuses(spec, message):
    # issue 14: '' meant cards 0-3, repeats were dropped silently, 0-1000000000 exhausted memory
    with pytest.raises(TrainboxError, match=message):
        parse_devices(spec)


def test_parse_devices_accepts_every_card_of_an_a3_node():
    assert parse_devices("0-15") == list(range(16))
    assert parse_devices(" 4-7 , 0") == [0, 4, 5, 6, 7]


def test_empty_devices_is_an_error_not_the_default():
    with pytest.raises(TrainboxError, match="empty"):
        npu_plan("")
    with pytest.raises(TrainboxError, match="no devices to choose"):
        plan_run("cpu-ddp", devices="", dry_run=True)


def test_required_inputs_are_checked_before_anything_runs():
    with pytest.raises(TrainboxError) as exc:
        plan_run("relax-qwen3-4b-4npu-colocate", sets={"CODE_DIR": "/src"}, dry_run=True)
    msg = str(exc.value)
    for name in ("MODEL_DIR", "REF_LOAD", "DATA_PATH", "CKPT_DIR"):
        assert f"--set {name}=..." in msg
    assert "CODE_DIR" not in msg


@pytest.mark.parametrize("sets,needle", [
    ({"NOPE": "1"}, "has no input or environment variable 'NOPE'"),
    ({"MASTER_PORT": "70000"}, "expected a port number 1-65535"),
    ({"MASTER_PORT": "29500; id"}, "expected a port number"),
    ({"MASTER_ADDR": "$(id)"}, "expected a host name or IP address"),
    ({"NODE_RANK": "1"}, "use --node-rank"),
    ({"MODEL_DIR": "/usr"}, "refusing to mount over /usr"),
])
def test_bad_sets_are_refused(sets, needle):
    with pytest.raises(TrainboxError, match=needle.replace("(", r"\(").replace(")", r"\)").replace("$", r"\$")):
        npu_plan(sets=sets)


def test_relative_paths_become_absolute_on_both_sides(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    plan = npu_plan(sets={"MODEL_DIR": "models/q"})
    want = str(tmp_path / "models" / "q")
    assert any(m["source"] == want and m["target"] == want for m in mounts(plan.argv_per_node[0]))
    assert f"MODEL_DIR={want}\n" in plan.script


def test_env_override_with_set():
    plan = npu_plan(sets={"PYTORCH_NPU_ALLOC_CONF": "max_split_size_mb:64"})
    assert envs(plan.argv_per_node[0])["PYTORCH_NPU_ALLOC_CONF"] == "max_split_size_mb:64"
    assert "export PYTORCH_NPU_ALLOC_CONF=max_split_size_mb:64\n" in plan.script


HOSTILE_PATH = "/data/my models/it's \"q\",x $(touch /tmp/pwned)\nline2"


@pytest.mark.parametrize("text", ["plain", "a,b", 'q"uote', "new\nline", " lead", HOSTILE_PATH])
def test_mount_fields_round_trip_through_a_csv_reader(text):
    fields = next(csv.reader(io.StringIO(mount_arg(text, text, True))))
    assert fields == ["type=bind", f"source={text}", f"target={text}", "readonly"]
    assert csv_field("plain") == "plain"


def test_hostile_values_arrive_intact_in_argv_and_script():
    plan = npu_plan(sets={"MODEL_DIR": HOSTILE_PATH})
    ms = [m for m in mounts(plan.argv_per_node[0]) if m["target"] == HOSTILE_PATH]
    assert ms and ms[0]["source"] == HOSTILE_PATH
    assert f"MODEL_DIR={shlex.quote(HOSTILE_PATH)}\n" in plan.script


def test_dry_run_prints_a_command_that_pastes(capsys):
    sets = [f"--set={k}={v}" for k, v in RELAX_INPUTS.items()] + [f"--set=MODEL_DIR={HOSTILE_PATH}"]
    assert main(["run", "relax-qwen3-4b-4npu-colocate", "--dry-run", "--devices", "4-7", "--image", "my img",
                 *sets]) == 0
    out, err = capsys.readouterr()
    assert "launcher script" in err
    plan = npu_plan("4-7", sets={"MODEL_DIR": HOSTILE_PATH})
    # pasted into bash (docker stood in for by a function that prints its arguments), the printed text
    # is exactly the argv, image name included, and nothing in it runs
    words = pasted(out)
    want = list(plan.argv_per_node[0])
    want[want.index("img:1")] = "my img"
    assert words == want[1:]
    assert out.startswith("docker run ")


def pasted(text: str) -> list[str]:
    shell = "docker() { printf '%s\\0' \"$@\"; }\n" + text
    out = subprocess.run(["bash", "-c", shell], capture_output=True, check=True, cwd="/")
    return out.stdout.decode().split("\0")[:-1]


SPECFORGE = {"TARGET_MODEL_PATH": "/m", "TRAIN_DATA_PATH": "/d", "OUTPUT_DIR": "/o"}  # torchrun, scales


def test_multi_node_plan_has_one_command_per_node(capsys):
    plan = plan_run("specforge-domino-qwen35-4b-npu", sets={**SPECFORGE, "MASTER_ADDR": "10.1.2.3"}, nodes=2,
                    image="i", dry_run=True)
    assert len(plan.argv_per_node) == 2
    for rank, argv in enumerate(plan.argv_per_node):
        assert envs(argv)["NODE_RANK"] == str(rank)
    text = format_plan(plan)
    assert "# node 0 of 2 (master)" in text and "# node 1 of 2 (worker)" in text
    words = pasted(text)  # both commands, one after the other
    assert words == plan.argv_per_node[0][1:] + plan.argv_per_node[1][1:]
    assert "--master-addr \"$MASTER_ADDR\"" in plan.script and "--node-rank \"$NODE_RANK\"" in plan.script
    with pytest.raises(TrainboxError, match="needs these inputs:\n  --set MASTER_ADDR"):
        plan_run("specforge-domino-qwen35-4b-npu", sets=SPECFORGE, nodes=2, dry_run=True)


def test_render_command_writes_an_executable_script(tmp_path, capsys):
    out = tmp_path / "job.sh"
    assert main(["launch", "render", "ray-cpu", "--nodes", "2", "--set", "MASTER_ADDR=head", "-o", str(out)]) == 0
    assert os.stat(out).st_mode & stat.S_IXUSR
    err = capsys.readouterr().err
    assert f"NODE_RANK=0 bash {out}" in err and f"NODE_RANK=1 bash {out}" in err
    assert "MASTER_ADDR=head\n" in out.read_text()
    assert main(["launch", "render", "cpu-ddp", "--set", "MASTER_PORT=nope"]) == 2
    assert "--set MASTER_PORT: 'nope': expected a port number" in capsys.readouterr().err


def test_list_and_show(capsys):
    assert main(["launch", "list"]) == 0
    out = capsys.readouterr().out
    assert "cpu-ddp" in out and "relax-qwen35-9b-8npu-async" in out
    assert main(["launch", "show", "relax-qwen3-4b-4npu-colocate"]) == 0
    out = capsys.readouterr().out
    assert "MODEL_DIR" in out and "mounted ro" in out and "ROLLOUT_DEVICES_PER_ENGINE=4" in out  # Relax: 4 per engine


def test_check_command(tmp_path, capsys):
    assert main(["launch", "check", "cpu-ddp", "ray-cpu", "--nodes", "2"]) == 0
    assert "ok   cpu-ddp" in capsys.readouterr().out
    bad = tmp_path / "bad.yaml"
    bad.write_text("description: x\nstack: cpu\nlauncher: exec\ndevices_per_node: 1\ncommand: [\"run ${NOPE}\"]\n")
    assert main(["launch", "check", "cpu-ddp", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "FAIL " + str(bad) in err and "${NOPE} is not defined here" in err


def test_launch_check_is_a_library_function_that_returns_its_results(tmp_path):
    """`launch check` prints what trainbox.launch.lint.check_recipes returns, one result per recipe as it is made."""
    from trainbox.launch.lint import CheckOptions, check_recipes

    bad = tmp_path / "bad.yaml"
    bad.write_text("description: x\nstack: cpu\nlauncher: exec\ndevices_per_node: 1\ncommand: [\"run ${NOPE}\"]\n")
    seen = []
    run = check_recipes(["cpu-ddp", str(bad)], CheckOptions(targets=("slurm",), nodes=2), None, on_result=seen.append)
    assert seen == run.recipes and [r.status for r in run.recipes] == ["ok", "fail"] and run.failed == 1
    assert run.recipes[0].ok and run.recipes[0].problems == [] and run.recipes[0].summary == "cpu-ddp"
    assert any("${NOPE} is not defined here" in p for p in run.recipes[1].problems)
    doc = run.as_dict()
    assert doc["ok"] is False and doc["shellcheck"] is False and doc["not_checked"] == []
    assert [r["recipe"] for r in doc["recipes"]] == ["cpu-ddp", str(bad)] and "args" not in doc["recipes"][0]
