"""Upstream repositories for tests: the real upstream URLs, reached through git's own url.<base>.insteadOf
configuration (GIT_CONFIG_COUNT/KEY/VALUE), as a user reaches an internal mirror; no switch in trainbox."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from trainbox.paths import REPO_ROOT, STACKS_DIR

DATA = Path(__file__).parent / "data"
MINDSPEED = ("https://gitcode.com/Ascend/MindSpeed.git", "MindSpeed.git", "d0d5809d4323eb908f89e87958de254465eb57b4")
MEGATRON = ("https://github.com/NVIDIA/Megatron-LM.git", "Megatron-LM.git", "309ffca6a40553362d44fd17efc56b772fa1aa44")


def shared_upstream() -> Path:
    """../shared/upstream beside the checkout (CI), else /work/shared/upstream (git worktrees)."""
    for d in (REPO_ROOT.parent / "shared" / "upstream", Path("/work/shared/upstream")):
        if (d / "MindSpeed.git").is_dir():
            return d
    pytest.skip("no shared/upstream/ beside the checkout")


def make_mirrors(root: Path) -> dict[str, Path]:
    """Writable copies of the upstream repositories (the shared ones are read-only and lack the empty refs/
    directory git needs to recognise a repository)."""
    out = {}
    for _, name, _ in (MINDSPEED, MEGATRON):
        dst = root / name
        shutil.copytree(shared_upstream() / name, dst)
        for p in [dst, *dst.rglob("*")]:
            p.chmod(p.stat().st_mode | 0o200)
        (dst / "refs").mkdir(exist_ok=True)
        out[name] = dst
    return out


def git_env(mirrors: dict[str, Path], **extra: str) -> dict[str, str]:
    """What a user with an internal mirror has in ~/.gitconfig, as GIT_CONFIG_* (git's own mechanism)."""
    env = dict(os.environ)
    pairs = [(f"url.{mirrors[name].as_uri()}.insteadOf", url) for url, name, _ in (MINDSPEED, MEGATRON)]
    env["GIT_CONFIG_COUNT"] = str(len(pairs))
    for i, (k, v) in enumerate(pairs):
        env[f"GIT_CONFIG_KEY_{i}"], env[f"GIT_CONFIG_VALUE_{i}"] = k, v
    env.update(extra)
    return env


def stack_file(tmp_path: Path, edit=None) -> Path:
    import yaml

    data = yaml.safe_load((DATA / "stacks" / "cpu-sources.yaml").read_text())
    if edit:
        edit(data)
    p = tmp_path / "cpu-sources.yaml"
    p.write_text(yaml.safe_dump(data))
    p.with_suffix(".lock").write_bytes((STACKS_DIR / "cpu.lock").read_bytes())  # the pins it inherits
    return p


