"""`trainbox stack diff|validate|lock|list` as a user scripts them (issue 15, items 3 and 6). Offline: the one
index stand-in (`offline_lock`) replaces PyPI where a lock is computed, and is named so."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from trainbox.supply import lock as lockmod
from trainbox.cli import main
from trainbox.paths import STACKS_DIR
from trainbox.specs.stack import load_stack


@pytest.fixture
def stacks(tmp_path) -> Path:
    """The shipped npu-910b and npu-a3 (which extends it) and cpu, with their locks, in a scratch directory."""
    for name in ("npu-910b", "npu-a3", "cpu"):
        for ext in (".yaml", ".lock"):
            shutil.copy(STACKS_DIR / f"{name}{ext}", tmp_path / f"{name}{ext}")
    return tmp_path


def edit(path: Path, fn) -> None:
    data = yaml.safe_load(path.read_text())
    fn(data)
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def offline_lock(stack, wheelhouse=None, resolve_deps=True, **_):
    """Stand-in for the index (PyPI is not asked in these tests): a lock of the stack's pins as they are now."""
    rep = lockmod.LockReport()
    rep.lock = {"stack": stack.name, "python": stack.python, "pins_digest": stack.pins_digest(),
                "indexes": dict(stack.indexes), "platforms": {}}
    for plat in stack.platforms:
        comps = {k: {"version": c.pin_for(plat).version, "index": c.pin_for(plat).index, "sha256": ["a" * 64]}
                 for k, c in stack.installed_components.items() if c.source == "pypi"}
        rep.lock["platforms"][plat] = {"components": comps}
        old = ((stack.lock or {}).get("platforms") or {}).get(plat, {}).get("components") or {}
        rep.changes += [f"{plat} {k}: {(old.get(k) or {}).get('version', '-')} -> {v['version']}"
                        for k, v in comps.items() if old.get(k) != v]
    return rep


def test_diff_names_cann_chip_hashes_indexes_packages_env_and_exits_1(stacks, capsys):
    def bump(d):
        d["base"].update(image="quay.io/ascend/cann:9.0.0-910b-ubuntu22.04-py3.11", cann="9.0.0")
        d["indexes"]["pypi"] = "https://mirror.example/simple"
        d["system_packages"].append("numactl")
        d["env"]["HCCL_BUFFSIZE"] = "400"
        d["components"]["torch-npu"]["version"] = "2.9.0.post6"
    shutil.copy(stacks / "npu-910b.yaml", stacks / "npu-new.yaml")
    edit(stacks / "npu-new.yaml", lambda d: (d.update(name="npu-new"), bump(d)))
    rc = main(["stack", "diff", str(stacks / "npu-910b.yaml"), str(stacks / "npu-new.yaml"), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 1 and doc["schema"] == 1 and doc["same"] is False
    keys = {c["key"] for c in doc["changes"]}
    assert {"base.cann", "base.image", "indexes.pypi", "system_packages", "env.HCCL_BUFFSIZE",
            "components.torch-npu.pins.linux/amd64.version", "components.torch-npu.pins.linux/amd64.sha256",
            "lock.state"} <= keys, keys
    cann = next(c for c in doc["changes"] if c["key"] == "base.cann")
    assert (cann["a"], cann["b"], cann["change"]) == ("8.5.1", "9.0.0", "changed")
    env = next(c for c in doc["changes"] if c["key"] == "env.HCCL_BUFFSIZE")
    assert env == {"key": "env.HCCL_BUFFSIZE", "a": None, "b": "400", "change": "added"}

    rc = main(["stack", "diff", str(stacks / "npu-910b.yaml"), str(stacks / "npu-new.yaml")])
    out = capsys.readouterr().out
    assert rc == 1 and "base.cann: 8.5.1 -> 9.0.0" in out and "env.HCCL_BUFFSIZE: (absent) -> 400" in out
    assert "None" not in out and "['" not in out  # no Python reprs

    assert main(["stack", "diff", "cpu", "cpu"]) == 0
    assert "build the same" in capsys.readouterr().out


def test_validate_checks_declared_cann_against_the_base_tag(stacks, capsys):
    path = stacks / "npu-910b.yaml"
    edit(path, lambda d: d["base"].update(image="quay.io/ascend/cann:9.0.0-910b-ubuntu22.04-py3.11"))
    assert main(["stack", "validate", str(path), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    msgs = [f["message"] for s in doc["stacks"] for f in s["findings"] if f["rule"] == "base-reference"]
    assert msgs and "base.cann: 8.5.1" in msgs[0] and "9.0.0" in msgs[0]
    assert main(["stack", "validate", str(path)]) == 1
    err = capsys.readouterr().err
    assert f"{path}: [base-reference] error: base.cann: 8.5.1" in err  # file and key

    edit(path, lambda d: d["base"].update(image="quay.io/ascend/cann:8.5.1-a3-ubuntu22.04-py3.11"))
    main(["stack", "validate", str(path)])
    assert "base.chip: 910b" in capsys.readouterr().err


def test_lock_of_a_parent_relocks_its_dependants(stacks, capsys, monkeypatch):
    monkeypatch.setattr(lockmod, "lock_stack", offline_lock)
    edit(stacks / "npu-910b.yaml", lambda d: d["components"]["transformers"].update(version="5.10.3"))
    # the problem: the derived stack's lock is stale and validate says so, naming the moved pin
    assert main(["stack", "validate", str(stacks / "npu-a3.yaml")]) == 1
    err = capsys.readouterr().err
    # said once, at the file that moved the pin, with the command that relocks both (issue 24)
    assert "npu-910b.yaml: [lock-fresh] error: npu-910b.lock is stale: components.transformers: locked 5.10.4" in err
    assert "the stack pins 5.10.3" in err and "(inherited from npu-910b.yaml)" in err
    assert err.count("[lock-fresh]") == 1

    assert main(["stack", "lock", str(stacks / "npu-910b.yaml"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == 1 and [s["stack"] for s in doc["stacks"]] == ["npu-910b", "npu-a3"]
    assert all(s["written"] for s in doc["stacks"])
    assert load_stack(stacks / "npu-a3.yaml").lock_is_fresh()
    assert main(["stack", "validate", str(stacks / "npu-a3.yaml"), str(stacks / "npu-910b.yaml")]) == 0


def test_lock_no_dependants_names_them(stacks, capsys, monkeypatch):
    monkeypatch.setattr(lockmod, "lock_stack", offline_lock)
    edit(stacks / "npu-910b.yaml", lambda d: d["components"]["transformers"].update(version="5.10.3"))
    assert main(["stack", "lock", str(stacks / "npu-910b.yaml"), "--no-dependants", "--json"]) == 0
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert [s["stack"] for s in doc["stacks"]] == ["npu-910b"]
    assert doc["not_locked_dependants"] == [{"stack": "npu-a3", "extends": "npu-910b"}]
    assert "npu-a3 extends npu-910b" in captured.err and "trainbox stack lock npu-a3" in captured.err
    assert not load_stack(stacks / "npu-a3.yaml").lock_is_fresh()


def test_lock_takes_several_stacks_and_all(stacks, capsys, monkeypatch):
    monkeypatch.setattr(lockmod, "lock_stack", offline_lock)
    rc = main(["stack", "lock", str(stacks / "npu-a3.yaml"), str(stacks / "cpu.yaml"), "--check", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert [s["stack"] for s in doc["stacks"]] == ["npu-a3", "cpu"]
    assert rc == 1 and not any(s["written"] for s in doc["stacks"])  # --check: hashes would change, nothing written
    assert main(["stack", "lock", "--all", "--check", "--json"]) == 1
    names = [s["stack"] for s in json.loads(capsys.readouterr().out)["stacks"]]
    assert names.index("npu-910b") < names.index("npu-a3") and names.index("cpu") < names.index("cpu-ray")
    with pytest.raises(SystemExit) as exc:
        main(["stack", "lock"])
    assert exc.value.code == 2 and "usage: trainbox stack lock" in capsys.readouterr().err


def test_stale_lock_names_a_moved_index_url(stacks):
    edit(stacks / "npu-910b.yaml", lambda d: d["indexes"].update(pypi="https://mirror.example/simple"))
    why = load_stack(stacks / "npu-910b.yaml").lock_staleness()
    assert why == ["indexes.pypi: locked against https://pypi.org/simple, the stack has https://mirror.example/simple"]


def test_stack_list(capsys):
    assert main(["stack", "list", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    rows = {r["name"]: r for r in doc["stacks"]}
    assert rows["npu-a3"]["extends"] == "npu-910b" and rows["npu-a3"]["cann"] == "8.5.1"
    assert all(r["lock"] == "fresh" for r in rows.values())
    assert main(["stack", "list"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:3] == ["NAME", "DEVICE", "PYTHON"] and any(line.startswith("npu-a3 ") for line in out)


@pytest.mark.network
def test_lock_check_against_pypi_covers_the_dependants(capsys):
    """The real index (PEP 691): the shipped locks are current, and a derived stack is checked with its parent."""
    rc = main(["stack", "lock", "npu-910b", "--check", "--no-deps", "--json"])
    doc = json.loads(capsys.readouterr().out)
    from trainbox.specs.stack import dependants

    # the parent first, then every stack that extends it (directly or through others), parents before children
    assert [s["stack"] for s in doc["stacks"]] == ["npu-910b", *dependants("npu-910b")]
    assert {"npu-a3", "twinkle", "relax"} <= {s["stack"] for s in doc["stacks"]}
    assert rc == 0 and doc["ok"] and not any(s["written"] or s["changes"] for s in doc["stacks"]), doc


def test_patches_edit_names_a_stale_lock_instead_of_two_identical_pins(stacks, monkeypatch, capsys):
    """Issue 15, item 3: after locking only the parent, `patches edit` met two pins that printed the same."""
    import trainbox.specs.stack as stackmod
    from trainbox.supply.patches import PatchSeriesError, resolve_component

    monkeypatch.setattr(lockmod, "lock_stack", offline_lock)
    monkeypatch.setattr(stackmod, "STACKS_DIR", stacks)
    (stacks / "cpu.yaml").unlink()
    edit(stacks / "npu-910b.yaml", lambda d: d["components"]["megatron-core"].update(version="0.15.2"))
    assert main(["stack", "lock", "npu-910b", "--no-dependants"]) == 0
    with pytest.raises(PatchSeriesError, match=r"megatron-core==0.15.2 in every stack, but with other hashes .*"
                                               r"a stale lock\?"):
        resolve_component("megatron-core")
    assert main(["stack", "lock", "npu-a3"]) == 0
    assert resolve_component("megatron-core")[1].version == "0.15.2"


def test_a_build_that_drops_an_unreachable_index_keeps_its_lock():
    """image build drops an index that does not answer (its pins come from the wheelhouse); the lock was computed
    against that index, so the dependency closure stays locked (and the online and --bundle tags agree)."""
    from trainbox.image import render
    from trainbox.specs.stack import load_stack

    s = load_stack("cpu")
    assert render.render_stack(s).manifest["deps_locked"]
    s = s.without_indexes(["pytorch-cpu"])
    assert s.lock_staleness() == [] and render.render_stack(s).manifest["deps_locked"]
    gone = load_stack("cpu")
    # an index really removed from the stack still makes the lock stale
    gone = gone.model_copy(update={"indexes": {k: v for k, v in gone.indexes.items() if k != "pytorch-cpu"}})
    assert any("indexes.pytorch-cpu" in w for w in gone.lock_staleness())


def test_validate_shows_the_error_first_and_one_line_per_rule_of_notes(stacks, capsys):
    """Issue 41 item 4: the one error is not buried under a screenful of `info` lines (all still in --json)."""
    path = stacks / "npu-910b.yaml"

    def add(d):
        d["base"]["image"] = "quay.io/ascend/cann:9.0.0-910b-ubuntu22.04-py3.11"  # an error (base-reference)
        for i in range(6):  # six pins without an arm64 artifact in the lock: six arm64-artifacts infos
            d["components"][f"extra{i}"] = {"source": "pypi", "version": "1.0"}
    edit(path, add)
    assert main(["stack", "validate", str(path)]) == 1
    out, err = capsys.readouterr()
    lines = [ln for ln in (err + out).splitlines() if ln.startswith("  ")]
    assert "[base-reference] error" in lines[0], lines
    arm = [ln for ln in lines if "[arm64-artifacts] info" in ln]
    assert len(arm) == 1 and "more like it" in arm[0], arm
    assert main(["stack", "validate", str(path), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert sum(f["rule"] == "arm64-artifacts" for s in doc["stacks"] for f in s["findings"]) >= 6


def test_adding_a_git_component_built_as_a_wheel_says_the_lock_does_not_cover_it(stacks, capsys):
    """Issue 41 item 4: a git component the image builds a wheel from needs its build requirements in the lock;
    a derived stack that adds one is told, as it is for an added pypi pin."""
    child = stacks / "mine.yaml"
    child.write_text(yaml.safe_dump({"name": "mine", "extends": "npu-910b", "components": {"mindspeed": {
        "source": "git", "git": "https://gitcode.com/Ascend/MindSpeed.git",
        "commit": "d0d5809d4323eb908f89e87958de254465eb57b4"}}}))
    main(["stack", "validate", str(child)])
    said = "".join(capsys.readouterr())
    assert "[pinned-sources] warning: builds mindspeed from source" in said, said
    assert "run `trainbox stack lock mine`" in said
    # a tree (no wheel built) leaves the inherited lock as it is
    child.write_text(child.read_text().replace("mindspeed:", "mindspeed:\n    install: tree"))
    main(["stack", "validate", str(child)])
    assert "builds mindspeed" not in "".join(capsys.readouterr())


def test_lock_says_each_step_as_it_starts(stacks, capsys, monkeypatch):
    """Issue 41 item 5: a lock takes minutes (pip's resolver): each step is one timed line on stderr, as it
    starts. The index stand-in: project_files answers from nothing (every pin unreachable), which is enough."""
    from trainbox.supply.index import IndexUnreachable

    def unreachable(index, name, *a, **k):
        raise IndexUnreachable(index, "https://index.invalid/simple", "stand-in")

    monkeypatch.setattr(lockmod, "project_files", unreachable)
    main(["stack", "lock", str(stacks / "cpu.yaml"), "--no-deps", "--check"])
    err = capsys.readouterr().err
    steps = [ln for ln in err.splitlines() if ln.startswith("  [")]
    assert any("cpu linux/amd64: the pins' hashes" in s for s in steps), err
    assert steps[-1].endswith("cpu: done") and lockmod.PROGRESS is None


def test_pip_resolver_says_how_far_it_is_and_keeps_its_last_lines(monkeypatch):
    """Issue 38 item 5: `stack lock cuda --check` was minutes of silence inside pip's resolver. The resolver's
    output is read as it comes: a line every PIP_HEARTBEAT_S with the distributions collected so far, and pip's
    last lines when it fails. A stand-in for pip (a script printing pip's lines), as pip would need an index."""
    import sys

    script = ("import sys, time\n"
              "for n in ('torch==2.9.1', 'numpy', 'sympy'):\n"
              "    print('Collecting', n, flush=True); time.sleep(0.3)\n"
              "print('  Downloading torch-2.9.1-cp312-cp312-manylinux_2_28_x86_64.whl (899.7 MB)', flush=True)\n"
              "time.sleep(0.3)\n"
              "print('ERROR: ResolutionImpossible: numpy', file=sys.stderr); sys.exit(1)\n")
    monkeypatch.setattr(lockmod, "PIP_HEARTBEAT_S", 0.2)
    said = []
    rc, tail = lockmod._run_pip([sys.executable, "-c", script], {}, "cuda linux/amd64: pip's resolver", said.append)
    assert rc == 1 and tail[-1] == "ERROR: ResolutionImpossible: numpy", tail
    assert any(s.startswith("cuda linux/amd64: pip's resolver: 2 distributions so far (numpy)") for s in said), said
    assert "3 distributions so far (downloading torch-2.9.1" in said[-1], said
    # no result in PIP_TIMEOUT_S: pip is stopped and the last line says so
    monkeypatch.setattr(lockmod, "PIP_TIMEOUT_S", 0.5)
    rc, tail = lockmod._run_pip([sys.executable, "-c", "print('Collecting x', flush=True); import time; "
                                 "time.sleep(30)"], {}, "x", None)
    assert rc != 0 and tail == ["Collecting x", "(stopped: no result after 0.5 s)"], (rc, tail)


def _pip_stand_in(monkeypatch, first_error: str):
    """A stand-in for pip's resolver runs: the wheel-only run fails with `first_error`, a native run (no
    --only-binary) writes a report of one sdist. Returns the commands it was given."""
    cmds = []

    def run(cmd, env, what, say):
        cmds.append(cmd)
        if "--only-binary=:all:" in cmd:
            return 1, ["ERROR: " + first_error]
        report = {"install": [{"metadata": {"name": "crcmod", "version": "1.7"},
                               "download_info": {"archive_info": {"hashes": {"sha256": "ab" * 32}}}}]}
        Path(cmd[cmd.index("--report") + 1]).write_text(json.dumps(report))
        return 0, []

    monkeypatch.setattr(lockmod, "_run_pip", run)
    return cmds


def test_an_sdist_only_requirement_is_resolved_again_natively_on_the_host_platform(monkeypatch):
    """pip reads no sdist with --platform (crcmod, oss2 ... publish no wheel), so the wheel-only resolution cannot
    lock a closure holding one; on this host's own platform and the stack's Python the closure is resolved again
    without --platform, as the image build's pip would. Only for pip's "no matching distribution": a conflict,
    or a pin whose index is down, is not retried."""
    from trainbox.specs.platforms import host_platform

    stack = load_stack("cpu")
    monkeypatch.setattr(lockmod, "builds_for", lambda st, plat: plat == host_platform())
    cmds = _pip_stand_in(monkeypatch, "No matching distribution found for crcmod==1.7")
    out = lockmod._pip_resolve(stack, host_platform(), None, set())
    assert out == {"crcmod": {"version": "1.7", "sha256": ["ab" * 32]}}
    assert len(cmds) == 2 and not any(a.startswith("--platform") or a.startswith("--only-binary") for a in cmds[1])
    # a pin the lock found without a wheel: straight to the native resolution; for another platform, no pip at all
    cmds = _pip_stand_in(monkeypatch, "not asked")
    assert lockmod._pip_resolve(stack, host_platform(), None, set(), sdists=["crcmod"]) == out
    assert len(cmds) == 1 and "--only-binary=:all:" not in cmds[0]
    other = "linux/arm64" if host_platform() == "linux/amd64" else "linux/amd64"
    with pytest.raises(lockmod.SdistOnly, match="crcmod is published as an sdist only"):
        lockmod._pip_resolve(stack, other, None, set(), sdists=["crcmod"])
    assert len(cmds) == 1
    for error, skip in (("ResolutionImpossible: numpy", set()),
                        ("No matching distribution found for torch==2.13.0+cpu", {"pytorch-cpu"})):
        cmds = _pip_stand_in(monkeypatch, error)
        with pytest.raises(lockmod.TrainboxError) as exc:
            lockmod._pip_resolve(stack, host_platform(), None, skip)
        assert error in str(exc.value) and len(cmds) == 1


@pytest.mark.parametrize("files, sdist_only", [
    (["crcmod-1.7.tar.gz", "crcmod-1.7.win32-py3.1.msi"], True),
    (["crcmod-1.7.tar.gz", "crcmod-1.7-py3-none-any.whl"], False),  # a wheel fits: pip's own error stands
])
def test_an_sdist_only_requirement_of_another_platform_leaves_its_closure_unlocked(monkeypatch, files, sdist_only):
    """Another platform's closure with an sdist-only requirement cannot be resolved from here: the lock says so
    (incomplete, with the fix: lock on that platform) instead of failing for a pin that is fine. The index is a
    stand-in answering the project's files."""
    from trainbox.specs.platforms import host_platform

    other = "linux/arm64" if host_platform() == "linux/amd64" else "linux/amd64"
    stack = load_stack("cpu")
    cmds = _pip_stand_in(monkeypatch, "No matching distribution found for crcmod==1.7")
    monkeypatch.setattr(lockmod, "project_files", lambda index, url, name, *a, **k: [
        {"filename": f, "hashes": {"sha256": "cd" * 32}} for f in files])
    rep = lockmod.LockReport()
    assert lockmod._lock_deps(stack, other, {}, True, None, [], rep) is None
    assert len(cmds) == 1
    if sdist_only:
        assert rep.problems == [] and rep.incomplete == [
            f"{other}: dependencies not locked: crcmod is published as an sdist only, and pip resolves sdists for "
            f"its own platform alone; lock on a {other} host with Python 3.11 to lock them (the image build "
            "resolves them against the hash-checked pins)"], rep
    else:
        assert rep.incomplete == [] and "No matching distribution found for crcmod" in rep.problems[0], rep


def test_lock_runs_the_stacks_side_by_side_sharing_the_index_answers(stacks, capsys, monkeypatch):
    """A parent and its dependants are locked two at a time where pip reads metadata only (each lock is mostly
    pip waiting on the index), reported in the plan's order, and each project's index page is asked once per
    run, not once per stack. The index stand-in: project_files answers an empty page (no release of any pin)."""
    import threading

    asked, running, most = [], set(), [0]
    lock = threading.Lock()

    def empty(index, url, project, *a, **k):
        with lock:
            asked.append((url, project))
        return []

    real = lockmod.lock_stack

    def counted(stack, *a, **k):
        import time

        with lock:
            running.add(stack.name)
            most[0] = max(most[0], len(running))
        time.sleep(0.3)  # long enough for a second lock to start beside it
        try:
            return real(stack, *a, **k)
        finally:
            with lock:
                running.discard(stack.name)

    monkeypatch.setattr(lockmod, "project_files", empty)
    monkeypatch.setattr(lockmod, "lock_stack", counted)
    monkeypatch.setattr(lockmod, "metadata_only", lambda: True)
    main(["stack", "lock", str(stacks / "npu-910b.yaml"), "--no-deps", "--check", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert [s["stack"] for s in doc["stacks"]] == ["npu-910b", "npu-a3"]
    assert most[0] == 2, "the two locks ran one after the other"
    assert asked and len(asked) == len(set(asked)), sorted(asked)  # npu-a3 asked nothing npu-910b had asked


def test_lock_stacks_is_a_library_function_that_returns_its_results(stacks, monkeypatch):
    """`stack lock` prints what trainbox.supply.lockrun.lock_stacks returns: the parent, then its dependant with
    it, each said as it starts and as it ends; with check nothing is written and a change fails the run."""
    from trainbox.supply.lockrun import lock_stacks

    monkeypatch.setattr(lockmod, "lock_stack", offline_lock)
    edit(stacks / "npu-910b.yaml", lambda d: d["components"]["transformers"].update(version="5.10.3"))
    before = (stacks / "npu-910b.lock").read_bytes()
    started, done = [], []
    run = lock_stacks([str(stacks / "npu-910b.yaml")], check=True,
                      on_start=lambda st, why: started.append((st.name, why)), on_done=done.append)
    # two locks may run side by side (pip >= 25.3): each said as it starts, in whichever order they start
    assert sorted(started) == [("npu-910b", ""), ("npu-a3", " (extends npu-910b, locked with it)")]
    assert done == run.stacks and [s.stack for s in run.stacks] == ["npu-910b", "npu-a3"]
    assert run.stacks[0].changes and run.failed and not run.refused and run.stacks[0].written is None
    assert (stacks / "npu-910b.lock").read_bytes() == before  # check: nothing written
    assert run.as_dict()["ok"] is False and run.as_dict()["check"] is True
    run = lock_stacks([str(stacks / "npu-910b.yaml")], dependants=False)
    assert [s.stack for s in run.stacks] == ["npu-910b"] and run.named == [("npu-a3", "npu-910b")]
    assert run.stacks[0].written and not run.failed and load_stack(stacks / "npu-910b.yaml").lock_is_fresh()
