"""From the build host to a registry and back (marker `docker`): the cpu image pushed to a real registry on
127.0.0.1 (Debian's docker-registry), deleted here, pulled again by the digest the rendered Slurm script and
Kubernetes manifest name, and run with no network."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

import docker_helpers as dh
from registry_helpers import docker_cli, names_restored, remove_all_names

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def _rendered_refs(target: str, image: str) -> list[str]:
    """The image the rendered Slurm script or Volcano Job names, for a job given the local content-hash tag (not
    :latest, which another build on a shared engine may move meanwhile)."""
    from trainbox.launch.targets import render_target, resolve_for

    job = resolve_for(target, "cpu-ddp", nodes=2, image=image)
    out = render_target(job, target)
    if target == "slurm":
        return [job.image] if job.image in out else []
    return [d["spec"]["tasks"][0]["template"]["spec"]["containers"][0]["image"]
            for d in yaml.safe_load_all(out) if d["kind"] == "Job"]


def test_push_pull_by_digest_run(registry, tmp_path):
    from trainbox.image.push import push

    outcome = dh.build_cpu_outcome()
    lines: list[str] = []
    pushed = push("cpu", registry, say=lines.append, report=outcome.report_path)
    with names_restored(pushed):
        assert pushed.ref == f"{registry}/trainbox/cpu@{pushed.digest}" and pushed.digest.startswith("sha256:")
        assert any("Pushed" in ln or "Layer already exists" in ln for ln in lines), lines
        refs = _check_records(pushed, outcome)
        remove_all_names(pushed.image_id)  # only the registry has it now
        pull = docker_cli("pull", refs[0])
        assert pull.returncode == 0, pull.stderr
        assert docker_cli("image", "inspect", "--format", "{{.Id}}", refs[0]).stdout.strip() == pushed.image_id
        run = dh.run_in_image(refs[0], "python", "-c", "import torch, trainbox; print('ran', torch.__version__)",
                              timeout=300)
        assert run.returncode == 0 and "ran " in run.stdout, run.stdout + run.stderr


def _check_records(pushed, outcome) -> list[str]:
    """The digest is in the build report, in `image ls` (PUSHED), and in what the cluster targets render, which
    then no longer warn that the image is a local tag (but that its registry is on a loopback address). Returns
    the rendered references."""
    from trainbox.image.inventory import built_images
    from trainbox.launch.targets import resolve_for, unpullable

    report = json.loads(outcome.report_path.read_text())
    assert pushed.ref in [p["ref"] for p in report["pushed"]]
    assert [i.digests for i in built_images(["cpu"])
            if pushed.image_id.removeprefix("sha256:").startswith(i.id)] == [[pushed.ref]]
    refs = _rendered_refs("slurm", pushed.source) + _rendered_refs("volcano", pushed.source)
    assert refs == [pushed.ref, pushed.ref], refs
    # pullable by digest, though only here: the test's registry is on 127.0.0.1, which other nodes do not reach
    problem = unpullable(resolve_for("slurm", "cpu-ddp", nodes=2, image=pushed.source), "slurm")
    assert problem and "a loopback address" in problem and "local tag" not in problem, problem
    return refs


def test_push_refuses_a_bad_registry_before_the_engine(tmp_path):
    from trainbox.image.push import check_registry
    from trainbox.runtime.errors import TrainboxError

    for bad in ("https://registry.example.com", "registry example", "Registry.Example.com/UPPER", ""):
        with pytest.raises(TrainboxError, match="--registry"):
            check_registry(bad)
    assert check_registry("127.0.0.1:5000/") == "127.0.0.1:5000"
    assert check_registry("registry.example.com/ml") == "registry.example.com/ml"


def test_push_command_json_names_the_digest_the_registry_serves(registry):
    import urllib.request

    dh.build_cpu_image()
    proc = subprocess.run([sys.executable, "-m", "trainbox.cli", "image", "push", "cpu", "--registry", registry,
                           "--json"], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    try:
        assert out["ref"] == f"{registry}/trainbox/cpu@{out['digest']}"
        repo_tag = out["tag"].split("/", 1)[1]  # trainbox/cpu:HASH
        name, tag = repo_tag.rsplit(":", 1)
        req = urllib.request.Request(f"http://{registry}/v2/{name}/manifests/{tag}", method="HEAD", headers={
            "Accept": "application/vnd.docker.distribution.manifest.v2+json, "
                      "application/vnd.oci.image.manifest.v1+json"})
        with urllib.request.urlopen(req, timeout=120) as resp:
            assert resp.headers["Docker-Content-Digest"] == out["digest"]
        assert "pushing " in proc.stderr  # progress goes to stderr under --json
    finally:
        docker_cli("image", "rm", out["tag"], out["ref"])


def test_push_without_a_registry_is_a_usage_error(monkeypatch):
    monkeypatch.delenv("TRAINBOX_REGISTRY", raising=False)
    proc = subprocess.run([sys.executable, "-m", "trainbox.cli", "image", "push", "cpu"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and "--registry REG is required" in proc.stderr


def _names_of(repo: str) -> list[str]:
    out = docker_cli("image", "ls", "--format", "{{.Repository}}:{{.Tag}}", repo).stdout.split()
    return [n for n in out if n.startswith(repo + ":")]


def test_a_failed_push_exits_1_in_one_line_and_leaves_no_tag():
    """Issue 37: a registry that does not answer is a failed push (1, the registry's message, one line), not a
    usage error (2); the REG/trainbox/cpu:HASH name made for the push goes with it."""
    from registry_helpers import free_port

    dh.build_cpu_image()
    reg = f"127.0.0.1:{free_port()}"  # nothing listens there
    proc = subprocess.run([sys.executable, "-m", "trainbox.cli", "image", "push", "cpu", "--registry", reg],
                          capture_output=True, text=True, timeout=300)
    try:
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert proc.stderr.startswith("trainbox: error: push failed: ") and len(proc.stderr.splitlines()) == 1, \
            proc.stderr
        assert "connection refused" in proc.stderr
        assert _names_of(f"{reg}/trainbox/cpu") == []
    finally:
        for name in _names_of(f"{reg}/trainbox/cpu"):
            docker_cli("image", "rm", name)


def test_a_failed_push_gives_a_name_it_moved_back(tmp_path):
    """REG/trainbox/cpu:HASH named another image (an earlier build pushed there): a push that fails leaves it on
    that image, as a push that did not happen must."""
    from registry_helpers import free_port
    from trainbox.image.push import PushFailed, push

    tag = dh.build_cpu_image()
    reg = f"127.0.0.1:{free_port()}"
    name = f"{reg}/trainbox/cpu:{tag.split(':', 1)[1]}"
    client = dh.docker_client()
    client.run("import", "--change", "LABEL trainbox.test=1", "-", name, input=_empty_tar())
    other = client.image_id(name)
    try:
        with pytest.raises(PushFailed, match="connection refused"):
            push("cpu", reg, say=lambda _m: None)
        assert client.image_id(name) == other
    finally:
        client.remove_image(name)
        client.remove_image(other)


def _empty_tar() -> bytes:
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.addfile(tarfile.TarInfo("marker"), io.BytesIO(b""))
    return buf.getvalue()


def test_a_forced_rebuild_keeps_a_pushed_image_by_digest_and_leaves_no_untagged_one(registry, tmp_path):
    """Issue 37: `image build --force` moves the content-hash tag to the rebuilt image. Not pushed, the image it
    named went away (it stayed as a 1 GB `<none>`); pushed, it stays, named by its registry tag and reachable by the
    digest jobs rendered before name (the tag silently moved off it). A stack of its own on the cpu image's layers
    (all cached), so no other test's image moves."""
    import uuid

    from trainbox.image import build as image_build
    from trainbox.image.push import push

    client = dh.docker_client()
    dh.ensure_base()
    name = f"cpu-retag-{uuid.uuid4().hex[:8]}"
    stack = tmp_path / f"{name}.yaml"
    stack.write_text(yaml.safe_dump({"name": name, "extends": "cpu",
                                     "description": "the cpu stack under its own tag (a test stack)"}))
    report = tmp_path / "report.json"

    def build(force: bool):
        return image_build.build(dh.build_options(stack=str(stack), wheelhouse=str(dh.wheelhouse_dir()), tag_latest=False,
                                            force=force, labels={"trainbox.test": "1"}, report=str(report)))

    def untagged() -> list[str]:
        return docker_cli("image", "ls", "-q", "--no-trunc", "--filter", "dangling=true", "--filter",
                          f"label=io.trainbox.stack={name}").stdout.split()

    made: list[str] = []  # image ids
    names: list[str] = []
    try:
        first = build(False)
        names.append(first.tag)
        made.append(first.report["image_id"])
        second = build(True)
        made.append(second.report["image_id"])
        assert second.tag == first.tag and made[1] != made[0]
        assert client.image_info(made[0]) is None, "the replaced image stayed"
        assert second.report["replaced"] == {"image_id": made[0], "pushed": [], "kept_as": [], "removed": True}
        assert untagged() == []

        pushed = push(name, registry, say=lambda _m: None, report=report)
        names += [pushed.tag, pushed.ref]
        third = build(True)
        made.append(third.report["image_id"])
        assert client.image_id(third.tag) == made[2] != made[1]
        old = client.image_info(made[1])
        assert old is not None, "the pushed image was removed"
        assert pushed.ref in old["RepoDigests"] and old["RepoTags"] == [pushed.tag]
        assert client.image_id(pushed.ref) == made[1]  # by the digest jobs name
        assert third.report["replaced"] == {"image_id": made[1], "pushed": [pushed.ref], "kept_as": [pushed.tag],
                                            "removed": False}
        assert untagged() == []
    finally:
        for ref in names + made:
            client.remove_image(ref, force=True)
