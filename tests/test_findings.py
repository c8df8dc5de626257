"""One findings pass wherever a stack is used (issue 24): each finding once, with its platforms, at the file that
holds the pin; a derived stack uses its parent's lock; the dry run and the build plan through one path.

Offline: where an index would be asked, the one stand-in (`index_stand_in`) answers for PyPI, and is named so."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from trainbox.image import build as image_build
from trainbox.supply import lock as lockmod
from trainbox.cli import main
from trainbox.paths import REPO_ROOT, STACKS_DIR
from trainbox.specs.stack import load_stack
from upstream_helpers import MEGATRON, git_env, make_mirrors

OWN_TORCH_NPU = ("npu-910b-megatron", "twinkle", "twinkle-a3", "swift")
WRONG = "2.8.0.post2"  # torch_npu built for torch 2.8.0 (Ascend's table); npu-910b pins torch 2.9.0
FINDING = re.compile(r"^\s*(\S+): \[torch-npu-cann\] error: (.*)$", re.M)


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    """A dry run stages its context under the cache: each test its own, never the user's (~/.cache/trainbox),
    which a build running beside the tests would share."""
    monkeypatch.setenv("TRAINBOX_CACHE", str(tmp_path / "cache"))


@pytest.fixture
def stacks(tmp_path) -> Path:
    """Every shipped stack and lock in a scratch directory, npu-910b's torch_npu moved to a wrong pin: npu-910b has
    7 dependants (npu-a3, npu-910b-megatron, twinkle, twinkle-a3, swift, specforge, relax), of which the Megatron
    line (npu-910b-megatron, twinkle, twinkle-a3, swift) pins its own torch / torch_npu (2.7.1)."""
    d = tmp_path / "stacks"
    d.mkdir()
    for p in STACKS_DIR.iterdir():
        shutil.copy(p, d / p.name)
    data = yaml.safe_load((d / "npu-910b.yaml").read_text())
    data["components"]["torch-npu"]["version"] = WRONG
    (d / "npu-910b.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return d


def findings_in(text: str) -> list[tuple[str, str]]:
    return FINDING.findall(text)


def test_a_wrong_torch_npu_pin_is_one_finding_per_platform_at_npu_910b(stacks, capsys, monkeypatch):
    """stack lock, image build --dry-run and image build refuse with the same one finding, at npu-910b.yaml, naming
    both platforms; validate over all the stacks says it once (it said it 16 times, once per platform for
    npu-910b and for each of its 7 dependants, each at the dependant's file)."""
    npu = str(stacks / "npu-910b.yaml")
    locks = {p.name: p.read_bytes() for p in stacks.glob("*.lock")}
    def no_lock(stack, *a, **k):  # the Megatron line pins its own torch_npu: only those may be locked
        if stack.name not in OWN_TORCH_NPU:
            pytest.fail(f"a refused stack was locked: {stack.name}")
        return lockmod.LockReport(lock=dict(stack.lock or {}))  # its lock as it was (a lock is never empty)

    monkeypatch.setattr(lockmod, "lock_stack", no_lock)
    monkeypatch.setattr(image_build, "find_client", lambda: pytest.fail("a refused build asked for the engine"))

    assert main(["stack", "lock", npu]) == 1
    lock_err = capsys.readouterr().err
    assert main(["image", "build", npu, "--dry-run"]) == 1  # the same status for the same finding (issue 37)
    dry_err = capsys.readouterr().err
    assert main(["image", "build", npu]) == 1
    build_err = capsys.readouterr().err

    for err in (lock_err, dry_err, build_err):
        found = findings_in(err)
        assert len(found) == 1, err
        where, message = found[0]
        assert where == npu
        assert f"torch_npu {WRONG} is built for torch 2.8.0" in message
        assert message.endswith("(linux/amd64, linux/arm64)"), message
    assert findings_in(lock_err) == findings_in(dry_err) == findings_in(build_err)
    # the lock refuses npu-910b and each dependant, each named once, nothing written
    for name in ("npu-910b", "npu-a3", "specforge", "relax"):
        assert re.search(rf"^{name}: not locked: 1 error finding", lock_err, re.M), (name, lock_err)
    for name in OWN_TORCH_NPU:  # their own pin is a good pair: not refused for the parent's
        assert not re.search(rf"^{name}: not locked", lock_err, re.M), (name, lock_err)
    assert "npu-a3: not locked: 1 error finding (inherited from npu-910b.yaml)" in lock_err
    after = {p.name: p.read_bytes() for p in stacks.glob("*.lock")}
    refused = {n for n in after if n.removesuffix(".lock") not in OWN_TORCH_NPU}  # the stub wrote the others
    assert {n: after[n] for n in refused} == {n: locks[n] for n in refused}

    # validate over every stack: the finding once, each dependant counting it as inherited
    assert main(["stack", "validate", *map(str, sorted(stacks.glob("*.yaml")))]) == 1
    out = capsys.readouterr()
    assert len(findings_in(out.err)) == 1 and findings_in(out.err)[0][0] == npu
    assert "FAIL specforge" in out.err and "inherited from npu-910b.yaml (shown there)" in out.err

    # a dependant alone: the finding at npu-910b.yaml, saying it is inherited; in the JSON too
    assert main(["image", "build", str(stacks / "npu-a3.yaml"), "--dry-run", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is False and [(f["rule"], f["file"], f["inherited_from"], f["platforms"])
                                   for f in doc["findings"]] == [
        ("torch-npu-cann", npu, "npu-910b.yaml", ["linux/amd64", "linux/arm64"])]


def test_one_exit_status_per_kind_of_problem_from_every_command(stacks, capsys, monkeypatch):
    """Issue 37: a stack's error finding exits 1 (a check found a problem) from validate, lock, render, patches
    verify, the dry run and the build, with --json or not; a stack file that does not load exits 2 (invalid
    input) from each of them. validate and lock said 1 and the build 2 for the same finding; validate said 1 and
    the rest 2 for the same schema error."""
    from trainbox.specs.findings import EXIT_FINDINGS

    monkeypatch.setattr(lockmod, "lock_stack", lambda *a, **k: pytest.fail("a refused stack was locked"))
    monkeypatch.setattr(image_build, "find_client", lambda: pytest.fail("a refused build asked for the engine"))
    commands = {
        "validate": ["stack", "validate"], "validate --json": ["stack", "validate", "--json"],
        "lock": ["stack", "lock", "--no-dependants"], "lock --json": ["stack", "lock", "--no-dependants", "--json"],
        "render": ["render", "-o", str(stacks.parent / "out")],
        "patches verify": ["patches", "verify", "--offline"],
        "build --dry-run": ["image", "build", "--dry-run"],
        "build --dry-run --json": ["image", "build", "--dry-run", "--json"],
        "build": ["image", "build"], "build --json": ["image", "build", "--json"],
    }

    def statuses(stack: Path) -> dict[str, int]:
        out = {}
        for what, argv in commands.items():
            out[what] = main([*argv, str(stack)])
            err = capsys.readouterr().err
            assert "Traceback" not in err, (what, err)
        return out

    finding = statuses(stacks / "npu-910b.yaml")  # the wrong torch_npu pin of the fixture: a rule's error
    assert EXIT_FINDINGS == 1 and finding == dict.fromkeys(commands, EXIT_FINDINGS), finding
    bad = stacks / "cpu.yaml"
    bad.write_text(bad.read_text().replace("python:", "pythn:", 1))  # a key the schema does not know
    assert statuses(bad) == dict.fromkeys(commands, 2)
    assert not (stacks.parent / "out").exists()


def test_a_warning_is_a_plan_note_and_in_the_plan_json(stacks, capsys):
    """A torch_npu inside Ascend's documented compatibility but off the recommended pair is a warning: the dry run
    goes on and carries it as a note and in the plan's `findings`."""
    data = yaml.safe_load((stacks / "npu-910b.yaml").read_text())
    data["components"]["torch-npu"]["version"] = "2.9.0.post2"  # TorchNPU 26.0, recommended with CANN 9.0
    data["components"]["torch-npu"]["sha256"] = ["a" * 64]
    (stacks / "npu-910b.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    rc = main(["image", "build", str(stacks / "npu-910b.yaml"), "--dry-run", "--json"])
    plan = json.loads(capsys.readouterr().out)
    # not refused (2): planned, exit 1 only where the base or an index would stop the real build here
    assert rc == (1 if plan["would_stop"] else 0), (rc, plan["notes"])
    assert ("torch-npu-cann", "warning") in [(f["rule"], f["level"]) for f in plan["findings"]]
    # the lock no longer fits the moved pin: a note for the build (which resolves the closure), not a refusal
    assert {f["level"] for f in plan["findings"]} == {"warning"}
    assert any(n.startswith("finding: ") and "[torch-npu-cann] warning" in n for n in plan["notes"])


@pytest.fixture(scope="module")
def mirrors(tmp_path_factory):
    return make_mirrors(tmp_path_factory.mktemp("mirrors"))


@pytest.mark.slow
def test_a_new_stack_extending_cpu_with_a_git_component_needs_no_lock(tmp_path, mirrors):
    """It validates (strict) and dry-runs with no warning about the pins it inherits: cpu's lock serves them. The
    plan lists the git source with its URL and commit."""
    d = tmp_path / "stacks"
    d.mkdir()
    for ext in (".yaml", ".lock"):
        shutil.copy(STACKS_DIR / f"cpu{ext}", d / f"cpu{ext}")
    new = d / "cpu-git.yaml"
    new.write_text(yaml.safe_dump({"name": "cpu-git", "extends": "cpu", "components": {"megatron-lm": {
        "source": "git", "git": MEGATRON[0], "commit": MEGATRON[2], "install": "tree"}}}))
    st = load_stack(new)
    assert st.lock_inherited == "cpu.lock" and st.lock_is_fresh() and st.locked_deps("linux/amd64")

    env = git_env(mirrors, TRAINBOX_CACHE=str(tmp_path / "cache"), PYTHONPATH=str(REPO_ROOT / "python"))
    run = lambda *args: subprocess.run([sys.executable, "-m", "trainbox.cli", *args], env=env, capture_output=True,  # noqa: E731
                                       text=True, timeout=300, cwd=REPO_ROOT)
    proc = run("stack", "validate", str(new), "--strict", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(proc.stdout)["stacks"][0]["findings"] == []

    proc = run("image", "build", str(new), "--dry-run", "--json", "--platform", "linux/amd64")
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert plan["findings"] == []
    said = "\n".join(plan["notes"]) + proc.stderr
    assert "no sha256" not in said and "stack lock" not in said and "inherited" not in said, said
    git = [f for f in plan["fetch"] if f["key"] == "megatron-lm"]
    assert git and MEGATRON[0] in git[0]["from"] and MEGATRON[2] in git[0]["from"]
    # cpu's pins come hashed from cpu's lock
    assert all(f["sha256"] for f in plan["fetch"] if f["key"] in ("torch", "numpy"))


def test_a_derived_stack_that_adds_a_pin_says_so_in_one_line(tmp_path, capsys):
    d = tmp_path / "stacks"
    d.mkdir()
    for ext in (".yaml", ".lock"):
        shutil.copy(STACKS_DIR / f"cpu{ext}", d / f"cpu{ext}")
    new = d / "cpu-more.yaml"
    new.write_text(yaml.safe_dump({"name": "cpu-more", "extends": "cpu", "components": {
        "six": {"source": "pypi", "version": "1.17.0"}, "numpy": {"version": "2.3.4"}}}))
    assert not load_stack(new).lock_is_fresh()
    assert main(["stack", "validate", str(new)]) == 0
    out = capsys.readouterr().out
    lines = [ln for ln in out.splitlines() if "[pinned-sources]" in ln]
    assert len(lines) == 1, out
    assert "moves numpy to 2.3.4 from pypi; adds six==1.17.0: cpu.lock (inherited)" in lines[0]
    assert "run `trainbox stack lock cpu-more`" in lines[0]
    assert "torch" not in lines[0]  # the pin it does not change is hashed from cpu.lock


def test_the_dry_run_hashes_a_moved_pin_as_the_build_does(tmp_path, monkeypatch):
    """`image build npu-910b --profile ci/smoke-offline.yaml --dry-run` refused the moved torch-npu pin ("no sha256 ...
    run stack lock") that the build hashes from its index. Now both take the hash from the index (here the
    stand-in), and both refuse the same way when the index has no such release."""
    monkeypatch.setenv("TRAINBOX_CACHE", str(tmp_path / "cache"))  # no remembered lock for these overrides
    sha = "b" * 64

    def index_stand_in(index, url, project):  # PyPI's JSON API, for torch-npu only (named stand-in)
        if project != "torch-npu":
            raise lockmod.IndexUnreachable(index, url, "not asked in this test")
        return [{"filename": "torch_npu-2.13.0-cp311-cp311-manylinux_2_28_x86_64.whl", "url": "x",
                 "hashes": {"sha256": sha}}]

    monkeypatch.setattr(lockmod, "project_files", index_stand_in)
    monkeypatch.setattr(image_build, "url_answers", lambda *a, **k: (True, ""))  # the index probes: answered
    monkeypatch.setattr(lockmod, "_pip_resolve", lambda *a, **k: {})  # the build's closure: not asked here
    torch = "6746dbcbeb526eb61330b76b41ff1b4eb848951103a892eeb080dfa2b264667b"  # cpu.yaml's torch 2.13.0+cpu
    sets = {"torch.version": "2.13.0+cpu", "torch.sha256": torch, "torch-npu.version": "2.13.0",
            "base.cann": "9.2.0"}
    opts = image_build.BuildOptions(stack="npu-910b", sets=sets, base="local/debian:bookworm", platform="linux/amd64",
                              dry_run=True)
    plan = image_build.plan(opts, client=None, say=lambda m: None)
    npu = [f for f in plan.fetch if f["key"] == "torch-npu"]
    assert npu and npu[0]["sha256"] == [sha], plan.fetch
    assert any("the build resolves their dependency closure" in n for n in plan.notes)
    built = lockmod.lock_overrides(load_stack("npu-910b", sets=sets), "linux/amd64", [], None, lambda m: None)
    assert built.components["torch-npu"].pin_for("linux/amd64").sha256 == [sha]

    sets["torch-npu.version"] = "2.13.9"  # no such release on the index: the same refusal on both paths
    errors = []
    for dry in (True, False):
        with pytest.raises(Exception) as exc:
            if dry:
                image_build.plan(image_build.BuildOptions(stack="npu-910b", sets=sets, base="local/debian:bookworm",
                                              platform="linux/amd64", dry_run=True), client=None, say=lambda m: None)
            else:
                lockmod.lock_overrides(load_stack("npu-910b", sets=sets), "linux/amd64", [], None, lambda m: None)
        errors.append(str(exc.value))
    assert errors[0] == errors[1] and "torch-npu==2.13.9 has no artifact" in errors[0]


def test_plan_lists_patch_series_with_hashes(tmp_path):
    from trainbox.image.plan import source_plan
    from trainbox.image.render import render_stack

    st = load_stack("twinkle")
    fetch = source_plan(render_stack(st).manifest)
    series = {f["key"]: f for f in fetch if f["key"].startswith("patches:")}
    assert {"patches:megatron-core", "patches:mindspeed"} <= set(series)
    assert all(len(h) == 64 for h in series["patches:mindspeed"]["sha256"])
    git = {f["key"]: f["from"] for f in fetch if not f["key"].startswith("patches:")}
    assert "d0d5809d4323eb908f89e87958de254465eb57b4" in git["mindspeed"]


def test_mindspeed_megatron_relabel_is_caught_on_a_shipped_stack(tmp_path, capsys):
    """The core_r0.16.0 commit written as `ref: core_r0.15.3` in npu-910b-megatron: validate fails."""
    d = tmp_path / "s"
    d.mkdir()
    for name in ("npu-910b", "npu-910b-megatron"):
        for ext in (".yaml", ".lock"):
            shutil.copy(STACKS_DIR / f"{name}{ext}", d / f"{name}{ext}")
    data = yaml.safe_load((d / "npu-910b-megatron.yaml").read_text())
    data["components"]["mindspeed"].update(commit="e4772499f7eb9fa9a68919dd1eaddef00e915b2d", ref="core_r0.15.3")
    (d / "npu-910b-megatron.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    assert main(["stack", "validate", str(d / "npu-910b-megatron.yaml")]) == 1
    assert "[mindspeed-megatron] error" in capsys.readouterr().err


def test_locking_a_parent_leaves_a_dependant_that_inherits_its_lock_without_one(tmp_path, capsys, monkeypatch):
    from test_cli_stack import offline_lock

    monkeypatch.setattr(lockmod, "lock_stack", offline_lock)
    d = tmp_path / "stacks"
    d.mkdir()
    for ext in (".yaml", ".lock"):
        shutil.copy(STACKS_DIR / f"cpu{ext}", d / f"cpu{ext}")
    (d / "cpu-env.yaml").write_text(yaml.safe_dump({"name": "cpu-env", "extends": "cpu", "env": {"X": "1"}}))
    assert main(["stack", "lock", str(d / "cpu.yaml"), "--json"]) == 0
    assert [s["stack"] for s in json.loads(capsys.readouterr().out)["stacks"]] == ["cpu"]
    assert not (d / "cpu-env.lock").exists() and load_stack(d / "cpu-env.yaml").lock_is_fresh()


def test_validate_is_a_library_function_that_returns_its_verdicts(stacks):
    """`stack validate` prints what trainbox.specs.findings.validate returns: the stack that does not load first,
    then each stack after the one it extends, the inherited finding placed at the parent's file."""
    from trainbox.specs.findings import validate

    (stacks / "broken.yaml").write_text("device: cpu\n")
    result = validate([str(stacks / n) for n in ("npu-a3.yaml", "npu-910b.yaml", "broken.yaml")])
    assert [v.stack for v in result.stacks] == [str(stacks / "broken.yaml"), "npu-910b", "npu-a3"]  # as named
    assert result.invalid and result.failed and result.stacks[0].error and not result.stacks[0].ok
    parent, child = result.stacks[1:]
    wrong = [r for r in parent.bad if r.finding.rule == "torch-npu-cann"]  # (and its lock is stale now)
    assert len(wrong) == 1 and wrong[0].inherited_from is None
    inherited = [r for r in child.bad if r.finding.rule == "torch-npu-cann"]
    assert [r.inherited_from for r in inherited] == ["npu-910b.yaml"] and str(inherited[0].file) == parent.file
    doc = result.as_dict()
    assert doc["ok"] is False and doc["stacks"][0]["findings"][0]["rule"] == "schema"
    assert validate(["cpu"]).failed is False
