"""The SpecForge recipes' commands, as trainbox renders them, parse with SpecForge's own parser at the pinned
commit (61f9cb01, ../shared/upstream), through trainbox.runtime.argcheck: a misspelt or removed flag fails here."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from test_argcheck import SEED_FLAGS, argcheck
from upstream_helpers import checkout, find_shared_upstream

pytestmark = pytest.mark.skipif(find_shared_upstream() is None, reason="../shared/upstream is missing")
RECIPES = ["specforge-domino-qwen35-4b-npu", "specforge-domino-qwen35-4b-gpu"]


@pytest.fixture(scope="module")
def specforge(tmp_path_factory):
    return checkout("SpecForge", tmp_path_factory.mktemp("up"))


def rendered_args(recipe: str) -> tuple[str, list[str]]:
    """The recipe's entry script and its arguments, inputs at their defaults or stand-in paths."""
    shown = json.loads(subprocess.run([sys.executable, "-m", "trainbox.cli", "launch", "show", recipe, "--json"],
                                      capture_output=True, text=True, check=True).stdout)
    values = {k: str(v) for k, v in shown["layout"].items()}
    for name, spec in shown["inputs"].items():
        values[name] = str(spec.get("default") if spec.get("default") is not None else f"/stand-in/{name.lower()}")
    words = [re.sub(r"\$\{(\w+)\}", lambda m: values[m.group(1)], w) for w in shown["command"]]
    return words[0], words[1:]


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.slow
def test_recipe_command_parses_with_specforges_parser(specforge, recipe):
    script, args = rendered_args(recipe)
    assert script == "scripts/train_domino.py"
    rc, out = argcheck(specforge, args)
    assert rc == 0 and out["ok"], f"{recipe}: {out['error']}"


def test_npu_recipe_carries_the_seed_flags():
    """Every flag of examples/run_qwen3.5_4b_domino_npu.sh, with the seed's values where they are fixed."""
    _, args = rendered_args("specforge-domino-qwen35-4b-npu")
    seed = dict(zip(SEED_FLAGS[::2], SEED_FLAGS[1::2]))
    ours = " ".join(args)
    assert SEED_FLAGS[-1] == "--trust-remote-code" and "--trust-remote-code" in args
    for flag, value in seed.items():
        if flag in ("--trust-remote-code",) or value.startswith("/"):
            assert flag in args, flag
            continue
        if flag in ("--output-dir",):
            continue
        assert f"{flag} {value}" in ours, f"{flag} {value}"
