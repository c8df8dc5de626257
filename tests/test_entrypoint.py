"""Unit tests for trainbox-entrypoint, run as a real process (no Docker).

Stand-ins: set_env.sh scripts written to tmp_path play the CANN/NNAL scripts (TRAINBOX_SET_ENV_SCRIPTS),
and manifests written to tmp_path play /etc/trainbox/stack.json (TRAINBOX_MANIFEST).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainbox.runtime import entrypoint

DUMP_ENV = [sys.executable, "-c", "import json, os; print(json.dumps(dict(os.environ)))"]


def write_manifest(tmp_path: Path, env: dict, device="cpu") -> Path:
    p = tmp_path / "stack.json"
    p.write_text(json.dumps({"schema": 1, "trainbox_version": "0.1.0", "stack": "test", "device": device,
                             "python": "3.11", "base": {"image": "x", "cann": None, "substituted": None},
                             "components": {}, "env": env, "patches": {}, "overrides": {}}))
    return p


def base_env(tmp_path: Path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRAINBOX_", "ASCEND_", "HCCL_"))}
    env.update({"TRAINBOX_MANIFEST": str(tmp_path / "no-manifest.json"), "TRAINBOX_SET_ENV_SCRIPTS": ""})
    env.update(extra)
    return env


def entry(args, env, **kw):
    return subprocess.run([sys.executable, "-m", "trainbox.runtime.entrypoint", *args], env=env, capture_output=True,
                          text=True, timeout=120, **kw)


def env_after(tmp_path, **extra) -> dict:
    proc = entry(DUMP_ENV, base_env(tmp_path, **extra))
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


# ----------------------------------------------------------------------------------------------- defaults


def test_stack_defaults_apply_but_set_values_win(tmp_path):
    man = write_manifest(tmp_path, {"TB_A": "stack", "TB_B": "stack", "TB_EMPTY": "stack"})
    env = env_after(tmp_path, TRAINBOX_MANIFEST=str(man), TB_B="user", TB_EMPTY="")
    assert env["TB_A"] == "stack"
    assert env["TB_B"] == "user"
    assert env["TB_EMPTY"] == ""  # set to empty on purpose is still set


def test_apply_defaults_unit():
    env = {"KEEP": "image"}
    applied = entrypoint.apply_defaults(env, {"env": {"KEEP": "stack", "NEW": "stack"}})
    assert env == {"KEEP": "image", "NEW": "stack"} and applied == ["NEW"]
    assert entrypoint.apply_defaults({}, None) == []


def test_cpu_on_purpose_disables_backend_autoload(tmp_path):
    assert env_after(tmp_path, TRAINBOX_DEVICE="cpu")["TORCH_DEVICE_BACKEND_AUTOLOAD"] == "0"
    assert env_after(tmp_path, TRAINBOX_DEVICE="cpu", TORCH_DEVICE_BACKEND_AUTOLOAD="1")[
        "TORCH_DEVICE_BACKEND_AUTOLOAD"] == "1"
    assert "TORCH_DEVICE_BACKEND_AUTOLOAD" not in env_after(tmp_path, TRAINBOX_DEVICE="npu")


def test_corrupt_manifest_warns_and_still_runs(tmp_path):
    bad = tmp_path / "stack.json"
    bad.write_text("{")
    proc = entry(["sh", "-c", "echo ran"], base_env(tmp_path, TRAINBOX_MANIFEST=str(bad)))
    assert proc.returncode == 0 and proc.stdout == "ran\n"
    assert "warning" in proc.stderr and "not valid JSON" in proc.stderr


# ----------------------------------------------------------------------------------------------- set_env.sh


# Written like the CANN scripts: reads variables that may be unset (fatal under `set -u`), prepends to
# LD_LIBRARY_PATH, prints to stdout.
CANN_LIKE = """\
echo "set_env noise on stdout"
if [ -n "$LD_LIBRARY_PATH_NOT_SET_ANYWHERE" ]; then :; fi
export ASCEND_TOOLKIT_HOME=/opt/fake-cann/latest
export LD_LIBRARY_PATH=${ASCEND_TOOLKIT_HOME}/lib64:${ASCEND_TOOLKIT_HOME}/lib64/plugin:${LD_LIBRARY_PATH}
export PATH=${ASCEND_TOOLKIT_HOME}/bin:$PATH
export TB_USER_SET=from-script
export TB_NEW="value with spaces"
"""


def script(tmp_path: Path, name: str, text: str, strict_u=False) -> Path:
    p = tmp_path / name
    p.write_text(("set -u\n" if strict_u else "") + text)
    return p


def test_sources_cann_like_script(tmp_path):
    s = script(tmp_path, "set_env.sh", CANN_LIKE)
    proc = entry(DUMP_ENV, base_env(tmp_path, TRAINBOX_SET_ENV_SCRIPTS=str(s), TB_USER_SET="user",
                                    LD_LIBRARY_PATH="/opt/fake-cann/latest/lib64:/usr/local/lib"))
    assert proc.returncode == 0, proc.stderr
    env = json.loads(proc.stdout)  # the script's stdout noise did not reach the command's stdout
    assert env["ASCEND_TOOLKIT_HOME"] == "/opt/fake-cann/latest"
    # extended and de-duplicated, first occurrence kept
    assert env["LD_LIBRARY_PATH"] == "/opt/fake-cann/latest/lib64:/opt/fake-cann/latest/lib64/plugin:/usr/local/lib"
    assert env["PATH"].startswith("/opt/fake-cann/latest/bin:")
    assert env["TB_USER_SET"] == "user"  # the user's value wins over the script's
    assert env["TB_NEW"] == "value with spaces"
    assert "SHLVL" not in env or env["SHLVL"] == os.environ.get("SHLVL")


def test_cpu_on_purpose_skips_the_cann_scripts(tmp_path):
    s = script(tmp_path, "set_env.sh", CANN_LIKE)
    assert env_after(tmp_path, TRAINBOX_SET_ENV_SCRIPTS=str(s))["ASCEND_TOOLKIT_HOME"] == "/opt/fake-cann/latest"
    env = env_after(tmp_path, TRAINBOX_SET_ENV_SCRIPTS=str(s), TRAINBOX_DEVICE="cpu")
    assert "ASCEND_TOOLKIT_HOME" not in env and "TB_NEW" not in env


def test_sourcing_empty_ld_library_path_leaves_no_empty_entry(tmp_path):
    s = script(tmp_path, "set_env.sh", CANN_LIKE)
    env = env_after(tmp_path, TRAINBOX_SET_ENV_SCRIPTS=str(s))
    assert env["LD_LIBRARY_PATH"] == "/opt/fake-cann/latest/lib64:/opt/fake-cann/latest/lib64/plugin"


def test_scripts_that_break_under_set_u_still_work(tmp_path):
    # Even when the caller's shell would run with -u, the entrypoint's bash sources with +u.
    s = script(tmp_path, "set_env.sh", 'export TB_FROM_U="x${SURELY_UNSET_VARIABLE}y"\n')
    assert env_after(tmp_path, TRAINBOX_SET_ENV_SCRIPTS=str(s), SHELLOPTS="nounset")["TB_FROM_U"] == "xy"


def test_failing_script_is_reported_others_apply(tmp_path):
    bad = script(tmp_path, "bad.sh", "export TB_BAD=1\nreturn 3\n")
    good = script(tmp_path, "good.sh", "export TB_GOOD=1\n")
    missing = tmp_path / "missing.sh"
    proc = entry(DUMP_ENV, base_env(tmp_path, TRAINBOX_SET_ENV_SCRIPTS=f"{bad}:{missing}:{good}"))
    assert proc.returncode == 0
    env = json.loads(proc.stdout)
    assert env["TB_GOOD"] == "1" and env["TB_BAD"] == "1"
    assert f"warning: '{bad}' returned 3" in proc.stderr


def test_script_that_exits_is_survived(tmp_path):
    s = script(tmp_path, "exits.sh", "export TB_X=1\nexit 1\n")
    proc = entry(DUMP_ENV, base_env(tmp_path, TRAINBOX_SET_ENV_SCRIPTS=str(s)))
    assert proc.returncode == 0
    assert "TB_X" not in json.loads(proc.stdout)
    assert "starting without it" in proc.stderr


def test_script_cannot_eat_stdin(tmp_path):
    s = script(tmp_path, "reader.sh", "read -r line || true\nexport TB_READ=\"$line\"\n")
    proc = entry(["sh", "-c", "cat; echo \"[$TB_READ]\""], base_env(tmp_path, TRAINBOX_SET_ENV_SCRIPTS=str(s)),
                 input="for the command\n")
    assert proc.stdout == "for the command\n[]\n"


def test_default_script_list_only_existing(tmp_path, monkeypatch):
    env = {"TRAINBOX_SET_ENV_SCRIPTS": f"{tmp_path}/nope.sh"}
    assert entrypoint.set_env_scripts(env) == []
    assert entrypoint.set_env_scripts({}) == [p for p in entrypoint.SET_ENV_SCRIPTS if os.path.isfile(p)]


def test_debug_says_what_changed(tmp_path):
    s = script(tmp_path, "set_env.sh", "export TB_DBG=1\n")
    proc = entry(["true"], base_env(tmp_path, TRAINBOX_SET_ENV_SCRIPTS=str(s), TRAINBOX_DEBUG="1"))
    assert "set by the scripts: TB_DBG" in proc.stderr and "exec ['true']" in proc.stderr


# ----------------------------------------------------------------------------------------------- exec


def test_exec_replaces_the_process(tmp_path):
    p = subprocess.Popen([sys.executable, "-m", "trainbox.runtime.entrypoint", "sh", "-c", "echo $$"],
                         env=base_env(tmp_path), stdout=subprocess.PIPE, text=True)
    out, _ = p.communicate(timeout=60)
    assert int(out.strip()) == p.pid  # same PID: no Python process stayed behind


@pytest.mark.parametrize("code", [0, 1, 7, 255])
def test_exit_code_passes_through(tmp_path, code):
    assert entry(["sh", "-c", f"exit {code}"], base_env(tmp_path)).returncode == code


def test_killed_by_signal_reports_the_signal(tmp_path):
    assert entry(["sh", "-c", "kill -TERM $$"], base_env(tmp_path)).returncode == -15


def test_command_not_found_is_127(tmp_path):
    proc = entry(["no-such-command-xyz"], base_env(tmp_path))
    assert proc.returncode == 127
    assert "trainbox-entrypoint: error: command not found: 'no-such-command-xyz'" in proc.stderr


def test_not_executable_is_126(tmp_path):
    f = tmp_path / "plain.txt"
    f.write_text("echo hi\n")
    proc = entry([str(f)], base_env(tmp_path))
    assert proc.returncode == 126 and "cannot execute" in proc.stderr


def test_no_command_starts_a_shell(tmp_path):
    proc = entry([], base_env(tmp_path), input="echo shell=$0\nexit 5\n")
    assert proc.returncode == 5 and proc.stdout.strip() in ("shell=bash", "shell=sh")


def test_double_dash_and_help(tmp_path):
    assert entry(["--", "sh", "-c", "exit 4"], base_env(tmp_path)).returncode == 4
    h = entry(["--help"], base_env(tmp_path))
    assert h.returncode == 0 and "TRAINBOX_CHECK" in h.stdout


def test_signal_dispositions_are_restored(tmp_path):
    # Python ignores SIGPIPE/SIGXFSZ; ignored signals survive exec unless the entrypoint restores them.
    proc = entry(["sh", "-c", "grep SigIgn /proc/$$/status"], base_env(tmp_path))
    mask = int(proc.stdout.split()[1], 16)
    assert mask & (1 << (13 - 1)) == 0, "SIGPIPE still ignored"
    assert mask & (1 << (25 - 1)) == 0, "SIGXFSZ still ignored"
    # The observable effect: `yes | head` ends because yes dies of SIGPIPE.
    pipe = entry(["sh", "-c", "yes | head -n 1; echo status=$?"], base_env(tmp_path))
    assert pipe.stdout == "y\nstatus=0\n" and "Broken pipe" not in pipe.stderr


# ----------------------------------------------------------------------------------------------- checks


def test_check_off_by_default_is_silent(tmp_path):
    proc = entry(["true"], base_env(tmp_path, STREAMS_PER_DEVICE="16"))
    assert proc.returncode == 0 and proc.stderr == ""


def test_check_1_reports_and_starts(tmp_path):
    proc = entry(["sh", "-c", "echo ran"], base_env(tmp_path, TRAINBOX_CHECK="1", STREAMS_PER_DEVICE="16"))
    assert proc.returncode == 0 and proc.stdout == "ran\n"
    assert "trainbox-entrypoint: FAIL npu.streams_per_device: STREAMS_PER_DEVICE='16'" in proc.stderr
    assert "checks: FAIL" in proc.stderr


def test_check_strict_refuses_to_start(tmp_path):
    # The failing value comes from the stack's defaults: the checks see the prepared environment.
    man = write_manifest(tmp_path, {"STREAMS_PER_DEVICE": "16"})
    proc = entry(["sh", "-c", "echo ran"], base_env(tmp_path, TRAINBOX_CHECK="strict", TRAINBOX_MANIFEST=str(man)))
    assert proc.returncode == entrypoint.EXIT_CHECK_FAILED == 78
    assert proc.stdout == ""
    assert "refusing to start" in proc.stderr and "STREAMS_PER_DEVICE" in proc.stderr


def test_check_strict_starts_when_clean(tmp_path):
    proc = entry(["sh", "-c", "echo ran"], base_env(tmp_path, TRAINBOX_CHECK="strict", TRAINBOX_MIN_SHM_GB="0",
                                                    TRAINBOX_MIN_FREE_GB="0"))
    assert proc.returncode == 0 and proc.stdout == "ran\n", proc.stderr


def test_check_unknown_value_warns(tmp_path):
    proc = entry(["true"], base_env(tmp_path, TRAINBOX_CHECK="yesplease"))
    assert proc.returncode == 0 and "is not 0, 1 or strict" in proc.stderr


def test_entrypoint_import_is_light():
    code = ("import sys, trainbox.runtime.entrypoint\n"
            "print(sorted(m for m in ('subprocess', 'trainbox.runtime.doctor', 'torch', 'json', 'dataclasses', 'typing')"
            " if m in sys.modules))")
    out = subprocess.run([sys.executable, "-S", "-c", f"import sys; sys.path.insert(0, {str(Path(entrypoint.__file__).parents[2])!r})\n" + code],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
