"""TRAINBOX_DEVICE=cpu through the venv's .pth hook (trainbox.runtime.cpu_mode), in real interpreter starts.

Stand-in: a package named torch_npu written to tmp_path plays the installed torch_npu (this host has none); a site
directory in tmp_path holding trainbox.pth and the hook plays the image's venv. tests/test_cpu_mode_docker.py runs
the same hook in the real specforge and twinkle images.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainbox.paths import REPO_ROOT
from trainbox.runtime import cpu_mode

PROBE = """
import importlib.util, json, os, sys
site_dir = sys.argv[1]
import site; site.addsitedir(site_dir)
out = {"spec": importlib.util.find_spec("torch_npu") is not None,
       "loaded": "trainbox.runtime.cpu_mode" in sys.modules,
       "autoload": os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD"),
       "cuda_visible": os.environ.get("CUDA_VISIBLE_DEVICES")}
try:
    import torch_npu
    out["import"] = "ok"
except ModuleNotFoundError as exc:
    out["import"] = str(exc)
sys.modules.pop("torch_npu", None)  # a fixture that clears sys.modules: the finder still refuses it
try:
    import torch_npu.contrib
    out["after_pop"] = "ok"
except ModuleNotFoundError as exc:
    out["after_pop"] = str(exc)
print(json.dumps(out))
"""


@pytest.fixture()
def venv_site(tmp_path) -> Path:
    """A site directory as the image's venv has it: trainbox.pth (the package on sys.path), then the hook."""
    site_dir = tmp_path / "site-packages"
    (site_dir / "torch_npu" / "contrib").mkdir(parents=True)
    (site_dir / "torch_npu" / "__init__.py").write_text("")
    (site_dir / "torch_npu" / "contrib" / "__init__.py").write_text("")
    (site_dir / "trainbox.pth").write_text(str(REPO_ROOT / "python") + "\n")
    assert Path(cpu_mode.write_pth(str(site_dir))) == site_dir / cpu_mode.PTH_NAME
    return site_dir


def probe(site_dir: Path, **env) -> dict:
    # -S, then site.addsitedir(site_dir): only this venv's .pth files run, as in the image (not the host's own
    # site-packages, whose editable install may point at another checkout)
    base = {k: v for k, v in os.environ.items()
            if k not in ("TRAINBOX_DEVICE", "TORCH_DEVICE_BACKEND_AUTOLOAD", "PYTHONPATH")}
    proc = subprocess.run([sys.executable, "-S", "-c", PROBE, str(site_dir)], env={**base, **env}, capture_output=True,
                          text=True, timeout=60, cwd=site_dir.parent)
    assert proc.returncode == 0 and "Error processing line" not in proc.stderr, proc.stderr
    return json.loads(proc.stdout)


def test_hook_sorts_after_the_package_path():
    # site reads a directory's .pth files in sorted order: the hook needs trainbox.pth's path entry first
    assert sorted(["trainbox.pth", cpu_mode.PTH_NAME]) == ["trainbox.pth", cpu_mode.PTH_NAME]


def test_cpu_mode_hides_torch_npu_from_find_spec_and_import(venv_site):
    out = probe(venv_site, TRAINBOX_DEVICE=" CPU ", TORCH_DEVICE_BACKEND_AUTOLOAD="1", CUDA_VISIBLE_DEVICES="0")
    assert out["spec"] is False and out["loaded"] is True
    assert "torch_npu" in out["import"]
    assert "TRAINBOX_DEVICE=cpu hides" in out["after_pop"]
    assert out["autoload"] == "0" and out["cuda_visible"] == ""


@pytest.mark.parametrize("device", [None, "npu", ""])
def test_hook_does_nothing_and_imports_nothing_otherwise(venv_site, device):
    out = probe(venv_site, **({} if device is None else {"TRAINBOX_DEVICE": device}))
    assert out == {"spec": True, "loaded": False, "autoload": None, "import": "ok", "after_pop": "ok",
                   "cuda_visible": os.environ.get("CUDA_VISIBLE_DEVICES")}


def test_install_leaves_an_imported_module_alone(monkeypatch):
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    monkeypatch.setattr(os, "environ", dict(os.environ))
    sentinel = object()
    saved = {n: sys.modules.get(n, sentinel) for n in cpu_mode.HIDDEN}
    monkeypatch.setitem(sys.modules, "torch_npu", sys)  # already imported: too late to hide
    try:
        hidden = cpu_mode.install()
        assert "torch_npu" not in hidden and set(hidden) == set(cpu_mode.HIDDEN) - {"torch_npu"}
        assert sys.modules["acl"] is None and sys.modules["torch_npu"] is sys
        assert sum(isinstance(f, cpu_mode._Refuse) for f in sys.meta_path) == 1
        cpu_mode.install()
        assert sum(isinstance(f, cpu_mode._Refuse) for f in sys.meta_path) == 1
    finally:
        for n, v in saved.items():
            if n != "torch_npu":
                sys.modules.pop(n, None) if v is sentinel else sys.modules.__setitem__(n, v)


def test_module_cli(tmp_path, capsys):
    assert cpu_mode.main(["--write-pth", str(tmp_path)]) == 0
    assert (tmp_path / cpu_mode.PTH_NAME).read_text() == cpu_mode.PTH_LINE
    assert cpu_mode.main(["--bogus"]) == 2
