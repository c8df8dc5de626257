"""Issue 14, items 1, 3, 4, 5 and 7: hostile or careless inputs give one clear error (file, key or line, fix)
and a non-zero exit, never a traceback, a silent winner or a half-written result."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from trainbox.cli import main as cli
from trainbox.paths import REPO_ROOT, STACKS_DIR
from trainbox.launch.recipe import RecipeError, load_recipe
from trainbox.image.render import drift, render_all, write_set
from trainbox.specs.rules import check as rule_check
from trainbox.runtime.errors import TrainboxError
from trainbox.smoke import load_profile
from trainbox.supply.fetch import fetch
from trainbox.supply.pins import Pin
from trainbox.supply.sources import SourceError
from trainbox.specs.stack import StackError, load_stack

ENTRYPOINT = [sys.executable, "-m", "trainbox.runtime.entrypoint"]


def stack_dir(tmp_path: Path, text: str | None = None, name: str = "cpu") -> Path:
    d = tmp_path / "stacks"
    d.mkdir(exist_ok=True)
    shutil.copy(STACKS_DIR / "cpu.lock", d / f"{name}.lock")
    (d / f"{name}.yaml").write_text(text if text is not None else (STACKS_DIR / "cpu.yaml").read_text())
    return d / f"{name}.yaml"


# ---------------------------------------------------------------------------------------- 1. grammars

@pytest.mark.parametrize("path, value, words", [
    (("components", "numpy", "version"), "2.3.5\n", "PEP 440"),
    (("components", "numpy", "version"), "2.3.5\tx", "PEP 440"),
    (("name",), "cpu\nRUN id", "name"),
    (("base", "image"), "debian:bookworm\nRUN touch /tmp/pwned", "OCI image reference"),
    (("base", "python"), "python3; touch /tmp/pwned", "command"),
    (("system_packages",), ["git", "curl; touch /tmp/pwned"], "Debian package"),
    (("indexes", "pypi"), "https://pypi.org/simple $(touch /tmp/pwned)", "URL"),
    (("indexes", "pypi"), "ftp://pypi.org/simple", "https:// or http:// or file:// URL"),
    (("env",), {"FOO=1\nRUN touch /tmp/pwned\nENV BAR": "1"}, "environment variable name"),
])
def test_stack_fields_have_a_grammar(tmp_path, path, value, words):
    doc = yaml.safe_load((STACKS_DIR / "cpu.yaml").read_text())
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    with pytest.raises(StackError) as exc:
        load_stack(stack_dir(tmp_path, yaml.safe_dump(doc)))
    assert words in str(exc.value) and "cpu.yaml" in str(exc.value)


def test_set_value_with_a_newline_is_refused():
    with pytest.raises(StackError, match="components.numpy: version '2.3.5"):
        load_stack("cpu", sets={"numpy.version": "2.3.5\nRUN touch /tmp/pwned"})
    with pytest.raises(StackError, match="PEP 440"):
        load_stack("cpu", sets={"numpy.version": "2.3.5\n"})


# ---------------------------------------------------------------------------------------- 3. duplicates

def test_duplicate_key_in_a_stack_is_refused_with_line(tmp_path):
    text = (STACKS_DIR / "cpu.yaml").read_text().replace("    version: 2.3.5\n",
                                                          "    version: 2.3.5\n    version: 9.9.9\n")
    with pytest.raises(StackError) as exc:
        load_stack(stack_dir(tmp_path, text))
    assert "duplicate key 'version'" in str(exc.value)
    line = text.splitlines().index("    version: 9.9.9") + 1
    assert f"cpu.yaml:{line}:" in str(exc.value)


def test_duplicate_key_in_a_lock_is_refused(tmp_path):
    path = stack_dir(tmp_path)
    lock = path.with_suffix(".lock")
    lock.write_text(lock.read_text().replace("pins_digest:", "pins_digest: x\npins_digest:", 1))
    with pytest.raises(StackError, match=r"cpu.lock:[0-9]+:1: .*duplicate key 'pins_digest'"):
        load_stack(path)


def test_duplicate_key_in_a_recipe_is_refused(tmp_path):
    text = (REPO_ROOT / "launchers/recipes/cpu-ddp.yaml").read_text() + "stack: cuda\n"
    path = tmp_path / "cpu-ddp.yaml"
    path.write_text(text)
    with pytest.raises(RecipeError, match=r"cpu-ddp.yaml:\d+:1: .*duplicate key 'stack'"):
        load_recipe(path)


def test_a_value_cut_short_by_a_hash_is_refused_with_line(tmp_path):
    """`(PR #208)` in an unquoted value makes the rest of the line a YAML comment: the recipe's description was
    silently `... (PR`. Refused with the line and the fix; quoted, or with a real `# comment`, it loads."""
    text = (REPO_ROOT / "launchers/recipes/cpu-ddp.yaml").read_text()
    desc = next(ln for ln in text.splitlines() if ln.startswith("description:"))
    path = tmp_path / "cpu-ddp.yaml"
    path.write_text(text.replace(desc, "description: DDP smoke (issue #12), two ranks"))
    with pytest.raises(RecipeError) as exc:
        load_recipe(path)
    line = path.read_text().splitlines().index("description: DDP smoke (issue #12), two ranks") + 1
    assert f"cpu-ddp.yaml:{line}: the value 'DDP smoke (issue' is cut short" in str(exc.value)
    assert "Quote the whole value" in str(exc.value)
    path.write_text(text.replace(desc, 'description: "DDP smoke (issue #12), two ranks"  # a comment'))
    assert load_recipe(path).description == "DDP smoke (issue #12), two ranks"


def test_duplicate_key_in_a_smoke_profile_is_refused(tmp_path):
    path = tmp_path / "profile.yaml"
    path.write_text("stacks: [cpu]\nkeep_going: true\nstacks: [cuda]\n")
    with pytest.raises(TrainboxError, match=r"profile.yaml:3:1: .*duplicate key 'stacks'"):
        load_profile(path)


def test_yaml_merge_keys_may_still_override(tmp_path):
    from trainbox.yamlfile import parse_yaml

    assert parse_yaml("a: &x {b: 1}\nc:\n  <<: *x\n  b: 2\n", "t") == {"a": {"b": 1}, "c": {"b": 2}}


# ---------------------------------------------------------------------------------------- 4. bounds

def test_nodes_are_bounded():
    with pytest.raises(RecipeError, match="--nodes 10000000: expected 1 to 1024"):
        load_recipe("twinkle-megatron-tp-8npu", nodes=10000000)
    assert load_recipe("swift-megatron-qwen35-8npu", nodes=1024).nodes == 1024


def test_recipe_nodes_and_devices_fields_are_bounded(tmp_path):
    base = (REPO_ROOT / "launchers/recipes/cpu-ddp.yaml").read_text()
    for old, new, words in [("devices_per_node: 2 ", "devices_per_node: 100000 ", "devices_per_node"),
                            ("launcher: torchrun\n", "launcher: torchrun\nnodes: 5000\n", "nodes")]:
        path = tmp_path / "cpu-ddp.yaml"
        path.write_text(base.replace(old, new))
        with pytest.raises(RecipeError, match=words):
            load_recipe(path)


def test_a_huge_stack_file_is_refused(tmp_path):
    path = stack_dir(tmp_path)
    with path.open("a") as fh:
        fh.write("# " + "x" * (2 << 20) + "\n")
    with pytest.raises(StackError, match="at most 1048576 bytes"):
        load_stack(path)


# ---------------------------------------------------------------------------------------- 5. one-line errors

def test_stack_path_that_is_a_directory_or_not_utf8(tmp_path, capsys):
    d = tmp_path / "dir.yaml"
    d.mkdir()
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b"name: bad\ndescription: \xff\n")
    assert cli(["stack", "validate", str(d)]) != 0
    assert cli(["stack", "validate", str(bad)]) != 0
    err = capsys.readouterr()
    text = err.out + err.err
    assert "is a directory, expected a stack file" in text and "bad.yaml:2: not UTF-8" in text
    assert "Traceback" not in text


@pytest.mark.slow
def test_render_out_is_all_or_nothing(tmp_path, capsys):
    out = tmp_path / "out"
    assert cli(["render", "--out", str(out)]) == 0
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    # one place in the set cannot be written (a file where a directory must be): nothing may change
    shutil.rmtree(out / "build/generated/npu-a3")
    (out / "build/generated/npu-a3").write_text("in the way\n")
    (out / "Dockerfile.cuda").write_text("old\n")
    before[out / "Dockerfile.cuda"] = b"old\n"
    capsys.readouterr()
    assert cli(["render", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "nothing was changed" in err and "Traceback" not in err
    after = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    before = {p: v for p, v in before.items() if "npu-a3" not in str(p)}
    assert {p: v for p, v in after.items() if "npu-a3" not in str(p)} == before
    assert not [p for p in out.rglob(".*") if p.is_file()]  # no staged or backup files left behind


def test_write_set_rolls_back_a_failed_move(tmp_path, monkeypatch):
    (tmp_path / "a").write_text("old a\n")
    (tmp_path / "b").write_text("old b\n")
    real = os.replace
    calls = []

    def flaky(src, dst):
        calls.append(dst)
        if str(dst).endswith("/b") and str(src).endswith(".trainbox-old") is False and len(calls) > 3:
            raise OSError(28, "No space left on device", str(dst))
        return real(src, dst)

    monkeypatch.setattr(os, "replace", flaky)
    with pytest.raises(TrainboxError, match="nothing was changed"):
        write_set({"a": b"new a\n", "b": b"new b\n"}, tmp_path)
    monkeypatch.setattr(os, "replace", real)
    assert (tmp_path / "a").read_text() == "old a\n" and (tmp_path / "b").read_text() == "old b\n"


def test_launch_render_into_a_missing_directory(tmp_path, capsys):
    assert cli(["launch", "render", "cpu-ddp", "-o", str(tmp_path / "missing" / "job.sh")]) == 2
    err = capsys.readouterr().err
    assert "cannot write the script there" in err and "Traceback" not in err


@pytest.mark.parametrize("name", ["a" * 5000, "./" + "a" * 5000 + ".yaml"])
def test_very_long_recipe_name(name, capsys):
    assert cli(["launch", "render", name]) == 2
    err = capsys.readouterr().err
    assert err.startswith("trainbox: error:") and "Traceback" not in err and len(err) < 2000


def _entrypoint(tmp_path, manifest: bytes, **env):
    path = tmp_path / "stack.json"
    path.write_bytes(manifest)
    e = dict(os.environ, PYTHONPATH=str(REPO_ROOT / "python"), TRAINBOX_MANIFEST=str(path),
             TRAINBOX_SET_ENV_SCRIPTS="", **env)
    e.pop("TRAINBOX_CHECK", None)
    e.update(env)
    return subprocess.run([*ENTRYPOINT, "sh", "-c", "echo started; echo BAR=${BAR-unset}"], capture_output=True,
                          text=True, env=e, timeout=60)


MANIFEST = {"schema": 1, "stack": "cpu", "device": "cpu", "components": {}, "base": {}}


def test_entrypoint_runs_the_command_with_a_bad_env_key(tmp_path):
    proc = _entrypoint(tmp_path, json.dumps(dict(MANIFEST, env={"BAR=1": "x", "GOOD": "1"})).encode())
    assert proc.returncode == 0, proc.stderr
    assert "started" in proc.stdout and "BAR=unset" in proc.stdout
    assert "'BAR=1'" in proc.stderr and "skipped" in proc.stderr and "Traceback" not in proc.stderr


def test_entrypoint_runs_the_command_with_a_non_utf8_manifest(tmp_path):
    proc = _entrypoint(tmp_path, b'{"schema": 1, "stack": "\xff"}')
    assert proc.returncode == 0, proc.stderr
    assert "started" in proc.stdout and "not UTF-8" in proc.stderr and "Traceback" not in proc.stderr


def test_entrypoint_strict_refuses_a_bad_manifest(tmp_path):
    proc = _entrypoint(tmp_path, json.dumps(dict(MANIFEST, env={"BAR=1": "x"})).encode(), TRAINBOX_CHECK="strict")
    assert proc.returncode == 78 and "started" not in proc.stdout
    assert "refusing to start" in proc.stderr


# ---------------------------------------------------------------------------------------- 7. sources

@pytest.mark.parametrize("field, value", [("url", "http://example.org/x.tar.gz"), ("url", "file:///tmp/x.tar.gz")])
def test_insecure_sources_are_flagged(tmp_path, field, value):
    doc = yaml.safe_load((STACKS_DIR / "cpu.yaml").read_text())
    doc["components"]["demo"] = {"source": "url", field: value, "sha256": ["0" * 64]}
    findings = [f for f in rule_check(load_stack(stack_dir(tmp_path, yaml.safe_dump(doc))))
                if f.rule == "secure-sources"]
    assert findings and findings[0].level == "warning" and "components.demo.url" in findings[0].message


def test_insecure_source_fails_strict_validation(tmp_path, capsys):
    doc = yaml.safe_load((STACKS_DIR / "cpu.yaml").read_text())
    doc["components"]["demo"] = {"source": "url", "url": "http://example.org/demo-1.0.tar.gz", "sha256": ["0" * 64]}
    path = stack_dir(tmp_path, yaml.safe_dump(doc))
    assert cli(["stack", "validate", str(path)]) == 0
    assert cli(["stack", "validate", "--strict", str(path)]) != 0
    assert "secure-sources" in capsys.readouterr().out


@pytest.mark.parametrize("url, words", [("ext::sh -c touch% {marker}", "transport 'ext' not allowed"),
                                        ("git://127.0.0.1:1/nothing.git", "transport 'git' not allowed")])
def test_fetcher_restricts_git_protocols(tmp_path, url, words, monkeypatch):
    monkeypatch.delenv("GIT_ALLOW_PROTOCOL", raising=False)
    marker = tmp_path / "PWNED"
    pin = Pin(key="demo", source="git", name="demo", git=url.format(marker=marker), commit="0" * 40)
    with pytest.raises(SourceError, match=words):
        fetch(pin, cache_dir=tmp_path / "cache")
    assert not marker.exists()


def test_git_url_is_never_an_option(tmp_path, monkeypatch):
    monkeypatch.delenv("GIT_ALLOW_PROTOCOL", raising=False)
    marker = tmp_path / "PWNED"
    pin = Pin(key="demo", source="git", name="demo", git=f"--upload-pack=touch {marker}", commit="0" * 40)
    with pytest.raises(SourceError):
        fetch(pin, cache_dir=tmp_path / "cache")
    assert not marker.exists()


@pytest.mark.slow
def test_render_check_flags_a_stale_generated_directory(tmp_path, capsys):
    outputs = render_all()
    write_set(outputs, tmp_path)
    assert drift(outputs, tmp_path) == []
    stale = tmp_path / "build/generated/removed-stack"
    stale.mkdir()
    (stale / "Dockerfile").write_text("FROM scratch\n")
    assert drift(outputs, tmp_path) == ["build/generated/removed-stack/: stale, no stack produces it (its stack was "
                                        "removed); delete it"]
    assert cli(["render", "--check", "--out", str(tmp_path)]) == 1
    assert cli(["render", "--out", str(tmp_path)]) == 0  # rendering removes it
    assert not stale.exists() and cli(["render", "--check", "--out", str(tmp_path)]) == 0


@pytest.mark.parametrize("parent", ["../../../etc/passwd", "/etc/hostname", "sub/dir"])
def test_extends_stays_in_the_stacks_directory(tmp_path, parent):
    text = (STACKS_DIR / "cpu.yaml").read_text().replace("name: cpu\n", f"name: cpu\nextends: {parent}\n")
    with pytest.raises(StackError, match="extends: expected the name of a stack"):
        load_stack(stack_dir(tmp_path, text))


@pytest.mark.parametrize("registry", ["127.0.0.1:5000/" + "/".join(["a" * 60] * 110),  # ~6.7 KB: a traceback
                                      "registry.example.com/" + "b" * 240])
def test_an_image_name_past_the_registry_limit_is_one_line(registry, capsys, monkeypatch):
    """Issue 37: a registry path that makes REG/trainbox/STACK longer than the 255 characters a reference may have
    went to the engine's tag call, outside any try, and came back as an HTTP 500 traceback. Refused before the
    engine is asked, one line, exit 2 (invalid input), no tag made."""
    from trainbox.image import push as pushmod

    monkeypatch.setattr(pushmod, "sdk", lambda: pytest.fail("an over-long name reached the engine"))
    assert cli(["image", "push", "cpu", "--registry", registry]) == 2
    out, err = capsys.readouterr()
    assert not out and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "REG/trainbox/cpu would be" in err and "an image name takes at most 255" in err and len(err) < 400, err
    assert pushmod.check_registry("registry.example.com/" + "b" * 200)  # the path alone is no problem
