"""linux/arm64 without an engine: platform names and tags, the emulation check, the plan for an arm64 build,
`image ls`/`prune` per platform, the arm64-artifacts rule, and markers evaluated for the target machine when
locking (the real build is tests/test_arm64_docker.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile

import pytest

from trainbox.image import inventory, plan as buildplan
from trainbox.specs import platforms, rules
from trainbox.specs.stack import load_stack


def test_tags_and_base_names_per_platform():
    assert platforms.tag_suffix("linux/amd64") == "" and platforms.tag_suffix("linux/arm64") == "-arm64"
    assert platforms.local_base_for("local/debian:bookworm", "linux/arm64") == "local/debian:bookworm-arm64"
    assert platforms.local_base_for("local/debian:bookworm-arm64", "linux/arm64") == "local/debian:bookworm-arm64"
    assert platforms.local_base_for("local/debian:bookworm", "linux/amd64") == "local/debian:bookworm"
    assert platforms.platform_of({"Os": "linux", "Architecture": "arm64"}) == "linux/arm64"
    assert platforms.platform_of({"Os": "linux", "Architecture": "amd64"}) == "linux/amd64"
    assert platforms.platform_of({"Os": "linux", "Architecture": "s390x"}) is None
    assert platforms.platform_of(None) is None


def _binfmt(tmp_path, text: str | None):
    if text is not None:
        (tmp_path / "qemu-aarch64").write_text(text)
    return str(tmp_path)


@pytest.mark.parametrize("text, problem", [
    ("enabled\ninterpreter /usr/libexec/qemu-binfmt/aarch64-binfmt-P\nflags: PF\noffset 0\n", None),
    ("enabled\ninterpreter /usr/bin/qemu-aarch64-static\nflags: P\noffset 0\n", "without the F (fix-binary) flag"),
    ("disabled\ninterpreter /usr/bin/qemu-aarch64-static\nflags: PF\n", "disabled"),
    (None, "no emulator for aarch64"),
])
def test_emulation_problem_reads_binfmt_misc(tmp_path, monkeypatch, text, problem):
    monkeypatch.setattr(platforms, "host_platform", lambda: "linux/amd64")
    got = platforms.emulation_problem("linux/arm64", _binfmt(tmp_path, text))
    assert (got is None) if problem is None else (problem in got), got
    assert platforms.emulation_problem("linux/amd64", _binfmt(tmp_path, None)) is None  # the host's own


def test_an_arm64_plan_names_its_platform_in_tag_label_and_manifest(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINBOX_CACHE", str(tmp_path / "cache"))
    stack = load_stack("cpu")
    base = buildplan.BuildBase(requested="debian:bookworm-slim", used="local/debian:bookworm-arm64",
                          substituted="local/debian:bookworm-arm64")
    amd = buildplan.make_plan(stack, base, buildplan.PlanInputs(platform="linux/amd64"))
    arm = buildplan.make_plan(stack, base, buildplan.PlanInputs(platform="linux/arm64"))
    assert arm.content_hash != amd.content_hash
    assert arm.tags == [f"trainbox/cpu:{arm.content_hash[:12]}-arm64", "trainbox/cpu:latest-arm64"]
    assert amd.tags == [f"trainbox/cpu:{amd.content_hash[:12]}", "trainbox/cpu:latest"]  # as before
    assert arm.labels["io.trainbox.platform"] == "linux/arm64" and amd.labels["io.trainbox.platform"] == "linux/amd64"
    assert ["--platform", "linux/arm64"] == arm.args[arm.args.index("--platform"):][:2]
    man = json.loads(arm.files["build/generated/cpu/stack.json"])
    assert man["platform"] == "linux/arm64"
    assert man["components"]["torch"]["version"] == "2.10.0"  # what is installed there (the doctor compares it)
    assert json.loads(amd.files["build/generated/cpu/stack.json"])["components"]["torch"]["version"] == "2.13.0+cpu"
    reqs = arm.files["build/generated/cpu/requirements.txt"].decode()
    assert 'torch==2.10.0 ; platform_machine == "aarch64"' in reqs
    assert 'torch==2.13.0+cpu ; platform_machine == "x86_64"' in reqs


def _stages(dockerfile: str) -> list[str]:
    return [line for line in dockerfile.splitlines() if line.startswith("FROM ")]


def _cross_plans(tmp_path, monkeypatch, stack_name):
    monkeypatch.setenv("TRAINBOX_CACHE", str(tmp_path / "cache"))
    stack = load_stack(stack_name)
    base = buildplan.BuildBase(requested=stack.base.image, used="local/debian:bookworm-arm64",
                               substituted="local/debian:bookworm-arm64")
    plain = buildplan.make_plan(stack, base, buildplan.PlanInputs(platform="linux/arm64"))
    cross = buildplan.make_plan(stack, base, buildplan.PlanInputs(platform="linux/arm64",
                                                                  native_base="local/debian:bookworm"))
    assert cross.content_hash != plain.content_hash
    assert "AS native" not in plain.dockerfile and "NATIVE_BASE_IMAGE" not in plain.dockerfile
    assert "ARG NATIVE_BASE_IMAGE=local/debian:bookworm\n" in cross.dockerfile
    assert _stages(cross.dockerfile)[0] == "FROM --platform=$BUILDPLATFORM ${NATIVE_BASE_IMAGE} AS native"
    # what does not depend on the machine runs natively: /etc/hosts and trainbox's own files
    assert {"FROM native AS hosts", "FROM native AS files"} <= set(_stages(cross.dockerfile))
    assert {"FROM ${BASE_IMAGE} AS hosts", "FROM system AS files"} <= set(_stages(plain.dockerfile))
    return plain, cross


VENV_COMPILE = "-m compileall -q -f \\\n            --invalidation-mode"  # partials/venv_compile.j2


def test_a_cross_build_with_a_builder_compiles_the_venv_natively(tmp_path, monkeypatch):
    """Where the venv is made in a builder (twinkle: patches, git sources), the cross build compiles its bytecode in
    a native stage (qemu would take minutes over torch) and copies only the .pyc into the image."""
    plain, cross = _cross_plans(tmp_path, monkeypatch, "twinkle")
    assert "FROM native AS pyc" in _stages(cross.dockerfile) and "AS pyc" not in plain.dockerfile
    # twinkle's final stage continues its builder (nothing build-only in it)
    assert _stages(cross.dockerfile)[-1] == "FROM builder AS final"
    pyc = cross.dockerfile[cross.dockerfile.index(" AS pyc\n"):cross.dockerfile.index(_stages(cross.dockerfile)[-1])]
    assert "COPY --from=builder /opt/venv/lib /opt/venv/lib" in pyc
    # every source of the venv's lib, not only those newer than SOURCE_DATE_EPOCH (the steps that copied them here
    # stamped them all), with the flags of the venv's own steps
    assert "find /opt/venv/lib -name '*.py' ! -type d -print0" in pyc
    assert "-m compileall -q -f \\\n            --invalidation-mode unchecked-hash >/dev/null" in pyc
    assert "! -type d ! -name '*.pyc' -delete" in pyc  # only bytecode travels back
    final = cross.dockerfile[cross.dockerfile.index(_stages(cross.dockerfile)[-1]):]
    assert "COPY --from=pyc /opt/venv/lib /opt/venv/lib" in final
    # the emulated compile (the venv's own Python, on the target platform) is gone; the plain plan keeps it
    assert "/opt/venv/bin/python -m compileall" in plain.dockerfile
    assert "/opt/venv/bin/python -m compileall" not in cross.dockerfile
    assert cross.dockerfile.count(VENV_COMPILE) == 1
    # the venv's pip, torch's own layer, the other pins; and the venv step again at the head of each build-env stage
    # (the builder's very step: BuildKit runs it once)
    assert plain.dockerfile.count(VENV_COMPILE) == 3 + plain.dockerfile.count(" AS build-env-")


def test_a_cross_build_without_a_builder_makes_the_venv_natively(tmp_path, monkeypatch):
    """cpu (no builder, every dependency locked): the whole venv is made natively, with the target's wheels (pip's
    --platform), each pin step into a tree of its own; under emulation only the checks run."""
    plain, cross = _cross_plans(tmp_path, monkeypatch, "cpu")
    stages = _stages(cross.dockerfile)
    assert stages[-4:] == ["FROM native AS venv", "FROM venv AS venv-torch", "FROM venv AS venv-pins",
                           "FROM system AS final"], stages
    assert "AS pyc" not in cross.dockerfile
    final = cross.dockerfile[cross.dockerfile.index(stages[-1]):]
    assert final.index("COPY --from=venv /opt/venv /opt/venv") < final.index("COPY --from=venv-torch /out/ /") \
        < final.index("COPY --from=venv-pins /out/ /")
    emulated_runs = final.split("\nRUN ")[1:]
    assert len(emulated_runs) == 1 and "-m pip check" in emulated_runs[0] and "pip install" not in emulated_runs[0]
    # pip's --platform: aarch64's manylinux tags, binary wheels only; every pin step hash-checked, into its own tree
    assert "platform = manylinux2014_aarch64" in cross.dockerfile and "only-binary = :all:" in cross.dockerfile
    venv = cross.dockerfile[cross.dockerfile.index(stages[-3]):cross.dockerfile.index(stages[-1])]
    assert venv.count("--require-hashes --no-deps \\\n      --target /out.pip -r") == 2
    assert venv.count("-s /out -p /") == 2  # bytecode naming the paths the sources have in the image
    # each step is fed the target's own lines: markers already evaluated for aarch64 (pip would take the build
    # machine's), and torch only in its own layer's file
    files = {k.rsplit("/", 1)[1]: v.decode() for k, v in cross.files.items() if "/linux-arm64/" in k}
    assert set(files) == {"torch.txt", "requirements.txt", "deps.txt"}
    assert "torch==2.10.0 --hash=sha256:" in files["torch.txt"] and "x86_64" not in "".join(files.values())
    assert "torch==" not in files["requirements.txt"] and "numpy==2.3.5 --hash=" in files["requirements.txt"]
    assert not any(k.startswith("build/generated/cpu/linux-") for k in plain.files)


def test_requirements_for_a_platform_keep_its_lines_without_their_marker():
    from trainbox.specs.platforms import requirements_for

    text = ("# header\n"
            'a==1 ; platform_machine == "aarch64" --hash=sha256:aa\n'
            'a==2 ; platform_machine == "x86_64" --hash=sha256:bb\n'
            'b==3 ; platform_machine == "x86_64" or platform_machine == "aarch64" --hash=sha256:cc\n'
            "c==4 --hash=sha256:dd\n")
    assert requirements_for(text, "linux/arm64") == "# header\na==1 --hash=sha256:aa\nb==3 --hash=sha256:cc\n" \
        "c==4 --hash=sha256:dd\n"
    assert requirements_for(text, "linux/amd64") == "# header\na==2 --hash=sha256:bb\nb==3 --hash=sha256:cc\n" \
        "c==4 --hash=sha256:dd\n"


def test_native_twin_is_trainboxs_own_base_for_this_machine(monkeypatch):
    from trainbox.image import base

    class Engine:
        def __init__(self, *have):
            self.have = set(have)

        def image_exists(self, tag):
            return tag in self.have

    monkeypatch.setattr(base, "host_platform", lambda: "linux/amd64")
    engine = Engine("local/debian:bookworm", "local/debian:trixie")
    assert base.native_twin("local/debian:bookworm-arm64", "linux/arm64", engine) == "local/debian:bookworm"
    assert base.native_twin("local/debian:trixie-arm64", "linux/arm64", engine) == "local/debian:trixie"
    assert base.native_twin("local/debian:bookworm", "linux/amd64", engine) is None  # not a cross build
    assert base.native_twin("local/debian:bookworm-arm64", "linux/arm64", Engine()) is None  # no twin here
    assert base.native_twin("quay.io/ascend/cann:8.5.0-910b-py3.11-arm64", "linux/arm64", engine) is None
    assert base.native_twin("local/debian:bookworm-arm64", "linux/arm64", None) is None  # no engine (dry run)


def _image(stack, tag, plat, created):
    return inventory.BuiltImage(id=tag[-6:], tags=[tag], stack=stack, hash=tag.split(":")[1][:12], base=None,
                                substitute=False, overrides={}, size=1, created=created, age_s=1, platform=plat)


def test_hash_tags_and_prune_per_platform():
    assert inventory.HASH_TAG_RE.match("trainbox/cpu:0123456789ab-arm64")
    assert inventory.HASH_TAG_RE.match("trainbox/cpu:0123456789ab")
    assert not inventory.HASH_TAG_RE.match("trainbox/cpu:0123456789ab-s390x")
    imgs = [_image("cpu", "trainbox/cpu:aaaaaaaaaaaa-arm64", "linux/arm64", "2026-11-26T03:00:00"),
            _image("cpu", "trainbox/cpu:bbbbbbbbbbbb", "linux/amd64", "2026-11-26T02:00:00"),
            _image("cpu", "trainbox/cpu:cccccccccccc", "linux/amd64", "2026-11-26T01:00:00")]
    # keeping one per stack and platform: the newer arm64 build does not push out the newest amd64 one
    assert [a.tag for a in inventory.prune_plan(imgs, keep=1)] == ["trainbox/cpu:cccccccccccc"]


def test_arm64_artifacts_rule_names_where_each_pin_comes_from():
    def found(name):
        return [f.message for f in rules.check(load_stack(name)) if f.rule == "arm64-artifacts"]

    assert found("cpu") == []  # every pin from PyPI, every one locked for linux/arm64
    npu = found("npu-910b")
    assert any("torch==2.9.0+cpu for linux/arm64 is on PyTorch's own index" in m for m in npu), npu
    assert not any("torch-npu" in m for m in npu)  # torch_npu's aarch64 wheel is on PyPI
    [cuda] = found("cuda")
    assert "no linux/arm64 image" in cuda
    assert all(f.level == "info" for f in rules.check(load_stack("cuda")) if f.rule == "arm64-artifacts")


def _wheel(dirpath, name, version, requires=()):
    path = dirpath / f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{info}/METADATA", meta)
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
    return path


def test_lock_evaluates_markers_for_the_target_machine(tmp_path):
    """pip's --platform picks wheel tags only; its markers see the host. torch declares its CUDA wheels
    `; platform_machine == "x86_64"`: resolving aarch64 on an x86_64 host must not want them."""
    from trainbox.supply.lock import _pip_for

    _wheel(tmp_path, "fake_torch", "1.0", ['fake-nvidia==1.0 ; platform_machine == "x86_64"',
                                          'fake-arm==1.0 ; platform_machine == "aarch64"'])
    _wheel(tmp_path, "fake_arm", "1.0")  # there is no fake-nvidia anywhere: wanting it fails the resolve

    def resolve(machine):
        report = tmp_path / f"{machine}.json"
        proc = subprocess.run([*_pip_for(machine), "install", "--dry-run", "--quiet", "--no-index", "--find-links",
                               str(tmp_path), "--ignore-installed", "--report", str(report), "fake_torch==1.0"],
                              capture_output=True, text=True, timeout=120, env={"PIP_CONFIG_FILE": "/dev/null",
                                                                                "PATH": "/usr/bin:/bin"})
        return proc, report

    proc, report = resolve("aarch64")
    assert proc.returncode == 0, proc.stderr
    names = sorted(i["metadata"]["name"] for i in json.loads(report.read_text())["install"])
    assert names == ["fake_arm", "fake_torch"]
    if platforms.host_platform() == "linux/amd64":
        proc, _ = resolve("x86_64")
        assert proc.returncode != 0 and "fake-nvidia" in proc.stderr
    assert _pip_for(platforms.PLATFORM_MACHINE[platforms.host_platform()])[:3] == [sys.executable, "-m", "pip"]


def test_image_build_without_emulation_stops_in_one_line(monkeypatch):
    """No qemu for arm64 here: the build says so, and how to get it, before it looks for an engine."""
    from trainbox.image import build as image_build
    from trainbox.runtime.errors import TrainboxError

    monkeypatch.setattr(image_build, "emulation_problem", lambda plat: "no qemu-aarch64 emulator is registered in X")
    monkeypatch.setattr(image_build, "find_client", lambda: pytest.fail("must stop before the engine"))
    with pytest.raises(TrainboxError) as exc:
        image_build.build(image_build.BuildOptions(stack="cpu", platform="linux/arm64"))
    assert exc.value.exit_code == 2 and "\n" not in str(exc.value)
    assert "--platform linux/arm64" in str(exc.value) and "ci/ensure-docker.sh --emulate arm64" in str(exc.value)
    with pytest.raises(TrainboxError, match="supports linux/amd64, linux/arm64"):  # unchanged: bad input first
        image_build.build(image_build.BuildOptions(stack="cpu", platform="linux/s390x"))


@pytest.mark.parametrize("value", ["linux/s390x", "linux/arm64,linux/arm64", ","])
def test_push_platform_list_is_checked_before_the_engine(value, capsys):
    from trainbox.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["image", "push", "cpu", "--registry", "127.0.0.1:5000", "--platform", value])
    assert exc.value.code == 2 and "comma-separated list of distinct platforms" in capsys.readouterr().err
