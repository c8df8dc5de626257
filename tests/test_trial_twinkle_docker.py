"""`trainbox trial` of Twinkle's FSDP + Ulysses recipe (PR #208's sp_fsdp_dense.py at f3c953de) in the twinkle-a3
image as the smoke builds it (substitute base, CPU torch): 2 CPU ranks on Gloo take 2 optimizer steps with a finite
loss and the LoRA checkpoint the script saves loads again. Its real path broken two ways stops the trial at the
right frame, naming it: the image's Twinkle without patches/twinkle-f3c953de (no CPU platform: the process group is
bound to cuda:0 at model/base.py's init_process_group), and the data without the field Twinkle's preprocessor reads
(`response`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from docker_helpers import commit_edited, docker_client
from test_cpu_mode_docker import _image
from trainbox.paths import REPO_ROOT
from upstream_helpers import find_shared_upstream

pytestmark = [pytest.mark.docker, pytest.mark.slow,
              pytest.mark.skipif(find_shared_upstream() is None, reason="../shared/upstream is missing")]

RECIPE = "twinkle-fsdp-ulysses-qwen35-4b-4a3"
TWINKLE_SP = "f3c953de2073fc1713f1ba917f73449d636e5a36"
TREE = "/opt/src/twinkle"
PLATFORMS = "src/twinkle/utils/platforms"


@pytest.fixture(scope="module")
def twinkle_a3_img(tmp_path_factory):
    yield from _image("twinkle-a3", ("twinkle", "MindSpeed", "Megatron-LM"), tmp_path_factory)


def trial(*args: str, cache: Path, timeout: int = 900) -> tuple[subprocess.CompletedProcess, dict]:
    proc = subprocess.run([sys.executable, "-m", "trainbox.cli", "trial", *args, "--json"], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, "TRAINBOX_CACHE": str(cache)})
    try:
        doc = json.loads(proc.stdout)
    except ValueError:
        pytest.fail(f"no JSON (exit {proc.returncode}): {proc.stdout[-2000:]} {proc.stderr[-3000:]}")
    return proc, doc


def pristine(path: str) -> str:
    """A file of Twinkle's tree at f3c953de as upstream has it (no trainbox patch)."""
    git = ["git", "--git-dir", str(find_shared_upstream() / "twinkle.git"), "show", f"{TWINKLE_SP}:{path}"]
    return subprocess.run(git, check=True, capture_output=True, text=True, timeout=60).stdout


def test_the_trial_takes_two_steps_on_two_cpu_ranks_and_its_checkpoint_loads(twinkle_a3_img, tmp_path):
    proc, doc = trial(RECIPE, "--image", twinkle_a3_img, cache=tmp_path / "cache")
    assert proc.returncode == 0 and doc["ok"], (doc.get("line"), proc.stderr[-3000:])
    assert doc["mode"] == "cpu" and doc["ranks"] == 2
    assert [s["step"] for s in doc["steps"]] == [1, 2] and all(s["finite"] and s["loss"] > 0 for s in doc["steps"])
    assert doc["line"].startswith("passed 2 steps (loss ") and doc["line"].endswith(", finite)")
    [check] = doc["verify"]
    assert check["ok"] and "lora_B trained" in check["message"], check
    ckpt = Path(doc["run_dir"]) / "code" / "cookbook" / "transformers" / "output" / "last-checkpoint"
    assert (ckpt / "adapter_model.safetensors").is_file()
    # the script's own mesh, re-cut for 2 ranks by the overlay (not a mesh of trainbox's)
    assert any(e.endswith("nproc_per_node=2,") for e in doc["code_edits"]), doc["code_edits"]
    log = Path(doc["log"]).read_text()
    assert "falling back to torch implementations for Qwen3.5 linear attention sequence parallel" in log


def _image_without_the_series(tag: str, tmp_path: Path) -> str:
    """`tag` with its Twinkle tree's platforms as upstream has them (the series dropped), a throwaway image."""
    src = tmp_path / "pristine"
    src.mkdir()
    for name in ("base.py", "__init__.py"):
        (src / name).write_text(pristine(f"{PLATFORMS}/{name}"))
    script = (f"set -e; d={TREE}/{PLATFORMS}; test -f $d/cpu.py; cp /pristine/base.py /pristine/__init__.py $d/; "
              "rm $d/cpu.py")
    return commit_edited(tag, f"trainbox-test/twinkle-a3-unpatched:{uuid.uuid4().hex[:12]}", script,
                         mounts=(f"type=bind,source={src},target=/pristine,readonly",))


def test_without_the_patch_series_the_trial_stops_at_the_cuda_bound_process_group(twinkle_a3_img, tmp_path):
    base = pristine("src/twinkle/model/base.py")
    line = base[:base.index("dist.init_process_group(**init_kwargs)")].count("\n") + 1
    image = _image_without_the_series(twinkle_a3_img, tmp_path)
    try:
        proc, doc = trial(RECIPE, "--image", image, cache=tmp_path / "cache")
    finally:
        subprocess.run([docker_client().docker, "rmi", "-f", image], capture_output=True)
    assert proc.returncode == 1 and doc["result"] == "stopped", doc["line"]
    where = doc["stopped_at"]
    assert where["file"].endswith("/code/src/twinkle/model/base.py") and where["line"] == line, doc["line"]
    assert f"src/twinkle/model/base.py:{line}: ValueError: device_id cuda:0" in doc["line"], doc["line"]
    assert doc["steps"] == []


def test_data_without_the_response_field_stops_in_twinkle_s_preprocessor(twinkle_a3_img, tmp_path):
    text = (REPO_ROOT / "launchers" / "recipes" / f"{RECIPE}.yaml").read_text()
    good = "    data: {format: query-response-jsonl, samples: 16, words: 32}\n"
    assert text.count(good) == 1
    recipe = tmp_path / "twinkle-sp-no-response.yaml"
    recipe.write_text(text.replace(good, good.replace("words: 32}", "words: 32, drop_fields: [response]}")))
    proc, doc = trial(str(recipe), "--image", twinkle_a3_img, cache=tmp_path / "cache")
    assert proc.returncode == 1 and doc["result"] == "stopped", doc["line"]
    where = doc["stopped_at"]
    assert where["file"].endswith("/code/src/twinkle/preprocessor/llm.py") and where["type"] == "KeyError", doc["line"]
    assert "KeyError: 'response'" in doc["line"] and doc["steps"] == [], doc["line"]
