"""`trainbox jobs / status / logs / cancel` against real docker jobs in the cpu image: a job that ends is
`succeeded` with its log kept after the container is gone; a long job started with --detach is listed, followed
(`logs -f` ends when the job does), cancelled (docker stop: SIGTERM through tini to torchrun, within the 20 s
grace) and then `cancelled`, with no container left and its log still readable."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def tb(env, *args, timeout=300, **kw):
    return subprocess.run([sys.executable, "-m", "trainbox.cli", *args], env=env, capture_output=True, text=True,
                          timeout=timeout, **kw)


@pytest.fixture
def env(tmp_path):
    return dict(os.environ, TRAINBOX_CACHE=str(tmp_path / "cache"))


def _container(name: str) -> list[str]:
    return subprocess.run(["docker", "ps", "-aq", "--filter", f"name=^{name}$"], capture_output=True, text=True,
                          timeout=60).stdout.split()


def test_a_finished_job_is_succeeded_and_its_log_outlives_the_container(env, cpu_image, tmp_path):
    run = tb(env, "run", "cpu-ddp", "--image", cpu_image, "--nproc-per-node", "1", "--set", "STEPS=20", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    (name,) = re.findall(r"job (cpu-ddp-[0-9a-f]{6}) \(", run.stderr)  # the unique name, shown at submit
    assert _container(name) == []  # --rm: gone
    status = tb(env, "status", name, "--json")
    assert status.returncode == 0, status.stderr
    job = json.loads(status.stdout)["job"]
    assert job["state"] == "succeeded" and job["exit_code"] == 0 and job["target"] == "docker"
    logs = tb(env, "logs", name)
    assert logs.returncode == 0 and len(re.findall(r"^step\s+\d+ loss ", logs.stdout, re.M)) == 20
    again = tb(env, "run", "cpu-ddp", "--image", cpu_image, "--nproc-per-node", "1", "--set", "STEPS=1",
               "--name", name)
    assert again.returncode == 2 and "one per submission" in again.stderr  # a name is never reused


def test_a_detached_job_is_listed_followed_and_cancelled(env, cpu_image, tmp_path):
    start = tb(env, "run", "cpu-ddp", "--detach", "--image", cpu_image, "--nproc-per-node", "1",
               "--set", "STEPS=100000000", cwd=tmp_path, timeout=600)
    assert start.returncode == 0, start.stderr
    name = start.stdout.strip()
    assert re.fullmatch(r"cpu-ddp-[0-9a-f]{6}", name) and name in start.stderr
    follower = None
    try:
        deadline = time.monotonic() + 180
        while "step " not in tb(env, "logs", name).stdout:  # training has begun
            assert time.monotonic() < deadline, tb(env, "logs", name).stdout
            time.sleep(1)
        listed = json.loads(tb(env, "jobs", "--json").stdout)["jobs"]
        assert [(j["name"], j["state"], j["container"]) for j in listed] == [(name, "running", name)]
        assert tb(env, "status", name).returncode == 0
        assert tb(env, "cancel", name, "--dry-run").stdout.split() == ["docker", "stop", "--time", "20", name]
        follower = subprocess.Popen([sys.executable, "-m", "trainbox.cli", "logs", name, "-f"], env=env,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        cancel = tb(env, "cancel", name, timeout=120)
        assert cancel.returncode == 0 and f"{name}: cancelled" in cancel.stdout, cancel.stdout + cancel.stderr
        out, _ = follower.communicate(timeout=60)  # -f ends with the job
        assert follower.returncode == 0 and "step " in out and "got signal: 15" in out, out[-2000:]
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, timeout=60)
        if follower and follower.poll() is None:
            follower.kill()
    assert _container(name) == []
    status = tb(env, "status", name, "--json")
    job = json.loads(status.stdout)["job"]
    assert status.returncode == 1 and job["state"] == "cancelled" and job["cancel_requested"]
    deadline = time.monotonic() + 120  # the detached follower records the container's exit status
    while job.get("exit_code") is None and time.monotonic() < deadline:
        time.sleep(0.5)
        job = json.loads(tb(env, "status", name, "--json").stdout)["job"]
    # torchrun ends on SIGTERM with a failure status; 137 would be docker's SIGKILL after the grace (judged by the
    # status, not by the clock: a loaded machine is slow, not wrong)
    assert job["exit_code"] not in (None, 0, 137)
    assert "got signal: 15" in tb(env, "logs", name).stdout  # the log outlives the container
    assert "already cancelled" in tb(env, "cancel", name).stdout


def test_a_detached_job_that_cannot_start_says_why_and_leaves_no_record(env, tmp_path):
    out = tb(env, "run", "cpu-ddp", "--detach", "--image", "trainbox-test/no-such-image:1", "--nproc-per-node", "1")
    assert out.returncode == 2 and "is not present" in out.stderr and out.stdout == ""
    assert json.loads(tb(env, "jobs", "--json").stdout)["jobs"] == []
    assert not list((tmp_path / "cache" / "runs").glob("*"))
