"""Upstream repositories for tests: the real upstream URLs, reached through git's own url.<base>.insteadOf
configuration (GIT_CONFIG_COUNT/KEY/VALUE), as a user reaches an internal mirror; no switch in trainbox.

The copies in ../shared/upstream are read-only and lack the empty `refs/` folder git needs to recognise a
repository, so a test first takes a writable copy of each (a mirror, as a site would keep one)."""

from __future__ import annotations

import os
import shutil
import subprocess
import zlib
from pathlib import Path

import pytest

from trainbox.supply.gitobjects import clean_env
from trainbox.paths import REPO_ROOT

DATA = Path(__file__).parent / "data"
UPSTREAM_URLS = {
    "MindSpeed": "https://gitcode.com/Ascend/MindSpeed.git",
    "Megatron-LM": "https://github.com/NVIDIA/Megatron-LM.git",
    "SpecForge": "https://github.com/sgl-project/SpecForge.git",
    "twinkle": "https://github.com/modelscope/twinkle.git",
    "ms-swift": "https://github.com/modelscope/ms-swift.git",
    "sgl-kernel-npu": "https://github.com/sgl-project/sgl-kernel-npu.git",
    "Relax": "https://github.com/redai-infra/Relax.git",
    "TransferQueue": "https://github.com/redai-infra/TransferQueue.git",
}
MINDSPEED = (UPSTREAM_URLS["MindSpeed"], "MindSpeed.git", "d0d5809d4323eb908f89e87958de254465eb57b4")
MEGATRON = (UPSTREAM_URLS["Megatron-LM"], "Megatron-LM.git", "309ffca6a40553362d44fd17efc56b772fa1aa44")


def find_shared_upstream() -> Path | None:
    """../shared/upstream beside the checkout (CI), else /work/shared/upstream (git worktrees)."""
    for d in (REPO_ROOT.parent / "shared" / "upstream", Path("/work/shared/upstream")):
        if (d / "MindSpeed.git").is_dir():
            return d
    return None


def shared_upstream() -> Path:
    found = find_shared_upstream()
    if found is None:
        pytest.skip("no shared/upstream/ beside the checkout")
    return found


def mirror(name: str, root: Path) -> Path:
    """A writable mirror of shared/upstream/<name>.git under root (made once)."""
    dst = root / f"{name}.git"
    if not dst.exists():
        shutil.copytree(shared_upstream() / f"{name}.git", dst)
        for p in [dst, *dst.rglob("*")]:
            p.chmod(p.stat().st_mode | 0o200)
        (dst / "refs").mkdir(exist_ok=True)
    return dst


def make_mirrors(root: Path) -> dict[str, Path]:
    """Mirrors of MindSpeed and Megatron-LM, keyed by their file names in shared/upstream."""
    return {name: mirror(name.removesuffix(".git"), root) for _, name, _ in (MINDSPEED, MEGATRON)}


def git_env(mirrors: dict[str, Path], **extra: str) -> dict[str, str]:
    """What a user with an internal mirror has in ~/.gitconfig, as GIT_CONFIG_* (git's own mechanism)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_CONFIG")}
    pairs = [(f"url.{path.as_uri()}.insteadOf", UPSTREAM_URLS[name.removesuffix(".git")])
             for name, path in sorted(mirrors.items())]
    env["GIT_CONFIG_COUNT"] = str(len(pairs))
    for i, (k, v) in enumerate(pairs):
        env[f"GIT_CONFIG_KEY_{i}"], env[f"GIT_CONFIG_VALUE_{i}"] = k, v
    env.update(extra)
    return env


def checkout(name: str, tmp: Path) -> Path:
    """The pinned tree of an upstream project, cloned from its real URL through a mirror."""
    env = git_env({name: mirror(name, tmp / "mirrors")})
    work = tmp / name
    subprocess.run(["git", "clone", "-q", "--", UPSTREAM_URLS[name], str(work)], env=env, check=True,
                   capture_output=True, timeout=120)
    return work


def stack_file(tmp_path: Path, edit=None) -> Path:
    import yaml

    data = yaml.safe_load((DATA / "stacks" / "cpu-sources.yaml").read_text())
    if edit:
        edit(data)
    p = tmp_path / "cpu-sources.yaml"
    p.write_text(yaml.safe_dump(data))
    # cpu's pins plus the hash-pinned build requirements of the MindSpeed wheel (`trainbox stack lock`)
    p.with_suffix(".lock").write_bytes((DATA / "stacks" / "cpu-sources.lock").read_bytes())
    return p


def git(repo: Path, *args: str, input: bytes | None = None) -> str:
    """git on a bare repository with replace refs and grafts ignored (what trainbox's object checks see)."""
    return subprocess.run(["git", "--git-dir", str(repo), *args], input=input, capture_output=True, check=True,
                          env=clean_env()).stdout.decode().strip()


def rewrite_blob(repo: Path, commit: str, path: str, content: bytes) -> str:
    """A forger's edit: the packs exploded into loose objects, then the blob of `path` at `commit` rewritten in
    place under its old name (so it no longer hashes to it); returns the blob's id."""
    for pack in list((repo / "objects" / "pack").glob("*.pack")):
        data = pack.read_bytes()
        for p in pack.parent.glob(pack.stem + ".*"):
            p.unlink()
        git(repo, "unpack-objects", "-q", input=data)
    blob = git(repo, "rev-parse", f"{commit}:{path}")
    loose = repo / "objects" / blob[:2] / blob[2:]
    loose.chmod(0o644)
    loose.write_bytes(zlib.compress(b"blob %d\0" % len(content) + content))
    return blob


def hostile_setuptools_wheel(dest: Path, marker: str = "/setuptools-99-ran") -> Path:
    """The issue's input: a real, installable `setuptools-99.0.0` wheel whose import writes `marker` and stops the
    build (a wheel build that took it from a wheelhouse ran its code, and says so)."""
    import base64
    import hashlib
    import zipfile

    code = (f"import pathlib\npathlib.Path({marker!r}).write_text('setuptools-99 ran')\n"
            "raise SystemExit('setuptools-99 from the wheelhouse ran its code')\n")
    files = {
        "setuptools/__init__.py": code,
        "setuptools/build_meta.py": "from setuptools import *  # noqa\n",
        "setuptools-99.0.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: setuptools\nVersion: 99.0.0\n",
        "setuptools-99.0.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                             "Tag: py3-none-any\n",
    }
    record = []
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(text.encode())}")
    files["setuptools-99.0.0.dist-info/RECORD"] = "\n".join(record + ["setuptools-99.0.0.dist-info/RECORD,,"]) + "\n"
    dest.mkdir(parents=True, exist_ok=True)
    wheel = dest / "setuptools-99.0.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for name, text in files.items():
            # a fixed date: the same bytes every run, so a build whose wheelhouse holds it stays cacheable
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            zf.writestr(info, text)
    return wheel
