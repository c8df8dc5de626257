"""trainbox.image.build without an engine: input checks (each one clear message, non-zero exit, fast),
the content hash, the staged context and the wheelhouse rules."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import stat
from pathlib import Path

import pytest

import trainbox.paths
from trainbox.image import engine, build as image_build, plan as buildplan, run as buildrun
from trainbox.cli import main
from trainbox.paths import REPO_ROOT
from trainbox.runtime.errors import TrainboxError
from trainbox.supply import wheelhouse as wheels_mod
from trainbox.supply.pins import Pin

DATA = Path(__file__).parent / "data"


def _cli(capsys, *argv) -> tuple[int, str]:
    """main(argv), and that it reached no long step: no network connection (a registry or index probe, a pull) and
    no build (what was a wall-clock limit here, which a loaded machine could pass with no defect)."""
    from unittest import mock

    from hangguard import no_connection

    with no_connection() as reached, \
            mock.patch.object(buildrun, "run", side_effect=AssertionError("a build started")):
        rc = main(list(argv))
    err = capsys.readouterr().err
    assert not reached, f"{' '.join(argv)}: {reached[0]} before the answer; input must be checked before any long step"
    return rc, err


@pytest.fixture
def no_engine(monkeypatch, tmp_path):
    """A stand-in docker client whose engine never answers (so nothing here can start a build)."""
    fake = tmp_path / "docker"
    fake.write_text('#!/bin/sh\nif [ "$1" = "--version" ]; then echo "Docker version 20.10.24, build x"; exit 0; fi\n'
                    'echo "Cannot connect to the Docker daemon at unix:///nonexistent.sock" >&2\nexit 1\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("TRAINBOX_DOCKER", str(fake))
    monkeypatch.setattr(engine, "_CLIENT", None)
    return fake


@pytest.fixture
def wheelhouse(tmp_path):
    """A wheelhouse holding a stand-in torch wheel file (only its name and hash matter here)."""
    d = tmp_path / "wh"
    d.mkdir()
    return d


def _fake_wheel(d: Path, name: str, content: bytes = b"not really a wheel") -> str:
    (d / name).write_bytes(content)
    return hashlib.sha256(content).hexdigest()


# -- bad input ---------------------------------------------------------------------------------------

def test_unknown_stack(capsys, no_engine):
    rc, err = _cli(capsys, "image", "build", "no-such-stack")
    assert rc == 2
    assert "unknown stack 'no-such-stack'" in err and "known stacks:" in err and "cpu" in err


def test_override_of_missing_component(capsys, no_engine):
    rc, err = _cli(capsys, "image", "build", "cpu", "--set", "flash-attn.version=2.0")
    assert rc == 2
    assert "no component 'flash-attn'" in err and "torch" in err


def test_malformed_set(capsys, no_engine):
    rc, err = _cli(capsys, "image", "build", "cpu", "--set", "torch=2.0")
    assert rc == 2 and "COMPONENT.FIELD=VALUE" in err


def test_ca_file_that_is_not_a_certificate(capsys, no_engine, tmp_path):
    bad = tmp_path / "ca.pem"
    bad.write_text("-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBg\n-----END PRIVATE KEY-----\n")
    rc, err = _cli(capsys, "image", "build", "cpu", "--ca-bundle", str(bad))
    assert rc == 2
    assert f"--ca-bundle {bad}: holds no PEM certificate" in err


def test_ca_file_with_a_broken_certificate(tmp_path):
    bad = tmp_path / "ca.pem"
    bad.write_text("-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n-----END CERTIFICATE-----\n")
    with pytest.raises(TrainboxError, match="OpenSSL cannot load it"):
        image_build.check_ca_bundle(bad)


def test_ca_bundle_accepts_real_pem():
    assert image_build.check_ca_bundle(DATA / "marker-ca.pem") == DATA / "marker-ca.pem"


def test_missing_ca_file(capsys, no_engine, tmp_path):
    rc, err = _cli(capsys, "image", "build", "cpu", "--ca-bundle", str(tmp_path / "nope.pem"))
    assert rc == 2 and "no such file" in err


def test_wheelhouse_without_the_pinned_wheel(capsys, no_engine, wheelhouse):
    # a torch wheel of another version (same name, different file): must be refused by name
    _fake_wheel(wheelhouse, "torch-2.9.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl")
    rc, err = _cli(capsys, "image", "build", "cpu", "--wheelhouse", str(wheelhouse),
                   "--platform", "linux/amd64")
    assert rc == 2
    assert "torch-2.9.0+cpu-cp311" in err and "pins torch==2.13.0+cpu" in err and "pip download" in err


def test_wheelhouse_with_a_substituted_wheel(capsys, no_engine, wheelhouse):
    # right file name, wrong bytes: what a tampered mirror looks like
    _fake_wheel(wheelhouse, "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl", b"tampered")
    rc, err = _cli(capsys, "image", "build", "cpu", "--wheelhouse", str(wheelhouse),
                   "--platform", "linux/amd64")
    assert rc == 2
    assert "pins torch==2.13.0+cpu with sha256 6746dbcbeb52" in err


def test_wheelhouse_with_nothing_pinned(capsys, no_engine, wheelhouse):
    _fake_wheel(wheelhouse, "six-1.16.0-py2.py3-none-any.whl")
    rc, err = _cli(capsys, "image", "build", "cpu", "--wheelhouse", str(wheelhouse),
                   "--platform", "linux/amd64")
    assert rc == 2 and "holds none of the stack's pinned artifacts" in err


def test_empty_or_missing_wheelhouse(capsys, no_engine, tmp_path, wheelhouse):
    rc, err = _cli(capsys, "image", "build", "cpu", "--wheelhouse", str(wheelhouse))
    assert rc == 2 and "holds no wheels" in err
    rc, err = _cli(capsys, "image", "build", "cpu", "--wheelhouse", str(tmp_path / "none"))
    assert rc == 2 and "no such directory" in err


def test_unsupported_platform(capsys, no_engine):
    rc, err = _cli(capsys, "image", "build", "cpu", "--platform", "linux/s390x")
    assert rc == 2 and "--platform linux/s390x" in err and "linux/amd64" in err


def test_no_engine(capsys, no_engine, monkeypatch):
    # valid input, every index answers (stand-in probe); only the engine is missing
    monkeypatch.setattr(image_build, "url_answers", lambda url, timeout, cafile=None: (True, ""))
    rc, err = _cli(capsys, "image", "build", "cpu")
    assert rc == 2
    assert "no Docker engine answers" in err and "ci/ensure-docker.sh" in err


@pytest.fixture
def answering_engine(monkeypatch):
    """A stand-in client whose engine answers and holds only the bootstrapped base; registries are
    unreachable (as on these machines)."""
    from trainbox.image import base

    class Stub(engine.Client):
        def __init__(self):
            super().__init__("/nonexistent/docker", "20.10.24", "buildkit")

        def require_engine(self):
            return "20.10.24"

        def image_exists(self, ref):
            return ref == "local/debian:bookworm"

        def image_id(self, ref):
            return "sha256:" + "1" * 64 if self.image_exists(ref) else None

        def image_info(self, ref):  # a current trainbox base: used as it is
            labels = {"org.trainbox.base.suite": "bookworm", base.INCLUDE_LABEL: ",".join(base.DEFAULT_INCLUDE)}
            return {"Id": self.image_id(ref), "Config": {"Labels": labels}} if self.image_exists(ref) else None

    monkeypatch.setattr(image_build, "find_client", Stub)
    monkeypatch.setattr(base, "registry_reachable", lambda ref, timeout=8.0: (False, "stand-in: no route"))


def test_unreachable_index_without_wheelhouse(capsys, answering_engine, monkeypatch):
    # the index serving the CPU torch does not answer (as on these machines, or forced here)
    monkeypatch.setattr(image_build, "url_answers",
                        lambda url, timeout, cafile=None: (False, "stand-in: unreachable") if "pytorch" in url else (True, ""))
    from trainbox.supply import pipconfig

    monkeypatch.setattr(pipconfig, "pip_config", pipconfig.PipConfig)  # and pip names no wheel directory
    rc, err = _cli(capsys, "image", "build", "cpu", "--platform", "linux/amd64")
    assert rc == 2
    assert "torch==2.13.0+cpu" in err and "--wheelhouse DIR" in err


# -- pieces ----------------------------------------------------------------------------------------

def test_parse_sets():
    from trainbox.specs.stack import parse_sets

    assert parse_sets(["torch.version=2.1", "numpy.install=false"]) == \
        {"torch.version": "2.1", "numpy.install": "false"}
    for bad in ["torch", "torch=1", "=1", "torch.version="]:
        with pytest.raises(TrainboxError, match="expected COMPONENT.FIELD=VALUE"):
            parse_sets([bad])


def test_check_wheelhouse_serves_pinned(tmp_path):
    sha = _fake_wheel(tmp_path, "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl")
    wheels = wheels_mod.read_wheelhouse(tmp_path)
    pins = [Pin("torch", "pypi", "torch", "2.13.0+cpu", "pytorch-cpu", "https://download.pytorch.org/whl/cpu", (sha,)),
            Pin("numpy", "pypi", "numpy", "2.3.5", sha256=("0" * 64,))]
    served = wheels_mod.check_wheelhouse(wheels, pins, str(tmp_path))
    assert [p.key for p in served] == ["torch"]


def test_sha256_memo_notices_changes(tmp_path, monkeypatch):
    from trainbox.specs import dists

    monkeypatch.setenv("TRAINBOX_CACHE", str(tmp_path / "cache"))
    f = tmp_path / "a.whl"
    f.write_bytes(b"one")
    assert dists.sha256_file(f, remember=True) == hashlib.sha256(b"one").hexdigest()
    assert (tmp_path / "cache" / "sha256.json").is_file()
    f.write_bytes(b"two!")
    os.utime(f, ns=(1, 1))  # even with an old mtime: the size differs
    assert dists.sha256_file(f, remember=True) == hashlib.sha256(b"two!").hexdigest()


def _ctx(tmp_path, files: dict[str, bytes], mode: int = 0o644) -> Path:
    ctx = tmp_path / "ctx"
    for rel, data in files.items():
        p = ctx / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        p.chmod(mode)
    (ctx / buildplan.WHEELHOUSE_DIR).mkdir(exist_ok=True)
    return ctx


def test_content_hash_covers_every_input(tmp_path):
    from trainbox.image.plan import tree_files

    def ch(ctx, wheels, extra):
        return buildplan.content_hash(tree_files(ctx), wheels, extra)

    base = {"Dockerfile": b"FROM x\n", "python/trainbox/a.py": b"print(1)\n", "launchers/r.yaml": b"a: 1\n"}
    h0 = ch(_ctx(tmp_path / "0", base), [], {"base": "sha256:1"})
    assert h0 == ch(_ctx(tmp_path / "1", base), [], {"base": "sha256:1"})  # deterministic
    for rel in base:
        changed = dict(base, **{rel: base[rel] + b"#"})
        assert ch(_ctx(tmp_path / rel, changed), [], {"base": "sha256:1"}) != h0, rel
    renamed = {("launchers/s.yaml" if k == "launchers/r.yaml" else k): v for k, v in base.items()}
    assert ch(_ctx(tmp_path / "r", renamed), [], {"base": "sha256:1"}) != h0
    assert ch(_ctx(tmp_path / "x", base, 0o755), [], {"base": "sha256:1"}) != h0
    assert ch(_ctx(tmp_path / "b", base), [], {"base": "sha256:2"}) != h0
    wheel = wheels_mod.WheelFile("torch-1-py3-none-any.whl", 10, "a" * 64, Path("/nonexistent"))
    h_w = ch(_ctx(tmp_path / "w", base), [wheel], {"base": "sha256:1"})
    assert h_w != h0
    other = wheels_mod.WheelFile(wheel.name, 10, "b" * 64, wheel.path)
    assert ch(_ctx(tmp_path / "w2", base), [other], {"base": "sha256:1"}) != h_w


def test_staged_context_holds_inputs_and_links_wheels(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINBOX_CACHE", str(tmp_path / "cache"))
    whdir = tmp_path / "wh"
    whdir.mkdir()
    _fake_wheel(whdir, "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl")
    wheels = wheels_mod.read_wheelhouse(whdir)
    files = {**buildplan.input_files(), "build/generated/cpu/stack.json": b"{}",
             "build/generated/cpu/Dockerfile": b"FROM x\n"}
    ctx = tmp_path / "cache" / "build" / "cpu" / "context"
    buildplan.populate(ctx, files, wheels)
    assert (ctx / "build/generated/cpu/stack.json").read_bytes() == b"{}"
    assert (ctx / "python/trainbox/__init__.py").is_file()
    assert (ctx / "pyproject.toml").is_file()
    assert not list(ctx.rglob("__pycache__")) and not list(ctx.rglob("*.egg-info"))
    staged = ctx / "wheelhouse" / wheels[0].name
    assert staged.is_file() and staged.stat().st_ino == wheels[0].path.stat().st_ino  # a hard link
    # the staged tree hashes as the file map it was made from
    staged_items = [i for i in buildplan.CONTEXT_ITEMS + ["build"] if (ctx / i).exists()]
    assert buildplan.content_hash(buildplan.tree_files(ctx, staged_items), wheels, {}) == \
        buildplan.content_hash(files, wheels, {})


def test_content_hash_covers_what_the_build_uses_and_nothing_else(tmp_path):
    """An edit to a launcher changes the hash (and so the tag); an edit to the README, which .dockerignore keeps
    out of every context, does not."""
    root = tmp_path / "repo"
    buildplan.copy_inputs(root)
    (root / "README.md").write_text("# trainbox\n")

    def digest() -> str:
        return buildplan.content_hash(buildplan.input_files(root), [], {})

    before = digest()
    (root / "README.md").write_text("# trainbox, edited\n")
    assert digest() == before
    launcher = sorted(p for p in (root / "launchers").rglob("*") if p.is_file())[0]
    launcher.write_text(launcher.read_text() + "\n# edited\n")
    assert digest() != before
    ignored = (REPO_ROOT / ".dockerignore").read_text().splitlines()
    assert all(f"!{item}" in ignored for item in buildplan.CONTEXT_ITEMS if item != "python") and \
        "!python/trainbox" in ignored  # every hashed item can reach the build


def test_dockerfile_order():
    from trainbox.image.engine import Step

    df = "FROM a AS system\nRUN x\nFROM system AS builder\nRUN y\nFROM system AS final\nCOPY z /z\n"
    steps = [Step(3, "[final 1/1] COPY z /z", "final", 1, 1), Step(2, "[builder 1/1] RUN y", "builder", 1, 1),
             Step(1, "[system 1/1] RUN x", "system", 1, 1)]
    assert [s.stage for s in buildrun.dockerfile_order(steps, df)] == ["system", "builder", "final"]


def test_summary_line():
    r = {"tag": "trainbox/cpu:abc", "image_id": "sha256:" + "1" * 64, "size": 1_074_000_000,
         "layers": [{}] * 14, "wall_s": 40.2, "rebuilt_steps": 11, "cached_steps": 2,
         "base": {"substituted": "local/debian:bookworm"}}
    line = buildrun.summary(r)
    assert "trainbox/cpu:abc" in line and "1074 MB" in line and "14 layers" in line and "11 steps run" in line
    assert "\n" not in line
    assert "up to date" in buildrun.summary(dict(r, skipped=True))


def test_dry_run_prints_plan_and_a_command_that_runs_as_is(capsys, monkeypatch, tmp_path):
    """--dry-run with a stand-in engine that answers: the plan, a command whose context and secret files
    exist after the dry run, and nothing built."""
    fake = tmp_path / "docker"
    log = tmp_path / "calls"
    fake.write_text(
        "#!/bin/sh\n"
        f'echo "$@" >> {log}\n'
        'case "$1" in\n'
        '  --version) echo "Docker version 20.10.24, build x";;\n'
        '  info) echo 20.10.24;;\n'
        '  image) [ "$5" = "local/debian:bookworm" ] && echo sha256:feed || exit 1;;\n'
        '  *) exit 1;;\n'
        'esac\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("TRAINBOX_DOCKER", str(fake))
    monkeypatch.setattr(engine, "_CLIENT", None)
    monkeypatch.setattr(trainbox.paths, "REPORTS_DIR", tmp_path / "reports")
    monkeypatch.setenv("TRAINBOX_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(image_build, "url_answers", lambda url, timeout, cafile=None: (True, ""))
    rc = main(["image", "build", "cpu", "--base", "local/debian:bookworm", "--dry-run",
               "--pip-index-url", "https://user:pw@mirror.example/simple", "--platform", "linux/amd64"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "plan: build trainbox/cpu:" in out and "fetch:" in out and "torch==2.13.0+cpu" in out
    cmd = out.strip().splitlines()[-1].strip()
    assert cmd.startswith("DOCKER_BUILDKIT=1 ") and " build --progress plain " in cmd
    assert "--network host" in cmd and "--secret id=pip_cert,src=" in cmd and "id=pip_index_url" in cmd
    assert "-t trainbox/cpu:" in cmd
    assert "user:pw" not in out + err  # the index URL is a secret file, not an argument
    argv = shlex.split(cmd)
    context = Path(argv[-1])
    assert context.is_dir() and (context / "build/generated/cpu/Dockerfile").is_file()
    assert Path(argv[argv.index("-f") + 1]).is_file()
    secret = Path(next(a for a in argv if a.startswith("id=pip_index_url,src=")).split("src=", 1)[1])
    assert secret.read_text() == "https://user:pw@mirror.example/simple"
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600 and context not in secret.parents
    assert "dry run: would build trainbox/cpu:" in err
    assert " build " not in log.read_text()  # nothing was built
    assert not (tmp_path / "reports").exists()


@pytest.mark.parametrize("engine_env", [{"TRAINBOX_DOCKER": "/nonexistent/docker"},
                                        {"DOCKER_HOST": "unix:///nonexistent/docker.sock"}])
def test_dry_run_offline_without_an_engine(capsys, monkeypatch, tmp_path, engine_env):
    """No engine (no client, or a dead socket) and no index: the dry run still plans, as JSON with a schema,
    and says what it could not check."""
    import json

    if "DOCKER_HOST" in engine_env and not Path("/usr/bin/docker").exists():
        pytest.skip("needs a docker client to point at a dead socket")
    for k, v in engine_env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(engine, "_CLIENT", None)
    monkeypatch.setenv("TRAINBOX_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(image_build, "url_answers", lambda url, timeout, cafile=None: (False, "stand-in: offline"))
    from trainbox.supply import pipconfig

    monkeypatch.setattr(pipconfig, "pip_config", pipconfig.PipConfig)  # a host whose pip has no wheel directory
    rc, err = _cli(capsys, "image", "build", "cpu", "--dry-run", "--json", "--platform", "linux/amd64")
    # torch's index does not answer and no wheelhouse holds it: the plan is made, and says the build would stop
    assert rc == 1 and "would stop" in err, err
    # _cli read stderr; the plan went to stdout: run it again to read it (the staged context is reused)
    assert main(["image", "build", "cpu", "--dry-run", "--json", "--platform", "linux/amd64"]) == 1
    plan = json.loads(capsys.readouterr().out)
    assert plan["schema"] == "trainbox.image-plan/1" and plan["would_stop"] is True
    assert plan["tag"].startswith("trainbox/cpu:") and plan["base"]["image_id"] is None
    assert "no engine answers" in plan["base"]["note"]
    assert any("would stop here" in n and "torch==2.13.0+cpu" in n for n in plan["notes"])
    assert Path(plan["context"], plan["dockerfile"]).is_file()
    assert {f["requirement"] for f in plan["fetch"]} >= {"torch==2.13.0+cpu", "numpy==2.3.5"}


def test_plan_is_pure(monkeypatch, tmp_path):
    """make_plan reads the checkout and nothing else: no process, no network, no file written."""
    import subprocess
    import urllib.request

    from trainbox.specs.stack import load_stack

    def refuse(*a, **k):
        raise AssertionError("make_plan must not run processes or reach the network")

    monkeypatch.setattr(subprocess, "run", refuse)
    monkeypatch.setattr(subprocess, "Popen", refuse)
    monkeypatch.setattr(urllib.request, "urlopen", refuse)
    monkeypatch.setenv("TRAINBOX_CACHE", str(tmp_path / "cache"))
    stack = load_stack("cpu")
    base = buildplan.BuildBase(requested="debian:bookworm-slim", used="debian:bookworm-slim")
    inp = buildplan.PlanInputs(platform="linux/amd64", ca_bundle="/etc/ssl/certs/ca-certificates.crt")
    p1 = buildplan.make_plan(stack, base, inp)
    p2 = buildplan.make_plan(load_stack("cpu"), base, inp)
    assert p1.content_hash == p2.content_hash and p1.tags == ["trainbox/cpu:" + p1.content_hash[:12],
                                                              "trainbox/cpu:latest"]
    assert not (tmp_path / "cache").exists()
    sub = buildplan.make_plan(stack, buildplan.BuildBase("debian:bookworm-slim", "local/debian:bookworm",
                                                    substituted="local/debian:bookworm"), inp)
    assert sub.content_hash != p1.content_hash
    assert b"FROM ${BASE_IMAGE}" in sub.files[sub.dockerfile_rel] and "local/debian:bookworm" in sub.dockerfile
    manifest = json.loads(sub.files["build/generated/cpu/stack.json"])
    assert manifest["base"]["image"] == "debian:bookworm-slim"
    assert manifest["base"]["substituted"] == "local/debian:bookworm"
    assert sub.labels["io.trainbox.base.substituted"] == "local/debian:bookworm"
    d = sub.as_dict()
    assert d["schema"] == "trainbox.image-plan/1" and d["argv"][-1] == str(sub.context)


def test_profile_gives_pins_wheelhouse_and_the_substitute_base(no_engine, tmp_path, capsys):
    """`image build STACK --profile FILE`: the NPU template on a CPU host in one step (no engine here: the
    stack's own base cannot be probed, so the plan is on its base.substitute); the command line wins."""
    from trainbox.commands.image import _apply_profile
    from trainbox.cli import build_parser
    from trainbox.specs.stack import parse_sets

    prof = tmp_path / "p.yaml"
    prof.write_text(f"set:\n  npu-910b: {{torch.version: 2.13.0+cpu, torch-npu.version: '2.13.0'}}\n"
                    f"wheelhouse: {tmp_path}\n")
    args = build_parser().parse_args(["image", "build", "npu-910b", "--profile", str(prof),
                                      "--set", "torch-npu.version=2.12.0"])
    _apply_profile(args)
    assert args.base == "local/debian:bookworm" and args.wheelhouse == str(tmp_path)
    assert parse_sets(args.sets) == {"torch.version": "2.13.0+cpu", "torch-npu.version": "2.12.0"}
    assert "torch.version=2.13.0+cpu" in capsys.readouterr().err
    mine = build_parser().parse_args(["image", "build", "npu-910b", "--profile", str(prof), "--base", "my/cann:1"])
    _apply_profile(mine)
    assert mine.base == "my/cann:1"
    cpu = build_parser().parse_args(["image", "build", "cpu", "--profile", str(REPO_ROOT / "ci/smoke-offline.yaml")])
    _apply_profile(cpu)
    assert cpu.base is None and cpu.sets == []  # cpu substitutes by itself; the profile moves none of its pins


def test_a_given_base_is_a_substitute_in_the_label_the_manifest_and_the_plan(tmp_path, monkeypatch):
    """`--base local/debian:bookworm` on an NPU stack: `image ls` and `run` read the label, `doctor` the manifest;
    both say substitute (the label used to be set only when the build fell back by itself)."""
    from trainbox.specs.stack import load_stack

    monkeypatch.setenv("TRAINBOX_CACHE", str(tmp_path / "cache"))
    stack = load_stack("npu-910b", base="local/debian:bookworm")
    base = image_build.choose_base(stack, None, lambda _msg: None, dry_run=True)
    plan = buildplan.make_plan(stack, base, buildplan.PlanInputs(platform="linux/amd64"))
    manifest = json.loads(plan.files["build/generated/npu-910b/stack.json"])
    assert manifest["base"]["substituted"] == "local/debian:bookworm"
    assert plan.labels["io.trainbox.base.substituted"] == manifest["base"]["substituted"]
    assert base.substituted == "local/debian:bookworm"
    assert "(substitute for quay.io/ascend/cann:" in buildplan.format_plan(plan)
    own = buildplan.make_plan(load_stack("npu-910b"), buildplan.BuildBase("x", "x"), buildplan.PlanInputs("linux/amd64"))
    assert "io.trainbox.base.substituted" not in own.labels


def test_planning_leaves_the_loaded_stack_as_it_was(monkeypatch, tmp_path, wheelhouse):
    """image_build.plan resolves more on its way to make_plan (a pin --set moved, the build's one platform, an index
    that does not answer dropped): each on a new stack, so the stack loading returned is read, never written."""
    import copy

    monkeypatch.setenv("TRAINBOX_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(image_build, "url_answers", lambda url, timeout, cafile=None:
                        (False, "stand-in: unreachable") if "pytorch" in url else (True, ""))
    _fake_wheel(wheelhouse, "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl")
    numpy_sha = _fake_wheel(wheelhouse, "numpy-2.3.4-cp311-cp311-manylinux_2_27_x86_64.whl", b"stand-in numpy")
    opts = image_build.BuildOptions(stack="cpu", sets={"numpy.version": "2.3.4"}, wheelhouse=str(wheelhouse),
                              platform="linux/amd64", dry_run=True, check_wheelhouse=False)
    stack, inp = image_build._check_inputs(opts)

    def snapshot(s):
        return (s.model_dump(), copy.deepcopy(s.resolution),
                {k: (copy.deepcopy(c.locked), c._tree_id) for k, c in s.components.items()})

    before = snapshot(stack)
    p = image_build.plan(opts, None, lambda msg: None, checked=(stack, inp))
    assert snapshot(stack) == before
    # the plan's stack did resolve more: the moved pin is pinned to the wheelhouse's file, the index dropped
    assert stack.components["numpy"].sha256 == [] and p.stack.components["numpy"].sha256 == [numpy_sha]
    assert "pytorch-cpu" in stack.indexes and "pytorch-cpu" not in p.stack.indexes
    assert p.stack.dropped_indexes == {"pytorch-cpu": stack.indexes["pytorch-cpu"]}
    assert p.stack.overrides == {"numpy.version": "2.3.4"} and p.stack.platforms == ["linux/amd64"]


def test_dry_run_names_what_a_wheelhouse_lacks(tmp_path):
    from trainbox.specs.stack import load_stack
    from trainbox.supply import wheelhouse

    stack = load_stack("cpu")
    torch_sha = stack.components["torch"].pin_for("linux/amd64").sha256[0]
    wheels = [wheelhouse.WheelFile("torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl", 1, torch_sha,
                                   tmp_path / "t.whl")]
    notes = wheelhouse.wheelhouse_notes(stack, "linux/amd64", wheels, str(tmp_path))
    assert len(notes) == 1 and "numpy==2.3.5" in notes[0] and "torch" not in notes[0].split("(fill")[0]
    assert f"trainbox image wheelhouse cpu --platform linux/amd64 -o {tmp_path}" in notes[0]
    fetch = {f["key"]: f["from"] for f in wheelhouse.fetch_plan(stack, "linux/amd64", wheels, str(tmp_path))}
    assert fetch["torch"].startswith(f"wheelhouse {tmp_path}") and fetch["numpy"].startswith("index pypi")
    assert wheelhouse.wheelhouse_notes(stack, "linux/amd64", wheels, None) == []


def test_json_of_a_real_build_is_its_report_and_nothing_on_failure(capsys, no_engine, monkeypatch):
    # issue 15: --json on image build, dry run or not (a real build prints its report: tests/test_cli_docker.py)
    monkeypatch.setattr(image_build, "url_answers", lambda url, timeout, cafile=None: (True, ""))
    assert main(["image", "build", "cpu", "--json"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "no Docker engine answers" in err  # no half a JSON document on stdout


# ----------------------------------------------------------------------------- a build cache naming a lost layer

@pytest.mark.parametrize("error, stale", [
    ("layer does not exist", True),  # CI's engine, 2026-11-28: the same build failed so on every try
    ("stat /var/lib/docker/overlay2/1r3k5ul68yuyfhh9ameoxc3hz: no such file or directory", True),
    ("process \"/bin/bash -o pipefail -c pip install\" did not complete successfully: exit code: 1", False),
    ("open /tmp/trainbox/requirements.txt: no such file or directory", False),
])
def test_a_build_failing_on_a_lost_cache_layer_says_how_to_drop_the_cache(tmp_path, error, stale):
    """The fix is said where the cause is the engine's build cache, and only there."""
    from types import SimpleNamespace

    step = SimpleNamespace(name="exporting to image", log=["exporting layers", "exporting layers 5.9s done"])
    result = SimpleNamespace(failed=step, error=error, output_tail=step.log, returncode=1)
    report_path = tmp_path / "report.json"
    with pytest.raises(buildrun.BuildFailed) as exc:
        buildrun._fail(SimpleNamespace(tag="trainbox/cpu:abc"), result, {"stack": "cpu"}, report_path)
    said = "`docker builder prune -af`" in str(exc.value)
    assert said == stale, str(exc.value)
    assert ("fix" in json.loads(report_path.read_text())["error"]) == stale
