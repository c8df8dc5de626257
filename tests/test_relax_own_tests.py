"""Relax's own tests at the commit the relax image holds (tests/data/relax-cpu-tests.yaml: the files under its tests/
that need no accelerator, with the commit they were picked at) pass inside the relax image under TRAINBOX_DEVICE=cpu,
no network: the image's Relax, with its pins, works as Relax's authors test it, as far as a CPU can show."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from test_cpu_mode_docker import _image
from test_relax_imports import RELAX_REPOS
from docker_helpers import run_in_image
from trainbox.specs.stack import load_stack
from upstream_helpers import find_shared_upstream

DATA = yaml.safe_load((Path(__file__).parent / "data" / "relax-cpu-tests.yaml").read_text())

pytestmark = [pytest.mark.docker, pytest.mark.slow,
              pytest.mark.skipif(find_shared_upstream() is None, reason="../shared/upstream is missing")]


def test_the_list_is_of_the_commit_the_image_holds():
    assert DATA["commit"] == load_stack("relax").components["relax"].commit
    assert DATA["tests"] and not set(DATA["tests"]) & set(DATA["left_out"])


@pytest.fixture(scope="module")
def relax_img(tmp_path_factory):
    yield from _image("relax", RELAX_REPOS, tmp_path_factory)


def test_relax_s_cpu_tests_pass_in_the_image(relax_img):
    # a copy of the image's tree: Relax's tests write beside themselves; the image's own stays as built
    script = "cp -r /opt/src/relax /tmp/relax && cd /tmp/relax && exec python -m pytest -q -p no:cacheprovider " + \
        " ".join(DATA["tests"])
    proc = run_in_image(relax_img, "-c", script, entrypoint="bash", env={"TRAINBOX_DEVICE": "cpu"}, timeout=1500)
    tail = proc.stdout[-4000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, tail
    assert " passed" in proc.stdout.strip().splitlines()[-1] and "failed" not in proc.stdout.strip().splitlines()[-1]
