"""The command line as one grammar (issue 15, item 7): every subcommand's --help, every --json output, the
generated command reference (docs/reference/commands.md), usage errors, deprecated spellings, pipes that close early."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from trainbox import cli_reference
from trainbox.supply import lock as lockmod
from trainbox.cli import main
from trainbox.paths import REPO_ROOT

LEAVES = cli_reference.leaf_commands()
JSON_LEAVES = {path for path, p in LEAVES if any("--json" in a.option_strings for a in p._actions)}

# every --json command, with arguments that make it run offline and without an engine (rc: what it must exit)
OFFLINE_JSON = {
    "stack list": (["stack", "list"], 0),
    "stack validate": (["stack", "validate", "cpu", "npu-a3"], 0),
    "stack show": (["stack", "show", "npu-910b"], 0),
    "stack diff": (["stack", "diff", "cpu", "cpu-ray"], 1),
    "stack lock": (["stack", "lock", "cpu", "--check", "--no-deps"], None),  # index stand-in below
    "stack rules": (["stack", "rules"], 0),
    "render": (["render", "--check"], 0),
    "patches verify": (["patches", "verify", "npu-910b", "--offline"], None),  # 1 when the cache is empty
    "launch check": (["launch", "check", "cpu-ddp"], 0),
    "launch list": (["launch", "list"], 0),
    "launch show": (["launch", "show", "cpu-ddp"], 0),
    "jobs": (["jobs"], 0),
    "run": (["run", "cpu-ddp", "--dry-run", "--image", "trainbox/cpu:any"], 0),
    "trial": (["trial", "cpu-ddp", "--dry-run", "--image", "trainbox/cpu:any"], 0),
    "doctor": (["doctor", "--quick"], None),  # 1 when a check fails on this host
    "image build": (["image", "build", "cpu", "--dry-run"], None),  # 1 when no index or wheelhouse has torch
    "fetch": (["fetch", "cpu", "--sources-only", "--offline"], 0),  # cpu has no git or archive source  # a dry run needs no engine and no index
    "smoke": (["smoke", "cpu", "--skip", "validate,lock,render,hadolint,patches,build,doctor,recipes"], 0),
}
# these need the Docker engine (tests/test_cli_docker.py walks them) or PyPI (tests/test_wheelhouse.py)
ENGINE_JSON = {"image ls", "image prune", "image push", "image sbom", "status"}  # push, sbom, status: their docker tests
NETWORK_JSON = {"image wheelhouse"}


def test_every_json_command_is_walked():
    assert JSON_LEAVES == set(OFFLINE_JSON) | ENGINE_JSON | NETWORK_JSON, (
        "a --json command is not walked: add it to OFFLINE_JSON here (or ENGINE_JSON and a docker test)")


@pytest.mark.parametrize("path,parser", LEAVES, ids=[p for p, _ in LEAVES])
def test_help_of_every_subcommand(path, parser, capsys):
    with pytest.raises(SystemExit) as exc:
        main([*path.split(), "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: trainbox {path}")
    flat = " ".join(out.split())
    assert "Exit status: 0 ok" in flat and "2 usage or invalid input" in flat, (
        f"{path}: exit statuses not documented: call trainbox.commands._args.exits(parser, ...) in its register()")
    if path in JSON_LEAVES:
        assert 'schema' in flat, f"{path}: --json help does not name its schema"
    opts = {o for a in parser._actions for o in a.option_strings}
    # one grammar: paths written are -o/--output; the old spellings are hidden aliases
    assert not opts & {"--out", "--report", "--workdir"} or "-o" in opts
    for old in ("--out ", "--report ", "--workdir "):
        assert old not in out
    if "--stack" in opts and path not in ("launch render", "run", "patches edit", "patches import"):
        assert "--stack" not in out, f"{path}: the stack is positional here (--stack is a hidden alias)"


def test_group_help_and_top_level(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "Exit status: 0 ok, 1 a check found problems, 2 usage or invalid input" in " ".join(out.split())
    assert main(["stack"]) == 2 and "usage: trainbox stack" in capsys.readouterr().err


@pytest.mark.parametrize("path", sorted(OFFLINE_JSON))
def test_json_outputs_parse_and_carry_a_schema(path, capsys, monkeypatch, tmp_path):
    from tests.test_cli_stack import offline_lock

    monkeypatch.setattr(lockmod, "lock_stack", offline_lock)  # `stack lock` asks no index here
    monkeypatch.setenv("TRAINBOX_CACHE", str(tmp_path / "cache"))  # where a dry run stages its context
    argv, want = OFFLINE_JSON[path]
    if path == "smoke":
        argv = argv + ["-o", str(tmp_path / "smoke")]
    rc = main([*argv, "--json"])
    out = capsys.readouterr().out
    doc = json.loads(out)
    # a version: an int, or a named one such as "trainbox.image-plan/1"
    assert isinstance(doc, dict) and isinstance(doc.get("schema"), (int, str)) and doc["schema"] != "", out[:200]
    assert want is None and rc in (0, 1) or rc == want, (rc, out[:400])
    assert "None" not in out.replace('"None"', "")  # JSON null, never a Python repr


def test_command_reference_is_generated_from_the_parser():
    readme = (REPO_ROOT / cli_reference.DEFAULT_FILE).read_text()
    assert cli_reference.replace_block(readme, cli_reference.markdown(), cli_reference.DEFAULT_FILE) == readme, (
        f"{cli_reference.DEFAULT_FILE}'s command reference differs from the parser: run `make docs` and commit it")
    for path, _ in LEAVES:
        assert f"| `trainbox {path}` |" in readme


def test_reference_check_fails_on_drift(tmp_path):
    readme = tmp_path / "commands.md"
    readme.write_text((REPO_ROOT / cli_reference.DEFAULT_FILE).read_text().replace("| `trainbox stack diff` |", "| `trainbox x` |"))
    assert cli_reference.main(["--check", str(readme)]) == 1
    assert cli_reference.main([str(readme)]) == 0
    assert cli_reference.main(["--check", str(readme)]) == 0


def test_unknown_argument_shows_the_subcommands_usage(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["stack", "show", "cpu", "--bogus"])
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert err.startswith("usage: trainbox stack show") and "unrecognized arguments: --bogus" in err
    with pytest.raises(SystemExit):
        main(["image", "build"])
    assert "usage: trainbox image build" in capsys.readouterr().err


def test_one_parser_serves_every_command_of_a_process_and_reads_the_environment_per_command(capsys, monkeypatch):
    """`main` builds its parser once per process; what a command takes from the environment is read when that
    command runs, not when the parser was built (TRAINBOX_REGISTRY set after a first command still counts)."""
    import trainbox.image.push as pushmod

    from trainbox import cli
    from trainbox.runtime.errors import TrainboxError

    monkeypatch.delenv("TRAINBOX_REGISTRY", raising=False)
    with pytest.raises(SystemExit) as exc:
        main(["image", "push", "cpu"])
    assert exc.value.code == 2 and "--registry REG is required" in capsys.readouterr().err
    seen = []

    def push_stand_in(stack, registry, say):  # records what the command gave it; no engine, no registry
        seen.append((stack, registry))
        raise TrainboxError("stand-in push")

    monkeypatch.setattr(pushmod, "push", push_stand_in)
    monkeypatch.setenv("TRAINBOX_REGISTRY", "127.0.0.1:5999")
    assert main(["image", "push", "cpu"]) == 2 and "stand-in push" in capsys.readouterr().err
    assert seen == [("cpu", "127.0.0.1:5999")]
    assert cli._parser() is cli._parser()


def test_deprecated_spellings_still_work_with_a_note(capsys, tmp_path):
    assert main(["render", "--stack", "cpu", "--check"]) == 0
    err = capsys.readouterr().err
    assert "--stack is deprecated" in err and "positional STACK" in err
    assert main(["render", "cpu", "--out", str(tmp_path), "--json"]) == 0
    captured = capsys.readouterr()
    assert "--out is deprecated" in captured.err and "-o/--output" in captured.err
    assert json.loads(captured.out)["root"] == str(tmp_path)
    assert (tmp_path / "build" / "generated" / "cpu" / "Dockerfile").is_file()
    with pytest.raises(SystemExit) as exc:
        main(["stack", "show", "cpu", "--stack", "cuda"])
    assert exc.value.code == 2 and "given twice" in capsys.readouterr().err


def test_no_traceback_when_the_reader_goes_away():
    proc = subprocess.Popen([sys.executable, "-m", "trainbox.cli", "stack", "show", "npu-910b"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO_ROOT)
    proc.stdout.close()  # like `| head` that has already exited
    _, err = proc.communicate(timeout=120)
    assert b"Traceback" not in err and b"BrokenPipe" not in err, err.decode()
    assert proc.returncode == 141


def test_tables_are_plain_and_untruncated_when_piped():
    proc = subprocess.run([sys.executable, "-m", "trainbox.cli", "stack", "show", "npu-910b"], capture_output=True,
                          text=True, timeout=120, cwd=REPO_ROOT, env={**__import__("os").environ, "COLUMNS": "40"})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[1].split()[:3] == ["COMPONENT", "PLATFORM", "PIN"]
    assert any("torch==2.9.0+cpu" in line and "pytorch-cpu" in line for line in lines)  # one row, one line
    assert not any(ch in proc.stdout for ch in "┃│━…")


def test_tables_use_the_terminals_full_width():
    import os
    import pty

    master, slave = pty.openpty()
    env = {**os.environ, "COLUMNS": "220", "TERM": "xterm"}
    proc = subprocess.Popen([sys.executable, "-m", "trainbox.cli", "stack", "list"], stdout=slave,
                            stderr=subprocess.PIPE, cwd=REPO_ROOT, env=env)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    assert proc.wait(timeout=120) == 0
    text = b"".join(chunks).decode(errors="replace")
    rows = [line for line in text.splitlines() if "npu-a3" in line]
    assert rows and "quay.io/ascend/cann:8.5.1-a3-ubuntu22.04-py3.11" in rows[0]  # not folded at 80 columns
    assert "│" in text or "┃" in text  # a terminal gets the rich table
