"""`trainbox fetch` and staging, against real upstream trees reached through git's insteadOf config."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from trainbox.supply.fetch import check_series, fetch_sources, stage
from trainbox.paths import REPO_ROOT
from trainbox.runtime.errors import TrainboxError
from trainbox.supply.sources import SourceError
from trainbox.specs.stack import load_stack
from upstream_helpers import MEGATRON, MINDSPEED, git_env, make_mirrors, stack_file


@pytest.fixture(scope="module")
def mirrors(tmp_path_factory):
    return make_mirrors(tmp_path_factory.mktemp("mirrors"))


@pytest.fixture
def gitenv(mirrors, monkeypatch):
    for k, v in git_env(mirrors).items():
        if k.startswith("GIT_CONFIG_"):
            monkeypatch.setenv(k, v)


def fetch_cli(args, env):
    return subprocess.run([sys.executable, "-m", "trainbox.cli", "fetch", *args], env=env, capture_output=True,
                          text=True, timeout=300, cwd=REPO_ROOT)


@pytest.mark.slow
def test_fetch_fills_the_cache_then_works_offline(tmp_path, mirrors):
    env = git_env(mirrors, TRAINBOX_CACHE=str(tmp_path / "cache"))
    stack = str(stack_file(tmp_path))
    proc = fetch_cli([stack, "--sources-only", "--json"], env)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["schema"] == "trainbox.fetch/1"
    assert {r["component"]: r["commit"] for r in out["fetched"]} == {"mindspeed": MINDSPEED[2],
                                                                       "megatron-lm": MEGATRON[2]}
    # the mirrors gone (no insteadOf, and the real hosts are unreachable here): the cache alone serves
    offline = {k: v for k, v in env.items() if not k.startswith("GIT_CONFIG_")}
    proc = fetch_cli([stack, "--sources-only", "--offline"], offline)
    assert proc.returncode == 0, proc.stderr
    proc = fetch_cli([stack, "--sources-only", "--offline"], dict(offline, TRAINBOX_CACHE=str(tmp_path / "empty")))
    assert proc.returncode == 2
    assert "stack cpu-sources: component megatron-lm (https://github.com/NVIDIA/Megatron-LM.git@309ffca6a" in proc.stderr
    assert "not in the cache" in proc.stderr


def test_only_https_ssh_and_file_transports(tmp_path, mirrors, monkeypatch):
    """A mirror rewrite to a transport trainbox does not allow (here ext::, which runs a command) is refused."""
    monkeypatch.setenv("GIT_CONFIG_COUNT", "1")
    monkeypatch.setenv("GIT_CONFIG_KEY_0", "url.ext::sh -c touch% " + str(tmp_path / "pwned") + "% >&2.insteadOf")
    monkeypatch.setenv("GIT_CONFIG_VALUE_0", MEGATRON[0])
    stack = load_stack(stack_file(tmp_path))
    with pytest.raises(SourceError, match=r"component megatron-lm \(https://github.com/NVIDIA/Megatron-LM.git@309ffca"
                                          r".*\): cannot fetch from https://github.com/NVIDIA/Megatron-LM.git: "
                                          r"fatal: transport 'ext' not allowed"):
        fetch_sources(stack, cache_dir=tmp_path / "cache")
    assert not (tmp_path / "pwned").exists()


@pytest.mark.slow
def test_stage_puts_trees_without_git_and_records_tree_hashes(tmp_path, gitenv):
    stack = load_stack(stack_file(tmp_path))
    got = fetch_sources(stack, cache_dir=tmp_path / "cache")
    stage(tmp_path / "ctx", got)
    tree = tmp_path / "ctx" / "build" / "sources" / "megatron-lm"
    assert (tree / "megatron" / "training" / "arguments.py").is_file()
    assert not list((tmp_path / "ctx").rglob(".git"))
    meta = json.loads((tree / ".trainbox-source.json").read_text())
    assert meta["commit"] == MEGATRON[2] and len(meta["tree"]) == 40
    # the tree hash is git's, of exactly this commit
    assert got.stack.components["megatron-lm"]._tree_id == meta["tree"]
    assert stack.components["megatron-lm"]._tree_id is None, "the stack given is left as it was"


@pytest.mark.slow
def test_a_patch_that_no_longer_applies_names_patch_file_and_hunk(tmp_path, gitenv):
    """The series made for core_r0.15.3's setup.py against core_r0.16.0's tree: fails before any build."""
    def edit(d):
        d["components"]["mindspeed"]["commit"] = "e4772499f7eb9fa9a68919dd1eaddef00e915b2d"
    stack = load_stack(stack_file(tmp_path, edit))
    got = fetch_sources(stack, cache_dir=tmp_path / "cache")
    stage(tmp_path / "ctx", got, check_patches=False)
    series = tmp_path / "patches" / "mindspeed"
    series.mkdir(parents=True)
    (series / "series").write_text("0001-setup-version.patch\n")
    (series / "0001-setup-version.patch").write_text(
        "From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n"
        "From: trainbox <trainbox@localhost>\nSubject: [PATCH] setup: local version\n\n"
        "Why: test of a stale patch.\n\nUpstream-Status: Inappropriate [test]\n"
        "Upstream-Ref: https://gitcode.com/Ascend/MindSpeed.git@e4772499f7eb9fa9a68919dd1eaddef00e915b2d\n---\n"
        "diff --git a/setup.py b/setup.py\n--- a/setup.py\n+++ b/setup.py\n"
        "@@ -10,3 +10,3 @@ __description__ = 'MindSpeed for LLMs of Ascend'\n"
        " __description__ = 'MindSpeed for LLMs of Ascend'\n-__version__ = '0.15.3'\n+__version__ = '0.15.3+local'\n"
        " __author__ = 'Ascend'\n")
    with pytest.raises(TrainboxError, match=r"component mindspeed: patch patches/mindspeed/0001-setup-version.patch "
                                            r"does not apply to https://gitcode.com/Ascend/MindSpeed.git@e4772499f7eb"
                                            r"9fa9a68919dd1eaddef00e915b2d: .*setup.py hunk 1"):
        check_series("mindspeed", stack.components["mindspeed"], tmp_path / "ctx/build/sources/mindspeed",
                     tmp_path / "patches")
    shutil.rmtree(tmp_path / "ctx")


def _unified(path: str, old: str, new: str) -> str:
    import difflib

    body = "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True), f"a/{path}", f"b/{path}"))
    return f"diff --git a/{path} b/{path}\n{body}"


@pytest.mark.slow
def test_patches_import_turns_one_diff_into_series_entries(tmp_path, mirrors, gitenv):
    """A Relax-style single diff (plain `git diff`, two files, no message) against MindSpeed d0d5809."""
    from trainbox.supply.patch_import import import_diff
    from trainbox.paths import PATCHES_DIR
    from trainbox.runtime import apply_patches as ap

    show = lambda rel: subprocess.run(["git", "--git-dir", str(mirrors["MindSpeed.git"]), "show",  # noqa: E731
                                       f"{MINDSPEED[2]}:{rel}"], capture_output=True, text=True, check=True).stdout
    setup, readme = show("setup.py"), show("README.md")
    diff = tmp_path / "mindspeed-npu.patch"
    diff.write_text(_unified("setup.py", setup, setup.replace("__version__ = '0.15.3'", "__version__ = '0.15.3'\n# npu"))
                    + _unified("README.md", readme, readme + "\nPatched for the NPU image.\n"))
    patches = tmp_path / "patches"
    shutil.copytree(PATCHES_DIR / "mindspeed", patches / "mindspeed")
    names = import_diff(diff, "mindspeed", stack=str(stack_file(tmp_path)), patches_dir=patches)
    shipped = len(ap.read_series(PATCHES_DIR / "mindspeed"))  # the series as shipped, then one entry per file
    assert names[0] == "0001-mindspeed-expose-__version__.patch" and len(names) == shipped + 2
    loaded = ap.load_series(patches / "mindspeed")
    for p in loaded[shipped:]:
        assert p.upstream_ref == f"{MINDSPEED[0]}@{MINDSPEED[2]}"
        assert p.upstream_status == "Pending" and "mindspeed-npu.patch" in p.subject
    assert {p.touched()[0] for p in loaded[shipped:]} == {"setup.py", "README.md"}

    stale = tmp_path / "stale.patch"
    stale.write_text(_unified("setup.py", setup.replace("0.15.3", "0.14.0"), setup.replace("0.15.3", "0.14.1")))
    before = sorted(p.name for p in (patches / "mindspeed").iterdir())
    with pytest.raises(TrainboxError, match=r"stale.patch: the change to setup.py does not apply to "
                                            r"https://gitcode.com/Ascend/MindSpeed.git@d0d5809"):
        import_diff(stale, "mindspeed", stack=str(stack_file(tmp_path)), patches_dir=patches)
    assert sorted(p.name for p in (patches / "mindspeed").iterdir()) == before


@pytest.mark.slow
def test_builder_fetches_with_git_when_no_tree_is_staged(tmp_path, mirrors):
    """The plain `docker build` path of install_source: nothing staged, so git fetches the commit (through the
    same insteadOf config), the HEAD is checked, and the tree lands without .git on the venv's sys.path."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    env = dict(git_env(mirrors), PYTHONPATH=str(REPO_ROOT / "python"))
    run = lambda commit: subprocess.run(  # noqa: E731
        [str(venv / "bin" / "python"), "-m", "trainbox.runtime.install_source", "--component", "megatron-lm",
         "--mode", "tree", "--git", MEGATRON[0], "--commit", commit, "--sources-dir", str(tmp_path / "none"),
         "--tree-root", str(tmp_path / "src")], env=env, capture_output=True, text=True, timeout=120)
    proc = run(MEGATRON[2])
    assert proc.returncode == 0, proc.stderr
    tree = tmp_path / "src" / "megatron-lm"
    assert (tree / "megatron" / "training" / "__init__.py").is_file() and not (tree / ".git").exists()
    assert json.loads((tree / ".trainbox-source.json").read_text())["commit"] == MEGATRON[2]
    out = subprocess.run([str(venv / "bin" / "python"), "-c", "import sys; print(sys.path)"], capture_output=True,
                         text=True, check=True).stdout
    assert str(tree) in out
    proc = run("1" * 40)
    assert proc.returncode == 1
    assert proc.stderr.startswith("trainbox-install-source: error: megatron-lm: git fetch "
                                  f"{MEGATRON[0]} {'1' * 40} failed")
