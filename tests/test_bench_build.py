"""bench/build.py's workload figure: which pins and base it builds the workload stack with, and its verdict.
(The benchmark itself takes many minutes and an engine: `make bench-build`, not a test.)"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from trainbox.runtime.errors import TrainboxError
from trainbox.smoke.profile import load_profile
from trainbox.specs.stack import load_stack

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import build as bench  # noqa: E402

PROFILE = str(Path(__file__).resolve().parents[1] / "ci" / "smoke-offline.yaml")


@pytest.mark.parametrize("stack", ["twinkle", "swift"])
def test_workload_is_built_as_smoke_builds_it(stack):
    sets, base = bench.workload_inputs(PROFILE, stack)
    assert sets == load_profile(PROFILE)["set"][stack] and sets["torch.version"] == "2.13.0+cpu"
    assert base == load_stack(stack, sets=sets).base.substitute
    assert base != load_stack(stack, sets=sets).base.image  # not the NPU base this machine cannot have


def test_a_stack_the_profile_does_not_pin_is_refused(tmp_path):
    profile = tmp_path / "p.yaml"
    profile.write_text("stacks: [twinkle]\nset: {}\n")
    with pytest.raises(TrainboxError, match=r"no set.twinkle entry"):
        bench.workload_inputs(str(profile), "twinkle")


def test_verdict_against_the_goal():
    assert bench.verdict(130.0, 100.0, 1.3) == "1.30 x (goal <= 1.30 x: within)"
    assert bench.verdict(131.0, 100.0, 1.3) == "1.31 x (goal <= 1.30 x: OVER)"
    assert bench.WORKLOAD_GOAL == 1.3


@pytest.mark.network  # the plan probes the stack's indexes and hashes torch-npu from PyPI
def test_the_workload_limit_installs_the_pins_the_build_gets():
    """The limit installs the requirement files of the build's own plan: the profile's moved pins (torch
    2.13.0+cpu, which no lock holds) hashed from the wheelhouse as the build hashes them, not the stack's NPU pins."""
    from docker_helpers import wheelhouse_dir

    from trainbox.image import build as image_build

    sets, base = bench.workload_inputs(PROFILE, "npu-910b")
    opts = image_build.BuildOptions(stack="npu-910b", base=base, sets=sets, wheelhouse=str(wheelhouse_dir()), dry_run=True)
    req, _deps = bench.limit_requirements("npu-910b", sets, image_build.plan(opts, None))
    torch = [ln for ln in req.decode().splitlines() if ln.startswith("torch==")]
    assert len(torch) == 1 and torch[0].startswith("torch==2.13.0+cpu --hash=sha256:"), torch
    # without the plan, the stack's own files cannot give the moved pin a hash: the build's plan is needed
    with pytest.raises(TrainboxError, match="no sha256"):
        bench.limit_requirements("npu-910b", sets)
