"""The CANN environment the cann base's own ENTRYPOINT would set up survives trainbox's entrypoint.

Stand-ins (no CANN here): set_env.sh scripts written to tmp_path play the toolkit's, BiSheng's (AscendNPU-IR)
and ATB's scripts; a JSON file plays the build's record /etc/trainbox/cann-env.json.
"""

from __future__ import annotations

import json
import subprocess
import sys

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
