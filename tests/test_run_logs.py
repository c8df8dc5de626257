"""`trainbox run` removes its containers (--rm), so it keeps each run's output itself: both streams pass through
to the terminal as before and into $TRAINBOX_CACHE/logs/RECIPE-TIME-nodeN.log, whose path it prints when the job
ends; `trainbox logs RECIPE` prints the newest. The container side is in tests/test_run_docker.py."""

from __future__ import annotations

import subprocess
import sys

from trainbox.image.engine import Client


def test_attached_keeps_both_streams_in_the_log_and_returns_the_exit_code(tmp_path, capfd):
    fake = tmp_path / "docker"
    fake.write_text("#!/bin/bash\necho \"out $*\"\necho err >&2\nexit 3\n")
    fake.chmod(0o755)
    log = tmp_path / "run.log"
    rc = Client(str(fake), "0", "buildkit").attached("run", "--rm", "img", log=log)
    out, err = capfd.readouterr()
    assert rc == 3 and out == "out run --rm img\n" and err == "err\n"  # the terminal sees what it saw before
    assert sorted(log.read_text().splitlines()) == ["err", "out run --rm img"]


def test_logs_prints_the_newest_run_of_a_recipe(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    import os
    import time

    runs = [("cpu-ddp-20260101T000000Z-node0.log", "old\n"), ("ray-cpu-20260101T000001Z-node0.log", "ray\n"),
            ("cpu-ddp-20260101T000002Z-node0.log", "new\n")]
    for i, (name, text) in enumerate(runs):
        (logs / name).write_text(text)
        os.utime(logs / name, (time.time() - 100 + i, time.time() - 100 + i))
    env = dict(os.environ, TRAINBOX_CACHE=str(tmp_path))
    cli = [sys.executable, "-m", "trainbox.cli", "logs"]
    proc = subprocess.run(cli + ["cpu-ddp"], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout == "new\n" and "cpu-ddp-20260101T000002Z-node0.log" in proc.stderr
    listed = subprocess.run(cli + ["--list"], env=env, capture_output=True, text=True, timeout=60).stdout.split()
    assert [p.rsplit("/", 1)[1] for p in listed] == [name for name, _ in runs]  # oldest first
    none = subprocess.run(cli + ["swift-megatron-qwen35-8npu"], env=env, capture_output=True, text=True, timeout=60)
    assert none.returncode == 2 and "no kept log of swift-megatron-qwen35-8npu" in none.stderr


def test_only_the_newest_logs_of_a_recipe_are_kept(tmp_path, monkeypatch):
    """Each run adds a log per node: when a run ends, all but the newest KEEP_LOGS of its recipe go; another
    recipe's logs (a name that shares the prefix included) are not touched."""
    import os
    import time

    from trainbox.launch import docker as launch_docker

    monkeypatch.setenv("TRAINBOX_CACHE", str(tmp_path))
    logs = tmp_path / "logs"
    logs.mkdir()
    now = time.time()
    names = [f"cpu-ddp-20260101T0000{i:02d}Z-node0.log" for i in range(25)]
    names += [f"cpu-ddp-long-20260101T0000{i:02d}Z-node0.log" for i in range(3)]
    for i, name in enumerate(names):
        (logs / name).write_text(name)
        os.utime(logs / name, (now - 100 + i, now - 100 + i))
    removed = launch_docker.prune_logs("cpu-ddp", keep=20)
    assert [p.name for p in removed] == names[:5]
    assert sorted(p.name for p in logs.iterdir()) == sorted(names[5:])
    assert launch_docker.prune_logs("cpu-ddp", keep=20) == []
