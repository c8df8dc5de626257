"""Real image builds on a real Docker engine (marker `docker`): the cpu image, Dockerfile.npu's own steps,
what the layers hold, and what a rebuild costs."""

from __future__ import annotations

import hashlib
import json
import uuid
from pathlib import Path

import pytest

import docker_helpers as dh

pytestmark = [pytest.mark.docker, pytest.mark.slow]


@pytest.fixture(scope="module")
def cpu_build():
    return dh.build_cpu_outcome()


@pytest.fixture(scope="module")
def npu_build():
    return dh.build_npu_template_outcome()


def _cat(tag: str, path: str) -> str:
    proc = dh.run_in_image(tag, "cat", path, entrypoint="", timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


# -- the cpu image -----------------------------------------------------------------------------------

def test_cpu_labels_and_manifest_match_the_stack(cpu_build):
    from trainbox.specs.stack import load_stack

    stack = load_stack("cpu")
    client = dh.docker_client()
    labels = client.labels(cpu_build.tag)
    assert labels["io.trainbox.stack"] == "cpu"
    assert labels["io.trainbox.runtime.device"] == "cpu"
    assert labels["io.trainbox.python"] == stack.python
    assert labels["io.trainbox.torch"] == stack.components["torch"].version
    assert labels["io.trainbox.content-hash"] == cpu_build.report["content_hash"]
    assert labels["io.trainbox.content-hash"].startswith(cpu_build.tag.rsplit(":", 1)[1])

    manifest = json.loads(_cat(cpu_build.tag, "/etc/trainbox/stack.json"))
    assert manifest["schema"] == 1 and manifest["stack"] == "cpu" and manifest["device"] == "cpu"
    assert manifest["python"] == stack.python
    assert manifest["base"]["image"] == stack.base.image
    assert manifest["base"]["substituted"] == cpu_build.report["base"]["substituted"]
    assert manifest["env"] == stack.env
    for key, comp in stack.installed_components.items():
        assert manifest["components"][key]["version"] == comp.version, key
    assert manifest["overrides"] == {}


def test_cpu_layers_hold_no_caches_and_no_secrets(cpu_build):
    """Scan every layer of the `docker save` archive: no pip cache, apt lists or packages, nothing
    from the CA bundle or the index credentials that reached the build as secrets."""
    from imagescan import scan_image

    client = dh.docker_client()
    image_bundle = _cat(cpu_build.tag, "/etc/ssl/certs/ca-certificates.crt").encode()
    needles = dh.secret_needles(image_bundle)
    assert "marker#0" in needles  # the marker at least
    scan = scan_image(client, cpu_build.tag, hash_files=True, needles=needles)
    assert scan.layer_count >= 3 and len(scan.files) > 1000  # really read the layers
    caches = [(f.layer, f.path) for f in scan.cache_files()]
    assert not caches, f"caches in the image's layers: {caches[:20]}"
    assert not [f.path for f in scan.files if f.path.startswith("var/lib/apt/lists/") and f.kind == "file"
                and not f.path.endswith("lock")]
    assert not [f.path for f in scan.files if f.path.startswith("run/secrets/") and f.kind == "file"]
    assert not scan.needle_hits, f"secret material in layers: {scan.needle_hits}"
    bundle_sha = hashlib.sha256(dh.marker_ca_bundle().read_bytes()).hexdigest()
    assert not [f.path for f in scan.files if f.sha256 == bundle_sha]


def test_cpu_history_and_config_show_no_secret(cpu_build):
    client = dh.docker_client()
    history = json.dumps(client.history(cpu_build.tag))
    config = json.dumps(client.inspect(cpu_build.tag).get("Config"))
    for label, needle in dh.secret_needles().items():
        text = needle.decode()
        assert text not in history, label
        assert text not in config, label
    assert "trainbox-test:" not in history  # the index URL's user, in any form
    assert "pip_cert" not in config and "PIP_CERT=" not in config


def test_torch_has_a_layer_of_its_own_that_the_next_step_leaves_alone(cpu_build):
    """torch is installed in a layer of its own (partials/install.j2), which the stacks on one base that pin it
    alike share. The pip step after it compiles and stamps only what it installs itself: touching one of torch's
    files would copy the whole file into its layer, which would then hold a second torch."""
    layers = dh.history_layers(cpu_build.tag)
    own = [size for text, _c, _d, size in layers if dh.TORCH_STEP in text]
    rest = [size for text, _c, _d, size in layers if dh.PINS_STEP in text]
    assert len(own) == 1 and len(rest) == 1, [text[-80:] for text, *_ in layers]
    assert own[0] > 500e6, own  # torch 2.13.0+cpu and its bytecode
    assert rest[0] < own[0] / 2, (own, rest)  # numpy, sympy, networkx ... and nothing of torch's


def test_cpu_container_runs_torch_under_tini(cpu_build):
    proc = dh.run_in_image(
        cpu_build.tag, "python", "-c",
        "import torch, trainbox, sys; print(torch.__version__, torch.zeros(2).device, trainbox.__version__); "
        "print(open('/proc/1/cmdline').read().replace(chr(0), ' '))",
        timeout=180)
    assert proc.returncode == 0, proc.stderr
    first, pid1 = proc.stdout.strip().splitlines()[:2]
    assert first.startswith("2.13.0+cpu cpu ")
    assert "tini" in pid1 and "-g" in pid1.split()


def test_cpu_image_holds_the_runtime_half_and_no_host_module(cpu_build):
    proc = dh.run_in_image(
        cpu_build.tag, "sh", "-c",
        "python3 -c 'import trainbox.image.render' 2>&1; echo rc=$?; "
        "python3 -m trainbox.runtime.doctor --quick --json | grep -c '\"schema\": 1'; "
        "trainbox doctor --quick | grep -c '^summary: '; echo cli; ls /opt/trainbox/python/trainbox",
        timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "No module named 'trainbox.image'" in out and "rc=1" in out  # the image stage's package is not shipped
    lines = out.splitlines()
    assert lines[lines.index("rc=1") + 1:][:2] == ["1", "1"], out  # both doctor entry points ran and reported (a FAIL on this host is fine)
    assert sorted(out.split("\ncli\n", 1)[1].split()) == ["__init__.py", "__pycache__", "cli.py", "commands",
                                                          "runtime"]


def test_cpu_final_stage_has_no_build_tools(cpu_build):
    proc = dh.run_in_image(
        cpu_build.tag, "sh", "-c",
        "for t in gcc cc c++ make patch git; do command -v $t; done; "
        "dpkg-query -W -f '${Package}\\n' | grep -E '^(build-essential|gcc|g\\+\\+|make|patch|python3-venv|"
        "python3-pip|libpython3.*-dev)$'; ls /root/.cache 2>/dev/null; true",
        entrypoint="", timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "", f"build-only tools in the final image: {proc.stdout}"


# -- Dockerfile.npu's own steps ----------------------------------------------------------------------

def test_npu_template_builds_with_user_overrides(npu_build):
    client = dh.docker_client()
    labels = client.labels(npu_build.tag)
    assert labels["io.trainbox.stack"] == "npu-910b"
    manifest = json.loads(_cat(npu_build.tag, "/etc/trainbox/stack.json"))
    expected = {**dh.NPU_OVERRIDES, "base.image": dh.ensure_base()}
    for key, value in expected.items():
        assert manifest["overrides"].get(key) == value, key
    assert npu_build.report["overrides"] == manifest["overrides"]
    assert manifest["base"]["image"].startswith("quay.io/ascend/cann:")  # what the stack declares
    assert manifest["components"]["torch-npu"]["version"] == "2.13.0"
    proc = dh.run_in_image(
        npu_build.tag, "sh", "-c",
        "python -m pip list --format=freeze 2>/dev/null | grep -iE '^(torch|torch.npu|triton.ascend|megatron.core)=='",
        entrypoint="", timeout=60)
    installed = dict(line.split("==") for line in proc.stdout.split())
    installed = {k.lower().replace("_", "-"): v for k, v in installed.items()}
    assert installed == {"torch": "2.13.0+cpu", "torch-npu": "2.13.0", "triton-ascend": "3.2.0",
                         "megatron-core": "0.15.3"}


def test_npu_template_torch_npu_fails_like_a_host_without_cann(npu_build):
    proc = dh.run_in_image(npu_build.tag, "python", "-c", "import torch_npu", entrypoint="", timeout=120)
    assert proc.returncode != 0
    assert "libhccl.so" in proc.stderr or "libascend" in proc.stderr, proc.stderr[-2000:]


# -- rebuilds ----------------------------------------------------------------------------------------

def test_rebuild_without_change_answers_from_the_hash_tag(cpu_build):
    """Answered from the content-hash tag: no build ran (its time is bench/build.py's "no-change rebuild")."""
    from trainbox.image.build import build

    again = build(dh.build_options(stack="cpu", wheelhouse=str(dh.wheelhouse_dir()),
                                   ca_bundle=str(dh.marker_ca_bundle()), report=str(dh._report_path("cpu-again"))))
    assert again.skipped and again.tag == cpu_build.tag and again.report["steps"] == []
    assert again.report["image_id"] == dh.docker_client().image_id(cpu_build.tag)


def _edited_repo(tmp_path: Path, edit: str) -> Path:
    """A copy of the checkout's build inputs with one file changed (the checkout itself is not touched)."""
    from trainbox.image.plan import copy_inputs

    root = tmp_path / "repo"
    copy_inputs(root)
    target = root / edit
    # unique each run: BuildKit's cache outlives the test, and a repeated edit would be answered from it
    target.write_text(target.read_text() + f"\n# edited by test_image_docker {uuid.uuid4().hex}\n")
    return root


def _steps_after(report: dict, marker: str, files_marker: str) -> tuple[list[dict], list[dict]]:
    """The steps before and from the first one that must rerun: in the files stage from the RUN that assembles
    the edited part (`files_marker`), in the final stage from the COPY that takes it (`marker`)."""
    steps = [s for s in report["steps"] if not s.get("from")]
    files = [s for s in steps if s.get("stage") == "files"]
    rest = [s for s in steps if s.get("stage") != "files"]
    f = next(i for i, s in enumerate(files) if files_marker in s["name"])
    first = next(i for i, s in enumerate(rest) if marker in s["name"])
    return files[:f] + rest[:first], files[f:] + rest[first:]


@pytest.mark.parametrize("edit,first_rebuilt,files_marker", [
    ("launchers", "COPY --from=files /out/launchers/", "source=launchers"),
    ("python/trainbox/__init__.py", "COPY --from=files /out/package/", "source=python/trainbox"),
])
def test_edit_rebuilds_only_later_steps(cpu_build, tmp_path, monkeypatch, edit, first_rebuilt, files_marker):
    from trainbox.image import build as image_build
    from trainbox.paths import REPO_ROOT

    if edit == "launchers":
        files = sorted(p for p in (REPO_ROOT / "launchers").rglob("*") if p.is_file())
        assert files, "no launcher files to edit"
        edit = str(files[0].relative_to(REPO_ROOT))
    opts = dict(stack="cpu", wheelhouse=str(dh.wheelhouse_dir()), ca_bundle=str(dh.marker_ca_bundle()),
                tag_latest=False, labels={"trainbox.test": "1"})
    # The unedited tree built again just before (all cached, unless something dropped its cache): the cpu image
    # may have been built long ago, and the docker queues beside this one build the same first steps meanwhile,
    # some with --no-cache (test_repro_docker), which re-points BuildKit's cache index at their own results. Such a
    # build between the two below makes a step before the edit run again with the same result: the pair is made
    # once more then (with a new edit), and only a pair whose earlier steps were all cached is judged. The check
    # stays as strict: an edit that invalidates an earlier step does so every time and fails both tries.
    for attempt in (1, 2):
        unedited = image_build.build(dh.build_options(**opts, force=True, report=str(tmp_path / "unedited.json")))
        assert unedited.tag != cpu_build.tag  # its label gives it its own tag: removing it below leaves the cpu image
        out = image_build.build(dh.build_options(**opts, source_root=_edited_repo(tmp_path / f"try{attempt}", edit),
                                                 report=str(tmp_path / "report.json")))
        try:
            assert not out.skipped and out.tag not in (cpu_build.tag, unedited.tag)
            before, after = _steps_after(out.report, first_rebuilt, files_marker)
            rerun = [(s["name"][:60], s["status"]) for s in before if s["status"] != "cached"]
            if rerun and attempt == 1:
                continue
            assert before and not rerun, rerun
            assert after and all(s["status"] == "done" for s in after), \
                [(s["name"][:60], s["status"]) for s in after]
            assert json.loads((tmp_path / "report.json").read_text())["rebuilt_steps"] == len(after)
            break
        finally:
            dh.docker_client().remove_image(out.tag)
            dh.docker_client().remove_image(unedited.tag)


def test_substituted_wheel_fails_the_build_in_hash_checking_mode(tmp_path, cpu_build):
    """With the early wheelhouse check turned off, pip itself must refuse a wheel whose bytes are
    not the pinned ones (a substituted file under the right name)."""
    from trainbox.image.build import build
    from trainbox.image.run import BuildFailed

    wh = tmp_path / "wh"
    wh.mkdir()
    real = next(p for p in dh.wheelhouse_dir().iterdir() if p.name.startswith("torch-2.13.0+cpu"))
    (wh / real.name).write_bytes(b"PK\x03\x04 not the pinned wheel")
    with pytest.raises(BuildFailed) as exc:
        build(dh.build_options(stack="cpu", wheelhouse=str(wh), ca_bundle=str(dh.marker_ca_bundle()),
                               tag_latest=False, labels={"trainbox.test": "1"}, check_wheelhouse=False,
                               report=str(tmp_path / "report.json")))
    msg = str(exc.value)
    assert "pip install" in msg and "HASHES" in msg.upper(), msg[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["ok"] is False and "pip install" in report["error"]["step"]
    assert any("hash" in line.lower() for line in report["error"]["last_lines"])


def test_build_report_written(cpu_build):
    report = cpu_build.report
    for key in ("tag", "image_id", "size", "layers", "wall_s", "steps", "content_hash", "base"):
        assert key in report, key
    assert report["ok"] is True and report["size"] > 100_000_000
    assert all({"created_by", "size"} <= set(layer) for layer in report["layers"])
    assert sum(layer["size"] for layer in report["layers"]) == pytest.approx(report["size"], rel=0.05)
    if not report.get("skipped"):
        assert report["steps"] and {s["status"] for s in report["steps"]} <= {"cached", "done"}
    # the same report on disk
    assert json.loads(Path(cpu_build.report_path).read_text())["tag"] == cpu_build.tag


def test_dry_run_command_builds_as_printed(cpu_build, tmp_path):
    """The command a dry run prints runs as printed (its context and secret files exist) and makes the very
    image the plan names: the same content-hash tag and label."""
    import subprocess

    from trainbox.image import build as image_build

    dh.docker_client()
    out = image_build.build(dh.build_options(
        stack="cpu", wheelhouse=str(dh.wheelhouse_dir()), dry_run=True, tag_latest=False,
        labels={"trainbox.test": "1", "trainbox.test.dry-run": uuid.uuid4().hex[:8]}))
    assert out.report["schema"] == "trainbox.image-plan/1" and out.report["base"]["image_id"]
    client = dh.docker_client()
    assert not client.image_exists(out.tag)  # the dry run built nothing
    try:
        proc = subprocess.run(["bash", "-c", out.report["command"]], capture_output=True, text=True, timeout=1500)
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
        assert client.image_exists(out.tag)
        assert client.labels(out.tag)["io.trainbox.content-hash"] == out.report["content_hash"]
    finally:
        client.remove_image(out.tag, force=True)
