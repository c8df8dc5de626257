"""From the build host to a registry and back (marker `docker`): the cpu image pushed to a real registry on
127.0.0.1 (Debian's docker-registry), deleted here, pulled again by the digest the rendered Slurm script and
Kubernetes manifest name, and run with no network."""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml

import docker_helpers as dh
from registry_helpers import local_registry

pytestmark = [pytest.mark.docker, pytest.mark.slow]


@pytest.fixture(scope="module")
def registry():
    try:
        with local_registry() as where:
            yield where
    except FileNotFoundError as exc:
        dh._unavailable(str(exc))


def _docker(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([dh.docker_client().docker, *args], capture_output=True, text=True, timeout=timeout)


def _rendered_refs(target: str) -> list[str]:
    from trainbox.launch.targets import render_target, resolve_for

    job = resolve_for(target, "cpu-ddp", nodes=2)
    out = render_target(job, target)
    if target == "slurm":
        return [job.image] if job.image in out else []
    return [d["spec"]["tasks"][0]["template"]["spec"]["containers"][0]["image"]
            for d in yaml.safe_load_all(out) if d["kind"] == "Job"]


def test_push_pull_by_digest_run(registry, tmp_path):
    from trainbox.launch.targets import resolve_for, unpullable
    from trainbox.push import push

    outcome = dh.build_cpu_outcome()
    lines: list[str] = []
    pushed = push("cpu", registry, say=lines.append, report=outcome.report_path)
    assert pushed.ref == f"{registry}/trainbox/cpu@{pushed.digest}" and pushed.digest.startswith("sha256:")
    assert any("Pushed" in ln or "Layer already exists" in ln for ln in lines), lines
    # the build report records the push; the registry serves that very manifest
    report = json.loads(outcome.report_path.read_text())
    assert pushed.ref in [p["ref"] for p in report["pushed"]]
    # the cluster targets name the pushed digest, and no longer warn that nodes cannot pull it
    refs = _rendered_refs("slurm") + _rendered_refs("volcano")
    assert refs == [pushed.ref, pushed.ref], refs
    assert unpullable(resolve_for("slurm", "cpu-ddp", nodes=2), "slurm") is None

    # delete every local name of the image, so only the registry has it (tags come back afterwards)
    tags = json.loads(_docker("image", "inspect", "--format", "{{json .RepoTags}}", pushed.image_id).stdout)
    try:
        rm = _docker("image", "rm", *tags, f"{registry}/trainbox/cpu@{pushed.digest}")
        assert rm.returncode == 0, rm.stderr
        assert _docker("image", "inspect", pushed.image_id).returncode != 0, "the image is still here"
        pull = _docker("pull", refs[0])
        assert pull.returncode == 0, pull.stderr
        assert _docker("image", "inspect", "--format", "{{.Id}}", refs[0]).stdout.strip() == pushed.image_id
        run = dh.run_in_image(refs[0], "python", "-c", "import torch, trainbox; print('ran', torch.__version__)",
                              timeout=300)
        assert run.returncode == 0 and "ran " in run.stdout, run.stdout + run.stderr
    finally:
        for tag in tags:
            _docker("tag", pushed.image_id, tag)
        # the registry goes with the test: no name of it may stay on the image (renders elsewhere would pin it)
        _docker("image", "rm", pushed.tag, pushed.ref)


def test_push_refuses_a_bad_registry_before_the_engine(tmp_path):
    from trainbox.push import check_registry
    from trainbox.runtime.errors import TrainboxError

    for bad in ("https://registry.example.com", "registry example", "Registry.Example.com/UPPER", ""):
        with pytest.raises(TrainboxError, match="--registry"):
            check_registry(bad)
    assert check_registry("127.0.0.1:5000/") == "127.0.0.1:5000"
    assert check_registry("registry.example.com/ml") == "registry.example.com/ml"
