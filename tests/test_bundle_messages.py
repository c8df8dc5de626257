"""What `trainbox fetch --bundle` and `image build --bundle` say when the bundle cannot be made or used (no
network, no engine: the bundle here is a tiny hand-made tar, the unreachable index a stand-in that raises)."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile

import pytest

from trainbox.image import bundle
from trainbox.supply import fetch as fetching
from trainbox.supply.index import IndexUnreachable
from trainbox.specs.stack import load_stack


def _bundle(path, meta: dict) -> None:
    data = json.dumps({"schema": bundle.SCHEMA, **meta}).encode()
    sums = f"{hashlib.sha256(data).hexdigest()}  bundle.json\n".encode()
    with tarfile.open(path, "w") as tar:
        for name, content in (("bundle.json", data), ("SHA256SUMS", sums)):
            info = tarfile.TarInfo(f"./{name}")
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))


def test_a_bundle_for_another_stack_says_each_difference_once(tmp_path):
    cpu, ray = load_stack("cpu"), load_stack("cpu-ray")
    _bundle(tmp_path / "b.tar", {"stack": "cpu", "platform": "linux/amd64", "pins_digest": ray.pins_digest()})
    with pytest.raises(bundle.BundleError) as exc:
        bundle.open_bundle(tmp_path / "b.tar", ray, tmp_path / "x")
    msg = str(exc.value)
    assert "made for stack cpu, not cpu-ray" in msg and "digest" not in msg  # same pins: not said twice
    _bundle(tmp_path / "c.tar", {"stack": "cpu", "platform": "linux/amd64", "pins_digest": "f" * 64})
    with pytest.raises(bundle.BundleError) as exc:
        bundle.open_bundle(tmp_path / "c.tar", cpu, tmp_path / "y")
    msg = str(exc.value)
    assert "made for stack" not in msg and f"({cpu.pins_digest()[:12]}): a pin moved" in msg
    assert msg.count(cpu.pins_digest()[:12]) == 1 and "(digest ffffffffffff)" in msg


def test_fetch_bundle_with_an_unreachable_index_suggests_a_wheelhouse(tmp_path, monkeypatch):
    def unreachable(pin, **_kw):
        raise IndexUnreachable("pytorch-cpu", "https://download.pytorch.org/whl/cpu", "stand-in: no network")

    monkeypatch.setattr(fetching, "fetch", unreachable)
    with pytest.raises(bundle.BundleError) as exc:
        bundle.write_bundle("cpu", tmp_path / "cpu.tar", say=lambda _m: None)
    assert "pass --wheelhouse DIR" in str(exc.value) and "torch==" in str(exc.value)
    assert not (tmp_path / "cpu.tar").exists()
