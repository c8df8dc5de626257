"""`trainbox image wheelhouse`: a wheelhouse filled for a stack and platform, every file hash-verified."""

from __future__ import annotations

import hashlib
import json

import pytest

from trainbox.cli import main
from trainbox.paths import STACKS_DIR

NUMPY_SHA = "8cba086a43d54ca804ce711b2a940b16e452807acebe7852ff327f1ecd49b0d4"  # numpy 2.3.5, cp311 x86_64


@pytest.fixture
def tiny(tmp_path):
    """The cpu stack with numpy alone (pinned by hash) and no lock: one artifact to fetch."""
    text = (STACKS_DIR / "cpu.yaml").read_text().replace("name: cpu", "name: tiny")
    text = text.replace("version: 2.3.5", f"version: 2.3.5\n    sha256: [{NUMPY_SHA}]")
    text = text.replace("    index: pytorch-cpu\n", "    index: pytorch-cpu\n    install: false\n")
    p = tmp_path / "tiny.yaml"
    p.write_text(text)
    return p


def test_unhashed_pin_is_refused_before_any_download(tiny, tmp_path, capsys):
    tiny.write_text(tiny.read_text().replace(f"\n    sha256: [{NUMPY_SHA}]", ""))
    rc = main(["image", "wheelhouse", str(tiny), "--platform", "linux/amd64", "-o", str(tmp_path / "wh")])
    assert rc == 2 and "no sha256 pinned for numpy==2.3.5" in capsys.readouterr().err
    assert not (tmp_path / "wh").exists() or not list((tmp_path / "wh").iterdir())


@pytest.mark.network
def test_fill_fetches_verifies_keeps_and_refuses_strangers(tiny, tmp_path, capsys):
    out = tmp_path / "wh"
    assert main(["image", "wheelhouse", str(tiny), "--platform", "linux/amd64", "-o", str(out), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["schema"] == "trainbox.wheelhouse/1" and len(rep["added"]) == 1 and rep["kept"] == []
    wheel = out / rep["added"][0]
    assert wheel.name.startswith("numpy-2.3.5-cp311") and hashlib.sha256(wheel.read_bytes()).hexdigest() == NUMPY_SHA
    # a second run keeps what is there
    assert main(["image", "wheelhouse", str(tiny), "--platform", "linux/amd64", "-o", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["kept"] == [wheel.name]
    # a dry run with this wheelhouse serves numpy from it
    assert main(["image", "build", str(tiny), "--dry-run", "--json", "--wheelhouse", str(out),
                 "--platform", "linux/amd64"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert [f["from"] for f in plan["fetch"] if f["key"] == "numpy"][0].startswith(f"wheelhouse {out}")
    # another artifact for a pinned project is refused (the build could pick either)
    (out / "numpy-2.3.5-cp311-cp311-manylinux_2_17_x86_64.whl").write_bytes(b"not the pinned bytes")
    rc = main(["image", "wheelhouse", str(tiny), "--platform", "linux/amd64", "-o", str(out)])
    assert rc == 2 and "is not the pinned artifact of numpy==2.3.5" in capsys.readouterr().err
