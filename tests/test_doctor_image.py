"""`trainbox doctor --image IMAGE` (issue 41 item 5): the doctor run inside an image from the host, with the
options `trainbox run` gives a CPU job, and qemu's `--init` for an image of another platform, as `run` does."""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest

from trainbox.cli import main
from trainbox.launch import images


def _fake_engine(monkeypatch, present: bool):
    """A stand-in engine client that records the docker run (no engine is asked)."""
    seen = {}

    def attached(*args, log=None):
        seen["argv"] = list(args)
        return 0

    client = SimpleNamespace(require_engine=lambda: None, image_exists=lambda ref: present, attached=attached)
    monkeypatch.setattr("trainbox.image.engine.find_client", lambda: client)
    return seen


def test_the_doctor_runs_in_the_image_with_a_cpu_jobs_options(monkeypatch):
    seen = _fake_engine(monkeypatch, present=True)
    monkeypatch.setattr(images, "emulation_args", lambda image: ([], None))
    assert main(["doctor", "--image", "trainbox/cpu:latest", "--json", "--quick"]) == 0
    argv = seen["argv"]
    assert argv[:5] == ["run", "--rm", "--network", "none", "--shm-size"]
    assert argv[argv.index("trainbox/cpu:latest"):] == ["trainbox/cpu:latest", "trainbox", "doctor", "--json", "--quick"]
    assert "--init" not in argv


def test_an_image_of_another_platform_gets_dockers_init(monkeypatch, capsys):
    seen = _fake_engine(monkeypatch, present=True)
    monkeypatch.setattr(images, "emulation_args",
                        lambda image: (["--init", "--entrypoint", "trainbox-entrypoint"], "runs under qemu"))
    assert main(["doctor", "--image", "trainbox/cpu:latest-arm64"]) == 0
    argv = seen["argv"]
    assert argv[argv.index("--init"):argv.index("trainbox/cpu:latest-arm64")] == [
        "--init", "--entrypoint", "trainbox-entrypoint"]
    assert "runs under qemu" in capsys.readouterr().err


def test_a_missing_image_is_one_line_and_exit_2(monkeypatch, capsys):
    _fake_engine(monkeypatch, present=False)
    assert main(["doctor", "--image", "nosuch/image:1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "nosuch/image:1" in err and "trainbox image build" in err


@pytest.mark.docker
def test_doctor_image_in_the_cpu_image(cpu_image):
    proc = subprocess.run([sys.executable, "-m", "trainbox.cli", "doctor", "--image", cpu_image, "--json"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert report["context"]["stack"] == "cpu" and report["summary"]["fail"] == 0
    assert {c["id"]: c["status"] for c in report["checks"]}["system.shm"] == "PASS"
