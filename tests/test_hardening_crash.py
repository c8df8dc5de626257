"""Issue 37, tracebacks and hangs: hostile or broken inputs and a hostile environment (deep or exploding
documents, malformed SBOMs, a full or read-only cache, a file where a directory belongs, Ctrl-C) end in one
line and the documented exit status (2 invalid input, 130 interrupted), quickly, with nothing half-written."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from trainbox.paths import REPO_ROOT, STACKS_DIR
from trainbox.recipe import RecipeError, load_recipe
from trainbox.runtime.errors import TrainboxError
from trainbox.smoke import load_profile
from trainbox.stack import StackError, load_stack
from trainbox.yamlfile import parse_yaml

RECIPE = REPO_ROOT / "launchers" / "recipes" / "cpu-ddp.yaml"


def trainbox(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    full = dict(os.environ, PYTHONPATH=str(REPO_ROOT / "python"), **(env or {}))
    return subprocess.run([sys.executable, "-m", "trainbox.cli", *args], capture_output=True, text=True,
                          env=full, timeout=timeout, cwd=REPO_ROOT)


def one_line(proc: subprocess.CompletedProcess, rc: int = 2) -> str:
    """The command failed with `rc` and said why in exactly one line on stderr (no traceback)."""
    err = proc.stderr.strip()
    assert proc.returncode == rc, (proc.returncode, proc.stdout[-2000:], err[-3000:])
    assert "Traceback" not in err and len(err.splitlines()) == 1, err[-3000:]
    return err


# ----------------------------------------------------------------------------- YAML: alias bombs, depth

def _laughs(levels: int = 8, width: int = 9, mapping: bool = False) -> str:
    """A billion-laughs document: each level holds `width` aliases of the one before (width**levels values)."""
    lines = ["a0: &a0 [" + ", ".join(["lol"] * width) + "]"]
    for i in range(1, levels + 1):
        if mapping:
            lines.append(f"a{i}: &a{i} {{" + ", ".join(f"k{j}: *a{i - 1}" for j in range(width)) + "}")
        else:
            lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]")
    return "\n".join(lines) + "\n"


HOSTILE_YAML = {
    "list bomb 9^8": (_laughs(), "aliases"),
    "mapping bomb 9^8": (_laughs(mapping=True), "aliases"),
    "bomb 9^10": (_laughs(levels=10), "aliases"),
    "wide bomb 30^5": (_laughs(levels=5, width=30), "aliases"),
    "bomb under a key": ("name: cpu\ncomponents:\n" + "".join(f"  {ln}\n" for ln in _laughs().splitlines()),
                         "aliases"),
    "recursive alias": ("a: &a [1, *a]\n", "contains it"),
    "recursive mapping": ("a: &a {b: *a}\n", "contains it"),
    "20000 lists deep": ("x: " + "[" * 20000 + "]" * 20000 + "\n", "levels deep"),
    "5000 mappings deep": ("x: " + "{a: " * 5000 + "1" + "}" * 5000 + "\n", "levels deep"),
    "deep by aliases": ("".join(f"a{i}: &a{i} [*a{i - 1}]\n" if i else "a0: &a0 [1]\n" for i in range(100)),
                        "levels deep"),
}


@pytest.mark.parametrize("name", sorted(HOSTILE_YAML))
def test_a_hostile_yaml_document_is_refused_in_one_line_at_once(tmp_path, name):
    """Through the command line (a subprocess with a timeout: the old code hangs here, for hours on 9^10)."""
    text, words = HOSTILE_YAML[name]
    assert len(text.encode()) < 64 * 1024
    path = tmp_path / "x.yaml"
    path.write_text(text)
    t0 = time.monotonic()
    err = one_line(trainbox("stack", "show", str(path), timeout=30))
    assert time.monotonic() - t0 < 15, "the refusal must not walk the expansion"
    assert err.startswith(f"trainbox: error: {path}") and "malformed YAML: " in err and words in err, err


def test_honest_aliases_and_merge_keys_still_load():
    text = "base: &b {version: 1, index: pypi}\none: *b\ntwo: {<<: *b, version: 2}\nlist: [*b, *b]\n"
    assert parse_yaml(text, "x.yaml") == {"base": {"version": 1, "index": "pypi"},
                                          "one": {"version": 1, "index": "pypi"},
                                          "two": {"version": 2, "index": "pypi"},
                                          "list": [{"version": 1, "index": "pypi"}] * 2}
    # every real file of the tree stays far below the bounds
    for path in sorted(STACKS_DIR.glob("*.*")) + sorted((REPO_ROOT / "launchers" / "recipes").glob("*.yaml")):
        parse_yaml(path.read_text(), str(path))


def _stack_dir(tmp_path: Path) -> Path:
    d = tmp_path / "stacks"
    d.mkdir()
    shutil.copy(STACKS_DIR / "cpu.yaml", d / "cpu.yaml")
    shutil.copy(STACKS_DIR / "cpu.lock", d / "cpu.lock")
    return d


def test_an_alias_bomb_in_each_kind_of_file_is_refused(tmp_path):
    """Stacks, locks, recipes and smoke profiles all read through the one loader."""
    bomb = _laughs()
    nested = "junk:\n" + "".join(f"  {ln}\n" for ln in bomb.splitlines())
    d = _stack_dir(tmp_path)
    (d / "cpu.lock").write_text(bomb)
    t0 = time.monotonic()
    with pytest.raises(StackError, match=r"cpu.lock: malformed YAML: .*aliases"):
        load_stack(d / "cpu.yaml")
    (d / "cpu.lock").write_text((STACKS_DIR / "cpu.lock").read_text())
    (d / "cpu.yaml").write_text((STACKS_DIR / "cpu.yaml").read_text() + nested)
    with pytest.raises(StackError, match=r"cpu.yaml: malformed YAML: .*aliases"):
        load_stack(d / "cpu.yaml")
    recipe = tmp_path / "cpu-ddp.yaml"
    recipe.write_text(RECIPE.read_text() + nested)
    with pytest.raises(RecipeError, match=r"cpu-ddp.yaml: malformed YAML: .*aliases"):
        load_recipe(recipe)
    profile = tmp_path / "profile.yaml"
    profile.write_text(bomb)
    with pytest.raises(TrainboxError, match=r"profile.yaml: malformed YAML: .*aliases"):
        load_profile(profile)
    assert time.monotonic() - t0 < 10


def test_an_alias_bomb_in_a_stack_is_one_line_from_the_command_line(tmp_path):
    d = _stack_dir(tmp_path)
    (d / "cpu.yaml").write_text((STACKS_DIR / "cpu.yaml").read_text() + "junk:\n"
                                + "".join(f"  {ln}\n" for ln in _laughs().splitlines()))
    for args in (["render", str(d / "cpu.yaml"), "-o", str(tmp_path / "out")], ["stack", "show", str(d / "cpu.yaml")],
                 ["image", "build", str(d / "cpu.yaml"), "--dry-run"]):
        err = one_line(trainbox(*args, env={"TRAINBOX_CACHE": str(tmp_path / "cache")}, timeout=60))
        assert "cpu.yaml: malformed YAML" in err and "aliases" in err
    assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------- extends chains

def _stack_chain(tmp_path: Path, depth: int) -> Path:
    """s0 (the cpu stack, locked) <- s1 <- ... <- s<depth>, each file only `extends:` its parent."""
    d = tmp_path / "chain"
    d.mkdir()
    (d / "s0.yaml").write_text((STACKS_DIR / "cpu.yaml").read_text().replace("name: cpu\n", "name: s0\n", 1))
    shutil.copy(STACKS_DIR / "cpu.lock", d / "s0.lock")
    for i in range(1, depth + 1):
        (d / f"s{i}.yaml").write_text(f"name: s{i}\nextends: s{i - 1}\n")
    return d / f"s{depth}.yaml"


@pytest.mark.parametrize("depth", [17, 80, 301, 3000])
def test_a_deep_extends_chain_is_refused_in_one_line_at_once(tmp_path, depth):
    """80 levels took 124 s (each level loaded its whole chain again, and the rules every ancestor: cubic), 301
    past 90 s, 3000 a RecursionError."""
    top = _stack_chain(tmp_path, depth)
    t0 = time.monotonic()
    for args in (["render", str(top), "-o", str(tmp_path / "out")], ["stack", "show", str(top)],
                 ["image", "build", str(top), "--dry-run"]):
        err = one_line(trainbox(*args, env={"TRAINBOX_CACHE": str(tmp_path / "cache")}, timeout=60))
        assert f"s{depth}.yaml: extends: a chain of more than 16 files" in err, err
    proc = trainbox("stack", "validate", str(top), timeout=60)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr and "a chain of more than 16" in proc.stderr
    assert time.monotonic() - t0 < 40
    assert not (tmp_path / "out").exists()


def test_an_extends_chain_within_the_limit_loads_in_linear_time(tmp_path):
    top = _stack_chain(tmp_path, 15)
    t0 = time.monotonic()
    proc = trainbox("stack", "validate", str(top), timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert time.monotonic() - t0 < 20
    st = load_stack(top)
    assert st.name == "s15" and st.lock_is_fresh() and st.components["torch"].version == "2.13.0+cpu"


def test_a_deep_recipe_extends_chain_is_refused(tmp_path):
    shutil.copy(RECIPE, tmp_path / "r0.yaml")
    for i in range(1, 302):
        (tmp_path / f"r{i}.yaml").write_text(f"extends: r{i - 1}\ndescription: level {i}\n")
    with pytest.raises(RecipeError, match="r301.yaml: extends: a chain of more than 16 files"):
        load_recipe(tmp_path / "r301.yaml")
    err = one_line(trainbox("launch", "show", str(tmp_path / "r301.yaml"), timeout=60))
    assert "a chain of more than 16 files" in err
    assert load_recipe(tmp_path / "r15.yaml").description == "level 15"


# ----------------------------------------------------------------------------- JSON: bundle.json

def _bundle_with_meta(path: Path, data: bytes) -> Path:
    """A tar whose SHA256SUMS matches its bundle.json (a forger can always make them match)."""
    sums = f"{hashlib.sha256(data).hexdigest()}  bundle.json\n".encode()
    with tarfile.open(path, "w") as tar:
        for name, content in (("bundle.json", data), ("SHA256SUMS", sums)):
            info = tarfile.TarInfo(f"./{name}")
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
    return path


BAD_META = {
    "100k-deep arrays": (b"[" * 100_000 + b"]" * 100_000, "nested more than 64 levels"),
    "100k-deep objects": (b'{"a":' * 100_000 + b"1" + b"}" * 100_000, "nested more than 64 levels"),
    "deep under a key": (b'{"schema": "trainbox.bundle/1", "manifest": ' + b"[" * 3000 + b"]" * 3000 + b"}",
                         "nested more than 64 levels"),
    "huge integer": (b'{"schema": ' + b"9" * 5000 + b"}", "not valid JSON"),
    "not UTF-8": (b'{"schema": "\xff"}', "not UTF-8"),
    "top-level array": (b"[1, 2]", "not a trainbox.bundle/1 object"),
}


@pytest.mark.parametrize("name", sorted(BAD_META))
def test_a_hostile_bundle_json_is_refused_in_one_line(tmp_path, name):
    data, words = BAD_META[name]
    bad = _bundle_with_meta(tmp_path / "b.tar", data)
    err = one_line(trainbox("image", "build", "cpu", "--bundle", str(bad), "--dry-run",
                            env={"TRAINBOX_CACHE": str(tmp_path / "cache")}))
    assert f"--bundle {bad}: bundle.json" in err and words in err, err
    assert not (tmp_path / "cache" / "build").exists()
