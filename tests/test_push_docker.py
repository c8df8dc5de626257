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
    from trainbox.push import push

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
    then no longer warn that nodes cannot pull the image. Returns the rendered references."""
    from trainbox.inventory import built_images
    from trainbox.launch.targets import resolve_for, unpullable

    report = json.loads(outcome.report_path.read_text())
    assert pushed.ref in [p["ref"] for p in report["pushed"]]
    assert [i.digests for i in built_images(["cpu"])
            if pushed.image_id.removeprefix("sha256:").startswith(i.id)] == [[pushed.ref]]
    refs = _rendered_refs("slurm", pushed.source) + _rendered_refs("volcano", pushed.source)
    assert refs == [pushed.ref, pushed.ref], refs
    assert unpullable(resolve_for("slurm", "cpu-ddp", nodes=2, image=pushed.source), "slurm") is None
    return refs


def test_push_refuses_a_bad_registry_before_the_engine(tmp_path):
    from trainbox.push import check_registry
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
