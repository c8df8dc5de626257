"""The real upstream trees in ../shared/upstream (shallow bare repositories at the seeds' commits), for tests.

The copies in shared/ are read-only and lack the empty `refs/` folder git needs to recognise a repository, so a
test first takes a writable copy (a mirror, as a site would keep one), then reaches it the way a user reaches an
internal mirror: through git's own `url.<base>.insteadOf` configuration.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from trainbox.paths import REPO_ROOT

UPSTREAM_URLS = {
    "MindSpeed": "https://gitcode.com/Ascend/MindSpeed.git",
    "Megatron-LM": "https://github.com/NVIDIA/Megatron-LM.git",
    "SpecForge": "https://github.com/sgl-project/SpecForge.git",
    "twinkle": "https://github.com/modelscope/twinkle.git",
    "ms-swift": "https://github.com/modelscope/ms-swift.git",
    "sgl-kernel-npu": "https://github.com/sgl-project/sgl-kernel-npu.git",
}


def shared_upstream() -> Path | None:
    for cand in (REPO_ROOT.parent / "shared" / "upstream", Path("/work/shared/upstream")):
        if (cand / "README.md").is_file():
            return cand
    return None


def mirror(name: str, dest: Path) -> Path:
    """A writable mirror of shared/upstream/<name>.git under dest."""
    src = shared_upstream()
    if src is None:
        raise FileNotFoundError("../shared/upstream is missing (CI and sessions lay it beside the checkout)")
    out = dest / f"{name}.git"
    if not out.exists():
        shutil.copytree(src / f"{name}.git", out)
        for p in [out, *out.rglob("*")]:
            p.chmod(p.stat().st_mode | 0o200)
        (out / "refs" / "heads").mkdir(parents=True, exist_ok=True)
        (out / "refs" / "tags").mkdir(parents=True, exist_ok=True)
    return out


def git_env(mirrors: dict[str, Path]) -> dict:
    """Environment that sends each upstream URL to its mirror through url.<base>.insteadOf."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_CONFIG")}
    env["GIT_CONFIG_COUNT"] = str(len(mirrors))
    for i, (name, path) in enumerate(sorted(mirrors.items())):
        env[f"GIT_CONFIG_KEY_{i}"] = f"url.file://{path}.insteadOf"
        env[f"GIT_CONFIG_VALUE_{i}"] = UPSTREAM_URLS[name]
    return env


def checkout(name: str, tmp: Path) -> Path:
    """The pinned tree of an upstream project, cloned from its real URL through the mirror."""
    env = git_env({name: mirror(name, tmp / "mirrors")})
    work = tmp / name
    subprocess.run(["git", "clone", "-q", "--", UPSTREAM_URLS[name], str(work)], env=env, check=True,
                   capture_output=True, timeout=120)
    return work
