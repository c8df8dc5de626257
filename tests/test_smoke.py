"""`trainbox smoke`: the runner drives the real CLI against a scratch checkout (TRAINBOX_ROOT) that holds a good
stack, a stack whose patch no longer applies and a stack whose pin does not exist."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from trainbox import smoke
from trainbox.runtime.errors import TrainboxError

REPO = Path(__file__).resolve().parents[1]
NUMPY_SHA = "8cba086a43d54ca804ce711b2a940b16e452807acebe7852ff327f1ecd49b0d4"  # numpy 2.3.5, cp311 x86_64


def _git(repo: Path, *args: str) -> str:
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@example.com", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@example.com", GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_NOSYSTEM="1")
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env=env).stdout.strip()


def make_checkout(root: Path) -> dict[str, str]:
    """A scratch checkout: templates, launchers (the cpu-ddp recipe), and three stacks:
    cpu (the real one), patched (a git component whose patch does not apply), badpin (numpy==0.0.99)."""
    (root / "build" / "stacks").mkdir(parents=True)
    shutil.copytree(REPO / "build" / "templates", root / "build" / "templates")
    shutil.copy(REPO / ".hadolint.yaml", root)
    (root / "launchers" / "recipes").mkdir(parents=True)
    shutil.copytree(REPO / "launchers" / "templates", root / "launchers" / "templates")
    shutil.copytree(REPO / "launchers" / "jobs", root / "launchers" / "jobs")
    shutil.copy(REPO / "launchers" / "recipes" / "cpu-ddp.yaml", root / "launchers" / "recipes")
    for f in ("cpu.yaml", "cpu.lock"):
        shutil.copy(REPO / "build" / "stacks" / f, root / "build" / "stacks")

    # The upstream of the patched component: a local git repository (no network needed to fetch it).
    up = root / "upstream"
    up.mkdir()
    _git(up, "init", "-q")
    (up / "hello.py").write_text("def hello():\n    return 'hello'\n")
    _git(up, "add", ".")
    _git(up, "commit", "-qm", "init")
    commit = _git(up, "rev-parse", "HEAD")
    (root / "patches" / "demo").mkdir(parents=True)
    (root / "patches" / "demo" / "series").write_text("0001-greet-louder.patch\n")
    # Written against another version of hello.py: its context no longer matches.
    (root / "patches" / "demo" / "0001-greet-louder.patch").write_text(
        "From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n"
        "From: t <t@example.com>\nSubject: [PATCH] greet louder\n\n"
        "Why: a test patch made against another version of hello.py.\n\n"
        f"Upstream-Status: Inappropriate [test]\nUpstream-Ref: {up.as_uri()}@{commit}\n\n"
        "diff --git a/hello.py b/hello.py\n--- a/hello.py\n+++ b/hello.py\n@@ -1,2 +1,2 @@\n"
        " def hello():\n-    return 'goodbye'\n+    return 'HELLO'\n")

    cpu = (REPO / "build" / "stacks" / "cpu.yaml").read_text()
    assert "name: cpu" in cpu and "version: 2.3.5" in cpu, "the fixture edits cpu.yaml's numpy pin"
    # the derived stacks have no lock: linux/amd64 only, where the stack file's own hashes pin every artifact
    assert "platforms: [linux/amd64, linux/arm64]" in cpu, "the fixture narrows cpu.yaml's platforms"
    cpu = cpu.replace("platforms: [linux/amd64, linux/arm64]", "platforms: [linux/amd64]")
    pinned = cpu.replace("version: 2.3.5", f"version: 2.3.5\n    sha256: [{NUMPY_SHA}]")
    patched = pinned.replace("name: cpu", "name: patched").replace("components:\n", (
        "components:\n  demo:\n    source: git\n"
        f"    git: {up.as_uri()}\n    commit: {commit}\n    install: false\n    patches: demo\n"), 1)
    (root / "build" / "stacks" / "patched.yaml").write_text(patched)
    badpin = cpu.replace("name: cpu", "name: badpin").replace(
        "version: 2.3.5", "version: 0.0.99\n    sha256: [" + "ab" * 32 + "]")
    (root / "build" / "stacks" / "badpin.yaml").write_text(badpin)
    env = dict(os.environ, TRAINBOX_ROOT=str(root), TRAINBOX_CACHE=str(root / "cache"))
    for stack in ("cpu", "patched", "badpin"):  # their generated files, as a checkout commits them
        subprocess.run([sys.executable, "-m", "trainbox.cli", "render", stack], env=env, check=True,
                       capture_output=True, timeout=120)
    return env


def run_smoke(env: dict[str, str], tmp: Path, *args: str, timeout: int = 600) -> tuple[int, dict, Path, str]:
    junit = tmp / "junit.xml"
    proc = subprocess.run([sys.executable, "-m", "trainbox.cli", "smoke", "--json", "--junit", str(junit),
                           "-o", str(tmp / "work"), *args],
                          env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.stdout.strip().startswith("{"), proc.stderr[-3000:]
    return proc.returncode, json.loads(proc.stdout), junit, proc.stderr


def steps(report: dict, stack: str) -> dict[str, dict]:
    s = next(s for s in report["stacks"] if s["stack"] == stack)
    return {st["step"]: st for st in s["steps"]}


@pytest.fixture(scope="module")
def checkout(tmp_path_factory):
    root = tmp_path_factory.mktemp("checkout")
    return root, make_checkout(root)


@pytest.fixture(scope="module")
def keep_going(checkout, tmp_path_factory):
    """The broken-patch stack first, then cpu, with --keep-going (no lock step: it needs PyPI; no build)."""
    _, env = checkout
    tmp = tmp_path_factory.mktemp("keep-going")
    return run_smoke(env, tmp, "patched", "cpu", "--keep-going", "--skip", "lock,build")


@pytest.mark.slow
def test_broken_patch_fails_at_patches_step_and_names_the_patch(keep_going):
    rc, report, _, stderr = keep_going
    assert rc == 1 and report["ok"] is False and report["exit_code"] == 1
    assert report["summary"]["failed"] == ["patched/patches"]
    st = steps(report, "patched")
    reason = st["patches"]["reason"]
    assert "0001-greet-louder.patch" in reason and "fails at hello.py hunk 1" in reason, reason
    assert [r["status"] for r in st["patches"]["details"]["rows"]] == ["failed"]
    # the steps before it passed; a stack whose patches fail is not built (minutes saved), and says why
    assert all(st[s]["status"] == "pass" for s in ("validate", "render", "hadolint")), st
    assert st["lock"] == {**st["lock"], "status": "skipped", "reason": "--skip lock"}
    assert st["build"]["status"] == "skipped" and st["doctor"]["status"] == "skipped"
    # the matrix (stderr with --json) names the failure too
    assert "FAIL  patched/patches: demo: 0001-greet-louder.patch fails at hello.py hunk 1" in stderr


@pytest.mark.slow
def test_keep_going_runs_the_stacks_after_a_broken_one(keep_going):
    _, report, _, _ = keep_going
    assert [s["stack"] for s in report["stacks"]] == ["patched", "cpu"]
    st = steps(report, "cpu")
    assert {k: v["status"] for k, v in st.items()} == {
        "validate": "pass", "lock": "skipped", "render": "pass", "hadolint": "pass", "patches": "skipped",
        "build": "skipped", "doctor": "skipped", "recipes": "pass", "args": "skipped", "trial": "skipped"}
    assert st["patches"]["reason"] == "no component of this stack carries patches"
    rows = st["recipes"]["details"]["recipes"]
    assert rows == [{"name": "cpu-ddp", "render": "pass", "shellcheck": "pass", "dry_run": "pass", "message": None}]


@pytest.mark.slow
def test_without_keep_going_later_stacks_are_reported_not_run(checkout, tmp_path):
    _, env = checkout
    rc, report, junit, _ = run_smoke(env, tmp_path, "patched", "cpu",
                                     "--skip", "lock", "--skip", "build", "--skip", "recipes")
    assert rc == 1
    st = steps(report, "cpu")
    assert {v["status"] for v in st.values()} == {"skipped"}
    assert st["validate"]["reason"] == "not run: stack patched failed (--keep-going runs every stack)"
    assert ET.parse(junit).getroot().find("testsuite[@name='cpu']").get("skipped") == str(len(smoke.STEPS))


@pytest.mark.slow
def test_junit_has_one_case_per_stack_and_step(keep_going):
    _, report, junit, _ = keep_going
    root = ET.parse(junit).getroot()
    assert root.tag == "testsuites" and root.get("failures") == "1"
    suites = root.findall("testsuite")
    assert [s.get("name") for s in suites] == ["patched", "cpu"]
    for suite in suites:
        assert [c.get("name") for c in suite.findall("testcase")] == list(smoke.STEPS)
        assert suite.get("tests") == str(len(smoke.STEPS))
    failures = root.findall(".//testcase/failure")
    assert len(failures) == 1
    case = root.find("testsuite[@name='patched']/testcase[@name='patches']")
    assert case.get("classname") == "trainbox.smoke.patched"
    fail = case.find("failure")
    assert "0001-greet-louder.patch fails at hello.py hunk 1" in fail.get("message")
    assert "patches.log" in fail.text  # the log's path and tail come with it
    skipped = root.find("testsuite[@name='cpu']/testcase[@name='build']/skipped")
    assert skipped.get("message") == "--skip build"
    assert root.find("testsuite[@name='cpu']/testcase[@name='validate']/failure") is None
    assert root.find("testsuite[@name='cpu']/testcase[@name='validate']/skipped") is None


@pytest.mark.slow
def test_json_report_follows_the_documented_schema(keep_going):
    _, report, _, _ = keep_going
    assert set(report) == {"schema", "trainbox_version", "ok", "exit_code", "started_at", "duration_s", "steps",
                           "options", "summary", "stacks"}
    assert report["schema"] == 1 and report["steps"] == list(smoke.STEPS)
    assert set(report["options"]) == {"stacks", "keep_going", "substitute_base", "wheelhouse", "profile", "skip",
                                      "build_cache", "workdir", "expect_fail", "expect_fail_as", "accept_not_checked",
                                      "jobs", "trial"}
    assert report["options"]["skip"] == ["lock", "build"] and report["options"]["keep_going"] is True
    assert set(report["summary"]) == {"pass", "fail", "skipped", "failed", "xfail", "xpass", "not_checked"}
    n = sum(len(s["steps"]) for s in report["stacks"])
    assert report["summary"]["pass"] + report["summary"]["fail"] + report["summary"]["skipped"] == n == 2 * len(smoke.STEPS)
    for s in report["stacks"]:
        assert set(s) == {"stack", "device", "ok", "overrides", "base", "image", "steps"}
        assert s["device"] == "cpu"
        assert set(s["base"]) == {"image", "used", "substituted", "decision", "reason"}
        assert [st["step"] for st in s["steps"]] == list(smoke.STEPS)
        for st in s["steps"]:
            assert set(st) == {"step", "status", "reason", "duration_s", "commands", "log", "details"}
            assert st["status"] in ("pass", "fail", "skipped")
            assert st["status"] == "pass" or st["reason"], st  # a fail or skip always says why
            assert isinstance(st["duration_s"], (int, float))
            if st["status"] != "skipped":
                assert st["commands"] and st["commands"][0][1:3] == ["-m", "trainbox.cli"]
    assert report["stacks"][0]["ok"] is False and report["stacks"][1]["ok"] is True


@pytest.mark.network
def test_pin_that_does_not_exist_fails_at_lock_and_is_not_built(checkout, tmp_path):
    _, env = checkout
    rc, report, _, _ = run_smoke(env, tmp_path, "badpin", "cpu", "--keep-going",
                                 "--skip", "recipes", timeout=900)
    assert rc == 1
    st = steps(report, "badpin")
    assert st["validate"]["status"] == "pass"  # hashes present: only the index knows the pin is not there
    assert st["lock"]["status"] == "fail"
    assert "numpy==0.0.99" in st["lock"]["reason"] and "has no artifact" in st["lock"]["reason"]
    assert st["build"] == {**st["build"], "status": "skipped", "reason": "not built: lock failed (fix that first)"}
    assert st["doctor"]["status"] == "skipped"
    assert steps(report, "cpu")["lock"]["status"] == "pass"
    assert "badpin/lock" in report["summary"]["failed"]


# ------------------------------------------------------------------------------- runner logic, no children


def stack_result(name="s", device="npu", **kw) -> smoke.StackResult:
    return smoke.StackResult(name, device=device, **kw)


def options(tmp_path, **kw) -> smoke.Options:
    return smoke.Options(stacks=["s"], workdir=tmp_path, **kw)


def test_missing_command_is_a_failure_not_a_pass(tmp_path):
    # Stand-in for a trainbox without the `patches` group: argparse's own answer to an unknown command.
    def run(argv, timeout, log=None, stream=False):
        return smoke.Proc(argv, 2, "", "usage: trainbox [-h]\ntrainbox: error: argument COMMAND: invalid choice: "
                                       "'patches' (choose from 'stack', 'render')\n", 0.1)

    res = smoke.Smoke(options(tmp_path), run=run, say=lambda m: None).step_patches(stack_result())
    assert res.status == smoke.FAIL
    assert "`trainbox patches verify` is not available" in res.reason


def test_args_step_judges_each_recipe_against_the_profile(tmp_path):
    """expect_fail turns the failure it names (a missing module, or a pattern of the summary) into XFAIL, any other
    failure (another module, a check killed by SIGKILL) into FAIL, and a pass into XPASS (a failure: the list cannot
    go stale); `not checked` fails unless accept_not_checked names the recipe; the text and JUnit reports say which
    is which. The child CLI is a stand-in here (its real output: tests/test_launch_recipecheck.py)."""
    outcome = {"plain-ok": ("ok", 0), "known-gap": ("fail", 1), "stale-gap": ("ok", 0),
               "mounted": ("not checked", 0), "unaccepted": ("not checked", 0), "broken": ("fail", 1),
               "runtime-gap": ("fail", 1), "killed-gap": ("killed", -9), "other-module": ("fail", 1),
               "pattern-gap": ("fail", 1)}
    summaries = {"runtime-gap": "args: the program failed before parsing its arguments: ModuleNotFoundError: No "
                                "module named 'transformer_engine.pytorch'",
                 "pattern-gap": "args: unrecognized arguments: --tp-size"}
    missing = {"known-gap": "sglang.srt", "other-module": "torchvision"}

    def run(argv, timeout, log=None, stream=False):
        if argv[-3:] == ["launch", "list", "--json"]:
            return smoke.Proc(argv, 0, json.dumps({"recipes": [{"name": n, "stack": "s"} for n in outcome]}), "", 0.1)
        name = argv[argv.index("check") + 1]
        status, rc = outcome[name]
        if status == "killed":  # the check died (SIGKILL: out of memory, say): no JSON, only the exit status
            return smoke.Proc(argv, rc, "", "", 0.1)
        row = {"recipe": name, "status": status, "ok": status == "ok",
               "args": {"status": status, "summary": f"{name}: {summaries.get(name, status + ' (summary)')}",
                        "stubs": [], "imports": {"missing": [{"module": missing[name]}] if name in missing else []}}}
        return smoke.Proc(argv, rc, json.dumps({"recipes": [row]}), "", 0.1)

    gap = {"why": "sglang is not in the stack yet", "missing": "sglang"}
    opts = options(tmp_path, expect_fail={"known-gap": gap, "stale-gap": {"why": "fixed?", "missing": "x"},
                                          "runtime-gap": {"why": "MindSpeed's dummy", "missing": "transformer_engine"},
                                          "killed-gap": gap, "other-module": gap,
                                          "pattern-gap": {"why": "an old parser", "match": r"unrecognized .*--tp-size"}},
                   accept_not_checked=["mounted"])
    sr = stack_result(image="trainbox/s:1")
    res = smoke.Smoke(opts, run=run, say=lambda m: None).step_args(sr)
    got = {r["name"]: r["result"] for r in res.details["recipes"]}
    assert got == {"plain-ok": "pass", "known-gap": "xfail", "stale-gap": "xpass", "mounted": "not checked",
                   "unaccepted": "fail", "broken": "fail", "runtime-gap": "xfail", "killed-gap": "fail",
                   "other-module": "fail", "pattern-gap": "xfail"}
    assert res.status == smoke.FAIL
    assert "expects it to fail with the missing module sglang (sglang is not in the stack yet), but it failed " \
        "otherwise" in res.reason
    for name in ("runtime-gap", "killed-gap", "other-module", "pattern-gap"):
        del outcome[name]
    assert "XPASS stale-gap: ok (summary) [passes, but the profile expects it to fail (fixed?)" in res.reason
    assert "FAIL unaccepted: not checked (summary) [not checked, and the profile does not accept" in res.reason
    assert "known-gap" not in res.reason and "plain-ok" not in res.reason and "mounted" not in res.reason
    sr.steps = [res]
    report = {"ok": False, "steps": ["args"], "stacks": [sr.as_dict()], "duration_s": 1.0,
              "started_at": "2026-01-01T00:00:00+00:00", "summary": {"pass": 0, "fail": 1, "skipped": 0}}
    text = smoke.format_matrix(report)
    assert "XFAIL s/args known-gap: sglang is not in the stack yet (saw: known-gap: fail (summary))" in text
    assert "not checked  s/args mounted: not checked (summary) (accepted by the profile" in text
    root = ET.fromstring(smoke.junit_xml(report))
    case = {c.get("name"): c for c in root.iter("testcase") if c.get("classname") == "trainbox.smoke.s.args"}
    assert case["known-gap"].find("skipped").get("message") == "XFAIL: sglang is not in the stack yet"
    assert case["stale-gap"].find("failure").get("message").startswith("XPASS: ")
    assert case["mounted"].find("skipped").get("type") == "not checked"
    assert case["unaccepted"].find("failure") is not None and case["plain-ok"].find("failure") is None
    assert root.get("failures") == str(1 + 5) and root.get("tests") == str(1 + 10)
    # all known or accepted: the step passes, and still names the XFAIL
    del outcome["stale-gap"], outcome["unaccepted"], outcome["broken"]
    res = smoke.Smoke(opts, run=run, say=lambda m: None).step_args(stack_result(image="trainbox/s:1"))
    assert res.status == smoke.PASS and "XFAIL known-gap" in res.reason and "NOT CHECKED mounted" in res.reason


def test_trial_step_judges_each_trial_against_the_profile(tmp_path):
    """`pass` must pass; {stop, why} must stop with that text in its final line; a stop elsewhere fails, and so
    does a pass where a stop is expected (stale). The child CLI is a stand-in here (the real trial:
    tests/test_trial_docker.py)."""
    lines = {"runs": ("passed", "passed 2 steps (loss 1 -> 0.5, finite)"),
             "blocked": ("stopped", "stopped at sglang/srt/configs/utils.py:18: ImportError: needs torchvision"),
             "moved": ("stopped", "stopped at specforge/data/preprocessing.py:381: ValueError: no conversations"),
             "fixed": ("passed", "passed 2 steps (loss 1 -> 0.9, finite)"), "other": ("passed", "x")}

    def run(argv, timeout, log=None, stream=False):
        if argv[-3:] == ["launch", "list", "--json"]:
            return smoke.Proc(argv, 0, json.dumps({"recipes": [{"name": n, "stack": "s"} for n in lines]}), "", 0.1)
        name = argv[argv.index("trial") + 1]
        assert argv[argv.index("--image") + 1] == "trainbox/s:1" and argv[-1] == "--json"
        result, line = lines[name]
        return smoke.Proc(argv, 0 if result == "passed" else 1, json.dumps({"result": result, "line": line,
                                                                            "steps": [{}, {}]}), "", 0.1)

    why = "the runner has no CPU torchvision"
    opts = options(tmp_path, trial={"runs": {"expect": "pass"},
                                    "blocked": {"expect": "stop", "at": "sglang/srt/configs/utils.py:18", "why": why},
                                    "moved": {"expect": "stop", "at": "sglang/srt/configs/utils.py:18", "why": why},
                                    "fixed": {"expect": "stop", "at": "sglang/", "why": why}})
    res = smoke.Smoke(opts, run=run, say=lambda m: None).step_trial(stack_result(image="trainbox/s:1"))
    got = {r["name"]: r["ok"] for r in res.details["recipes"]}
    assert got == {"runs": True, "blocked": True, "moved": False, "fixed": False}  # "other": not in the profile
    assert res.status == smoke.FAIL
    assert "moved: stopped at specforge/data/preprocessing.py:381" in res.reason
    assert "fixed: passed 2 steps" in res.reason and "it passes now" in res.reason
    assert "runs:" not in res.reason and "blocked:" not in res.reason
    none = smoke.Smoke(options(tmp_path), run=run, say=lambda m: None).step_trial(stack_result(image="trainbox/s:1"))
    assert none.status == smoke.SKIPPED and "names no trial" in none.reason


def test_profile_trial_entries_name_recipes_and_what_they_must_do(tmp_path):
    prof = tmp_path / "p.yaml"
    prof.write_text("trial: {cpu-ddp: pass, specforge-domino-qwen35-4b-npu: {stop: 'sglang/', why: no torchvision}}\n")
    assert smoke.load_profile(prof)["trial"] == {
        "cpu-ddp": {"expect": "pass"},
        "specforge-domino-qwen35-4b-npu": {"expect": "stop", "at": "sglang/", "why": "no torchvision"}}
    prof.write_text("trial: {cpu-ddp: {stop: x}}\n")
    with pytest.raises(TrainboxError, match=r"trial.cpu-ddp: expected `pass`, or \{stop"):
        smoke.load_profile(prof)
    prof.write_text("trial: {no-such: pass}\n")
    with pytest.raises(TrainboxError, match="trial: no-such: no such recipe"):
        smoke.load_profile(prof)


def test_profile_expect_fail_names_real_recipes_with_a_reason(tmp_path):
    prof = tmp_path / "p.yaml"
    prof.write_text("expect_fail: {no-such-recipe: {why: w, missing: torch}}\n")
    with pytest.raises(TrainboxError, match="expect_fail: no-such-recipe: no such recipe"):
        smoke.load_profile(prof)
    prof.write_text("expect_fail: {cpu-ddp: {why: '', missing: torch}}\n")
    with pytest.raises(TrainboxError, match="expect_fail.cpu-ddp.why: say in one line why"):
        smoke.load_profile(prof)
    prof.write_text("expect_fail: {cpu-ddp: {why: w, missing: torch}}\naccept_not_checked: [cpu-ddp]\n")
    with pytest.raises(TrainboxError, match="both expect_fail and accept_not_checked"):
        smoke.load_profile(prof)


@pytest.mark.parametrize("entry,message", [
    ("why it fails", r"expect_fail.cpu-ddp: state the failure it expects, as \{missing: MODULE, why: \.\.\.\}"),
    ("{why: w}", "expect_fail.cpu-ddp: name the failure it expects, either missing"),
    ("{why: w, missing: torch, match: x}", "expect_fail.cpu-ddp: name the failure it expects, either missing"),
    ("{why: w, missing: 'torch; rm'}", "expect_fail.cpu-ddp.missing: 'torch; rm' is not a module name"),
    ("{why: w, match: '(unclosed'}", "expect_fail.cpu-ddp.match: not a regular expression"),
    ("{why: w, missing: torch, pattern: x}", "pattern"),
])
def test_an_expected_failure_names_the_failure_it_expects(tmp_path, entry, message):
    """Issue 37: a bare reason let any failure, a SIGKILL included, count as the expected one. An entry states the
    failure (missing: MODULE, or match: PATTERN; one of them) besides why, each refused in one line otherwise."""
    prof = tmp_path / "p.yaml"
    prof.write_text(f"expect_fail:\n  cpu-ddp: {entry}\n")
    with pytest.raises(TrainboxError, match=message) as exc:
        smoke.load_profile(prof)
    assert len(str(exc.value).splitlines()) == 1, str(exc.value)
    prof.write_text("expect_fail:\n  cpu-ddp: {why: w, missing: transformer_engine.pytorch}\n")
    assert smoke.load_profile(prof)["expect_fail"] == {
        "cpu-ddp": {"why": "w", "missing": "transformer_engine.pytorch", "match": None}}


def test_doctor_findings_expected_on_a_substitute_npu_base():
    checks = [{"id": i, "status": st, "message": i} for i, st in [
        ("cann.toolkit", "FAIL"), ("cann.libs", "FAIL"), ("npu.devices", "FAIL"), ("npu.driver", "FAIL"),
        ("torch.import", "FAIL"), ("system.shm", "WARN"), ("packages.versions", "PASS"), ("cann.env", "SKIP"),
        ("system.memlock", "WARN")]]
    d = smoke.classify_doctor({"checks": checks}, "npu", substituted=True)
    assert sorted(f["id"] for f in d["expected"]) == ["cann.libs", "cann.toolkit", "npu.devices", "npu.driver",
                                                      "system.memlock", "torch.import"]
    assert all(f["why"] for f in d["expected"])
    assert d["unexpected"] == [] and [f["id"] for f in d["warnings"]] == ["system.shm"]
    # On the stack's own (CANN) base a missing toolkit is a real failure; missing cards still are not.
    d = smoke.classify_doctor({"checks": checks}, "npu", substituted=False)
    assert sorted(f["id"] for f in d["unexpected"]) == ["cann.libs", "cann.toolkit"]
    # A cpu image expects nothing.
    d = smoke.classify_doctor({"checks": [{"id": "torch.import", "status": "FAIL", "message": "x"}]}, "cpu", True)
    assert [f["id"] for f in d["unexpected"]] == ["torch.import"]


def test_expected_findings_name_real_doctor_checks():
    from trainbox.runtime import doctor

    for table in (smoke.EXPECTED_WITHOUT_ACCELERATOR, smoke.EXPECTED_ON_SUBSTITUTE):
        for device, ids in table.items():
            assert set(ids) <= set(doctor.CHECK_IDS), (device, set(ids) - set(doctor.CHECK_IDS))
    assert set(smoke.EXPECTED_IN_SMOKE_CONTAINER) <= set(doctor.CHECK_IDS)


class FakeBuild:
    """Stand-in for `trainbox image build`: records its argv and writes the build report it would write."""

    def __init__(self, ok=True, error=None):
        self.calls: list[list[str]] = []
        self.ok = ok
        self.error = error or {"step": "[builder 5/7] RUN pip install", "message": "exit code: 1"}

    def __call__(self, argv, timeout, log=None, stream=False):
        self.calls.append(argv)
        if "--help" in argv:
            return smoke.Proc(argv, 0, "usage: trainbox image build [-h] [STACK]", "", 0.1)
        if "build" in argv and "image" in argv:
            report = Path(argv[argv.index("-o") + 1])
            base = argv[argv.index("--base") + 1] if "--base" in argv else "own:1"
            rep = {"tag": "trainbox/s:0123456789ab", "ok": self.ok, "skipped": False, "wall_s": 3.0,
                   "base": {"requested": base, "used": base, "substituted": None}}
            if not self.ok:
                rep["error"] = self.error
            report.write_text(json.dumps(rep))
            return smoke.Proc(argv, 0 if self.ok else 1, "", "", 3.0)
        return smoke.Proc(argv, 0, "", "", 0.1)


def test_substitute_base_is_chosen_explicitly_and_recorded(tmp_path, monkeypatch):
    import trainbox.image.base

    # Stand-in registry probe: the stack's own base cannot be pulled.
    monkeypatch.setattr(trainbox.image.base, "base_available", lambda image, client=None, timeout=8.0, platform=None: (False, "registry unreachable"))
    fake = FakeBuild()
    s = smoke.Smoke(options(tmp_path, wheelhouse="/wh"), run=fake, say=lambda m: None)
    sr = stack_result(overrides={"torch.version": "2.13.0+cpu"})
    info = {"base": {"image": "quay.io/ascend/cann:8.5.1", "substitute": "local/debian:bookworm"}}
    res = s.step_build(sr, info)
    assert res.status == smoke.PASS and sr.image == "trainbox/s:0123456789ab"
    assert sr.base["decision"] == "substitute" and sr.base["substituted"] == "local/debian:bookworm"
    assert "registry unreachable" in sr.base["reason"]
    boot, build = fake.calls
    assert boot[-6:] == ["base", "bootstrap", "--tag", "local/debian:bookworm", "--suite", "bookworm"]
    assert build[build.index("--base") + 1] == "local/debian:bookworm"
    assert "torch.version=2.13.0+cpu" in build and build[build.index("--wheelhouse") + 1] == "/wh"
    assert "on substitute base local/debian:bookworm" in res.reason


def test_substitute_base_never_and_image(tmp_path, monkeypatch):
    import trainbox.image.base

    monkeypatch.setattr(trainbox.image.base, "base_available", lambda image, client=None, timeout=8.0, platform=None: (False, "unreachable"))
    info = {"base": {"image": "quay.io/x:1", "substitute": "local/debian:bookworm"}}
    fake = FakeBuild()
    sr = stack_result()
    smoke.Smoke(options(tmp_path, substitute_base="never"), run=fake, say=lambda m: None).step_build(sr, info)
    assert "--base" not in fake.calls[-1] and sr.base["decision"] == "own" and not sr.base["substituted"]
    fake = FakeBuild()
    sr = stack_result()
    smoke.Smoke(options(tmp_path, substitute_base="my/base:2"), run=fake, say=lambda m: None).step_build(sr, info)
    assert len(fake.calls) == 1  # not a local/debian image: nothing to bootstrap
    assert fake.calls[0][fake.calls[0].index("--base") + 1] == "my/base:2"
    assert sr.base == {"image": "quay.io/x:1", "used": "my/base:2", "substituted": "my/base:2",
                       "decision": "explicit", "reason": "substitute_base my/base:2"}


def test_build_failure_names_the_dockerfile_step(tmp_path, monkeypatch):
    import trainbox.image.base

    monkeypatch.setattr(trainbox.image.base, "base_available", lambda image, client=None, timeout=8.0, platform=None: (True, "present locally"))
    sr = stack_result()
    res = smoke.Smoke(options(tmp_path), run=FakeBuild(ok=False), say=lambda m: None).step_build(
        sr, {"base": {"image": "debian:x"}})
    assert res.status == smoke.FAIL and res.reason == "failed at [builder 5/7] RUN pip install: exit code: 1"
    assert sr.image is None and sr.base["decision"] == "own"
    # what the build knew to do about its failure (trainbox.image.run: a lost cache layer) reaches the smoke's line
    from trainbox.image.run import STALE_CACHE_FIX

    lost = {"step": "[final 2/7] RUN pip install", "message": "failed to export: layer does not exist",
            "fix": STALE_CACHE_FIX}
    res = smoke.Smoke(options(tmp_path), run=FakeBuild(ok=False, error=lost), say=lambda m: None).step_build(
        stack_result(), {"base": {"image": "debian:x"}})
    assert res.reason == f"failed at {lost['step']}: {lost['message']}; fix: {STALE_CACHE_FIX}", res.reason


def test_set_and_profile(tmp_path):
    assert smoke.parse_set("npu-910b:torch.version=2.13.0+cpu", []) == ("npu-910b", "torch.version", "2.13.0+cpu")
    assert smoke.parse_set("numpy.version=2.3.5", []) == ("*", "numpy.version", "2.3.5")
    with pytest.raises(TrainboxError, match="expected \\[STACK:\\]COMPONENT.FIELD=VALUE"):
        smoke.parse_set("torch", [])
    prof = tmp_path / "p.yaml"
    prof.write_text("stacks: [cpu]\nset:\n  cpu: {numpy.version: '2.3'}\n  '*': {torch.version: 2.13.0+cpu}\n"
                    "skip: [lock]\n")
    opts = smoke.build_options(stacks=None, sets=["cpu:numpy.version=2.3.5"], profile=str(prof), wheelhouse=None,
                               substitute_base=None, keep_going=False, skip=["recipes"], workdir=str(tmp_path),
                               pull_timeout=None, verbose=False)
    assert opts.stacks == ["cpu"] and opts.skip == ["lock", "recipes"] and opts.substitute_base == "auto"
    # the command line wins over the profile
    assert opts.sets_for("cpu") == {"torch.version": "2.13.0+cpu", "numpy.version": "2.3.5"}
    prof.write_text("set:\n  cpu: {numpy.version: 2.10}\n")
    with pytest.raises(TrainboxError, match=r"set.cpu.numpy.version: 2.1 is a number to YAML; quote the version"):
        smoke.load_profile(prof)
    prof.write_text("stackz: [cpu]\n")
    with pytest.raises(TrainboxError, match=r"p.yaml: stackz: unknown key \(check the spelling; profile keys: description"):
        smoke.load_profile(prof)
    with pytest.raises(TrainboxError, match="--skip bild: no such step"):
        smoke.build_options(["cpu"], None, None, None, None, False, ["bild"], None, None, False)
    with pytest.raises(TrainboxError, match="stack nope: no such stack"):
        smoke.build_options(["nope"], None, None, None, None, False, None, None, None, False)


def test_offline_profile_in_ci_is_valid():
    from trainbox.specs.stack import list_stacks

    prof = smoke.load_profile(REPO / "ci" / "smoke-offline.yaml")
    assert set(prof["stacks"]) <= set(list_stacks())
    assert prof["set"]["npu-910b"]["torch.version"].startswith("2.13.0")
    from trainbox.specs.stack import load_stack

    # every npu stack it builds (the workload stacks too) gets the CPU torch this runner has and its torch_npu pair
    npu = [s for s in prof["stacks"] if load_stack(s).device == "npu"]
    assert {"npu-910b", "specforge", "relax"} <= set(npu)
    for name in npu:
        assert prof["set"][name].items() >= prof["set"]["npu-910b"].items(), name
        # beyond that only what the stacks with sglang need here: no timm, so no PyPI (CUDA) torchvision
        extra = {k: v for k, v in prof["set"][name].items() if k not in prof["set"]["npu-910b"]}
        assert extra == ({"timm.install": "false"} if name in ("specforge", "relax") else {}), name
    # a recipe on these stacks that cannot be checked (its entry is not in the image) is accepted by name, and
    # declares why itself; an accepted one that became checkable would need the entry removed from the list
    from trainbox.launch.recipe import list_recipes, load_recipe

    mine = [load_recipe(n) for n in list_recipes()]
    mine = [r for r in mine if r.stack in prof["stacks"]]
    assert sorted(r.name for r in mine if r.check.imports == "none") == sorted(prof["accept_not_checked"])
    assert not any(n.startswith("relax-") for n in prof["accept_not_checked"])  # Relax is in its image (issue 35)
    assert all(load_recipe(n).check.why for n in prof["accept_not_checked"])
    assert all(load_recipe(n).stack in prof["stacks"] for n in prof["expect_fail"])


# ------------------------------------------------------------------------------------------ docker: cpu


def _wheelhouse() -> str | None:
    out = subprocess.run([sys.executable, "-m", "pip", "config", "get", "global.find-links"], capture_output=True,
                         text=True).stdout.split()
    return out[0] if out and Path(out[0]).is_dir() else None


@pytest.mark.docker
@pytest.mark.slow
def test_cpu_stack_end_to_end(tmp_path):
    from trainbox.image.engine import find_client

    client = find_client()
    before = set(client.run("images", "-q", "--no-trunc", "trainbox/cpu", check=False).stdout.split())
    # lock (PyPI) and render (drift of the working tree) are covered by the tests above and test_render
    args = ["cpu", "--skip", "lock", "--skip", "render"]
    if _wheelhouse():
        args += ["--wheelhouse", _wheelhouse()]
    env = dict(os.environ)
    rc, report, junit, stderr = run_smoke(env, tmp_path, *args, timeout=3000)
    st = steps(report, "cpu")
    assert rc == 0, stderr[-4000:]
    assert {k: v["status"] for k, v in st.items()} == {
        "validate": "pass", "lock": "skipped", "render": "skipped", "hadolint": "pass", "patches": "skipped",
        "build": "pass", "doctor": "pass", "recipes": "pass", "args": "pass", "trial": "skipped"}
    # cpu-ddp's command parsed by its own argparse parser in the image just built
    assert [r["name"] for r in st["args"]["details"]["recipes"]] == ["cpu-ddp"]
    assert "cpu-ddp: " in st["args"]["reason"] and "modules of the entry's import closure resolve, the arguments " \
        "parse" in st["args"]["reason"]
    assert st["args"]["details"]["recipes"][0]["result"] == "pass"
    s = report["stacks"][0]
    assert s["image"].startswith("trainbox/cpu:") and s["base"]["used"]
    if s["base"]["substituted"]:  # no registry here: the cpu stack's own substitute, said so
        assert s["base"]["decision"] == "substitute" and "cannot be pulled" in s["base"]["reason"]
    doc = st["doctor"]["details"]
    assert doc["summary"]["status"] in ("PASS", "WARN") and doc["unexpected"] == [] and doc["expected"] == []
    assert doc["context"]["stack"] == "cpu"
    assert st["recipes"]["details"]["image"] == s["image"]
    assert "cpu-ddp" in {r["name"] for r in st["recipes"]["details"]["recipes"]}
    assert len(ET.parse(junit).getroot().findall(".//testcase")) == len(smoke.STEPS) + 1  # + cpu-ddp's args case
    image_id = client.image_id(s["image"])
    if image_id and image_id not in before:  # built by this test: remove it (the build cache keeps its layers)
        client.run("rmi", s["image"], check=False)


def test_build_cache_is_passed_and_rotated(tmp_path, monkeypatch):
    import trainbox.image.base

    monkeypatch.setattr(trainbox.image.base, "base_available", lambda image, client=None, timeout=8.0, platform=None: (True, "present locally"))

    class CachingBuild(FakeBuild):
        # Stand-in for an `image build` that has --cache-from/--cache-to: exports a cache like BuildKit does.
        def __call__(self, argv, timeout, log=None, stream=False):
            if "--help" in argv:
                return smoke.Proc(argv, 0, "usage: ... --cache-from SPEC --cache-to SPEC", "", 0.1)
            if "--cache-to" in argv:
                dest = argv[argv.index("--cache-to") + 1].split("dest=")[1].split(",")[0]
                Path(dest).mkdir(parents=True)
                (Path(dest) / "index.json").write_text("{}")
            return super().__call__(argv, timeout, log, stream)

    cache = tmp_path / "bk"
    opts = options(tmp_path, build_cache=cache)
    fake = CachingBuild()
    smoke.Smoke(opts, run=fake, say=lambda m: None).step_build(stack_result(), {"base": {"image": "debian:x"}})
    first = fake.calls[-1]
    assert "--cache-from" not in first  # nothing cached yet
    assert first[first.index("--cache-to") + 1] == f"type=local,dest={cache}/s.new,mode=max"
    assert (cache / "s" / "index.json").is_file() and not (cache / "s.new").exists()
    smoke.Smoke(opts, run=fake, say=lambda m: None).step_build(stack_result(), {"base": {"image": "debian:x"}})
    assert fake.calls[-1][fake.calls[-1].index("--cache-from") + 1] == f"type=local,src={cache}/s"

    # An `image build` without the flags: the build still runs, and the report says the cache was not used.
    plain = FakeBuild()
    res = smoke.Smoke(opts, run=plain, say=lambda m: None).step_build(stack_result(), {"base": {"image": "debian:x"}})
    assert res.status == smoke.PASS and "--cache-to" not in plain.calls[-1]
    assert "--build-cache not used" in res.details["build_cache"]


def test_ci_definitions_use_real_stacks_options_and_recipes():
    import shlex

    import yaml

    from trainbox.cli import build_parser
    from trainbox.launch.recipe import load_recipe
    from trainbox.specs.stack import list_stacks

    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction").choices["smoke"]
    known = {o for a in sub._actions for o in a.option_strings}

    def check_command(line: str) -> None:
        words = shlex.split(line.replace("\\\n", " "))
        words = words[words.index("smoke") + 1:]
        for w in words:
            if w.startswith("--"):
                assert w.split("=")[0] in known, f"{w} is not a `trainbox smoke` option"

    gh = yaml.safe_load((REPO / "ci" / "github" / "trainbox-smoke.yml").read_text())
    assert set(gh["jobs"]["smoke"]["strategy"]["matrix"]["stack"]) <= set(list_stacks())
    runs = [s["run"] for s in gh["jobs"]["smoke"]["steps"] if "trainbox smoke" in s.get("run", "")]
    assert len(runs) == 1
    check_command("trainbox smoke " + runs[0].split("trainbox smoke", 1)[1].split("|")[0])
    assert gh["jobs"]["npu-cards"]["runs-on"] == ["self-hosted", "linux", "ascend-910b"]

    gl = yaml.safe_load((REPO / "ci" / "gitlab" / "trainbox-smoke.gitlab-ci.yml").read_text())
    assert set(gl["smoke"]["parallel"]["matrix"][0]["STACK"]) <= set(list_stacks())
    (script,) = [ln for ln in gl["smoke"]["script"] if "trainbox smoke" in ln]
    check_command(script)
    assert gl["smoke"]["artifacts"]["reports"]["junit"] == "smoke-$STACK.xml"

    # The NPU job's defaults: a real 8-card Megatron recipe, the stack it runs on, and a script shellcheck accepts.
    runner = (REPO / "ci" / "npu-runner.sh").read_text()
    recipe = load_recipe(runner.split('RECIPE="${RECIPE:-', 1)[1].split("}", 1)[0])
    stack = runner.split('STACK="${STACK:-', 1)[1].split("}", 1)[0]
    assert recipe.stack == stack and recipe.devices_per_node == 8 and "megatron" in recipe.name
    shellcheck = shutil.which("shellcheck")
    if shellcheck:
        proc = subprocess.run([shellcheck, str(REPO / "ci" / "npu-runner.sh")], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout


class _Timed(smoke.Smoke):
    """run_stack replaced by a stand-in that records when each stack ran (and fails the chosen ones): only the
    scheduling of run_all is under test. The stacks in `together` each hold their slot until all of them have
    started: that they ran at once is shown by the event, not by a sleep long enough on a quiet machine; a runner
    that never runs them together meets the hang guard instead (and the test's assertions fail). The stacks in
    `until_refused` hold theirs until the runner has refused a stack (a not-run result) after a failure."""

    def __init__(self, opts, fail=(), together=(), until_refused=()):
        super().__init__(opts, say=lambda m: None)
        import threading

        self.fail, self.spans, self.lock = set(fail), {}, threading.Condition()
        self.together, self.until_refused, self.refused = set(together), set(until_refused), []
        self.running, self.most, self.started = 0, 0, []

    def run_stack(self, stack, not_run=None):
        import time

        from hangguard import HANG_S

        sr = smoke.StackResult(stack)
        if not_run:
            with self.lock:
                self.refused.append(stack)
                self.lock.notify_all()
            sr.steps = [smoke.StepResult(s, smoke.SKIPPED, not_run) for s in smoke.STEPS]
            return sr
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
            self.started.append(stack)
            self.lock.notify_all()
            t0 = time.monotonic()
            if stack in self.together:
                self.lock.wait_for(lambda: self.together <= set(self.started), timeout=HANG_S)
            if stack in self.until_refused:
                self.lock.wait_for(lambda: self.refused, timeout=HANG_S)
            self.running -= 1
            self.spans[stack] = (t0, time.monotonic())
        sr.steps = [smoke.StepResult("build", smoke.FAIL if stack in self.fail else smoke.PASS)]
        return sr


def _overlaps(spans, a, b) -> bool:
    return spans[a][0] < spans[b][1] and spans[b][0] < spans[a][1]


def test_jobs_runs_the_first_stack_alone_then_the_rest_at_once_in_order(tmp_path):
    names = ["base-maker", "a", "b", "c", "d"]
    s = _Timed(smoke.Options(stacks=names, workdir=tmp_path, jobs=2, keep_going=True), together={"a", "b"})
    report = s.run_all()
    assert [r["stack"] for r in report["stacks"]] == names  # the report keeps the given order
    assert not any(_overlaps(s.spans, "base-maker", n) for n in names[1:])  # it made the base: alone
    assert s.most == 2 and s.started == names  # two at a time, started in the given order


def test_jobs_without_keep_going_reports_the_stacks_not_yet_started_as_not_run(tmp_path):
    # b runs on until the runner has refused a stack after a's failure: c, d and e are the stacks not yet started
    s = _Timed(smoke.Options(stacks=["base-maker", "a", "b", "c", "d", "e"], workdir=tmp_path, jobs=2), fail={"a"},
               together={"a", "b"}, until_refused={"b"})
    report = s.run_all()
    ran = set(s.spans)
    assert {"base-maker", "a", "b"} <= ran and "e" not in ran  # a and b started together; after a failed, none
    for r in report["stacks"]:
        if r["stack"] not in ran:
            assert all(st["reason"].startswith("not run: stack a failed") for st in r["steps"])
    assert report["ok"] is False


def test_jobs_is_checked(tmp_path):
    with pytest.raises(TrainboxError, match="--jobs 9: expected 1 to 8"):
        smoke.build_options(stacks=["cpu"], sets=None, profile=None, wheelhouse=None, substitute_base=None,
                            keep_going=False, skip=None, workdir=str(tmp_path), pull_timeout=None, verbose=False,
                            jobs=9)
