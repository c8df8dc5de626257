"""`base bootstrap` and `fetch` refuse bad input in one line before anything slow runs, and an interrupted
bootstrap leaves nothing behind (issue 37)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from trainbox.image import base
from trainbox.supply import fetch
from trainbox.cli import main
from trainbox.paths import REPO_ROOT, STACKS_DIR


@pytest.fixture
def no_engine(monkeypatch):
    """Input checks come first: nothing may ask the engine, run debootstrap or fetch."""
    monkeypatch.setattr(base, "find_client", lambda: pytest.fail("the engine was asked before the input check"))
    monkeypatch.setattr(base.shutil, "which", lambda *_: pytest.fail("debootstrap looked for before the check"))


@pytest.mark.parametrize("argv, option", [
    (["--tag", "x;id"], "--tag"),
    (["--tag", "local/debian:bookworm$(id)"], "--tag"),
    (["--tag", "Local/Debian:x y"], "--tag"),
    (["--tag", "local/debian@sha256:" + "a" * 64], "--tag"),
    (["--tag=-x"], "--tag"),
    (["--suite", "bookworm;id"], "--suite"),
    (["--suite", "../../etc"], "--suite"),
    (["--suite", "bookworm\nx"], "--suite"),
    (["--suite=--foreign"], "--suite"),
    (["--mirror", "http://deb.debian.org/debian;id"], "--mirror"),
    (["--mirror", "http://deb.debian.org/debian $(id)"], "--mirror"),
    (["--mirror", "ftp://deb.debian.org/debian"], "--mirror"),
    (["--mirror=--keyring=/tmp/k"], "--mirror"),
    (["--mirror", "http://user:s3cret@mirror.example/debian"], "--mirror"),
    (["--security-mirror", "http://x\n/debian"], "--security-mirror"),
    (["--include", "curl;id"], "--include"),
    (["--include", "curl,wget"], "--include"),
    (["--include=--no-check-gpg"], "--include"),
    (["--include", "curl=7.0"], "--include"),
    (["--include", "$(id)"], "--include"),
    (["--include", "curl\n"], "--include"),
    (["--suite", "bookworm\n"], "--suite"),
    (["--tag", "local/debian:bookworm\n"], "--tag"),
])
def test_bootstrap_inputs_are_refused_before_anything_runs(no_engine, capsys, argv, option):
    t0 = time.monotonic()
    assert main(["base", "bootstrap", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"trainbox: error: {option} ") and err.count("\n") == 1, err
    assert "s3cret" not in err
    assert time.monotonic() - t0 < 60  # a hang guard: minutes of debootstrap would pass it


def test_a_bad_mirror_from_the_environment_is_named(no_engine, capsys, monkeypatch):
    monkeypatch.setenv("TRAINBOX_DEBIAN_MIRROR", "http://x/debian;touch /tmp/p")
    assert main(["base", "bootstrap"]) == 2
    assert "$TRAINBOX_DEBIAN_MIRROR" in capsys.readouterr().err


def test_good_bootstrap_inputs_pass_the_check():
    base.check_bootstrap_inputs("local/debian:bookworm-arm64", "bookworm", "http://deb.debian.org/debian",
                                "none", ["curl", "libstdc++6", "python3.11-venv"])
    base.check_bootstrap_inputs(None, "trixie", None, base.DEFAULT_SECURITY_MIRROR, None)


FAKE_DEBOOTSTRAP = textwrap.dedent("""\
    #!/bin/bash
    # a stand-in for debootstrap (this test must not download Debian): fills the target and waits
    target=${@: -2:1}
    mkdir -p "$target/var/cache"
    head -c 20000000 /dev/zero > "$target/var/cache/big"
    touch "$target/.ready"
    exec sleep 300
    """)

DRIVER = textwrap.dedent("""\
    import sys
    from trainbox.image import base
    from trainbox.cli import main

    class Client:  # a stand-in for the engine: the tag does not exist yet
        def require_engine(self): pass
        def image_info(self, tag): return None

    base.find_client = lambda: Client()
    sys.exit(main(["base", "bootstrap", "--tag", "trainbox-test/never:made"]))
    """)


@pytest.mark.skipif(os.geteuid() != 0, reason="bootstrap refuses to run debootstrap without root")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_an_interrupted_bootstrap_leaves_no_tree_behind(tmp_path, sig):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "debootstrap").write_text(FAKE_DEBOOTSTRAP)
    (bin_dir / "debootstrap").chmod(0o755)
    work = tmp_path / "var-tmp"
    work.mkdir()
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", TRAINBOX_BOOTSTRAP_TMP=str(work),
               PYTHONPATH=str(REPO_ROOT / "python"))
    proc = subprocess.Popen([sys.executable, "-c", DRIVER], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not list(work.glob("trainbox-debootstrap-*/rootfs/.ready")):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.1)
        proc.send_signal(sig)
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert list(work.iterdir()) == [], "the debootstrap tree was left behind"
    ps = subprocess.run(["pgrep", "-f", "sleep 300"], capture_output=True, text=True)
    mine = [p for p in ps.stdout.split() if Path(f"/proc/{p}/environ").exists()
            and str(work).encode() in Path(f"/proc/{p}/environ").read_bytes()]
    assert not mine, "debootstrap was left running"


def _one_platform_stack(tmp_path: Path) -> Path:
    d = tmp_path / "stacks"
    d.mkdir()
    for ext in (".yaml", ".lock"):
        (d / f"cpu{ext}").write_bytes((STACKS_DIR / f"cpu{ext}").read_bytes())
    data = yaml.safe_load((d / "cpu.yaml").read_text())
    data["platforms"] = ["linux/amd64"]
    (d / "cpu.yaml").write_text(yaml.safe_dump(data))
    return d / "cpu.yaml"


@pytest.mark.parametrize("plat", ["linux/s390x", "linux/386", "windows/amd64", "linux/amd64\n", "amd64", ""])
@pytest.mark.parametrize("bundle", [False, True])
def test_fetch_refuses_a_platform_no_stack_targets(tmp_path, capsys, monkeypatch, plat, bundle):
    monkeypatch.setattr(fetch, "load_stack", lambda *a, **k: pytest.fail("loaded before --platform was checked"))
    argv = ["fetch", "cpu", "--platform", plat] + (["--bundle", str(tmp_path / "b.tar")] if bundle else [])
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--platform" in err and "expected one of linux/amd64, linux/arm64" in err and err.count("\n") == 1
    assert not (tmp_path / "b.tar").exists()


def test_fetch_refuses_a_platform_the_stack_does_not_have(tmp_path, capsys, monkeypatch):
    from trainbox.supply import fetch as fetching

    monkeypatch.setattr(fetching, "fetch", lambda *a, **k: pytest.fail("fetched for a refused platform"))
    assert main(["fetch", str(_one_platform_stack(tmp_path)), "--platform", "linux/arm64"]) == 2
    err = capsys.readouterr().err
    assert "--platform linux/arm64: stack cpu supports linux/amd64" in err and err.count("\n") == 1


@pytest.mark.parametrize("plat", ["linux/s390x", "linux/arm64/v8", "darwin/arm64"])
def test_image_wheelhouse_refuses_a_platform_no_stack_targets(tmp_path, capsys, monkeypatch, plat):
    from trainbox.supply import wheelhouse

    monkeypatch.setattr(wheelhouse, "fill", lambda *a, **k: pytest.fail("filled for a refused platform"))
    assert main(["image", "wheelhouse", "cpu", "--platform", plat, "-o", str(tmp_path / "wh")]) == 2
    err = capsys.readouterr().err
    assert "--platform" in err and "expected one of linux/amd64, linux/arm64" in err and err.count("\n") == 1
    assert not (tmp_path / "wh").exists()
