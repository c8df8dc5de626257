"""`trainbox run` for real, in the cpu image: cpu-ddp trains and exits 0 with a falling loss; a failing job's
exit code comes back; the Ray CPU recipe starts a Ray head inside the container on 127.0.0.1, submits its
job and exits 0. Containers are labelled trainbox.test=1 and removed (--rm)."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.docker, pytest.mark.slow]

LABEL = "trainbox.test=1"


def trainbox_run(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainbox.cli", "run", *args, "--label", LABEL],
                          capture_output=True, text=True, timeout=timeout)


def losses(output: str) -> list[float]:
    return [float(m) for m in re.findall(r"^step\s+\d+ loss ([0-9.]+)$", output, re.M)]


def leftover_containers(recipe: str) -> list[str]:
    out = subprocess.run(["docker", "ps", "-aq", "--filter", f"label={LABEL}",
                          "--filter", f"label=trainbox.recipe={recipe}"], capture_output=True, text=True)
    return out.stdout.split()


def test_cpu_ddp_trains_in_the_cpu_image(cpu_image, tmp_path):
    # a metrics directory whose name is hostile to shells and to docker's --mount syntax
    out_dir = tmp_path / "out dir, it's \"q\" $(touch pwned)"
    proc = trainbox_run("cpu-ddp", "--image", cpu_image, "--set", "STEPS=20", "--set", f"OUTPUT_DIR={out_dir}")
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    seen = losses(proc.stdout)
    assert len(seen) == 20 and seen[-1] < seen[0] * 0.5, seen
    assert "cpu-ddp: loss fell" in proc.stdout
    assert "backend gloo" in proc.stdout and "ranks reporting: [0, 1]" in proc.stdout
    metrics = json.loads((out_dir / "metrics.json").read_text())
    assert metrics["world_size"] == 2 and metrics["ok"] is True
    assert sorted(r["rank"] for r in metrics["ranks"]) == [0, 1]
    assert not (tmp_path / "pwned").exists() and not list(tmp_path.rglob("pwned"))
    assert leftover_containers("cpu-ddp") == []


def test_the_job_s_exit_code_comes_back(cpu_image):
    # two steps cannot halve the loss: the job exits 1 and so must `trainbox run`
    proc = trainbox_run("cpu-ddp", "--image", cpu_image, "--set", "STEPS=2")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "did NOT fall enough" in proc.stdout
    # the container is gone (--rm); its output is kept, and where is said
    log = re.search(r"job (cpu-ddp-[0-9a-f]{6}) failed, exit 1; log kept at (\S+) \(trainbox logs \1\)", proc.stderr)
    assert log and "did NOT fall enough" in open(log.group(2)).read(), proc.stderr[-2000:]


def free_port_block(n: int) -> int:
    """A base port with n free ports after it (the Ray head derives its agents' ports from its own), between Ray's
    worker ports and the kernel's ephemeral range. Not from the ephemeral range: Ray's own processes bind
    ephemeral ports while the head starts, and once one of them took the dashboard port chosen there before the
    dashboard bound it ("address already in use")."""
    import random

    from trainbox.launch.ports import RAY_WORKER_PORTS

    try:
        ephemeral = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral = 32768
    low, high = RAY_WORKER_PORTS[1] + 1, ephemeral - n
    for _ in range(200):
        base = random.randrange(low, high)
        socks = []
        try:
            for p in range(base, base + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no block of {n} free ports in {low}-{high + n}")


def test_ray_cpu_recipe_runs_a_real_ray_head(cpu_ray_image):
    ray_port = free_port_block(9)  # the head and its agents' 8 ports, then the dashboard: one block, no overlap
    dash = ray_port + 8
    proc = trainbox_run("ray-cpu", "--image", cpu_ray_image, "--set", f"RAY_PORT={ray_port}",
                        "--set", f"RAY_DASHBOARD_PORT={dash}", timeout=900)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert f"Ray head on 127.0.0.1:{ray_port}" in output
    assert "ray-cpu: ok: the workers see MALLOC_ARENA_MAX=2, RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES=1" \
        in output
    assert "succeeded" in output
    assert leftover_containers("ray-cpu") == []
