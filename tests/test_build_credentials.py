"""The index credentials reach only the steps that install hash-pinned files from the index (issue 37): never a
step that runs a component's own build code (`install: build` commands of a url or git component, a git tree's
setup.py or PEP 517 backend, a compiled sdist), which could print them, or copy them into a wheel or a layer."""

from __future__ import annotations

import re

import pytest

from trainbox.render import render_stack
from trainbox.stack import list_stacks, load_stack

SECRET_MOUNT = "id=pip_index_url"


def _runs(dockerfile: str) -> list[str]:
    joined = re.sub(r"\\\n", " ", dockerfile)
    return [re.sub(r"\s+", " ", ln) for ln in joined.splitlines() if ln.startswith("RUN ")]


def _may_see_the_secret(run: str) -> bool:
    """A pip install from the index of hash-pinned files, and nothing else: the venv's pin steps
    (partials/pip_pinned.j2) and a source component's build-requirements step (install_source --mode build-env)."""
    if "trainbox.runtime.install_source" in run:
        return bool(re.search(r"install_source --component \S+ --mode build-env ", run)) and " --build " not in run
    return "python -m pip install" in run and "--require-hashes" in run and "--no-deps" in run


@pytest.mark.parametrize("name", list_stacks())
def test_only_pinned_installs_from_the_index_see_the_credentials(name):
    runs = _runs(render_stack(load_stack(name)).dockerfile)
    for run in runs:
        if SECRET_MOUNT in run or "/run/secrets/pip_index_url" in run or "/tmp/secrets/pip_index_url" in run:
            assert _may_see_the_secret(run), run[:400]
            assert SECRET_MOUNT in run  # the file is read only where the secret is mounted


def test_specforge_sglang_build_runs_without_the_credentials():
    """The case issue 37 found: sglang (source: url, install: build) ran `pip wheel` with the secret mounted."""
    runs = _runs(render_stack(load_stack("specforge")).dockerfile)
    sglang = [r for r in runs if "--component sglang " in r]
    build = [r for r in sglang if "--mode build " in r]
    env = [r for r in sglang if "--mode build-env " in r]
    assert len(build) == 1 and len(env) == 1
    assert SECRET_MOUNT not in build[0] and "pip_index_url" not in build[0]
    assert "--build-env /opt/trainbox-build-env/sglang" in build[0] and "--build-req" not in build[0]
    assert "export PIP_INDEX_URL=https://pypi.org/simple " in build[0]  # the stack's own URL: no credentials
    assert SECRET_MOUNT in env[0] and "--build-req 'setuptools==" in env[0]
    assert runs.index(env[0]) < runs.index(build[0])


@pytest.mark.parametrize("name", ["npu-910b-megatron", "twinkle", "swift"])
def test_git_wheel_builds_get_their_build_requirements_from_a_step_before(name):
    runs = _runs(render_stack(load_stack(name)).dockerfile)
    builds = [r for r in runs if "install_source" in r and "--mode pip " in r]
    assert builds, "a git component built into a wheel"
    for run in builds:
        assert SECRET_MOUNT not in run and "--build-env /opt/trainbox-build-env/" in run
        key = re.search(r"--component (\S+) ", run).group(1)
        assert any(f"--component {key} --mode build-env " in r and SECRET_MOUNT in r for r in runs), key
