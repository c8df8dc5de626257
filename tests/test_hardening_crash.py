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
from trainbox.launch.recipe import RecipeError, load_recipe
from trainbox.runtime.errors import TrainboxError
from trainbox.smoke import load_profile
from trainbox.specs.stack import StackError, load_stack
from trainbox.yamlfile import parse_yaml

RECIPE = REPO_ROOT / "launchers" / "recipes" / "cpu-ddp.yaml"


def trainbox(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    full = dict(os.environ, PYTHONPATH=str(REPO_ROOT / "python"), **(env or {}))
    return subprocess.run([sys.executable, "-m", "trainbox.cli", *args], capture_output=True, text=True,
                          env=full, timeout=timeout, cwd=REPO_ROOT)


def in_process(capsys, *args: str) -> subprocess.CompletedProcess:
    """`trainbox ARGS` through main() in this process, as a CompletedProcess for one_line(): for the commands
    whose one line and exit status are the point (a CLI process costs 0.3-0.9 s of CPU; the hostile YAML, Ctrl-C,
    deep manifest and crash tests keep the real entry point). TRAINBOX_CACHE is read when a command uses the
    cache, so a test sets it with monkeypatch.setenv."""
    from hangguard import finishes
    from trainbox.cli import main

    capsys.readouterr()
    rc = finishes(main, list(args))  # a hang fails the test, as a subprocess's timeout did
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(["trainbox", *args], rc, out, err)


def one_line(proc: subprocess.CompletedProcess, rc: int = 2) -> str:
    """The command failed with `rc` and said why in exactly one line on stderr (no traceback), its last; notes
    it printed before it got there (`trainbox: base ... cannot be pulled; building on ...`) may precede it."""
    err = proc.stderr.strip()
    assert proc.returncode == rc, (proc.returncode, proc.stdout[-2000:], err[-3000:])
    lines = err.splitlines()
    assert "Traceback" not in err and lines and all(ln.startswith("trainbox: ") and "error" not in ln
                                                    for ln in lines[:-1]), err[-3000:]
    return lines[-1]


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
    "60000 compact sequences (SIGSEGV)": ("- " * 60_000 + "x\n", "levels deep"),
    "60000 complex keys (SIGSEGV)": ("? " * 60_000 + "x\n", "levels deep"),
    "flow in block, deep": ("x:\n  - " + "[" * 3000 + "]" * 3000 + "\n", "levels deep"),
    "1000 indented mappings": ("a:\n" + "".join(" " * i + "b:\n" for i in range(1, 1000)), "levels deep"),
    "deep by aliases": ("".join(f"a{i}: &a{i} [*a{i - 1}]\n" if i else "a0: &a0 [1]\n" for i in range(100)),
                        "levels deep"),
}


@pytest.mark.parametrize("name", sorted(HOSTILE_YAML))
def test_a_hostile_yaml_document_is_refused_in_one_line_at_once(tmp_path, name):
    """Through the command line (a subprocess with a timeout: the old code hangs here, for hours on 9^10)."""
    text, words = HOSTILE_YAML[name]
    assert len(text.encode()) < 1 << 20  # under the loader's size bound: the depth is what is refused
    path = tmp_path / "x.yaml"
    path.write_text(text)
    t0 = time.monotonic()
    err = one_line(trainbox("stack", "show", str(path), timeout=120))
    assert time.monotonic() - t0 < 60, "the refusal must not walk the expansion (a hang guard: it took minutes)"
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



def test_a_document_parsed_again_is_a_copy_and_a_refusal_is_made_again():
    """parse_yaml keeps what it parsed (by text): a caller that edits its result must not change the next one's,
    and a refused document is refused again, naming the second caller's file."""
    text = "pins: [a, b]\nbase: {version: 1}\n"
    first = parse_yaml(text, "one.yaml")
    first["pins"].append("c")
    first["base"]["version"] = 2
    second = parse_yaml(text, "two.yaml")
    assert second == {"pins": ["a", "b"], "base": {"version": 1}}
    second["pins"].clear()
    assert parse_yaml(text, "three.yaml") == {"pins": ["a", "b"], "base": {"version": 1}}
    bad = "version: 1\nversion: 2\n"
    for where in ("a.yaml", "b.yaml"):
        with pytest.raises(TrainboxError, match=rf"^{where}:2:1: malformed YAML: duplicate key 'version'"):
            parse_yaml(bad, where)


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
    assert time.monotonic() - t0 < 60  # a hang guard: the old loader took minutes


def test_an_alias_bomb_in_a_stack_is_one_line_from_the_command_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TRAINBOX_CACHE", str(tmp_path / "cache"))
    d = _stack_dir(tmp_path)
    (d / "cpu.yaml").write_text((STACKS_DIR / "cpu.yaml").read_text() + "junk:\n"
                                + "".join(f"  {ln}\n" for ln in _laughs().splitlines()))
    for args in (["render", str(d / "cpu.yaml"), "-o", str(tmp_path / "out")], ["stack", "show", str(d / "cpu.yaml")],
                 ["image", "build", str(d / "cpu.yaml"), "--dry-run"]):
        err = one_line(in_process(capsys, *args))
        assert "cpu.yaml: malformed YAML" in err and "aliases" in err
    assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------- extends chains

def _stack_chain(tmp_path: Path, depth: int) -> Path:
    """cpu (the cpu stack and its lock, which names it) <- s1 <- ... <- s<depth>, each file only `extends:` its
    parent."""
    d = tmp_path / "chain"
    d.mkdir()
    shutil.copy(STACKS_DIR / "cpu.yaml", d / "cpu.yaml")
    shutil.copy(STACKS_DIR / "cpu.lock", d / "cpu.lock")
    for i in range(1, depth + 1):
        (d / f"s{i}.yaml").write_text(f"name: s{i}\nextends: {f's{i - 1}' if i > 1 else 'cpu'}\n")
    return d / f"s{depth}.yaml"


@pytest.mark.parametrize("depth", [17, 3000])
def test_a_deep_extends_chain_is_refused_in_one_line_at_once(tmp_path, depth, capsys, monkeypatch):
    """80 levels took 124 s (each level loaded its whole chain again, and the rules every ancestor: cubic), 301
    past 90 s, 3000 a RecursionError. One past the limit and 3000 bracket them: any chain over 16 files is refused
    at its 17th, so 80 and 301 ran the same path as 17 (16 CLI runs of the inner loop's CPU, dropped)."""
    monkeypatch.setenv("TRAINBOX_CACHE", str(tmp_path / "cache"))
    top = _stack_chain(tmp_path, depth)
    t0 = time.monotonic()
    for proc in (in_process(capsys, "render", str(top), "-o", str(tmp_path / "out")),
                 in_process(capsys, "stack", "show", str(top)),
                 in_process(capsys, "image", "build", str(top), "--dry-run")):
        err = one_line(proc)
        assert f"s{depth}.yaml: extends: a chain of more than 16 files" in err, err
    proc = in_process(capsys, "stack", "validate", str(top))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "a chain of more than 16" in proc.stderr
    assert time.monotonic() - t0 < 60  # a hang guard: 80 levels took 124 s, 301 never ended
    assert not (tmp_path / "out").exists()


def test_an_extends_chain_within_the_limit_loads_in_linear_time(tmp_path, capsys):
    top = _stack_chain(tmp_path, 15)
    t0 = time.monotonic()
    proc = in_process(capsys, "stack", "validate", str(top))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert time.monotonic() - t0 < 60  # a hang guard: the cubic load of 15 levels took minutes
    st = load_stack(top)
    assert st.name == "s15" and st.lock_is_fresh() and st.components["torch"].version == "2.13.0+cpu"


def test_a_deep_recipe_extends_chain_is_refused(tmp_path, capsys):
    shutil.copy(RECIPE, tmp_path / "r0.yaml")
    for i in range(1, 302):
        (tmp_path / f"r{i}.yaml").write_text(f"extends: r{i - 1}\ndescription: level {i}\n")
    with pytest.raises(RecipeError, match="r301.yaml: extends: a chain of more than 16 files"):
        load_recipe(tmp_path / "r301.yaml")
    err = one_line(in_process(capsys, "launch", "show", str(tmp_path / "r301.yaml")))
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
def test_a_hostile_bundle_json_is_refused_in_one_line(tmp_path, name, capsys, monkeypatch):
    data, words = BAD_META[name]
    bad = _bundle_with_meta(tmp_path / "b.tar", data)
    monkeypatch.setenv("TRAINBOX_CACHE", str(tmp_path / "cache"))
    err = one_line(in_process(capsys, "image", "build", "cpu", "--bundle", str(bad), "--dry-run"))
    assert f"--bundle {bad}: bundle.json" in err and words in err, err
    assert not (tmp_path / "cache" / "build").exists()


# ----------------------------------------------------------------------------- image sbom: untrusted documents

SBOM_AT = "/etc/trainbox/sbom.cdx.json"


def _good_sbom(**component) -> dict:
    comp = {"type": "library", "name": "numpy", "version": "2.3.5",
            "hashes": [{"alg": "SHA-256", "content": "ab" * 32}],
            "properties": [{"name": "trainbox:hash-source", "value": "lock"}], **component}
    return {"bomFormat": "CycloneDX", "specVersion": "1.6",
            "metadata": {"component": {"name": "trainbox/cpu", "version": "abc"}}, "components": [comp]}


# (file content, what the one line says): each of the issue's malformed documents, and more of the same kinds
BAD_SBOMS = {
    "bad JSON": (b'{"bomFormat": "CycloneDX", ', "not valid JSON"),
    "empty": (b"", "not valid JSON"),
    "deep nesting": (b"[" * 100_000 + b"]" * 100_000, "nested more than 64 levels"),
    "deep under components": (json.dumps({"components": [{"name": "x", "properties": [
        {"name": "a", "value": "b", "x": json.loads("[" * 200 + "]" * 200)}]}]}).encode(), "nested more than 64"),
    "missing name": (json.dumps({**_good_sbom(), "components": [{"type": "library", "version": "1"}]}).encode(),
                     "components[0].name: expected a string, got nothing"),
    "name of the wrong type": (json.dumps(_good_sbom(name=["numpy"])).encode(),
                               "components[0].name: expected a string, got array"),
    "components an object": (json.dumps({**_good_sbom(), "components": {"numpy": 1}}).encode(),
                             "components: expected an array, got object"),
    "component a string": (json.dumps({**_good_sbom(), "components": ["numpy"]}).encode(),
                           "components[0]: expected an object, got str"),
    "property without a name": (json.dumps(_good_sbom(properties=[{"value": "x"}])).encode(),
                                "components[0].properties[0].name: expected a string"),
    "property value a number": (json.dumps(_good_sbom(properties=[{"name": "trainbox:git-url", "value": 5}])).encode(),
                                "properties[0].value: expected a string, got int"),
    "hashes a string": (json.dumps(_good_sbom(hashes="abc")).encode(), "components[0].hashes: expected an array"),
    "hash content a number": (json.dumps(_good_sbom(hashes=[{"alg": "SHA-256", "content": 1}])).encode(),
                              "hashes[0].content: expected a string"),
    "metadata a list": (json.dumps({**_good_sbom(), "metadata": []}).encode(), "metadata: expected an object"),
    "subject name a number": (json.dumps({**_good_sbom(), "metadata": {"component": {"name": 3}}}).encode(),
                              "metadata.component.name: expected a string"),
    "top-level array": (b"[1, 2, 3]", "(top level): expected an object, got array"),
    "top-level string": (b'"CycloneDX"', "(top level): expected an object, got str"),
    "non-UTF-8": (b'{"bomFormat": "Cyclone\xff\xfeDX"}', "not UTF-8"),
    "huge integer": (b'{"specVersion": ' + b"1" * 5000 + b"}", "not valid JSON"),
}


@pytest.mark.parametrize("name", sorted(set(BAD_SBOMS) - {"non-UTF-8"}))  # that one: read_from_image, below
def test_a_malformed_sbom_document_is_one_line(name):
    from trainbox.image import sbom

    raw, words = BAD_SBOMS[name]
    with pytest.raises(TrainboxError) as exc:
        sbom.parse_document(raw.decode("utf-8"), f"img: {SBOM_AT}")
    msg = str(exc.value)
    assert msg.startswith(f"img: {SBOM_AT}: ") and words in msg and "\n" not in msg, msg


def test_sbom_values_are_printed_without_their_control_characters():
    """ESC and OSC sequences, newlines, C1 controls and bidi overrides in a document's strings: escaped in the
    table and the heading; the --json text escapes what JSON lets through raw (C1, bidi, DEL)."""
    from trainbox.image import sbom

    evil = "numpy\x1b]0;owned\x07\x1b[2J\nok  fake-line\u202e\x9b31m\x7f"
    doc = _good_sbom(name=evil, version="1\r2", properties=[{"name": "trainbox:git-url", "value": "u\x1b[1m"}])
    doc["metadata"]["component"]["name"] = "img\x1b[H"
    text = json.dumps(doc, ensure_ascii=False)
    parsed = sbom.parse_document(text, "img")
    head, rows = sbom.summary(parsed, "img\x1b")
    for cell in [head, *rows[0]]:
        assert cell.isprintable(), repr(cell)
    assert rows[0][1] == "numpy\\x1b]0;owned\\x07\\x1b[2J\\nok  fake-line\\u202e\\u009b31m\\x7f"
    assert rows[0][4] == "u\\x1b[1m" and "img\\x1b[H" in head
    out = sbom.json_text(text, parsed)
    assert all(c.isprintable() or c in "\n " for c in out) and json.loads(out) == doc
    clean = json.dumps(_good_sbom(), indent=2)
    assert sbom.json_text(clean, json.loads(clean)) == clean  # an honest document keeps its own bytes


@pytest.fixture(scope="module")
def sbom_images():
    """Tiny images (`docker import` of one file: no base, no build) that carry each bad SBOM, or a link."""
    import docker_helpers as dh

    client = dh.docker_client()
    made: dict[str, str] = {}

    def image(name: str, raw: bytes | None, link: str | None = None) -> str:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for d in ("etc", "etc/trainbox"):
                info = tarfile.TarInfo(d)
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            info = tarfile.TarInfo(SBOM_AT.lstrip("/"))
            if link:
                info.type, info.linkname = tarfile.SYMTYPE, link
                tar.addfile(info)
            else:
                info.size = len(raw)
                tar.addfile(info, io.BytesIO(raw))
        tag = dh.temporary_tag("trainbox-test/sbom-bad")
        subprocess.run([client.docker, "import", "--change", f"LABEL {dh.TEST_LABEL}", "-", tag],
                       input=buf.getvalue(), check=True, capture_output=True, timeout=120)
        made[name] = tag
        return tag

    for name, (raw, _words) in BAD_SBOMS.items():
        image(name, raw)
    image("symlink to /etc/passwd", None, link="/etc/passwd")
    image("symlink in the image", None, link="sbom.real.json")
    evil = _good_sbom(name="numpy\x1b]0;owned\x07\x1b[2J\nforged line")
    image("control characters", json.dumps(evil).encode())
    yield made
    subprocess.run([client.docker, "rmi", "-f", *made.values()], capture_output=True, timeout=300)


@pytest.mark.docker
@pytest.mark.own_images  # the tiny images of sbom_images alone
def test_image_sbom_refuses_each_malformed_document_in_one_line(sbom_images):
    for name, (_raw, words) in sorted(BAD_SBOMS.items()):
        err = one_line(trainbox("image", "sbom", sbom_images[name]))
        assert SBOM_AT in err and words in err, (name, err)
        err = one_line(trainbox("image", "sbom", "--json", sbom_images[name]))
        assert words in err, (name, err)
    for name in ("symlink to /etc/passwd", "symlink in the image"):
        proc = trainbox("image", "sbom", sbom_images[name])
        err = one_line(proc)
        assert "is a link" in err and "refusing to follow it" in err and "root:" not in proc.stdout + err, err


@pytest.mark.docker
@pytest.mark.own_images  # the tiny images of sbom_images alone
def test_image_sbom_prints_control_characters_escaped(sbom_images):
    proc = trainbox("image", "sbom", sbom_images["control characters"])
    assert proc.returncode == 0, proc.stderr
    assert "\x1b" not in proc.stdout and "\x07" not in proc.stdout and "forged line" not in proc.stdout.splitlines()
    assert "numpy\\x1b]0;owned\\x07\\x1b[2J\\nforged line" in proc.stdout
    proc = trainbox("image", "sbom", "--json", sbom_images["control characters"])
    assert proc.returncode == 0 and "\x1b" not in proc.stdout
    assert json.loads(proc.stdout)["components"][0]["name"].startswith("numpy\x1b]0;owned")


# ----------------------------------------------------------------------------- a full, read-only or bogus cache

@pytest.fixture
def small_fs(tmp_path):
    """mount(small_fs)(size, ro=False, fill=False) -> a real tmpfs of `size` (full when `fill`), read-only when
    `ro`; unmounted at the end. Skipped where this process may not mount (not root, no CAP_SYS_ADMIN)."""
    mounts: list[Path] = []

    def make(size: str = "64k", ro: bool = False, fill: bool = False) -> Path:
        mnt = tmp_path / f"fs{len(mounts)}"
        mnt.mkdir()
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(mnt)],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
        mounts.append(mnt)
        if fill:
            _fill(mnt)
        if ro:
            subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
        return mnt

    yield make
    for mnt in reversed(mounts):
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def _fill(mnt: Path) -> None:
    """Take every block of the file system: the next write there gets ENOSPC (a new inode may still be made)."""
    fd = os.open(mnt / "filler", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError:
        pass
    finally:
        os.close(fd)


def _left(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.name != "filler")


def test_run_dry_run_with_the_cache_on_a_full_disk(small_fs, capsys, monkeypatch):
    cache = small_fs("16k", fill=True)
    monkeypatch.setenv("TRAINBOX_CACHE", str(cache))
    err = one_line(in_process(capsys, "run", "cpu-ddp", "--dry-run"))
    assert "no space left" in err and "TRAINBOX_CACHE" in err, err
    assert not [p for p in _left(cache) if p.endswith(".tmp")], _left(cache)  # no half-written script


@pytest.mark.parametrize("args", [["run", "cpu-ddp", "--dry-run"], ["image", "build", "cpu", "--dry-run"],
                                  ["render", "cpu", "--check"]])
def test_a_read_only_cache_is_one_line(small_fs, args, capsys, monkeypatch):
    cache = small_fs(ro=True)
    monkeypatch.setenv("TRAINBOX_CACHE", str(cache))
    proc = in_process(capsys, *args)
    if args[0] == "render":  # a command that writes nothing to the cache works without it
        assert proc.returncode == 0, proc.stderr
        return
    err = one_line(proc)
    assert "read-only" in err and f"trainbox's cache is {cache}" in err and "TRAINBOX_CACHE" in err, err


def test_image_build_dry_run_on_a_full_cache_leaves_no_half_staged_context(small_fs, capsys, monkeypatch):
    cache = small_fs("256k", fill=True)
    monkeypatch.setenv("TRAINBOX_CACHE", str(cache))
    err = one_line(in_process(capsys, "image", "build", "cpu", "--dry-run"))
    assert "no space left" in err and f"trainbox's cache is {cache}" in err, err
    assert not (cache / "build" / "cpu" / "context").exists(), _left(cache)


@pytest.mark.parametrize("value", ["/etc/passwd", "/dev/null"])
@pytest.mark.parametrize("args", [["run", "cpu-ddp", "--dry-run"], ["image", "build", "cpu", "--dry-run"],
                                  ["fetch", "cpu", "--offline"]])
def test_trainbox_cache_naming_a_file(value, args, capsys, monkeypatch):
    monkeypatch.setenv("TRAINBOX_CACHE", value)
    proc = in_process(capsys, *args)
    err = one_line(proc)
    assert value in err, err


# ----------------------------------------------------------------------------- fetch --bundle: where it writes

# The network is not what these tests are about: the pins to fetch and the sources are stand-ins (none), the
# rest of `fetch --bundle` (manifest, stack files, sums, the tar, the disk) is the real code.
NO_FETCHING = """
import sys, types
import trainbox.image.bundle, trainbox.supply.fetch
trainbox.image.bundle._pypi_pins = trainbox.image.bundle._build_pins = lambda stack, plat: []
trainbox.supply.fetch.fetch_sources = lambda stack, cache_dir=None, say=print: types.SimpleNamespace(stack=stack, fetched={})
from trainbox.cli import main
sys.exit(main(sys.argv[1:]))
"""


def fetch_bundle(out: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT / "python"), TRAINBOX_CACHE=str(tmp_path / "cache"))
    return subprocess.run([sys.executable, "-c", NO_FETCHING, "fetch", "cpu", "--bundle", str(out)],
                          capture_output=True, text=True, env=env, timeout=120, cwd=REPO_ROOT)


def test_fetch_bundle_on_a_full_disk_leaves_nothing_and_says_so(small_fs, tmp_path):
    roomy = small_fs("4m")
    proc = fetch_bundle(roomy / "cpu.tar", tmp_path)  # the same command where there is room: it works
    assert proc.returncode == 0 and (roomy / "cpu.tar").stat().st_size > 16 * 1024, proc.stderr
    tiny = small_fs("16k")
    err = one_line(fetch_bundle(tiny / "cpu.tar", tmp_path))
    assert f"--bundle {tiny / 'cpu.tar'}: the bundle cannot be written" in err and "no space left" in err, err
    assert _left(tiny) == [], "a .partial (or a bundle) was left on the full disk"
    (tiny / "cpu.tar").write_bytes(b"the old bundle")  # one already there is kept as it was
    one_line(fetch_bundle(tiny / "cpu.tar", tmp_path))
    assert _left(tiny) == ["cpu.tar"] and (tiny / "cpu.tar").read_bytes() == b"the old bundle"


def test_fetch_bundle_on_a_read_only_disk(small_fs, tmp_path):
    ro = small_fs(ro=True)
    err = one_line(fetch_bundle(ro / "cpu.tar", tmp_path))
    assert "read-only" in err and "nothing was written" in err, err


@pytest.mark.parametrize("target", ["/proc/self/mem", "/proc/self/environ", "/sys/kernel/notes", "/dev/full",
                                    "/dev/stdout", "/etc/passwd/cpu.tar", "/"])
def test_fetch_bundle_refuses_what_is_not_a_regular_file(tmp_path, target):
    err = one_line(fetch_bundle(Path(target), tmp_path))
    assert "not a regular file" in err or "not a usable path" in err, err


@pytest.mark.parametrize("target", ["/proc/self/mem", "/proc/self/environ", "/dev/zero"])
def test_image_build_bundle_refuses_what_is_not_a_regular_file(tmp_path, target, capsys, monkeypatch):
    monkeypatch.setenv("TRAINBOX_CACHE", str(tmp_path / "cache"))
    err = one_line(in_process(capsys, "image", "build", "cpu", "--bundle", target, "--dry-run"))
    assert "not a bundle file" in err, err


# ----------------------------------------------------------------------------- Ctrl-C

# A stand-in for the docker CLI (no engine needed): `docker run ...` prints that it started, then on SIGINT
# prints a traceback of the interrupt, as torchrun in the container does, and exits 130; everything else: ok.
FAKE_DOCKER = """#!/usr/bin/env python3
import os, signal, sys, time
if sys.argv[1:2] != ["run"]:
    sys.exit(0)
def stop(*_):
    print("Traceback (most recent call last):\\n  File 'torchrun', line 8\\nKeyboardInterrupt", file=sys.stderr,
          flush=True)
    sys.exit(130)
signal.signal(signal.SIGINT, stop)
if os.environ.get("FAKE_DOCKER_SPEW"):  # a chatty job that ends by itself
    for i in range(int(os.environ["FAKE_DOCKER_SPEW"])):
        print(f"step {i:06d} " + "x" * 100, flush=True)
    sys.exit(0)
print("job started", flush=True)
open(os.environ["FAKE_DOCKER_STARTED"], "w").close()
time.sleep(60)
sys.exit(0)
"""

RUN_WITH_FAKE_DOCKER = """
import sys
import trainbox.image.engine as engine
client = engine.Client(docker=sys.argv[1], version="stand-in", mode="buildx")
engine.find_client = lambda refresh=False: client
engine.Client.image_exists = lambda self, ref: True
from trainbox.cli import main
sys.exit(main(sys.argv[2:]))
"""


def _interrupt(argv: list[str], env: dict, started: Path, group: bool) -> tuple[int, str, str]:
    import signal

    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            cwd=REPO_ROOT, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not started.exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.1)
        time.sleep(0.5)
        if group:  # what a terminal's Ctrl-C does: SIGINT to the whole foreground process group
            os.killpg(proc.pid, signal.SIGINT)
        else:  # `kill -INT` of trainbox alone
            proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        with __import__("contextlib").suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode, out, err


@pytest.mark.parametrize("group", [True, False], ids=["ctrl-c", "kill -INT"])
def test_ctrl_c_during_run_is_130_and_one_line(tmp_path, group):
    """Was exit 1 and three tracebacks (~50 lines): trainbox's own, the tee threads', the job's."""
    docker = tmp_path / "docker"
    docker.write_text(FAKE_DOCKER)
    docker.chmod(0o755)
    started = tmp_path / "started"
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT / "python"), TRAINBOX_CACHE=str(tmp_path / "cache"),
               FAKE_DOCKER_STARTED=str(started))
    rc, out, err = _interrupt([sys.executable, "-c", RUN_WITH_FAKE_DOCKER, str(docker), "run", "cpu-ddp"], env,
                              started, group)
    assert rc == 130, (rc, out, err)
    assert "Traceback" not in out + err and "KeyboardInterrupt" not in out + err, out + err
    last = err.strip().splitlines()[-1]
    assert last.startswith("trainbox: interrupted: the cpu-ddp job cpu-ddp-"), last
    assert "stopped (container exit 130); its log is kept at" in last, last
    assert "job started" in out  # the job's output streamed until the interrupt
    log = Path(last.split("kept at ")[1].split(" (trainbox logs")[0])
    assert "KeyboardInterrupt" in log.read_text()  # its dying words: in the log, not on the terminal


STARTED_MAIN = """
import sys
from trainbox.cli import main
open(sys.argv[1], "w").close()  # imported: an interrupt from here on is trainbox's to answer
sys.exit(main(sys.argv[2:]))
"""


SWALLOWED_INTERRUPT = """
import argparse, signal, sys
from trainbox import cli
from trainbox.runtime.errors import TrainboxError

class Swallowing:  # Ctrl-C where it cannot be raised (as in a regex pydantic-core calls): "Exception ignored"
    def __del__(self):
        signal.raise_signal(signal.SIGINT)

def func(args):
    obj = Swallowing()
    del obj
    if sys.argv[1] == "fails":
        raise TrainboxError("the lock is invalid (what the lost interrupt left behind)")
    return 0

parser = argparse.ArgumentParser(prog="trainbox")
parser.set_defaults(func=func, command="demo")
cli._parser = lambda: parser
sys.exit(cli.main([]))
"""


@pytest.mark.parametrize("then", ["fails", "ends"])
def test_an_interrupt_a_library_swallowed_is_still_130_and_one_line(then):
    """Seen once in `render --check`: Ctrl-C inside pydantic-core's pattern check of a lock was printed as
    "Exception ignored" and lost, and the command said the lock was invalid (exit 2)."""
    proc = subprocess.run([sys.executable, "-c", SWALLOWED_INTERRUPT, then], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(REPO_ROOT / "python")), timeout=120)
    assert (proc.returncode, proc.stderr) == (130, "trainbox: interrupted\n")


@pytest.mark.parametrize("args", [["stack", "validate"], ["render", "--check"], ["launch", "check"]])
def test_ctrl_c_in_other_commands_is_130_and_one_line(tmp_path, args):
    """The dispatcher's own answer, wherever the interrupt lands (here: soon after the command starts)."""
    import signal

    started = tmp_path / "started"
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT / "python"), TRAINBOX_CACHE=str(tmp_path / "cache"))
    proc = subprocess.Popen([sys.executable, "-c", STARTED_MAIN, str(started), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=REPO_ROOT, start_new_session=True)
    deadline = time.monotonic() + 60
    while not started.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    if proc.returncode == 0:
        pytest.skip("the command ended before the interrupt")
    assert proc.returncode == 130, (proc.returncode, err[-2000:])
    assert "Traceback" not in err and err.strip().splitlines()[-1] == "trainbox: interrupted", err


@pytest.mark.docker
@pytest.mark.slow
def test_ctrl_c_during_a_real_run_stops_the_container(tmp_path):
    """The cpu-ddp job in the cpu image: torchrun prints its tracebacks of the interrupt into the log only, the
    container stops, trainbox exits 130 with one line."""
    import docker_helpers as dh

    image = dh.build_cpu_image()
    name = f"i37-ctrl-c-{os.getpid()}"
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT / "python"), TRAINBOX_CACHE=str(tmp_path / "cache"))
    proc = subprocess.Popen([sys.executable, "-m", "trainbox.cli", "run", "cpu-ddp", "--image", image, "--name", name,
                             "--set", "STEPS=100000"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, cwd=REPO_ROOT, start_new_session=True)
    import signal

    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if "trainbox launcher: node 0/1" in line:
                break
        time.sleep(8)  # torch imported, ranks training
        os.killpg(proc.pid, signal.SIGINT)
        rest, _ = proc.communicate(timeout=120)
    finally:
        with __import__("contextlib").suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        subprocess.run(["docker", "rm", "-f", name], capture_output=True)
    out = "".join(lines) + rest
    assert proc.returncode == 130, out[-3000:]
    assert "Traceback" not in out and out.strip().splitlines()[-1].startswith(
        "trainbox: interrupted: the cpu-ddp job "), out[-3000:]  # the job's name: --name's, here
    log = Path(out.strip().splitlines()[-1].split("kept at ")[1].split(" (trainbox logs")[0])
    assert "Traceback" in log.read_text() or "SignalException" in log.read_text()
    gone = subprocess.run(["docker", "ps", "-aq", "--filter", f"name={name}"], capture_output=True, text=True)
    assert gone.stdout.strip() == ""


# ----------------------------------------------------------------------------- more writes on a full disk

def test_launch_render_on_a_full_disk_leaves_no_half_script(small_fs, capsys):
    out = small_fs("16k", fill=True)
    err = one_line(in_process(capsys, "launch", "render", "cpu-ddp", "-o", str(out / "job.sh")))
    assert "cannot write the script there" in err, err
    assert _left(out) == [], _left(out)


def test_render_on_a_full_disk_is_one_line_and_all_or_nothing(small_fs, capsys):
    out = small_fs("16k", fill=True)
    err = one_line(in_process(capsys, "render", "cpu", "-o", str(out)))
    assert str(out) in err, err
    assert not [p for p in _left(out) if Path(out, p).is_file()], _left(out)


def test_a_lock_written_on_a_full_disk_keeps_the_old_one(small_fs):
    from trainbox.supply.lock import write_lock

    d = small_fs("64k")
    shutil.copy(STACKS_DIR / "cpu.yaml", d / "cpu.yaml")
    shutil.copy(STACKS_DIR / "cpu.lock", d / "cpu.lock")
    stack = load_stack(d / "cpu.yaml")
    old = (d / "cpu.lock").read_bytes()
    _fill(d)
    with pytest.raises(OSError):
        write_lock(stack, {**stack.lock, "padding": "x" * 100_000})
    assert (d / "cpu.lock").read_bytes() == old and sorted(p.name for p in d.iterdir()) == [
        "cpu.lock", "cpu.yaml", "filler"]


def test_write_atomic_under_ctrl_c_leaves_the_old_file(tmp_path, monkeypatch):
    from trainbox.paths import write_atomic

    target = tmp_path / "report.json"
    target.write_text("old")

    def interrupted(self, *a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(Path, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_atomic(target, "new")
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["report.json"]


# ----------------------------------------------------------------------------- other inputs of the same kinds

@pytest.mark.parametrize("content", [b"[" * 100_000 + b"]" * 100_000, b'{"a":' * 5000 + b"1" + b"}" * 5000],
                         ids=["arrays", "objects"])
def test_doctor_with_a_deep_manifest_fails_its_check_not_the_command(tmp_path, content):
    manifest = tmp_path / "stack.json"
    manifest.write_bytes(content)
    proc = trainbox("doctor", "--manifest", str(manifest), "--quick", "--json")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    failed = [c for c in json.loads(proc.stdout)["checks"] if c["status"] == "FAIL"]
    assert any("nested thousands of levels deep" in c["message"] for c in failed), failed


@pytest.mark.parametrize("target", ["/proc/self/mem", "/proc/self/environ"])
def test_an_unreadable_ca_bundle_is_one_line(tmp_path, target, capsys, monkeypatch):
    monkeypatch.setenv("TRAINBOX_CACHE", str(tmp_path / "cache"))
    err = one_line(in_process(capsys, "image", "build", "cpu", "--dry-run", "--ca-bundle", target))
    assert f"--ca-bundle {target}" in err, err


BUGGY = """
import sys
import trainbox.specs.stack
def broken(*a, **k):
    raise TypeError("a stand-in bug\\nover two lines")
trainbox.specs.stack.load_stack = broken
from trainbox.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_an_unexpected_error_is_one_line_and_its_traceback_on_demand():
    """The last resort: whatever no handler knows is said as an internal error (exit 1), not 40 lines."""
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT / "python"))
    env.pop("TRAINBOX_DEBUG", None)
    proc = subprocess.run([sys.executable, "-c", BUGGY, "stack", "show", "cpu"], capture_output=True, text=True,
                          env=env, timeout=60, cwd=REPO_ROOT)
    err = one_line(proc, rc=1)
    assert err == ("trainbox: error: internal error in `trainbox stack`: TypeError: a stand-in bug over two lines "
                   "(a bug in trainbox: please report it with the command; TRAINBOX_DEBUG=1 prints the traceback)")
    proc = subprocess.run([sys.executable, "-c", BUGGY, "stack", "show", "cpu"], capture_output=True, text=True,
                          env=dict(env, TRAINBOX_DEBUG="1"), timeout=60, cwd=REPO_ROOT)
    assert proc.returncode == 1 and "Traceback" in proc.stderr and "TypeError: a stand-in bug" in proc.stderr


def test_a_run_whose_log_fills_the_disk_goes_on_streaming(small_fs, tmp_path):
    """The log's disk fills during the job: no traceback from the copying thread; the job's output and its exit
    status are still the user's."""
    docker = tmp_path / "docker"
    docker.write_text(FAKE_DOCKER)
    docker.chmod(0o755)
    cache = small_fs("128k")
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT / "python"), TRAINBOX_CACHE=str(cache),
               FAKE_DOCKER_STARTED=str(tmp_path / "started"), FAKE_DOCKER_SPEW="5000")
    proc = subprocess.run([sys.executable, "-c", RUN_WITH_FAKE_DOCKER, str(docker), "run", "cpu-ddp"],
                          capture_output=True, text=True, env=env, timeout=120, cwd=REPO_ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "step 004999" in proc.stdout, proc.stderr[-3000:]


def test_every_table_cell_is_printed_without_control_characters():
    """`image ls` (image labels), `stack list`, `image sbom`: a value with ESC, OSC, a newline or a bidi
    override is escaped in the table, piped or on a terminal."""
    from trainbox.commands._output import plain_table, print_table

    evil = "cpu\x1b]0;owned\x07\x1b[2J\nforged row\u202e"
    text = plain_table(["STACK", "TAGS"], [[evil, [evil, "x"]]])
    assert text.isprintable() or set(text) - set(c for c in text if c.isprintable()) == {"\n"}
    assert len(text.splitlines()) == 2 and "cpu\\x1b]0;owned\\x07\\x1b[2J\\nforged row\\u202e" in text

    class Tty(io.StringIO):
        def isatty(self):
            return True

    out = Tty()
    print_table(["STACK"], [[evil]], stream=out)  # rich, where installed
    assert "\x1b]0;owned" not in out.getvalue() and "\x07" not in out.getvalue()


def test_stacks_load_in_several_threads_at_once(tmp_path):
    """The per-load memo (each file of an extends chain read once) is per thread: `smoke --jobs` loads stacks
    in several threads at once."""
    from concurrent.futures import ThreadPoolExecutor

    from trainbox.specs.findings import Review

    top = _stack_chain(tmp_path, 6)
    names = [top, "cpu", "cpu-ray", "twinkle-a3", "swift", top.with_name("s3.yaml")]
    want = {str(n): load_stack(n).pins_digest() for n in names}

    def one(n):
        st = load_stack(n)
        Review().stack(st)
        return str(n), st.pins_digest()

    with ThreadPoolExecutor(6) as pool:
        got = list(pool.map(one, names * 4))
    assert all(want[n] == d for n, d in got)
