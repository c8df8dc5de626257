"""The image SBOM (trainbox.image.sbom) from an inventory and a manifest, without an engine: schema-valid CycloneDX,
every part the issue asks for, the same bytes for the same inputs; and the runtime inventory and doctor check."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

pytest.importorskip("cyclonedx")

from trainbox.image import sbom  # noqa: E402
from trainbox.runtime import installed as inventory  # noqa: E402
from trainbox.runtime.doctor import Context  # noqa: E402
from trainbox.runtime.doctor.packages import check_sbom  # noqa: E402

H = {c: c * 64 for c in "abcdef"}


@dataclass
class Wheel:
    name: str
    sha256: str


def _inventory():
    def d(name, version, **kw):
        return {"name": name, "canonical_name": inventory.canon(name), "version": version, "installer": "pip",
                "requested": True, "location": "/opt/venv/lib/python3.11/site-packages", "direct_url": None,
                "wheel_tags": ["py3-none-any"], "record_sha256": H["f"], **kw}
    return {"schema": inventory.SCHEMA, "python": "3.11.2", "toolkits": {"cann": None, "cuda": None},
            "distributions": [
                d("numpy", "2.3.5", wheel_tags=["cp311-cp311-manylinux_2_27_x86_64"]),
                d("megatron_core", "0.15.3"),
                d("mindspeed", "0.15.3", direct_url={"url": "file:///tmp/w/mindspeed-0.15.3-py3-none-any.whl",
                                                     "archive_info": {"hashes": {"sha256": H["c"]}}}),
                d("torch", "2.13.0+cpu", wheel_tags=["cp311-cp311-manylinux_2_28_x86_64"]),
                d("loose", "1.0"),
            ]}


MANIFEST = {
    "stack": "demo", "device": "npu", "base": {"image": "quay.io/ascend/cann:8.5.1-910b-ubuntu22.04-py3.11",
                                               "cann": "8.5.1", "substituted": "local/debian:bookworm"},
    "components": {
        "megatron-core": {"source": "pypi", "name": "megatron-core", "version": "0.15.3", "patches": "megatron-core"},
        "mindspeed": {"source": "git", "git": "https://gitcode.com/Ascend/MindSpeed.git", "commit": "d0" * 20,
                      "tree": "7e" * 20, "ref": "core_r0.15.3", "install": "pip", "patches": "mindspeed"},
    },
    "patches": {"megatron-core": [{"file": "0001-a.patch", "sha256": H["d"]}],
                "mindspeed": [{"file": "0001-b.patch", "sha256": H["e"]}]},
}
REQS = ["numpy==2.3.5 --hash=sha256:" + H["a"] + "\nmegatron-core==0.15.3 --hash=sha256:" + H["b"]
        + " --hash=sha256:" + H["e"] + "\n", "torch==2.13.0+cpu --hash=sha256:" + H["d"] + "\n"]
WHEELS = [Wheel("torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl", H["d"])]
BASE = {"used": "local/debian:bookworm", "requested": MANIFEST["base"]["image"], "substituted": "local/debian:bookworm",
        "digest": None, "image_id": "sha256:" + "1" * 64}


def _doc(**kw):
    args = dict(manifest=MANIFEST, inventory=_inventory(), base=BASE, image="trainbox/demo", content_hash="9" * 64,
                platform="linux/amd64", requirements=REQS, wheels=WHEELS)
    args.update(kw)
    return sbom.to_json(sbom.make_bom(**args))


def _by_ref(doc):
    return {c["bom-ref"]: c for c in json.loads(doc)["components"]}


def _prop(c, name):
    return {p["name"]: p["value"] for p in c.get("properties", [])}.get("trainbox:" + name)


def test_valid_cyclonedx_and_deterministic():
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    doc = _doc()
    assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(doc) is None
    assert doc == _doc(), "the same inputs must give the same bytes (the SBOM layer rebuilds bit for bit)"
    data = json.loads(doc)
    assert data["metadata"]["timestamp"].startswith("1970-01-01")
    assert data["metadata"]["component"]["version"] == "9" * 64


def test_every_distribution_with_version_and_hash():
    comps = _by_ref(_doc())
    assert {k for k in comps if k.startswith("pypi:")} == {
        "pypi:numpy", "pypi:megatron-core", "pypi:mindspeed", "pypi:torch", "pypi:loose"}
    assert comps["pypi:numpy"]["hashes"] == [{"alg": "SHA-256", "content": H["a"]}]  # the one pinned hash
    assert comps["pypi:mindspeed"]["hashes"][0]["content"] == H["c"]  # pip's own record wins
    assert comps["pypi:torch"]["hashes"][0]["content"] == H["d"]  # the wheelhouse file with its tags
    assert "hashes" not in comps["pypi:megatron-core"]  # two allowed: pip does not say which
    assert H["b"] in _prop(comps["pypi:megatron-core"], "hash-source")
    assert "not hash-pinned" in _prop(comps["pypi:loose"], "hash-source")
    assert comps["pypi:torch"]["purl"] == "pkg:pypi/torch@2.13.0%2Bcpu"
    assert _prop(comps["pypi:numpy"], "record-sha256") == H["f"]


def test_git_sources_patches_base_and_toolkits():
    comps = _by_ref(_doc())
    git = comps["git:mindspeed"]
    assert git["version"] == "d0" * 20 and _prop(git, "git-tree") == "7e" * 20
    assert git["externalReferences"][0] == {"type": "vcs", "url": "https://gitcode.com/Ascend/MindSpeed.git"}
    assert git["pedigree"]["patches"][0]["diff"]["url"] == "patches/mindspeed/0001-b.patch"
    assert comps["patch:patches/megatron-core/0001-a.patch"]["hashes"][0]["content"] == H["d"]
    assert comps["pypi:megatron-core"]["pedigree"]["patches"][0]["diff"]["url"] == "patches/megatron-core/0001-a.patch"
    base = comps["base-image"]
    assert base["version"] == "sha256:" + "1" * 64 and "no registry digest" in _prop(base, "base-reference")
    assert comps["toolkit:cann"]["version"] == "8.5.1"
    assert "substitute" in _prop(comps["toolkit:cann"], "toolkit-source")
    inv = _inventory()
    inv["toolkits"]["cann"] = {"version": "8.5.0", "source": "/usr/local/Ascend/x"}
    found = _by_ref(_doc(inventory=inv, base={**BASE, "digest": "sha256:" + "2" * 64}))
    assert found["toolkit:cann"]["version"] == "8.5.0"
    assert found["base-image"]["version"] == "sha256:" + "2" * 64


def test_compare_names_what_is_left_out():
    doc = json.loads(_doc())
    assert sbom.compare(doc, _inventory()) == []
    doc["components"] = [c for c in doc["components"] if c["name"] != "numpy"]
    assert sbom.compare(doc, _inventory()) == ["numpy 2.3.5 is installed but not in the SBOM"]


def test_layer_tar_is_fixed():
    assert sbom.layer_tar("{}", 0) == sbom.layer_tar("{}", 0)
    import io
    import tarfile

    with tarfile.open(fileobj=io.BytesIO(sbom.layer_tar("{}", 0))) as tar:
        assert [(m.name, m.mtime, m.uid) for m in tar] == [("etc", 0, 0), ("etc/trainbox", 0, 0),
                                                           ("etc/trainbox/sbom.cdx.json", 0, 0)]


def test_runtime_inventory_matches_importlib():
    import importlib.metadata as md
    import sys

    listed = {d["canonical_name"]: d["version"] for d in inventory.distributions()}
    for dist in md.distributions(path=sys.path):
        name = inventory.canon(dist.metadata["Name"])
        assert name in listed
    assert listed["pytest"] == md.version("pytest")


def test_doctor_sbom_check(tmp_path):
    (tmp_path / "etc" / "trainbox").mkdir(parents=True)
    have = inventory.distributions()
    doc = {"components": [{"name": d["name"], "version": d["version"], "purl": f"pkg:pypi/{d['canonical_name']}"
                           f"@{d['version']}"} for d in have]}
    path = tmp_path / "etc" / "trainbox" / "sbom.cdx.json"
    ctx = Context(env={}, root=str(tmp_path), manifest={"stack": "x", "device": "cpu"})
    assert check_sbom(ctx).status == "WARN"  # no SBOM: a plain docker build
    path.write_text(json.dumps(doc))
    assert check_sbom(ctx).status == "PASS"
    doc["components"] = doc["components"][1:]
    path.write_text(json.dumps(doc))
    res = check_sbom(ctx)
    assert res.status == "FAIL" and f"{have[0]['canonical_name']} {have[0]['version']} installed" in res.message
    assert check_sbom(Context(env={}, root=str(tmp_path), manifest=None)).status == "SKIP"


def test_source_date_epoch_reaches_the_build_and_the_sbom(monkeypatch):
    from pathlib import Path

    from trainbox.image.plan import PlanInputs, _args
    from trainbox.runtime.errors import TrainboxError

    def args():
        return " ".join(_args(PlanInputs(platform="linux/amd64"), Path("Dockerfile"), [], {}, "buildkit"))

    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    assert "SOURCE_DATE_EPOCH" not in args()  # the templates' default, 0, and every tag as it was
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    assert "--build-arg SOURCE_DATE_EPOCH=1700000000" in args()
    assert json.loads(_doc())["metadata"]["timestamp"].startswith("2023-11-14")
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "yesterday")
    with pytest.raises(TrainboxError, match="SOURCE_DATE_EPOCH='yesterday'"):
        args()


def test_a_local_wheel_without_a_recorded_hash_is_hashed_in_the_image(tmp_path):
    """The venv's pip comes from the base's Debian wheel: pip records its file:// URL and no hash; the listing
    hashes the file, still in the image, and the SBOM carries that."""
    wheel = tmp_path / "pip-23.0.1-py3-none-any.whl"
    wheel.write_bytes(b"a wheel")
    site = tmp_path / "site"
    info = site / "pip-23.0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: pip\nVersion: 23.0.1\n")
    (info / "INSTALLER").write_text("pip\n")
    (info / "direct_url.json").write_text(json.dumps({"url": wheel.as_uri(), "archive_info": {}}))
    (entry,) = inventory.distributions([str(site)])
    import hashlib

    assert entry["local_file_sha256"] == hashlib.sha256(b"a wheel").hexdigest()
    inv = {**_inventory(), "distributions": [entry]}
    comps = _by_ref(_doc(inventory=inv))
    assert comps["pypi:pip"]["hashes"][0]["content"] == entry["local_file_sha256"]
    assert "still in the image" in _prop(comps["pypi:pip"], "hash-source")
    wheel.unlink()  # gone: nothing to hash, and the SBOM says why
    (entry,) = inventory.distributions([str(site)])
    assert entry["local_file_sha256"] is None


def test_each_platform_gets_the_hash_of_its_own_requirement_line():
    """Issue 37: the cpu stack pins torch (and numpy) once per platform, each line under its platform_machine
    marker. Keyed by name alone, the x86_64 line overwrote the aarch64 one, so the arm64 SBOM called its torch
    "not hash-pinned". Each platform's SBOM names the hash of the line pip installed there."""
    from trainbox.image.render import render_stack
    from trainbox.specs.stack import load_stack

    stack = load_stack("cpu")
    rendered = render_stack(stack)
    reqs = [rendered.requirements, rendered.deps]  # what run.sbom_for_plan reads from the plan's files
    assert any("platform_machine" in t for t in reqs), "the cpu stack no longer pins per platform"
    for plat in ("linux/amd64", "linux/arm64"):
        torch = stack.components["torch"].pin_for(plat)
        assert sbom.requirement_hashes(reqs, plat, "3.11")["torch"] == (torch.version, list(torch.sha256)), plat

    def dist(version, tags):
        return {"name": "torch", "canonical_name": "torch", "version": version, "installer": "pip",
                "requested": True, "location": "/opt/venv/lib/python3.11/site-packages", "direct_url": None,
                "wheel_tags": tags, "record_sha256": H["f"]}

    arm = stack.components["torch"].pin_for("linux/arm64")
    inv = {**_inventory(), "distributions": [dist(arm.version, ["cp311-cp311-manylinux_2_28_aarch64"])]}
    doc = _doc(platform="linux/arm64", inventory=inv, requirements=reqs, wheels=[],
               manifest={**MANIFEST, "python": "3.11"})
    torch = _by_ref(doc)["pypi:torch"]
    assert torch["hashes"] == [{"alg": "SHA-256", "content": arm.sha256[0]}]
    assert _prop(torch, "hash-source") == "hash-pinned requirement (pip --require-hashes)"
