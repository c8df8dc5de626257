"""The dependency pass of a stack without a dependency lock, built for real.

The NPU stacks have no lock for their pins' dependencies, so their builds resolve those with a second
`pip install`, constrained to the hash-checked pins. Their bases cannot be had here, so the pass runs on the cpu
stack with its lock left out (tmp stack `cpu-unlocked`): the pins come from the stack file, torch's dependencies
from PyPI during the build. A pin that a dependency wants moved must fail the build, not be replaced.

No --no-cache: on the base the cpu image uses, a --no-cache build points BuildKit's cache index at its own results
and the other docker tests' builds then missed their cached steps (see docker_helpers.cold_base), and it is not
needed: a step that fails is never cached, so the refused pass runs every time, and the resolving pass is the
same step over the same requirement files as any earlier build it is taken from (a template edit reruns it)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import yaml

import docker_helpers as dh
from trainbox.paths import STACKS_DIR

pytestmark = [pytest.mark.docker, pytest.mark.network]


def _unlocked_stack(tmp_path: Path, extra: dict | None = None) -> Path:
    """cpu with every pin's hash in the stack file and no lock beside it: the build resolves the rest."""
    lock = yaml.safe_load((STACKS_DIR / "cpu.lock").read_text())
    numpy = lock["platforms"]["linux/amd64"]["components"]["numpy"]
    data = {"name": "cpu-unlocked", "extends": "cpu", "description": "cpu without a dependency lock (a test stack)",
            "components": {"numpy": {"source": "pypi", "version": numpy["version"], "sha256": numpy["sha256"]},
                           **(extra or {})}}
    path = tmp_path / "cpu-unlocked.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _build(tmp_path: Path, stack: Path):
    from trainbox.image import build as image_build

    dh.ensure_base()
    return image_build.build(dh.build_options(
        stack=str(stack), wheelhouse=str(dh.wheelhouse_dir()), tag_latest=False, force=True,
        labels={"trainbox.test": "1"}, report=str(tmp_path / f"report-{uuid.uuid4().hex[:6]}.json")))


def test_unlocked_stack_resolves_its_dependencies_within_the_pins(tmp_path):
    from trainbox.image.render import render_stack
    from trainbox.specs.stack import load_stack

    from trainbox.supply.index import project_files

    # one pin the parent's lock does not hold (six): a stack that adds a pin cannot use cpu.lock for its
    # dependencies (as a derived stack that changes nothing would), so they are resolved in the build
    wheel = next(f for f in project_files("pypi", "https://pypi.org/simple", "six")
                 if f["filename"] == "six-1.17.0-py2.py3-none-any.whl")
    stack = _unlocked_stack(tmp_path, {"six": {"source": "pypi", "version": "1.17.0",
                                               "sha256": [wheel["hashes"]["sha256"]]}})
    rendered = render_stack(load_stack(str(stack)))
    assert not rendered.manifest["deps_locked"] and "-c /tmp/trainbox-pins.txt" in rendered.dockerfile
    out = _build(tmp_path, stack)
    try:
        pip_step = next(s for s in out.report["steps"] if dh.PINS_STEP in s["name"])
        assert pip_step["status"] in ("done", "cached"), pip_step  # cached: an identical earlier build's pass
        proc = dh.run_in_image(out.tag, "python", "-c",
                               "import importlib.metadata as m, os, torch, numpy, sympy; "
                               "print(m.version('torch'), m.version('numpy'), m.version('typing-extensions'), "
                               "os.path.exists('/tmp/trainbox-pins.txt'))", timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        torch_v, numpy_v, te_v, leftover = proc.stdout.split()
        assert (torch_v, numpy_v) == ("2.13.0+cpu", "2.3.5")  # the pins, as hash-checked
        assert tuple(int(x) for x in te_v.split(".")[:2]) >= (4, 10)  # torch's own floor, resolved in the build
        assert leftover == "False"  # the constraints file does not stay in the image
        # the torch pin is the cpu stack's: its layer is the cpu image's, shared (built once, stored once)
        mine, cpu = dh.history_layers(out.tag), dh.history_layers(dh.build_cpu_image())
        at = next(i for i, (text, *_rest) in enumerate(mine) if dh.TORCH_STEP in text)
        assert [d for _t, _c, d, _s in mine[:at + 1]] == [d for _t, _c, d, _s in cpu[:at + 1]]
    finally:
        dh.docker_client().remove_image(out.tag, force=True)


def test_a_dependency_that_would_move_a_pin_fails_the_build(tmp_path):
    """typing-extensions pinned below torch 2.13's floor (>=4.10): unconstrained, the dependency pass would
    upgrade it and `pip check` would find nothing wrong; constrained, the build fails and names it."""
    from trainbox.image.run import BuildFailed
    from trainbox.supply.index import project_files

    wheel = next(f for f in project_files("pypi", "https://pypi.org/simple", "typing-extensions")
                 if f["filename"] == "typing_extensions-4.9.0-py3-none-any.whl")
    stack = _unlocked_stack(tmp_path, {"typing-extensions": {
        "source": "pypi", "version": "4.9.0", "sha256": [wheel["hashes"]["sha256"]]}})
    with pytest.raises(BuildFailed) as exc:
        _build(tmp_path, stack)
    msg = str(exc.value)
    assert "typing-extensions" in msg.replace("_", "-").lower() and "conflict" in msg.lower(), msg[-3000:]
    assert "(constraint)" in msg  # pip's resolver, held by the pins file, refused it (not the hash-checked install)
