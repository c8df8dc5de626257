"""The CANN environment the cann base's own ENTRYPOINT would set up survives trainbox's entrypoint.

Stand-ins (no CANN here): set_env.sh scripts written to tmp_path play the toolkit's, BiSheng's (AscendNPU-IR)
and ATB's scripts; a JSON file plays the build's record /etc/trainbox/cann-env.json.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from test_entrypoint import DUMP_ENV, base_env, entry

from trainbox.runtime import cann_env, entrypoint
from trainbox.runtime.npu import ASCENDNPU_IR_SET_ENV


def _script(path, body):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(body)
    return path


def test_ascendnpu_ir_set_env_is_found_under_the_declared_toolkit_home(tmp_path):
    home = tmp_path / "cann-8.5.1"
    ir = _script(home / ASCENDNPU_IR_SET_ENV, 'export PATH="$(dirname "${BASH_SOURCE[0]}"):$PATH"\n')
    assert entrypoint.ascendnpu_ir_set_env({"ASCEND_HOME_PATH": str(home)}) == str(ir)
    assert entrypoint.ascendnpu_ir_set_env({"ASCEND_HOME_PATH": str(tmp_path / "none")}) in (None, *[
        p for p in [entrypoint.ascendnpu_ir_set_env({})] if p])


def test_atb_is_told_its_abi_and_script_arguments_reach_the_script(tmp_path):
    assert any(s.endswith("nnal/atb/set_env.sh --cxx_abi=1") for s in entrypoint.SET_ENV_SCRIPTS)
    atb = _script(tmp_path / "atb" / "set_env.sh",
                  'for a in "$@"; do case $a in --cxx_abi=*) export TB_ABI="${a#--cxx_abi=}";; esac; done\n'
                  '[ -n "${TB_ABI:-}" ] || export TB_IMPORTED_TORCH=1\n')
    proc = entry(DUMP_ENV, base_env(tmp_path, TRAINBOX_SET_ENV_SCRIPTS=f"{atb} --cxx_abi=1"))
    env = json.loads(proc.stdout)
    assert env["TB_ABI"] == "1" and "TB_IMPORTED_TORCH" not in env


def test_capture_records_what_the_scripts_export(tmp_path):
    s = _script(tmp_path / "set_env.sh", "export TB_CANN=1\nexport PATH=/opt/bisheng/bin:$PATH\n")
    rec = cann_env.capture(base_env(tmp_path, TRAINBOX_SET_ENV_SCRIPTS=str(s)))
    assert rec["schema"] == 1 and rec["sourced"] == [str(s)]
    assert rec["env"]["TB_CANN"] == "1" and rec["env"]["PATH"].startswith("/opt/bisheng/bin:")
    out = tmp_path / "cann-env.json"
    env = base_env(tmp_path, TRAINBOX_SET_ENV_SCRIPTS=str(s), PYTHONPATH=":".join(sys.path))
    subprocess.run([sys.executable, "-m", "trainbox.runtime.cann_env", "--write", str(out)], env=env, check=True)
    assert json.loads(out.read_text())["env"]["TB_CANN"] == "1"


def test_entrypoint_applies_the_build_record_without_sourcing(tmp_path):
    rec = tmp_path / "cann-env.json"
    rec.write_text(json.dumps({"schema": 1, "sourced": ["/usr/local/Ascend/ascend-toolkit/set_env.sh"],
                               "env": {"TB_CANN": "recorded", "TB_USER": "recorded", "PATH": "/opt/bisheng/bin"}}))
    env = base_env(tmp_path, TRAINBOX_CANN_ENV_FILE=str(rec), TB_USER="user")
    del env["TRAINBOX_SET_ENV_SCRIPTS"]
    out = json.loads(entry(DUMP_ENV, env).stdout)
    assert out["TB_CANN"] == "recorded" and out["TB_USER"] == "user"  # the user's value still wins


def test_a_record_from_a_base_without_cann_is_ignored(tmp_path):
    rec = tmp_path / "cann-env.json"
    rec.write_text(json.dumps({"schema": 1, "sourced": [], "env": {"TB_CANN": "stale"}}))
    env = base_env(tmp_path, TRAINBOX_CANN_ENV_FILE=str(rec))
    del env["TRAINBOX_SET_ENV_SCRIPTS"]
    assert "TB_CANN" not in json.loads(entry(DUMP_ENV, env).stdout)
    rec.write_text("{not json")
    proc = entry(DUMP_ENV, env)
    assert proc.returncode == 0 and "unreadable" in proc.stderr


# ------------------------------------------------ baking the record as ENV (trainbox.image.toolkits.cann; docker side:
# tests/test_cann_bake_docker.py)


def test_the_record_becomes_one_env_instruction_quoted_literally():
    from trainbox.image.toolkits import cann as cann_bake

    rec = {"schema": 1, "sourced": ["/usr/local/Ascend/ascend-toolkit/set_env.sh"],
           "env": {"PATH": "/opt/bisheng/bin:/usr/bin", "TB_Q": 'a "b" $c \\d'}}
    env, label = cann_bake.env_changes(rec)
    assert env == 'ENV PATH="/opt/bisheng/bin:/usr/bin" TB_Q="a \\"b\\" \\$c \\\\d"'
    assert label == f"LABEL {cann_bake.BAKED_LABEL}=2"
    assert cann_bake.env_changes({"schema": 1, "sourced": [], "env": {"TB": "stale"}}) == []  # no CANN in the base


@pytest.mark.parametrize("record, message", [
    ({"sourced": ["s"], "env": {"TB_NL": "a\nb"}}, "TB_NL: a value with a line break"),
    ({"sourced": ["s"], "env": {"BAD NAME": "x"}}, "'BAD NAME'='x': expected NAME=VALUE"),
    ({"sourced": ["s"], "env": ["PATH"]}, "expected the CANN environment record"),
])
def test_a_record_that_cannot_be_baked_is_refused_naming_the_variable(record, message):
    from trainbox.image.toolkits import cann as cann_bake
    from trainbox.runtime.errors import TrainboxError

    with pytest.raises(TrainboxError, match=message):
        cann_bake.env_changes(record)


def test_image_build_bakes_npu_images_only_and_a_failed_bake_fails_the_build(monkeypatch):
    from types import SimpleNamespace

    from trainbox.image import run as buildrun
    from trainbox.image.toolkits import cann as cann_bake
    from trainbox.runtime.errors import TrainboxError

    calls = []
    monkeypatch.setattr(cann_bake, "bake", lambda client, tags, say: calls.append(tags) or {"baked": 3})
    plan = SimpleNamespace(stack=SimpleNamespace(device="npu"), tags=["trainbox/npu-910b:abc", "x:latest"],
                           tag="trainbox/npu-910b:abc")
    assert buildrun.bake_toolkit_env(plan, None, print) == {"cann_env": {"baked": 3}}
    assert calls == [plan.tags]
    plan.stack.device = "cpu"
    assert buildrun.bake_toolkit_env(plan, None, print) == {} and len(calls) == 1

    def fails(client, tags, say):
        raise TrainboxError("ASCEND_OPP_PATH is '/elsewhere' in the image's ENV")

    monkeypatch.setattr(cann_bake, "bake", fails)
    plan.stack.device = "npu"
    with pytest.raises(buildrun.BuildFailed, match="baking the CANN environment as ENV failed: ASCEND_OPP_PATH") as e:
        buildrun.bake_toolkit_env(plan, None, print)
    assert e.value.exit_code == 1


def test_the_entrypoint_names_what_the_image_env_lacked(tmp_path):
    rec = tmp_path / "cann-env.json"
    rec.write_text(json.dumps({"schema": 1, "sourced": ["/s.sh"], "env": {"TB_CANN": "1", "TB_BAKED": "2"}}))
    env = base_env(tmp_path, TRAINBOX_CANN_ENV_FILE=str(rec), TB_BAKED="2")  # TB_BAKED: in the image's ENV
    del env["TRAINBOX_SET_ENV_SCRIPTS"]
    out = json.loads(entry(DUMP_ENV, env).stdout)
    assert out["TRAINBOX_CANN_ENV_APPLIED"] == "TB_CANN"
    env["TB_CANN"] = "1"  # everything baked: nothing to name
    assert "TRAINBOX_CANN_ENV_APPLIED" not in json.loads(entry(DUMP_ENV, env).stdout)
