"""`trainbox stack lock` against the real PyPI (PEP 691 JSON API): pins exist, hashes match, errors are named."""

from __future__ import annotations

import shutil

import pytest
import yaml

from trainbox.cli import main
from trainbox.supply.lock import lock_stack
from trainbox.paths import STACKS_DIR
from trainbox.specs.stack import load_stack

pytestmark = pytest.mark.network


@pytest.mark.parametrize("name", ["npu-910b", "cuda"])
def test_committed_component_hashes_match_the_index(name):
    """Every PyPI pin exists and the committed hashes are the index's (no dependency resolution: fast)."""
    stack = load_stack(name)
    rep = lock_stack(stack, resolve_deps=False)
    assert rep.problems == []
    for plat, entry in rep.lock["platforms"].items():
        for key, rec in entry["components"].items():
            assert rec["sha256"] == stack.components[key].pin_for(plat).sha256 or \
                set(stack.components[key].pin_for(plat).sha256) >= set(rec["sha256"]), (plat, key)


def test_unreachable_index_is_reported_by_name(tmp_path):
    """An index that does not answer (here a port on 127.0.0.1 nothing listens on, so it never answers) is named
    with its URL, and its pins are not taken as locked. (It asked the real download.pytorch.org and passed
    whether or not that answered: `any(...) or not rep.unreachable`.)"""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}/whl/cpu"
    shutil.copy(STACKS_DIR / "cpu.yaml", tmp_path / "cpu.yaml")
    data = yaml.safe_load((tmp_path / "cpu.yaml").read_text())
    data["indexes"]["pytorch-cpu"] = url
    (tmp_path / "cpu.yaml").write_text(yaml.safe_dump(data))
    rep = lock_stack(load_stack(tmp_path / "cpu.yaml"), resolve_deps=False)
    assert [u for u in rep.unreachable if "pytorch-cpu" in u and url in u], rep.unreachable
    assert not any("pypi" in u and "pytorch" not in u for u in rep.unreachable), rep.unreachable  # PyPI answered
    assert not [c for c in rep.changes if c.startswith("linux/amd64 torch")], rep.changes  # its pin: not locked
    assert [c for c in rep.changes if c.startswith("linux/arm64 torch")], rep.changes  # arm64's is on PyPI


def test_pin_that_does_not_exist(tmp_path, capsys):
    for f in ("cpu.yaml",):
        shutil.copy(STACKS_DIR / f, tmp_path / f)
    data = yaml.safe_load((tmp_path / "cpu.yaml").read_text())
    data["components"]["numpy"]["version"] = "0.0.999"
    (tmp_path / "cpu.yaml").write_text(yaml.safe_dump(data))
    rc = main(["stack", "lock", str(tmp_path / "cpu.yaml"), "--no-deps"])
    err = capsys.readouterr().err
    assert rc == 1
    assert "components.numpy: numpy==0.0.999 has no artifact for Python 3.11 on linux/amd64" in err
    assert not (tmp_path / "cpu.lock").exists(), "a failed lock writes nothing"


def test_lock_fills_hashes_and_deps(tmp_path, capsys):
    shutil.copy(STACKS_DIR / "cpu.yaml", tmp_path / "cpu.yaml")
    data = yaml.safe_load((tmp_path / "cpu.yaml").read_text())
    data["components"]["numpy"]["version"] = "2.3.4"
    (tmp_path / "cpu.yaml").write_text(yaml.safe_dump(data))
    assert main(["stack", "lock", str(tmp_path / "cpu.yaml")]) == 0
    out = capsys.readouterr().out
    assert "linux/amd64 numpy: - -> 2.3.4" in out
    stack = load_stack(tmp_path / "cpu.yaml")
    assert stack.lock_is_fresh()
    assert stack.components["numpy"].pin_for("linux/amd64").sha256
    assert "sympy" in stack.locked_deps("linux/amd64")  # torch's dependency closure


def test_an_sdist_only_pin_gets_its_closure_locked_on_this_platform(tmp_path):
    """crcmod 1.7 is published as an sdist only (oss2 needs it; twinkle and swift pin oss2): the wheel-only
    resolution cannot see it, and the closure was left unlocked on every platform. This host's platform is
    resolved again as the image's pip would (sdist metadata built here); the other is reported unlocked, with
    how to lock it, and the lock is written."""
    from trainbox.specs.platforms import host_platform
    from trainbox.supply.lock import builds_for

    shutil.copy(STACKS_DIR / "cpu.yaml", tmp_path / "cpu.yaml")
    data = yaml.safe_load((tmp_path / "cpu.yaml").read_text())
    data["components"]["crcmod"] = {"source": "pypi", "version": "1.7"}
    (tmp_path / "cpu.yaml").write_text(yaml.safe_dump(data))
    stack = load_stack(tmp_path / "cpu.yaml")
    here, other = host_platform(), ({"linux/amd64", "linux/arm64"} - {host_platform()}).pop()
    if not builds_for(stack, here):
        pytest.skip(f"this interpreter is not the stack's Python {stack.python} on Linux")
    rep = lock_stack(stack)
    assert rep.problems == [], rep.problems
    deps = rep.lock["platforms"][here]["deps"]
    assert "sympy" in deps and all(d["sha256"] for d in deps.values()), deps  # torch's closure, hashed
    crcmod = rep.lock["platforms"][here]["components"]["crcmod"]
    assert crcmod["version"] == "1.7" and len(crcmod["sha256"]) == 1  # the sdist's
    assert any(n.startswith(f"{other}: dependencies not locked: crcmod is published as an sdist only")
               for n in rep.incomplete), rep.incomplete
