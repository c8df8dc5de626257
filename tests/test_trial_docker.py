"""`trainbox trial` for real, in the cpu image: cpu-ddp's own job under its overlay passes with a loss and a time for
every optimizer step of rank 0; the same job with its real path broken (one line of the training loop changed in a
copy of the job, mounted as the recipe's code) stops at exactly that file and line, naming the exception and what it
means; the container is gone afterwards (--rm). The seed recipes' trials run in their own images in the smoke (ci/
smoke-offline.yaml, `trial:`)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from trainbox.paths import REPO_ROOT

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def trial(*args: str, cache, timeout: int = 600) -> tuple[subprocess.CompletedProcess, dict]:
    proc = subprocess.run([sys.executable, "-m", "trainbox.cli", "trial", *args, "--json"], capture_output=True,
                          text=True, timeout=timeout, env={**__import__("os").environ, "TRAINBOX_CACHE": str(cache)})
    try:
        doc = json.loads(proc.stdout)
    except ValueError:
        pytest.fail(f"no JSON (exit {proc.returncode}): {proc.stdout[-2000:]} {proc.stderr[-3000:]}")
    return proc, doc


def leftovers() -> list[str]:
    out = subprocess.run(["docker", "ps", "-aq", "--filter", "label=trainbox.trial=1", "--filter",
                          "label=trainbox.recipe=cpu-ddp"], capture_output=True, text=True)
    return out.stdout.split()


def test_cpu_ddp_trial_passes_with_a_loss_and_a_time_per_step(cpu_image, tmp_path):
    proc, doc = trial("cpu-ddp", "--image", cpu_image, cache=tmp_path / "cache")
    assert proc.returncode == 0 and doc["ok"], (doc.get("line"), proc.stderr[-3000:])
    assert doc["schema"] == "trainbox.trial/1" and doc["mode"] == "cpu" and doc["ranks"] == 2
    assert doc["line"].startswith("passed 10 steps (loss ") and doc["line"].endswith(", finite)")
    steps = doc["steps"]
    assert [s["step"] for s in steps] == list(range(1, 11))
    assert all(s["finite"] and s["loss"] > 0 and s["seconds"] >= 0 for s in steps)
    assert "[trainbox trial] step 10 loss" in proc.stderr
    # the job's own output (its loss-must-fall check ran and wrote metrics on rank 0)
    metrics = json.loads(open(f"{doc['run_dir']}/out/metrics.json").read())
    assert metrics["ok"] is True and len(metrics["losses"]) == 10
    assert leftovers() == []


BROKEN = """extends: cpu-ddp
inputs:
  JOBS: {description: a copy of launchers/jobs, kind: path, mount: ro}
command:
  - ${JOBS}/cpu_ddp.py --steps ${STEPS} --output-dir ${OUTPUT_DIR}
trial:
  why: the cpu-ddp overlay with the job taken from JOBS
  ranks: 2
  steps: 10
  timeout: 300
  set: {STEPS: "10", OUTPUT_DIR: "@run/out", JOBS: "%s"}
"""


def test_a_broken_training_loop_stops_the_trial_at_its_line(cpu_image, tmp_path):
    """The real path broken on purpose: the job's data no longer has the shape its model takes (one line of the
    loop), so the first batch fails; the trial names that file and line, not torch's."""
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    text = (REPO_ROOT / "launchers" / "jobs" / "cpu_ddp.py").read_text()
    good = "        y = x @ true_w + 0.01 * torch.randn(args.batch, 1, generator=gen)\n"
    assert text.count(good) == 1
    (jobs / "cpu_ddp.py").write_text(text.replace(good, good.replace("x @ true_w", "x @ true_w.T")))
    line = text[:text.index(good)].count("\n") + 1
    recipe = tmp_path / "cpu-ddp-broken.yaml"
    recipe.write_text(BROKEN % jobs)
    proc, doc = trial(str(recipe), "--image", cpu_image, cache=tmp_path / "cache")
    assert proc.returncode == 1 and doc["result"] == "stopped", doc["line"]
    where = doc["stopped_at"]
    assert (where["file"], where["line"]) == (str(jobs / "cpu_ddp.py"), line), doc["line"]
    assert doc["line"].startswith(f"stopped at {jobs / 'cpu_ddp.py'}:{line}: RuntimeError: "), doc["line"]
    assert doc["steps"] == []
    assert leftovers() == []
