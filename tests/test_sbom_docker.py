"""The SBOM in real images (marker `docker`): the cpu image's against `pip inspect` run in it, `trainbox image sbom`,
the copy beside the build report, and a copy of the image whose SBOM leaves a distribution out, which the same
check and the image's doctor both flag. (tests/conftest.py checks every image the docker tests build the same way.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import docker_helpers as dh

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainbox.cli", *args], capture_output=True, text=True, timeout=300)


def test_cpu_image_sbom_matches_pip_inspect():
    out = dh.build_cpu_outcome()
    assert dh.sbom_problems(out.tag) == []
    installed = {d["metadata"]["name"].lower() for d in dh.pip_inspect(out.tag)["installed"]}
    assert {"torch", "numpy", "pip"} <= installed  # the check saw the real venv, not an empty listing
    doc = json.loads(_cli("image", "sbom", out.tag, "--json").stdout)
    assert doc["bomFormat"] == "CycloneDX" and doc["metadata"]["component"]["version"] == out.report["content_hash"]
    comps = {c["bom-ref"]: c for c in doc["components"]}
    torch = comps["pypi:torch"]
    from trainbox.specs.stack import load_stack

    pin = load_stack("cpu").components["torch"].pin_for("linux/amd64").sha256
    assert [h["content"] for h in torch["hashes"]] == [pin[0]]
    labels = dh.docker_client().labels(out.tag)
    assert labels["io.trainbox.sbom"].startswith("sha256:") and "io.trainbox.sbom-probe" not in labels, labels
    base = comps["base-image"]
    assert base["name"] == out.report["base"]["used"] and base["version"].startswith("sha256:")
    # beside the report, the same bytes as in the image
    beside = Path(out.report["sbom"]["path"])
    assert beside.read_text() == _cli("image", "sbom", out.tag, "--json").stdout
    table = _cli("image", "sbom", out.tag)
    assert table.returncode == 0 and "torch" in table.stdout and "base-reference" not in table.stdout


def test_an_sbom_that_leaves_a_distribution_out_is_caught(tmp_path):
    """The check above and the doctor's packages.sbom go red on an image whose SBOM lacks numpy."""
    from trainbox.image import sbom

    out = dh.build_cpu_outcome()
    client = dh.docker_client()
    doc = json.loads(sbom.read_from_image(client, out.tag))
    doc["components"] = [c for c in doc["components"] if c.get("name") != "numpy"]
    broken = dh.temporary_tag("trainbox-test/sbom-less-one")
    client.tag(out.tag, broken)
    try:
        sbom.commit(client, [broken], json.dumps(doc, indent=2))
        assert any(p.startswith("numpy ") and "not in the SBOM" in p for p in dh.sbom_problems(broken)), \
            dh.sbom_problems(broken)
        proc = dh.run_in_image(broken, "trainbox", "doctor", "--json", "--quick")
        check = next(c for c in json.loads(proc.stdout)["checks"] if c["id"] == "packages.sbom")
        assert check["status"] == "FAIL" and "numpy" in check["message"], check
    finally:
        client.remove_image(broken, force=True)


def test_image_sbom_without_an_sbom_says_so():
    proc = _cli("image", "sbom", dh.ensure_base())
    assert proc.returncode == 2 and "no SBOM at /etc/trainbox/sbom.cdx.json" in proc.stderr, proc.stderr
