"""trainbox.runtime.argcheck: a command line checked by the framework's own parser, on the real upstream code.

SpecForge's scripts/train_domino.py at 61f9cb01 (PR #584, Domino on Ascend) from ../shared/upstream; its heavy
imports (sglang, transformers, accelerate ...) are not installed here and get stand-ins, the parser is its own.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from upstream_helpers import checkout, find_shared_upstream

pytestmark = pytest.mark.skipif(find_shared_upstream() is None, reason="../shared/upstream is missing")

# examples/run_qwen3.5_4b_domino_npu.sh at 61f9cb01: the flags of the seed
SEED_FLAGS = [
    "--target-model-path", "/models/Qwen3.5-4B", "--draft-config-path", "configs/qwen3.5-4b-domino.json",
    "--train-data-path", "/data/train.jsonl", "--output-dir", "/out", "--num-epochs", "10", "--batch-size", "1",
    "--accumulation-steps", "4", "--learning-rate", "6e-4", "--warmup-ratio", "0.04", "--max-grad-norm", "1.0",
    "--max-length", "1024", "--chat-template", "qwen3.5", "--attention-backend", "sdpa", "--num-anchors", "16",
    "--loss-decay-gamma", "7.0", "--log-interval", "50", "--save-interval", "3000", "--report-to", "tensorboard",
    "--target-model-backend", "hf", "--block-size", "16",
    "--embedding-key", "model.language_model.embed_tokens.weight", "--trust-remote-code",
]


@pytest.fixture(scope="module")
def specforge(tmp_path_factory):
    return checkout("SpecForge", tmp_path_factory.mktemp("up"))


def argcheck(tree, args, *own):
    proc = subprocess.run([sys.executable, "-m", "trainbox.runtime.argcheck", "--json", "--stub-missing",
                           "--stub", "torch_npu", "--path", str(tree), *own,
                           "--script", str(tree / "scripts" / "train_domino.py"), "--", *args],
                          capture_output=True, text=True, timeout=300, cwd=tree)
    return proc.returncode, json.loads(proc.stdout)


@pytest.mark.slow
def test_the_seed_command_parses_with_specforges_own_parser(specforge):
    rc, out = argcheck(specforge, SEED_FLAGS)
    assert rc == 0 and out["ok"], out
    assert out["schema"] == 1 and out["parser"] == "train_domino.py"
    assert out["namespace"]["num_anchors"] == "16" and out["namespace"]["loss_decay_gamma"] == "7.0"
    assert "sglang" in out["stubbed"] and "torch_npu" not in out["stubbed"]  # named, never hidden


@pytest.mark.slow
def test_a_bogus_flag_fails_naming_it(specforge):
    rc, out = argcheck(specforge, SEED_FLAGS + ["--bogus-flag", "1"])
    assert rc == 1 and not out["ok"]
    assert out["error"] == "unrecognized arguments: --bogus-flag 1"


@pytest.mark.slow
def test_the_flag_trainbox_recipes_used_to_pass_is_not_specforges(specforge):
    """The recipe said --draft-model-config; SpecForge's parser knows --draft-config-path."""
    flags = [f if f != "--draft-config-path" else "--draft-model-config" for f in SEED_FLAGS]
    rc, out = argcheck(specforge, flags)
    assert rc == 1 and "--draft-model-config" in out["error"]


def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return p


def run(script, *args, stub=(), strict=False):
    own = [a for s in stub for a in ("--stub", s)] + (["--strict"] if strict else [])
    return subprocess.run([sys.executable, "-m", "trainbox.runtime.argcheck", *own, "--script", str(script),
                           "--", *args], capture_output=True, text=True, timeout=60)


def test_subcommands_and_known_args_parsers(tmp_path):
    s = write(tmp_path, "cli.py", "import argparse, sys\n"
              "p = argparse.ArgumentParser(prog='cli'); sub = p.add_subparsers(dest='cmd')\n"
              "t = sub.add_parser('train'); t.add_argument('--lr', type=float)\n"
              "p.parse_args(); raise SystemExit('training started: the check did not stop the program')\n")
    assert run(s, "train", "--lr", "0.1").returncode == 0
    bad = run(s, "train", "--lr", "x")
    assert bad.returncode == 1 and "invalid float value: 'x'" in bad.stderr
    k = write(tmp_path, "known.py", "import argparse\np = argparse.ArgumentParser()\np.add_argument('--a')\n"
              "args, rest = p.parse_known_args()\n")
    assert run(k, "--a", "1", "--passthrough").returncode == 0  # parse_known_args accepts leftovers by design
    # --strict: for a framework that rejects the leftovers itself after the parse (ms-swift's remaining_argv)
    strict = run(k, "--a", "1", "--passthrough", strict=True)
    assert strict.returncode == 1 and "unrecognized arguments: --passthrough" in strict.stderr
    assert run(k, "--a", "1", strict=True).returncode == 0


def test_a_module_that_cannot_load_is_stood_in_only_when_asked(tmp_path):
    # acl: CANN's pyACL, on the device-only list and not installed here
    s = write(tmp_path, "npu.py", "import acl as t\nimport argparse\n"
              "from packaging.version import Version\nassert Version(t.__version__) < Version('0.0.1')\n"
              "@t.jit\ndef f(): pass\nclass M(t.nn.Module): pass\n"
              "argparse.ArgumentParser().parse_args()\n")
    assert run(s).returncode == 1 and "No module named" in run(s).stderr
    assert run(s, stub=["acl"]).returncode == 0


def test_only_device_only_modules_can_be_stood_in(tmp_path):
    s = write(tmp_path, "uses_sglang.py", "import sglang\nimport argparse\nargparse.ArgumentParser().parse_args()\n")
    proc = run(s, stub=["sglang"])
    assert proc.returncode == 2
    assert "--stub sglang: not a device-only module" in proc.stderr and "torch_npu" in proc.stderr


def test_a_program_that_never_parses_is_reported(tmp_path):
    s = write(tmp_path, "noparse.py", "print('hello')\n")
    proc = run(s)
    assert proc.returncode == 1 and "ended without parsing" in proc.stderr


def imports(tmp_path, *own):
    proc = subprocess.run([sys.executable, "-m", "trainbox.runtime.argcheck", "--json", "--imports", *own],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    return proc.returncode, json.loads(proc.stdout)


def test_imports_mode_follows_the_closure_and_runs_nothing(tmp_path):
    """--imports: a module missing two packages deep fails, naming the module, the importing file and line, and
    the chain from the entry; optional (try/except ImportError) imports are listed, not failed; device-only
    modules are not required; nothing of the entry or its packages runs."""
    pkg = tmp_path / "fw"
    (pkg / "data").mkdir(parents=True)
    (pkg / "__init__.py").write_text("open('RAN_INIT', 'w').write('ran')\nfrom .data import loader\n")
    (pkg / "data" / "__init__.py").write_text("")
    (pkg / "data" / "loader.py").write_text("import json\ntry:\n    import not_installed_optional\n"
                                            "except ImportError:\n    pass\n\n\nimport addict\n")
    entry = write(tmp_path, "entry.py", "import torch_npu\nimport fw\nopen('RAN', 'w').write('ran')\n")
    rc, out = imports(tmp_path, "--script", str(entry))
    assert rc == 1 and not (tmp_path / "RAN").exists() and not (tmp_path / "RAN_INIT").exists()
    assert [m["module"] for m in out["missing"]] == ["addict"]
    miss = out["missing"][0]
    assert miss["imported_by"] == [f"{pkg / 'data' / 'loader.py'}:8"] and miss["distribution"] == "addict"
    assert miss["chain"] == ["__main__", "fw", "fw.data.loader"]
    assert [m["module"] for m in out["optional_missing"]] == ["not_installed_optional"]
    assert out["device_only"] == ["torch_npu"] and out["modules"] == 4  # __main__, fw, fw.data, fw.data.loader
    assert "first addict (distribution: addict), imported by" in out["error"]
    (pkg / "data" / "loader.py").write_text("import json\n")
    rc, out = imports(tmp_path, "--script", str(entry))
    assert rc == 0 and out["ok"] and out["missing"] == []
    proc = subprocess.run([sys.executable, "-m", "trainbox.runtime.argcheck", "--imports", "--module", "fw"],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 0 and "module(s) of its import closure resolve" in proc.stdout, proc.stderr
