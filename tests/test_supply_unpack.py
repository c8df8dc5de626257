"""Issue 22 (MEDIUM): unpacking is safe wherever it happens, the builder included.

A plain `docker build` of a rendered Dockerfile has no staged trees: the builder fetches the pinned commit with git
and unpacks `git archive` with its own Python, Debian's 3.11.2, which has no tar extraction filter. The members the
issue found writing outside the target there (`../`, absolute, a file below a symlink that points out, a hard link)
are refused by install_source's own checks before anything is written; symlinks inside the tree, absolute ones
included, are kept as links and never followed. Tested here with the host's Python and the filter taken away, and
in the builder's own Python (the bootstrapped Debian base, --network none).
"""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
from pathlib import Path

import pytest

from trainbox.paths import REPO_ROOT
from trainbox.runtime import install_source
from trainbox.runtime.install_source import SourceFailed, extract_tree


def _tar(path: Path, members: list[tuple[str, str, str]]) -> Path:
    """(name, type, data-or-link-target): type f file, d dir, l symlink, h hard link, c char device."""
    with tarfile.open(path, "w") as tar:
        for name, kind, data in members:
            ti = tarfile.TarInfo(name)
            ti.type = {"f": tarfile.REGTYPE, "d": tarfile.DIRTYPE, "l": tarfile.SYMTYPE, "h": tarfile.LNKTYPE,
                       "c": tarfile.CHRTYPE}[kind]
            if kind in ("l", "h"):
                ti.linkname = data
            body = data.encode() if kind == "f" else b""
            ti.size = len(body)
            ti.mode = 0o4777 if kind == "f" else 0o755
            tar.addfile(ti, io.BytesIO(body) if body else None)
    return path


def hostile(outside: Path) -> dict[str, list[tuple[str, str, str]]]:
    """The issue's members, each aimed at `outside` (a directory beside the target that must stay empty)."""
    return {
        "dotdot": [("pkg/ok.py", "f", "x"), ("../outside/owned", "f", "dotdot")],
        "absolute": [(f"{outside}/owned", "f", "absolute")],
        "symlink": [("pkg", "d", ""), ("pkg/escape", "l", str(outside)), ("pkg/escape/owned", "f", "through a link")],
        "relative symlink": [("up", "l", "../outside"), ("up/owned", "f", "through a link")],
        "hardlink": [("pkg/hard", "h", f"{outside}/owned")],
        "device": [("pkg/null", "c", "")],
        "twice": [("pkg", "d", ""), ("pkg", "l", str(outside))],
    }


@pytest.fixture
def no_filter(monkeypatch):
    """This host's Python as Debian's 3.11.2 is: no tarfile extraction filters."""
    for name in ("data_filter", "tar_filter"):  # what install_source looks for; extractall then trusts fully
        monkeypatch.delattr(tarfile, name, raising=False)


@pytest.mark.parametrize("case", sorted(hostile(Path("/x"))))
def test_a_hostile_member_is_refused_and_nothing_is_written(tmp_path, no_filter, case):
    outside = tmp_path / "outside"
    outside.mkdir()
    dest = tmp_path / "tree"
    dest.mkdir()
    archive = _tar(tmp_path / "a.tar", hostile(outside)[case])
    with tarfile.open(archive) as tar, pytest.raises(SourceFailed, match="refused: .*nothing was unpacked"):
        extract_tree(tar, dest, "https://example.invalid/x.git@" + "a" * 40)
    assert list(outside.iterdir()) == [] and list(dest.iterdir()) == []


def test_links_inside_the_tree_are_kept_as_links_and_modes_are_plain(tmp_path, no_filter):
    dest = tmp_path / "tree"
    dest.mkdir()
    archive = _tar(tmp_path / "a.tar", [("pkg", "d", ""), ("pkg/mod.py", "f", "X = 1\n"),
                                        ("pkg/alias.py", "l", "mod.py"), ("etc-link", "l", "/etc/passwd")])
    with tarfile.open(archive) as tar:
        extract_tree(tar, dest, "t")
    assert (dest / "pkg" / "alias.py").is_symlink() and (dest / "pkg" / "alias.py").read_text() == "X = 1\n"
    assert (dest / "etc-link").is_symlink() and str((dest / "etc-link").readlink()) == "/etc/passwd"
    assert (dest / "pkg" / "mod.py").stat().st_mode & 0o7777 == 0o755  # no setuid bit from the archive


@pytest.mark.docker
def test_in_the_builders_own_python_without_a_filter(tmp_path):
    """Debian bookworm's python3 (3.11.2, the builder's): every hostile archive refused, nothing outside."""
    import docker_helpers

    base = docker_helpers.ensure_base()
    for case, members in hostile(Path("/work/outside")).items():
        _tar(tmp_path / f"{case.replace(' ', '-')}.tar", members)
    script = (
        "import sys, tarfile, pathlib, os\n"
        "from trainbox.runtime.install_source import extract_tree, SourceFailed\n"
        "assert not hasattr(tarfile, 'data_filter'), sys.version\n"
        "out = pathlib.Path('/work/outside'); out.mkdir()\n"
        "for a in sorted(pathlib.Path('/archives').glob('*.tar')):\n"
        "    dest = pathlib.Path('/work/tree-' + a.stem); dest.mkdir()\n"
        "    try:\n"
        "        extract_tree(tarfile.open(a), dest, a.stem); print('UNPACKED', a.stem)\n"
        "    except SourceFailed as exc:\n"
        "        print('REFUSED', a.stem, list(dest.iterdir()))\n"
        "print('OUTSIDE', sorted(os.listdir(out)), sys.version.split()[0])\n")
    proc = subprocess.run(["docker", "run", "--rm", "--network", "none", "--tmpfs", "/work",
                           "-v", f"{REPO_ROOT / 'python'}:/src:ro", "-v", f"{tmp_path}:/archives:ro",
                           "-e", "PYTHONPATH=/src", "--label", "trainbox.test=supply-unpack", base,
                           "python3", "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert [ln.split()[0] for ln in lines[:-1]] == ["REFUSED"] * len(hostile(Path("/x"))), proc.stdout
    assert all(ln.endswith("[]") for ln in lines[:-1]), proc.stdout
    assert lines[-1].startswith("OUTSIDE [] 3.11."), proc.stdout


def test_the_builders_git_fetch_unpacks_through_the_checks():
    """`_git_fetch` (the only place the builder unpacks a tree) goes through extract_tree, not extractall."""
    import inspect

    src = inspect.getsource(install_source._git_fetch)
    assert "extract_tree(" in src and "extractall" not in src


@pytest.mark.slow
def test_a_tree_with_an_absolute_symlink_is_staged_with_the_link_kept(tmp_path):
    """Issue 22's input: an upstream tree holding an absolute symlink (many real projects ship one) ended in a
    traceback and could not be built. `trainbox fetch` and the build's staging (a dry run stages the context) now
    write it as the same link, never followed, and the tree id still checks."""
    import shutil
    import sys

    from trainbox.paths import STACKS_DIR

    repo = tmp_path / "upstream"
    repo.mkdir()
    (repo / "pkg").mkdir()
    (repo / "pkg" / "__init__.py").write_text("X = 1\n")
    (repo / "pkg" / "etc-passwd").symlink_to("/etc/passwd")
    (repo / "pkg" / "alias.py").symlink_to("__init__.py")
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@e", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@e", "HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    for cmd in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "links"]):
        subprocess.run(["git", "-C", str(repo), *cmd], check=True, env=env, capture_output=True)
    commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], check=True, env=env,
                            capture_output=True, text=True).stdout.strip()
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    shutil.copy(STACKS_DIR / "cpu.lock", stacks / "links.lock")
    (stacks / "links.yaml").write_text(
        f"name: links\nextends: cpu\ncomponents:\n  linked:\n    source: git\n    git: {repo.as_uri()}\n"
        f"    commit: {commit}\n    install: tree\n")
    run_env = dict(os.environ, PYTHONPATH=str(REPO_ROOT / "python"), TRAINBOX_CACHE=str(tmp_path / "cache"))
    for args in (["fetch", "--sources-only", str(stacks / "links.yaml")],
                 ["image", "build", str(stacks / "links.yaml"), "--dry-run", "--wheelhouse", "/opt/wheels"]):
        proc = subprocess.run([sys.executable, "-m", "trainbox.cli", *args], capture_output=True, text=True,
                              env=run_env, timeout=600, cwd=REPO_ROOT)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    staged = [p for p in (tmp_path / "cache").rglob("etc-passwd") if "build" in p.parts]
    assert staged, "the dry run staged no tree"
    for link in staged:
        assert link.is_symlink() and str(link.readlink()) == "/etc/passwd"
        assert (link.parent / "alias.py").is_symlink() and (link.parent / "alias.py").read_text() == "X = 1\n"
