"""Issue 22 (HIGH): PEP 518 build requirements are hash-pinned like everything else.

The input that got through: a `setuptools-99.0.0` wheel added to the wheelhouse the builder offers pip. pip's
isolated build environment takes the newest setuptools it finds, unchecked, and ran that wheel's code. Now the lock
resolves each stack's build requirements (`build_requires`, pip's default for a tree without [build-system]) into
hash-pinned `build_deps`, the render passes them to the builder's install_source, and the wheel is built without
isolation in an environment holding exactly those files (`pip install --require-hashes`).

Here: the lock and the render (offline), and install_source itself on this host in a throwaway venv with the
network off for pip (PIP_NO_INDEX), the hostile wheel beside the pinned ones. The same input through a real engine
build (online, and a bundle with its SHA256SUMS rewritten): tests/test_sources_docker.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from trainbox.image.bundle import _build_pins
from trainbox.paths import REPO_ROOT
from trainbox.image.render import render_stack
from trainbox.specs.stack import StackError, load_stack
from upstream_helpers import DATA, hostile_setuptools_wheel, stack_file

LOCK = DATA / "stacks" / "cpu-sources.lock"


def _assert_render_passes_build_reqs(stack, component: str, deps: dict) -> None:
    """The rendered RUN step of `component` hands install_source each locked build requirement with its hash."""
    text = render_stack(stack).dockerfile
    line = next(ln for ln in text.splitlines() if f"--component {component}" in ln)
    rest = text[text.index(line):].split("\n\n")[0]
    for name, d in deps.items():
        assert f"--build-req '{name}=={d['version']} --hash=sha256:{d['sha256'][0]}'" in rest, rest


def test_the_lock_pins_the_build_requirements_and_the_render_passes_them(tmp_path):
    stack = load_stack(stack_file(tmp_path))
    assert stack.build_requirements() == ["setuptools>=40.8.0", "wheel"] and stack.lock_is_fresh()
    deps = stack.locked_build_deps("linux/amd64")
    assert {"setuptools", "wheel"} <= set(deps) and all(len(d["sha256"]) == 1 for d in deps.values())
    _assert_render_passes_build_reqs(stack, "mindspeed", deps)


def test_a_lock_without_build_deps_is_stale_and_names_them(tmp_path):
    p = stack_file(tmp_path)
    lock = yaml.safe_load(p.with_suffix(".lock").read_text())
    lock.pop("build_requires")
    p.with_suffix(".lock").write_text(yaml.safe_dump(lock))
    stack = load_stack(p)
    assert not stack.lock_is_fresh() and stack.locked_build_deps("linux/amd64") == {}
    assert any("build_requires: locked for (none)" in w for w in stack.lock_staleness())


@pytest.mark.parametrize("value, words", [("setuptools @ https://x.invalid/s.whl", "expected a requirement"),
                                          ("setuptools; os_name=='nt'", "expected a requirement"),
                                          ("setup tools", "expected a requirement")])
def test_build_requires_takes_names_and_version_ranges_only(tmp_path, value, words):
    def edit(d):
        d["components"]["mindspeed"]["build_requires"] = [value]
    with pytest.raises(StackError, match=words):
        load_stack(stack_file(tmp_path, edit))


def test_build_requires_belongs_to_wheels_built_in_isolation(tmp_path):
    def edit(d):
        d["components"]["megatron-lm"]["build_requires"] = ["setuptools"]
    with pytest.raises(StackError, match="megatron-lm.*build_requires"):
        load_stack(stack_file(tmp_path, edit))


@pytest.fixture(scope="module")
def offline_pip(tmp_path_factory):
    """A venv for install_source to install into, and a wheelhouse: the lock's build requirements (downloaded
    by their pinned hashes) plus the hostile setuptools-99 wheel."""
    tmp = tmp_path_factory.mktemp("buildreqs")
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True, timeout=300)
    wheelhouse = tmp / "wheelhouse"
    lines = _pinned_lines()
    reqs = tmp / "pins.txt"
    reqs.write_text("".join(line + "\n" for line in lines))
    proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--require-hashes", "-q",
                           "-d", str(wheelhouse), "-r", str(reqs)], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, PIP_CONSTRAINT=""))
    if proc.returncode != 0:
        pytest.skip(f"PyPI unreachable: {proc.stderr.strip().splitlines()[-1:]}")
    return venv, wheelhouse, lines


def _pinned_lines() -> list[str]:
    deps = yaml.safe_load(LOCK.read_text())["platforms"]["linux/amd64"]["build_deps"]
    return [f"{n}=={d['version']} --hash=sha256:{d['sha256'][0]}" for n, d in sorted(deps.items())]


def _tree(tmp: Path) -> Path:
    """A tree without [build-system] (as MindSpeed's and ms-swift's): pip's default build requirements."""
    tree = tmp / "sources" / "demo"
    tree.mkdir(parents=True)
    (tree / "setup.py").write_text("from setuptools import setup\nsetup(name='demo', version='1.0', "
                                   "py_modules=['demo'])\n")
    (tree / "demo.py").write_text("X = 1\n")
    (tree / ".trainbox-source.json").write_text('{"git": "https://example.invalid/demo.git", "commit": "%s"}'
                                                % ("a" * 40))
    return tree


@pytest.mark.network
@pytest.mark.slow
def test_a_setuptools_99_wheel_in_the_wheelhouse_never_runs(offline_pip, tmp_path):
    venv, wheelhouse, lines = offline_pip
    marker = tmp_path / "setuptools-99-ran"
    hostile_setuptools_wheel(wheelhouse, str(marker))
    _tree(tmp_path)
    argv = [str(venv / "bin" / "python"), "-m", "trainbox.runtime.install_source", "--component", "demo",
            "--mode", "pip", "--git", "https://example.invalid/demo.git", "--commit", "a" * 40,
            "--sources-dir", str(tmp_path / "sources"), *(a for ln in lines for a in ("--build-req", ln))]
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT / "python"), PIP_NO_INDEX="1", PIP_FIND_LINKS=str(wheelhouse),
               PIP_CONSTRAINT="", PIP_CONFIG_FILE=os.devnull)
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not marker.exists(), "the setuptools-99 wheel ran its code"
    assert "installed demo-1.0" in proc.stdout


def test_an_sdist_built_by_its_own_commands_gets_the_locked_build_requirements(tmp_path):
    """specforge's sglang (a PyPI sdist its `build:` commands turn into a wheel): its [build-system] requirements
    are locked as `build_deps` and passed to that step; fetch --bundle carries them like the git trees' ones."""
    stack = load_stack("specforge")
    assert {"setuptools-scm>=8.0", "setuptools>=61.0", "wheel"} <= set(stack.build_requirements())
    deps = stack.locked_build_deps("linux/amd64")
    assert {"setuptools", "setuptools-scm", "wheel"} <= set(deps), deps
    _assert_render_passes_build_reqs(stack, "sglang", deps)
    assert {p.name for p in _build_pins(stack, "linux/amd64")} == set(deps)  # what fetch --bundle adds


def test_build_requires_on_a_url_component_that_builds_nothing_is_refused(tmp_path):
    def edit(d):
        d["components"]["demo-wheel"] = {"source": "url", "url": "https://example.invalid/demo-1.0-py3-none-any.whl",
                                         "sha256": ["a" * 64], "build_requires": ["setuptools"]}
    with pytest.raises(StackError, match="demo-wheel.*build_requires"):
        load_stack(stack_file(tmp_path, edit))


@pytest.mark.network
@pytest.mark.slow
def test_an_sdist_build_command_never_runs_a_setuptools_99_wheel(offline_pip, tmp_path):
    """--mode build with --build-req: the commands' pip builds without isolation in exactly the pinned build
    requirements (on PYTHONPATH); the hostile setuptools-99 beside them in the wheelhouse never runs (an isolated
    build would take it: the newest setuptools on offer)."""
    import hashlib
    import tarfile

    venv, wheelhouse, lines = offline_pip
    marker = tmp_path / "setuptools-99-ran"
    hostile_setuptools_wheel(wheelhouse, str(marker))
    src = tmp_path / "demo-1.0"
    src.mkdir()
    (src / "pyproject.toml").write_text('[build-system]\nrequires = ["setuptools>=40.8.0", "wheel"]\n'
                                        'build-backend = "setuptools.build_meta"\n')
    (src / "setup.py").write_text("from setuptools import setup\nsetup(name='demo', version='1.0', "
                                  "py_modules=['demo'])\n")
    (src / "demo.py").write_text("X = 1\n")
    staged = tmp_path / "sources" / "demo"
    staged.mkdir(parents=True)
    archive = staged / "demo-1.0.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(src, arcname="demo-1.0")
    argv = [str(venv / "bin" / "python"), "-m", "trainbox.runtime.install_source", "--component", "demo",
            "--mode", "build", "--url", "https://example.invalid/demo-1.0.tar.gz",
            "--sha256", hashlib.sha256(archive.read_bytes()).hexdigest(),
            "--build", "python3 -m pip wheel --no-deps -w dist .",
            "--sources-dir", str(tmp_path / "sources"), *(a for ln in lines for a in ("--build-req", ln))]
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT / "python"), PIP_NO_INDEX="1", PIP_FIND_LINKS=str(wheelhouse),
               PIP_CONSTRAINT="", PIP_CONFIG_FILE=os.devnull)
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert not marker.exists(), "the setuptools-99 wheel ran its code"
    assert "installed demo-1.0" in proc.stdout


@pytest.mark.network
@pytest.mark.slow
def test_build_requirements_installed_in_a_step_before_the_build(offline_pip, tmp_path):
    """The image's way (issue 37): `--mode build-env` installs the locked build requirements (the one step given
    the index credentials); the build step takes them with --build-env and is given no index at all."""
    venv, wheelhouse, lines = offline_pip
    marker = tmp_path / "setuptools-99-ran"
    hostile_setuptools_wheel(wheelhouse, str(marker))
    _tree(tmp_path)
    py = [str(venv / "bin" / "python"), "-m", "trainbox.runtime.install_source", "--component", "demo"]
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT / "python"), PIP_NO_INDEX="1", PIP_FIND_LINKS=str(wheelhouse),
               PIP_CONSTRAINT="", PIP_CONFIG_FILE=os.devnull)
    benv = tmp_path / "build-env"
    proc = subprocess.run([*py, "--mode", "build-env", "--build-env", str(benv),
                           *(a for ln in lines for a in ("--build-req", ln))],
                          capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert any(benv.glob("setuptools-*.dist-info"))
    # the build step: no index and no wheelhouse reach it; it builds in the prepared environment only
    bare = {k: v for k, v in env.items() if k != "PIP_FIND_LINKS"}
    proc = subprocess.run([*py, "--mode", "pip", "--git", "https://example.invalid/demo.git", "--commit", "a" * 40,
                           "--sources-dir", str(tmp_path / "sources"), "--build-env", str(benv)],
                          capture_output=True, text=True, timeout=600, env=bare)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "installed demo-1.0" in proc.stdout and not marker.exists()


@pytest.mark.network
@pytest.mark.slow
def test_a_wheel_built_in_one_stage_is_installed_in_another(offline_pip, tmp_path):
    """The image's wheel-<name> stage builds with --wheel-out (nothing installed), the builder installs that wheel
    with --wheel-in (no tree, no build code, no build requirements) and records its commit (PEP 610)."""
    venv, wheelhouse, lines = offline_pip
    _tree(tmp_path)
    py = [str(venv / "bin" / "python"), "-m", "trainbox.runtime.install_source", "--component", "demo"]
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT / "python"), PIP_NO_INDEX="1", PIP_FIND_LINKS=str(wheelhouse),
               PIP_CONSTRAINT="", PIP_CONFIG_FILE=os.devnull)
    git = ["--mode", "pip", "--git", "https://example.invalid/demo.git", "--commit", "a" * 40, "--version", "1.0"]
    out = tmp_path / "wheel"
    # the module's venv: the tests before this one installed demo
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "uninstall", "-y", "-q", "demo"], capture_output=True,
                   timeout=300, env=env)
    proc = subprocess.run([*py, *git, "--sources-dir", str(tmp_path / "sources"), "--wheel-out", str(out),
                           *(a for ln in lines for a in ("--build-req", ln))],
                          capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [p.name for p in out.iterdir()] == ["demo-1.0-py3-none-any.whl"] and "built demo-1.0" in proc.stdout
    site = next(venv.glob("lib/python*/site-packages"))
    assert not list(site.glob("demo-*.dist-info"))  # built, not installed
    bare = {k: v for k, v in env.items() if k != "PIP_FIND_LINKS"}
    proc = subprocess.run([*py, *git, "--wheel-in", str(out)], capture_output=True, text=True, timeout=600, env=bare)
    assert proc.returncode == 0, proc.stderr[-3000:]
    direct = json.loads((site / "demo-1.0.dist-info" / "direct_url.json").read_text())
    assert direct["vcs_info"]["commit_id"] == "a" * 40 and "installed demo-1.0" in proc.stdout


def _wheel_dir(tmp: Path, names: list[str]) -> Path:
    out = tmp / "wheels"
    out.mkdir()
    for n in names:
        (out / n).write_bytes(b"")
    return out


@pytest.mark.parametrize("wheels, words", [
    ([], "gave 0 wheels"),
    (["demo-1.0-py3-none-any.whl", "demo-1.1-py3-none-any.whl"], "gave 2 wheels"),
    (["demo-2.0-py3-none-any.whl"], "builds version 2.0, but the stack says version: 1.0"),
])
def test_wheel_in_takes_exactly_the_one_wheel_of_the_pinned_version(tmp_path, wheels, words):
    proc = subprocess.run([sys.executable, "-m", "trainbox.runtime.install_source", "--component", "demo",
                           "--mode", "pip", "--git", "https://example.invalid/demo.git", "--commit", "a" * 40,
                           "--version", "1.0", "--wheel-in", str(_wheel_dir(tmp_path, wheels))],
                          capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(REPO_ROOT / "python")))
    assert proc.returncode == 1 and words in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr


@pytest.mark.parametrize("args, words", [
    (["--mode", "pip", "--git", "https://example.invalid/demo.git", "--commit", "a" * 40, "--build-env",
      "/nonexistent/x"],
     "--build-env /nonexistent/x: no such directory"),
    (["--mode", "build-env", "--build-env", "/tmp/x"], "--mode build-env takes --build-env DIR and the --build-req"),
])
def test_install_source_build_env_refusals_are_one_line(tmp_path, args, words):
    _tree(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "trainbox.runtime.install_source", "--component", "demo", *args,
                           "--sources-dir", str(tmp_path / "sources")], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(REPO_ROOT / "python")))
    assert proc.returncode == 1 and words in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
