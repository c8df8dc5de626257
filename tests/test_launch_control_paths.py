"""A mounted path input never reaches a host control path (issue 37): not the path itself, not a path inside one,
not a parent that holds one (/var/lib holds /var/lib/docker), whether `--set` gave it or the recipe's default did;
and the rendered job script refuses the same list when it runs, on whatever host, with whatever value."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import pytest

from trainbox.cli import main
from trainbox.launch.job import HOST_CONTROL_PATHS, control_conflict, resolve
from trainbox.paths import REPO_ROOT
from trainbox.runtime.errors import TrainboxError

REFUSED = ["/var/lib", "/var", "/", "/var/run/docker.sock", "/run/containerd/containerd.sock", "/var/lib/docker",
           "/var/lib/docker/volumes/x", "/var//lib/", "/var/lib/../run", "/etc/docker", "/sys/fs/cgroup", "/dev/shm",
           "/proc/1/root", "/var/lib/kubelet/pods", "/var/lib/containerd"]
ALLOWED = ["/srv/out", "/data/ckpt", "/var/lib2", "/var/libdocker", "/home/user/out", "/runs/x"]


@pytest.mark.parametrize("path", REFUSED)
def test_control_conflict_refuses_parents_children_and_the_paths(path):
    assert control_conflict(path)


@pytest.mark.parametrize("path", ALLOWED)
def test_control_conflict_leaves_other_paths(path):
    assert control_conflict(path) is None


@pytest.mark.parametrize("cmd", [["run", "cpu-ddp", "--dry-run"], ["launch", "render", "cpu-ddp"],
                                 ["launch", "render", "cpu-ddp", "--target", "slurm"]])
@pytest.mark.parametrize("path", ["/var/lib", "/var/run/docker.sock", "/var", "/run/user/0"])
def test_set_control_path_is_refused_by_every_target(tmp_path, capsys, cmd, path):
    out = tmp_path / "job.sh"
    rc = main([*cmd, "--set", f"OUTPUT_DIR={path}", *(["-o", str(out)] if cmd[0] == "launch" else [])])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.count("\n") == 1 and f"--set OUTPUT_DIR={path}:" in err and "host control path" in err, err
    assert not out.exists()


def _recipe_with_default(tmp_path: Path, default: str) -> Path:
    recipe = tmp_path / "cpu-ddp.yaml"
    text = (REPO_ROOT / "launchers/recipes/cpu-ddp.yaml").read_text()
    recipe.write_text(text.replace("    mount: rw\n    create: true\n",
                                   f"    mount: rw\n    create: true\n    default: {default}\n", 1))
    assert f"default: {default}" in recipe.read_text()
    return recipe


@pytest.mark.parametrize("default", ["/var/lib", "/var/run/docker.sock", "/"])
def test_a_recipe_default_is_refused_without_naming_set(tmp_path, default):
    recipe = _recipe_with_default(tmp_path, default)
    for host_paths in (True, False):
        with pytest.raises(TrainboxError) as exc:
            resolve(str(recipe), host_paths=host_paths, check_paths=False, require_inputs=False)
        msg = str(exc.value)
        assert len(msg.splitlines()) == 1 and "host control path" in msg
        assert not msg.startswith("--set") and "input OUTPUT_DIR (its default" in msg, msg


def test_the_list_is_the_one_the_script_checks(tmp_path):
    assert main(["launch", "render", "cpu-ddp", "-o", str(tmp_path / "job.sh")]) == 0
    script = (tmp_path / "job.sh").read_text()
    assert "for c in " + " ".join(HOST_CONTROL_PATHS) + "; do" in script
    assert 'refuse_control_path OUTPUT_DIR "$OUTPUT_DIR"' in script


@pytest.fixture
def job_script(tmp_path) -> Path:
    """cpu-ddp's script rendered with no OUTPUT_DIR fixed: it takes it from the environment when it runs."""
    assert main(["launch", "render", "cpu-ddp", "-o", str(tmp_path / "job.sh")]) == 0
    return tmp_path / "job.sh"


def _run(script: Path, value: str) -> subprocess.CompletedProcess:
    # the check comes before anything of the job runs (no mkdir, no torchrun); TRAINBOX_LAUNCHERS points nowhere so
    # a script without the check fails later, not by running a job here
    env = dict(os.environ, OUTPUT_DIR=value, TRAINBOX_LAUNCHERS="/nonexistent")
    return subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, timeout=60)


@pytest.mark.parametrize("value", ["/var/lib", "/var/run/docker.sock", "/var/lib/docker/x", "/", "/var//lib/",
                                   "/srv/../var/lib", "/dev/shm/x"])
def test_the_rendered_script_refuses_control_paths_when_it_runs(job_script, value):
    r = _run(job_script, value)
    assert r.returncode == 2, r.stderr
    assert "host control path" in r.stderr and "OUTPUT_DIR=" in r.stderr
    assert r.stderr.count("\n") == 1


def test_the_rendered_script_refuses_a_socket_and_a_link_to_one(job_script, tmp_path):
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tmp_path / "engine.sock"))
    (tmp_path / "innocent").symlink_to(tmp_path / "engine.sock")
    try:
        for value in (tmp_path / "engine.sock", tmp_path / "innocent"):
            r = _run(job_script, str(value))
            assert r.returncode == 2 and "is a socket" in r.stderr, r.stderr
    finally:
        sock.close()


def test_the_rendered_script_passes_a_directory_of_ones_own(job_script, tmp_path):
    r = _run(job_script, str(tmp_path / "out"))
    assert "host control path" not in r.stderr and "socket" not in r.stderr
    assert (tmp_path / "out").is_dir()  # it got past the check to the input's mkdir


def test_the_sbatch_node_step_refuses_a_mount_that_resolves_to_a_control_path_there(tmp_path):
    """--target slurm: the mounts are fixed at render time, but each node resolves them itself (a link there can
    point into /var/run): the node's step checks them with the same list before `docker run`."""
    out = tmp_path / "out"
    out.mkdir()
    sbatch = tmp_path / "job.sbatch"
    assert main(["launch", "render", "cpu-ddp", "--target", "slurm", "--set", f"OUTPUT_DIR={out}",
                 "-o", str(sbatch)]) == 0
    text = sbatch.read_text()
    step = text.split("node_step=$(cat <<'TRAINBOX_NODE_STEP_EOF'\n", 1)[1].split("\nTRAINBOX_NODE_STEP_EOF", 1)[0]
    out.rmdir()
    out.symlink_to("/var/run")  # on the node, the path is now a link into a control path
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "docker-calls"
    (bin_dir / "docker").write_text(f"#!/bin/sh\necho \"$@\" >> {calls}\n")
    (bin_dir / "docker").chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", SLURM_JOB_ID="7", SLURM_NODEID="0",
               TRAINBOX_JOB_SCRIPT="echo job", TMPDIR=str(tmp_path))
    r = subprocess.run(["bash", "-c", step], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 2 and "host control path" in r.stderr, r.stderr
    assert "run" not in (calls.read_text().split() if calls.exists() else []), "docker run was started"
