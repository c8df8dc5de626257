"""The guide runs: every fenced shell block of the README, the quickstart and the how-tos says where it runs, and
the blocks this machine can run are run, so that a command that stopped working fails here.

A block's info string carries its tag: ``bash run=offline`` (no network, no engine: run here, under a network
namespace of its own where this host allows one), ``run=network`` (PyPI), ``run=docker`` (a Docker engine; slow),
or ``run=no (why)`` (what it needs that a CPU host lacks, e.g. an NPU, a registry, a CANN base). A block is run
as one `bash -euo pipefail` script in a scratch directory that holds links to the checkout's top-level entries
(so `ci/...` and `Makefile` resolve, and files a command writes stay out of the checkout), with `trainbox` on PATH
as this checkout's CLI and, but for docker blocks, a trainbox cache of its own. The commands of every block,
tagged or not, are also parsed against the CLI by tests/test_readme_commands.py.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: the documents whose commands a reader runs as written
RUN_DOCS = [ROOT / "README.md", ROOT / "docs/quickstart.md", *sorted((ROOT / "docs/howto").glob("*.md"))]
TAGS = ("offline", "network", "docker", "no")
_FENCE = re.compile(r"^(```|~~~)\s*(\S*)\s*(.*)$")
_TAG = re.compile(r"^run=(\w+)(?:\s+\((.+)\))?\s*$")
SHELLS = {"bash", "sh", "shell", "console"}
TIMEOUT = 600


@dataclass
class Block:
    path: Path
    line: int  # 1-based line of the opening fence
    lang: str
    tag: str | None  # offline | network | docker | no | None (untagged)
    why: str | None
    code: str
    info: str

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT) if self.path.is_relative_to(ROOT) else self.path}:{self.line}"


def blocks(path: Path, text: str | None = None) -> list[Block]:
    """Every fenced block of a Markdown file (any language), with its run tag."""
    out, lines, i = [], (text if text is not None else path.read_text()).splitlines(), 0
    while i < len(lines):
        m = _FENCE.match(lines[i].strip())
        if not m:
            i += 1
            continue
        fence, lang, info = m.groups()
        start, body = i + 1, []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i])
            i += 1
        i += 1
        t = _TAG.match(info)
        out.append(Block(path, start, lang, t.group(1) if t else None, t.group(2) if t else None,
                         "\n".join(body) + "\n", info))
    return out


def problems(path: Path, text: str | None = None) -> list[str]:
    """What is wrong with a document's tags: an untagged shell block, an unknown tag, `run=no` without a why, an
    indented code block holding a command (it would escape the test)."""
    found = []
    for b in blocks(path, text):
        if b.lang not in SHELLS:
            continue
        if b.tag is None:
            found.append(f"{b.where}: a ```{b.lang} block without run=offline|network|docker|no (why): {b.info!r}")
        elif b.tag not in TAGS:
            found.append(f"{b.where}: run={b.tag}: expected one of {', '.join(TAGS)}")
        elif b.tag == "no" and not b.why:
            found.append(f"{b.where}: run=no needs the reason in parentheses, e.g. run=no (needs an Ascend NPU host)")
    fenced = False
    for n, line in enumerate((text if text is not None else path.read_text()).splitlines(), 1):
        if _FENCE.match(line.strip()):
            fenced = not fenced
        elif not fenced and line.startswith("    ") and re.match(r"\s+(\$ )?trainbox\s", line):
            found.append(f"{path.name}:{n}: an indented code block with a command: fence it and tag it")
    return found


def scratch(tmp: Path) -> dict[str, str]:
    """A working directory that looks like the checkout, and the environment with this checkout's `trainbox`."""
    for entry in ROOT.iterdir():
        if entry.name not in (".git",):
            (tmp / entry.name).symlink_to(entry)
    bindir = tmp.parent / f"{tmp.name}-bin"
    bindir.mkdir()
    shim = bindir / "trainbox"
    shim.write_text(f'#!/bin/sh\nexec {sys.executable} -m trainbox.cli "$@"\n')
    shim.chmod(0o755)
    env = dict(os.environ)
    env["PATH"] = f"{bindir}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(ROOT / "python") + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _netns() -> list[str]:
    """`unshare -n` where this host lets us make a network namespace (root in CI), so an offline block is proven
    offline; elsewhere the block runs with the host's network (said in the failure text)."""
    exe = shutil.which("unshare")
    if exe and subprocess.run([exe, "-n", "true"], capture_output=True).returncode == 0:
        return [exe, "-n"]
    return []


def run_block(b: Block, tmp: Path) -> subprocess.CompletedProcess:
    env = scratch(tmp)
    if b.tag != "docker":  # a cache of its own: dry runs stage their context there, and blocks run side by side
        env["TRAINBOX_CACHE"] = str(tmp.parent / f"{tmp.name}-cache")
    script = tmp.parent / f"{tmp.name}-block.sh"
    script.write_text(b.code)
    prefix = _netns() if b.tag == "offline" else []
    return subprocess.run([*prefix, "bash", "-euo", "pipefail", str(script)], cwd=tmp, env=env, text=True,
                          capture_output=True, timeout=TIMEOUT)


def _params(tag: str, *marks):
    return [pytest.param(b, id=b.where, marks=list(marks)) for p in RUN_DOCS for b in blocks(p) if b.tag == tag]


def test_every_shell_block_says_where_it_runs():
    bad = [msg for p in RUN_DOCS for msg in problems(p)]
    assert not bad, "\n".join(bad)
    counts = {t: len([b for p in RUN_DOCS for b in blocks(p) if b.tag == t]) for t in TAGS}
    assert counts["offline"] >= 8 and counts["docker"] >= 2, counts  # the tour and the quickstart are runnable


def _check(b: Block, tmp_path: Path):
    work = tmp_path / "checkout"
    work.mkdir()
    r = run_block(b, work)
    assert r.returncode == 0, (f"{b.where}: the block fails as written (exit {r.returncode}):\n{b.code}\n"
                               f"--- stdout (tail)\n{r.stdout[-3000:]}\n--- stderr (tail)\n{r.stderr[-3000:]}")


@pytest.mark.parametrize("block", _params("offline"))
def test_offline_block_runs(block, tmp_path):
    _check(block, tmp_path)


@pytest.mark.parametrize("block", _params("network", pytest.mark.network))
def test_network_block_runs(block, tmp_path):
    _check(block, tmp_path)


@pytest.mark.parametrize("block", _params("docker", pytest.mark.docker, pytest.mark.slow))
def test_docker_block_runs(block, tmp_path):
    _check(block, tmp_path)


def test_a_stale_block_fails_and_an_untagged_one_is_found(tmp_path):
    doc = tmp_path / "guide.md"
    text = "\n".join([
        "```bash run=offline", "trainbox stack show cpu", "trainbox stack show no-such-stack", "```",
        "```bash", "trainbox stack list", "```",
        "```bash run=no", "trainbox run cpu-ddp", "```",
        "```bash run=sometimes", "true", "```",
        "", "    trainbox stack list", "",
    ])
    doc.write_text(text)
    found = problems(doc)
    assert len(found) == 4, found
    assert "without run=" in found[0] and "needs the reason" in found[1] and "run=sometimes" in found[2]
    assert "indented code block" in found[3]
    stale = blocks(doc)[0]
    work = tmp_path / "checkout"
    work.mkdir()
    r = run_block(stale, work)
    assert r.returncode == 2 and "no-such-stack" in r.stderr, (r.returncode, r.stderr[-500:])
    assert not (ROOT / "no-such-stack").exists()


def test_offline_blocks_write_nothing_into_the_checkout(tmp_path):
    """A file a block writes (`-o job.sh`) lands in the scratch directory, not beside the checkout's files."""
    b = Block(tmp_path / "x.md", 1, "bash", "offline", None, "trainbox launch render cpu-ddp -o job.sh\n",
              "run=offline")
    work = tmp_path / "checkout"
    work.mkdir()
    r = run_block(b, work)
    assert r.returncode == 0, r.stderr[-1000:]
    assert (work / "job.sh").is_file() and not (work / "job.sh").is_symlink()
    assert not (ROOT / "job.sh").exists()
