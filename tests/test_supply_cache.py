"""Issue 22: the git cache is re-verified on use, and fetches into it serialise on a lock of trainbox's own.

Against the real MindSpeed and Megatron-LM trees (../shared/upstream through git's insteadOf), changed in the
cache's repository after a good fetch: a rewritten loose object is refused by `trainbox fetch` and by staging
(nothing staged); a `refs/replace` ref plus objects is ignored (the pinned commit's own tree is staged). Two
fetches at once both succeed; a lock left by a fetch killed with SIGKILL (git's shallow.lock, and trainbox's own
lock file held by a dead process) does not stop the next.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from trainbox.supply.fetch import fetch_sources, stage
from trainbox.paths import REPO_ROOT
from trainbox.supply.sources import SourceError, git_cache_repo
from trainbox.specs.stack import load_stack
from upstream_helpers import MEGATRON, MINDSPEED, git, git_env, make_mirrors, rewrite_blob, stack_file


@pytest.fixture(scope="module")
def mirrors(tmp_path_factory):
    return make_mirrors(tmp_path_factory.mktemp("mirrors"))


def fetch_cli(args, env):
    return subprocess.run([sys.executable, "-m", "trainbox.cli", "fetch", *args], capture_output=True, text=True,
                          timeout=300, cwd=REPO_ROOT, env=dict(env, PYTHONPATH=str(REPO_ROOT / "python")))


@pytest.fixture
def cached(tmp_path, mirrors):
    """A cache holding the stack's two commits, fetched for real; the MindSpeed repository in it."""
    env = git_env(mirrors, TRAINBOX_CACHE=str(tmp_path / "cache"))
    stack = stack_file(tmp_path)
    proc = fetch_cli([str(stack), "--sources-only", "--json"], env)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)["fetched"]
    assert {r["component"]: len(r["tree"]) for r in rows} == {"megatron-lm": 40, "mindspeed": 40}
    return env, stack, git_cache_repo(MINDSPEED[0], tmp_path / "cache")


def _refused(env, stack, words: str, tmp: Path, monkeypatch) -> None:
    proc = fetch_cli([str(stack), "--sources-only"], env)
    lines = proc.stderr.strip().splitlines()
    progress = [ln for ln in lines if ln.startswith("trainbox: fetch [")]  # one per component as its fetch starts
    err = "\n".join(ln for ln in lines if ln not in progress)
    assert proc.returncode == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, proc.stderr
    assert words in err, err
    monkeypatch.setenv("TRAINBOX_CACHE", env["TRAINBOX_CACHE"])
    srcs = fetch_sources(load_stack(stack), offline=True, cache_dir=Path(env["TRAINBOX_CACHE"]))
    ctx = tmp / "ctx"
    with pytest.raises(SourceError, match=words):
        stage(ctx, srcs, check_patches=False)
    assert not (ctx / "build" / "sources" / "mindspeed").exists()


@pytest.mark.slow
def test_a_replace_ref_in_the_cache_is_ignored_on_use(cached, tmp_path, monkeypatch):
    env, stack, repo = cached
    evil = git(repo, "hash-object", "-w", "--stdin", input=b"raise SystemExit('swapped')\n")
    entries = [ln if not ln.endswith("\tsetup.py") else f"100644 blob {evil}\tsetup.py"
               for ln in git(repo, "ls-tree", MINDSPEED[2]).splitlines()]
    tree = git(repo, "mktree", input=("\n".join(entries) + "\n").encode())
    git(repo, "replace", MINDSPEED[2], git(repo, "commit-tree", tree, "-m", "swapped"))
    # plain git follows it: the tree under the pinned name is now the swapped one
    plain = subprocess.run(["git", "--git-dir", str(repo), "rev-parse", f"{MINDSPEED[2]}^{{tree}}"],
                           capture_output=True, text=True).stdout.strip()
    assert plain == tree
    # ignored, not followed: the pinned commit's own tree is what is staged and recorded
    srcs = fetch_sources(load_stack(stack), offline=True, cache_dir=Path(env["TRAINBOX_CACHE"]))
    assert srcs.stack.components["mindspeed"]._tree_id != tree
    stage(tmp_path / "ctx", srcs, check_patches=False)
    setup = (tmp_path / "ctx" / "build" / "sources" / "mindspeed" / "setup.py").read_text()
    assert "swapped" not in setup and "setup(" in setup


@pytest.mark.slow
def test_a_rewritten_object_in_the_cache_is_refused_on_use(cached, tmp_path, monkeypatch):
    env, stack, repo = cached
    blob = rewrite_blob(repo, MINDSPEED[2], "setup.py", b"raise SystemExit('rewritten')\n")
    _refused(env, stack, f"object {blob} does not hash to its name", tmp_path, monkeypatch)


@pytest.mark.slow
def test_two_fetches_at_once_both_succeed(tmp_path, mirrors):
    env = git_env(mirrors, TRAINBOX_CACHE=str(tmp_path / "cache"))
    stack = str(stack_file(tmp_path))
    args = [sys.executable, "-m", "trainbox.cli", "fetch", stack, "--sources-only"]
    penv = dict(env, PYTHONPATH=str(REPO_ROOT / "python"))
    procs = [subprocess.Popen(args, env=penv, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(3)]
    results = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
    assert all(rc == 0 for rc, _ in results), results


@pytest.mark.slow
def test_a_fetch_killed_mid_way_does_not_block_the_next(tmp_path, mirrors):
    env = git_env(mirrors, TRAINBOX_CACHE=str(tmp_path / "cache"))
    stack = str(stack_file(tmp_path))
    repo = git_cache_repo(MEGATRON[0], tmp_path / "cache")
    repo.parent.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", "--bare", str(repo)], check=True)
    (repo / "shallow.lock").write_text("")  # what git leaves when SIGKILLed during a shallow fetch
    # our own lock, taken by a process that is then SIGKILLed while holding it
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, sys, time; fh = open(sys.argv[1], 'a'); fcntl.flock(fh, fcntl.LOCK_EX); "
        "print('held', flush=True); time.sleep(300)"), str(repo.parent / f".{repo.name}.lock")],
        stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    proc = fetch_cli([stack, "--sources-only"], env)
    assert proc.returncode == 0, proc.stderr
    assert not (repo / "shallow.lock").exists()
