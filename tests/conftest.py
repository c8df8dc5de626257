"""Shared fixtures. Docker tests need an engine: `make test` starts one (ci/ensure-docker.sh).

Without an engine, tests marked `docker` are skipped with the reason, except under CI (CI=true), where a
missing engine is a failure: CI must prove the real builds every time.
"""

from __future__ import annotations

import os
import signal
import sys
import warnings
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tests/docker_helpers.py, tests/engine_guard.py
# Test this checkout's package, also in subprocesses, whichever checkout the editable install points at
# (git worktrees share one interpreter).
_PKG = str(Path(__file__).resolve().parents[1] / "python")
sys.path.insert(0, _PKG)
# The suite models a CPU host whatever the machine: GPUs are hidden from torch (here and in subprocesses), so a
# test's device, backend and rank layout do not depend on where it runs. tests/gpu/check_cuda.py covers CUDA.
os.environ["CUDA_VISIBLE_DEVICES"] = ""
os.environ["PYTHONPATH"] = os.pathsep.join([_PKG] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
# torchrun's agent makes /tmp/torchelastic_XXXX for its workers' logs on every run, and never removes it (hundreds
# piled up on a host that ran the suite): the tests redirect no worker's output, so torchrun gets no log dir at all
# (PET_LOG_DIR is --log-dir's variable; os.devnull is torch's own "none").
os.environ.setdefault("PET_LOG_DIR", os.devnull)

import engine_guard  # noqa: E402  (found through the path above)

# The suite runs as from a terminal, where Ctrl-C stops a command: a run started in the background of a
# non-interactive shell (`make test &` in a script) inherits SIGINT ignored, every child process inherits that
# too, and the tests that send a child SIGINT then saw it ignored (three failed so). A handled signal is reset to
# its default in a child at exec, so handling it here gives every child the disposition a terminal's has.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


# `make test` runs everything in one pytest-xdist run (--dist loadgroup). The docker tests that use the cpu image,
# push it (a push untags it for a while) or start the Slurm cluster stay in one serial queue, "engine", so that no
# two of them share the engine at once; it is also where a new docker module goes. The modules below build, use and
# remove only images of their own (unique tags, their own kept bases, no prune beyond their own stacks): each is a
# queue of its own, beside "engine" and beside each other. The slow and PyPI tests also keep to one worker per
# module, so that a module's costly fixture (a megatron-core install, a bundle, an arm64 build) is made once. The
# rest fill the workers as they free up.
OWN_IMAGE_MODULES = {"test_arm64_docker", "test_cann_bake_docker", "test_cli_docker", "test_cpu_mode_docker",
                     "test_deps_pass_docker", "test_patches_docker", "test_recipe_args_megatron",
                     "test_repro_docker", "test_sources_docker", "test_supply_bundle", "test_supply_unpack",
                     "test_trial_twinkle_docker"}
# Modules that use one workload image and nothing of the engine queue's (not the cpu image, not the registry): one
# queue per image, beside "engine". One queue, not one each: where no smoke built the image, the first of them
# builds it and removes it again when it is done, which must not happen under another's feet.
IMAGE_QUEUES = {"test_relax_imports": "relax-image", "test_relax_image": "relax-image",
                "test_relax_own_tests": "relax-image", "test_swift_npu_fixes": "test_recipe_args_megatron"}
# A docker test in a module of the engine queue that uses only images it makes and removes itself (marker
# `own_images`) waits in its module's own queue instead.
# Fast modules whose module-scoped fixture costs seconds of CPU (every recipe's scripts through shellcheck, the
# NPU scenarios' child processes): one worker each, so that the fixture is made once and not on every worker
# (`make test-fast` passes --dist loadgroup too).
ONE_WORKER_MODULES = {"test_recipes", "test_runtime_npu"}

# The longest queues go out first (`make test` passes --no-loadscope-reorder, so xdist hands out the groups in the
# order of the collection): one that starts late becomes the run's tail, with one core idle. Longest first, as
# measured in a cold `.ci/run` (2026-11-28, seconds of each queue's tests on 4 workers and 2 cores): engine 1965
# (about 400 of it the relax, twinkle-a3, swift and SBOM-document tests, which have left it), arm64 1024, relax
# image 350, teardown 304, cann bake 323 (120 now), megatron patches 118, deps pass 111, cpu mode 92, trial twinkle
# 80, recipe args megatron 70. An order, not a result: a queue missing here only starts later.
LONG_FIRST = ("engine", "test_arm64_docker", "relax-image", "test_dist_teardown", "test_cann_bake_docker",
              "test_megatron_patches", "test_deps_pass_docker", "test_cpu_mode_docker", "test_trial_twinkle_docker",
              "test_supply_bundle", "test_sources_docker", "test_repro_docker", "test_recipe_args_megatron")


def _queue(item) -> str | None:
    """The xdist group a test waits in (see above), None for a test that may run on any worker."""
    module = item.module.__name__.rpartition(".")[2]
    if "docker" in item.keywords:
        if module in OWN_IMAGE_MODULES or "own_images" in item.keywords:
            return module
        return IMAGE_QUEUES.get(module, "engine")
    if "slow" in item.keywords or "network" in item.keywords:
        return IMAGE_QUEUES.get(module, module)
    return module if module in ONE_WORKER_MODULES else None


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the group into the test's id
def pytest_collection_modifyitems(config, items):
    for item in items:
        queue = _queue(item)
        if queue:
            item.add_marker(pytest.mark.xdist_group(queue))
    # xdist's workers, whose collection order is the one the groups go out in, see dist "no" and loadgroup True
    if getattr(config.option, "dist", "no") == "loadgroup" or getattr(config.option, "loadgroup", False):
        rank = {g: i for i, g in enumerate(LONG_FIRST)}
        items.sort(key=lambda it: rank.get(_queue(it), len(LONG_FIRST)))  # stable: the rest keep their order
    _skip_docker_without_engine(items)


def _skip_docker_without_engine(items):
    if not any("docker" in item.keywords for item in items):
        return
    # the same client choice the product and the fixtures make (BuildKit-capable, TRAINBOX_DOCKER honoured)
    from docker_helpers import _client_or_reason

    client, reason = _client_or_reason()
    if client is not None:
        return
    if os.environ.get("CI"):
        pytest.exit(f"{reason}; CI must run the docker tests: run ci/ensure-docker.sh", returncode=3)
    skip = pytest.mark.skip(reason=f"{reason} (run `make engine` or ci/ensure-docker.sh)")
    for item in items:
        if "docker" in item.keywords:
            item.add_marker(skip)


_docker_root: list[str] = []
_engine: list = []
_held: list = []  # this worker's hold on the engine, from a docker test's setup to its teardown (engine_guard)


def pytest_runtest_setup(item):
    """Before a docker test's fixtures: cut the disk when it runs low (tests/engine_guard.py), then hold the engine
    shared until the test's teardown, so that no other worker's cut runs under its builds."""
    if "docker" not in item.keywords:
        return
    if not _engine:
        from docker_helpers import _client_or_reason

        _engine.append(_client_or_reason()[0])
    if _engine[0] is None:
        return
    if not _docker_root:
        out = _engine[0].run("info", "--format", "{{.DockerRootDir}}", check=False).stdout.decode().strip()
        _docker_root.append(out if out.startswith("/") else "/var/lib/docker")
    said = engine_guard.free_disk_when_low(_engine[0], _docker_root[0])
    _held.append(engine_guard.EngineUse())
    if said:  # a warning: shown in the run's summary, also from an xdist worker (whose own output is dropped)
        warnings.warn(LowDiskCut(said), stacklevel=1)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    try:
        yield
    finally:  # after the teardown, also when the setup failed
        while _held:
            _held.pop().release()


class LowDiskCut(UserWarning):
    """The low-disk guard cut the engine's images or build cache before a docker test."""


@pytest.fixture
def cpu_image() -> str:
    """The cpu stack's image, built through `trainbox image build` (content-hash tag: free when unchanged). Asked
    for each test, not once a session: the engine queue's push tests untag it for a while, and a test after one
    must find it, not a name from before (build_cpu_image makes it again when it is gone)."""
    from docker_helpers import build_cpu_image

    return build_cpu_image()


@pytest.fixture(scope="session")
def cpu_ray_image() -> str:
    """The cpu-ray stack's image (ray[default] on top of the cpu stack) for the Ray recipe."""
    from docker_helpers import build_cpu_ray_image

    return build_cpu_ray_image()


@pytest.fixture(scope="session")
def npu_image() -> str:
    """Dockerfile.npu's own steps on the cpu base with pins this machine reaches (no CANN: a stand-in host)."""
    from docker_helpers import build_npu_template_image

    return build_npu_template_image()


@pytest.fixture(scope="session", autouse=True)
def every_built_image_carries_its_sbom():
    """Every image a test builds through `trainbox image build` is checked once it is built: its SBOM
    (/etc/trainbox/sbom.cdx.json) must list what `pip inspect` in the image lists (docker_helpers.sbom_problems)."""
    from trainbox.image import run as buildrun

    real = buildrun.run
    checked: set[str] = set()

    def run_and_check(plan, client, *args, **kw):
        outcome = real(plan, client, *args, **kw)
        image_id = outcome.report.get("image_id")
        if image_id not in checked:
            from docker_helpers import sbom_problems

            problems = sbom_problems(outcome.tag)
            assert not problems, f"{outcome.tag}: its SBOM differs from pip inspect: " + "; ".join(problems)
            checked.add(image_id)
        return outcome

    mp = pytest.MonkeyPatch()
    mp.setattr(buildrun, "run", run_and_check)
    yield
    mp.undo()


@pytest.fixture(scope="session")
def registry():
    """A real registry on 127.0.0.1 (Debian's docker-registry) for the push tests, one per test process: the push
    tests (all in the "engine" queue, one worker) share it, so the cpu image is compressed and uploaded once per run;
    a later push of it finds its layers there ("Layer already exists"), as a second push to a cluster's registry
    does. Each test still pulls by digest what only the registry has."""
    from docker_helpers import _unavailable
    from registry_helpers import local_registry

    try:
        with local_registry() as where:
            yield where
    except FileNotFoundError as exc:
        _unavailable(str(exc))
