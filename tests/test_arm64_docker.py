"""linux/arm64 for real on this x86_64 host: the arm64 Debian base, the cpu stack built for linux/arm64 through
BuildKit and qemu (binfmt_misc), `trainbox doctor` and a short cpu-ddp job inside it, and what the image config,
its manifest, its tag and `image ls` say about the platform.

torch on arm64 is PyPI's aarch64 torch 2.10.0, the newest PyPI aarch64 wheel that is the CPU build (see
build/stacks/cpu.yaml). Under qemu the torch imports take most of the time; the job trains 20 steps, as the
amd64 test does (3 are too few for the job's own "the loss fell" check). The image is labelled trainbox.test=1
(which gives it its own content hash, no :latest tag) and removed afterwards; the arm64 base is kept, as the
amd64 one is (`trainbox base bootstrap` makes either once). Cold, the build makes the venv natively, on the amd64 base
with pip's --platform (partials/cross_venv.j2: about 40 s alone; under qemu it took 2 minutes alone and 9 in a cold
`.ci/run`'s `make test`); with BuildKit's cache warm the module takes about 1.5 minutes quiet.

No verdict here depends on how fast the machine is: under qemu, and more so on a loaded host, each step may take
many times its quiet duration, so every wait is on the event (the container's exit) with an outer bound that only
catches a hang (HANG_S); the doctor's own limit on `import torch` is 10 times its usual one under emulation.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

import docker_helpers

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.network]

PLAT = "linux/arm64"
LABEL = "trainbox.test=1"
HANG_S = 3600  # an emulated torch job takes minutes quiet, several times that loaded: only a hang goes past this


def _require_emulation():
    from trainbox.specs.platforms import EMULATE_HINT, emulation_problem

    problem = emulation_problem(PLAT)
    if problem:
        docker_helpers._unavailable(f"{PLAT} cannot run here: {problem}; {EMULATE_HINT}")


@pytest.fixture(scope="module")
def arm64_base():
    from trainbox.image.base import bootstrap, PLATFORM_LABEL

    client = docker_helpers.docker_client()
    _require_emulation()
    bootstrap(platform=PLAT, client=client)  # reused when present
    docker_helpers.ensure_base()  # its amd64 twin, on which the arm64 build compiles the venv natively
    tag = "local/debian:bookworm-arm64"
    info = client.inspect(tag)
    return tag, info, PLATFORM_LABEL


@pytest.fixture(scope="module")
def arm64_wheels():
    """`image wheelhouse cpu --platform linux/arm64`: every arm64 pin and locked dependency, fetched natively and
    hash-checked here (kept between runs), so that the emulated pip only installs."""
    from trainbox.paths import cache_dir
    from trainbox.specs.stack import load_stack
    from trainbox.supply.wheelhouse import fill

    dest = cache_dir() / "test" / "wheels-arm64"
    out = fill(load_stack("cpu"), PLAT, dest, say=lambda m: None)
    assert out["deps_locked"], out
    assert any(n.startswith("torch-2.10.0-") and n.endswith("_aarch64.whl") for n in out["added"] + out["kept"])
    return dest


@pytest.fixture(scope="module")
def arm64_cpu(arm64_base, arm64_wheels):
    from trainbox.image.build import BuildOptions, build

    client = docker_helpers.docker_client()
    outcome = build(BuildOptions(stack="cpu", platform=PLAT, labels={"trainbox.test": "1"}, tag_latest=False,
                                 wheelhouse=str(arm64_wheels), report=str(docker_helpers._report_path("cpu-arm64"))))
    yield outcome
    for t in outcome.tags:
        client.remove_image(t, force=True)


def test_the_arm64_base_records_its_architecture(arm64_base):
    tag, info, label = arm64_base
    assert info["Architecture"] == "arm64" and info["Os"] == "linux", {k: info.get(k) for k in ("Os", "Architecture")}
    assert info["Config"]["Labels"][label] == PLAT
    proc = docker_helpers.run_in_image(tag, "uname", "-m", timeout=HANG_S)
    assert proc.stdout.strip() == "aarch64", proc.stdout + proc.stderr


def test_cpu_stack_for_arm64_tag_config_and_manifest(arm64_cpu):
    client = docker_helpers.docker_client()
    tag = arm64_cpu.tag
    assert re.fullmatch(r"trainbox/cpu:[0-9a-f]{12}-arm64", tag), arm64_cpu.tags
    info = client.inspect(tag)
    assert info["Architecture"] == "arm64", info.get("Architecture")
    assert info["Config"]["Labels"]["io.trainbox.platform"] == PLAT
    assert arm64_cpu.report["platform"] == PLAT and arm64_cpu.report["base"]["used"] == "local/debian:bookworm-arm64"
    man = json.loads(docker_helpers.run_in_image(tag, "cat", "/etc/trainbox/stack.json",
                                                 entrypoint="").stdout)
    assert man["platform"] == PLAT
    assert man["components"]["torch"]["version"] == "2.10.0"  # PyPI's aarch64 CPU build, not 2.13.0+cpu
    # the venv was made on this machine (FROM the amd64 base, pip's --platform): the emulated final stage only
    # copied it and checked it
    stages = {s["stage"] for s in arm64_cpu.report["steps"]}
    assert stages >= {"native", "venv", "venv-torch", "venv-pins", "final"}, arm64_cpu.report["steps"]
    emulated = [s["name"] for s in arm64_cpu.report["steps"] if s["stage"] in ("final", "system") and " RUN " in
                " " + s["name"].split("] ", 1)[-1]]
    assert not any("pip install" in n or "compileall" in n for n in emulated), emulated
    # its bytecode is what the aarch64 interpreter loads: the magic number and the unchecked-hash flag (1), else
    # Python would recompile every start; every file each distribution's RECORD names lies where it says (scripts
    # moved to the venv's bin/, their paths rewritten), and a console script runs with the venv's interpreter
    code = ("import importlib.metadata as md, importlib.util, pathlib, sys; p = next(pathlib.Path(sys.prefix, 'lib')"
            ".glob('python3.*/site-packages/torch/__pycache__/__init__.cpython-*.pyc')); h = p.read_bytes()[:8]; "
            "print(h[:4] == importlib.util.MAGIC_NUMBER, int.from_bytes(h[4:], 'little')); "
            "missing = [str(f) for d in md.distributions() for f in d.files or [] if not f.locate().exists()]; "
            "print(len(list(md.distributions())), missing[:5])")
    proc = docker_helpers.run_in_image(tag, "sh", "-c", f"python -c \"{code}\" && isympy --help | head -n 1",
                                       entrypoint="", timeout=HANG_S)
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0 and lines[0].split() == ["True", "1"], proc.stdout + proc.stderr
    assert lines[1].endswith(" []") and int(lines[1].split()[0]) >= 11, lines  # pip and the stack's 10 wheels
    assert lines[2].startswith("usage: isympy"), lines
    # that torch imports as aarch64's CPU build: the doctor test (each emulated torch import costs a minute here)


def test_the_arm64_sbom_names_the_aarch64_pins_hashes(arm64_cpu):
    """Issue 37: the cpu stack pins torch and numpy once per platform (a requirement line under each platform's
    marker). The SBOM keyed those lines by name, so the x86_64 line overwrote the aarch64 one and the arm64 image's
    SBOM called its torch "not hash-pinned". Each distribution now carries the hash of its own platform's pin."""
    from trainbox.image import sbom
    from trainbox.specs.stack import load_stack

    stack = load_stack("cpu")
    doc = json.loads(sbom.read_from_image(docker_helpers.docker_client(), arm64_cpu.tag))
    comps = {c["name"]: c for c in doc["components"] if c.get("bom-ref", "").startswith("pypi:")}
    for key in ("torch", "numpy"):
        pin = stack.components[key].pin_for(PLAT)
        c = comps[key]
        props = {p["name"].removeprefix(sbom.PROP): p["value"] for p in c.get("properties") or []}
        assert c["version"] == pin.version, (key, c["version"])
        assert [h["content"] for h in c.get("hashes") or []] == [pin.sha256[0]], (key, c.get("hashes"), props)
        assert not props.get("hash-source", "").startswith("not hash-pinned"), (key, props)


def test_image_ls_shows_the_platform(arm64_cpu):
    from trainbox.image.inventory import built_images

    [img] = [i for i in built_images(["cpu"]) if arm64_cpu.tag in i.tags]
    assert img.platform == PLAT and img.hash_tags == [arm64_cpu.tag]
    out = subprocess.run([sys.executable, "-m", "trainbox.cli", "image", "ls", "cpu"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    header, *rows = out.stdout.splitlines()
    assert "PLATFORM" in header.split()
    [row] = [r for r in rows if r.split()[0] == arm64_cpu.tag]
    assert row.split()[2] == PLAT, row


def test_cpu_ddp_trains_in_the_arm64_image(arm64_cpu):
    proc = subprocess.run([sys.executable, "-m", "trainbox.cli", "run", "cpu-ddp", "--image", arm64_cpu.tag,
                           "--set", "STEPS=20", "--label", LABEL], capture_output=True, text=True, timeout=HANG_S)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "runs under qemu, with docker's init as PID 1" in proc.stderr + proc.stdout
    assert "backend gloo" in proc.stdout and "ranks reporting: [0, 1]" in proc.stdout, proc.stdout
    assert "cpu-ddp: loss fell" in proc.stdout


def test_doctor_image_runs_an_arm64_image_as_run_does(arm64_cpu):
    """`trainbox doctor --image` on an arm64 image here: docker's init in front (qemu-user lacks what tini -s needs),
    said in one line, and the doctor passes in the emulated image: torch imports there as PyPI's aarch64 CPU build,
    and the doctor says it runs emulated. One emulated doctor for both (each emulated torch import costs a minute
    here); under emulation the doctor allows its `import torch` 10 times its usual limit by itself, and
    TRAINBOX_DOCTOR_IMPORT_S, which raises it further, is tests/test_doctor_emulation.py's."""
    proc = subprocess.run([sys.executable, "-m", "trainbox.cli", "doctor", "--image", arm64_cpu.tag, "--json"],
                          capture_output=True, text=True, timeout=HANG_S)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "qemu" in proc.stderr
    rep = json.loads(proc.stdout)
    failed = [c for c in rep["checks"] if c["status"] == "FAIL"]
    assert not failed, failed
    checks = {c["id"]: c for c in rep["checks"]}
    assert checks["packages.versions"]["status"] == "PASS", checks["packages.versions"]
    assert checks["torch.import"]["status"] == "PASS", checks["torch.import"]
    # imported in the image, under qemu: PyPI's aarch64 CPU build, which sees no CUDA
    assert checks["torch.import"]["data"]["torch"] == "2.10.0+cpu", checks["torch.import"]
    assert checks["torch.import"]["data"]["cuda"] == 0, checks["torch.import"]
    assert rep["context"]["device"] == "cpu"
    assert rep["context"]["platform"] == PLAT and rep["context"]["machine"] == "aarch64", rep["context"]
    # and it says that it runs emulated, on this host's kernel
    from trainbox.runtime.emulation import family
    import platform

    emulated = rep["context"]["emulated"] or {}
    assert emulated.get("machine") == "aarch64" and family(emulated.get("kernel")) == family(platform.machine()), \
        rep["context"]
    assert ", linux/arm64," in checks["manifest"]["message"], checks["manifest"]
