"""trainbox.specs.dists: the one home of distribution file names, PEP 503 names and artifact hashes."""

from __future__ import annotations

import hashlib

from trainbox.specs import dists


def test_canon_is_pep503():
    assert dists.canon("Foo.Bar_baz--Qux") == "foo-bar-baz-qux"
    from trainbox.runtime.apply_patches import canon_name

    assert dists.canon is canon_name  # ... and it is the runtime's


def test_one_pep503_rule_in_the_package():
    """The name rule is written once (the patch applier's canon_name); host, doctor and applier all call it."""
    from pathlib import Path

    import trainbox

    rule = 'r"[-_.]+"'
    pkg = Path(trainbox.__file__).parent
    holders = sorted(str(p.relative_to(pkg)) for p in pkg.rglob("*.py") if rule in p.read_text())
    assert holders == ["runtime/apply_patches.py"], holders
    assert (pkg / "runtime" / "apply_patches.py").read_text().count(rule) == 1
    assert "canon_name(" in (pkg / "runtime" / "doctor" / "core.py").read_text()


def test_parse_dist_wheels_sdists_and_others():
    assert dists.dist_key("torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl") == ("torch", "2.13.0+cpu")
    assert dists.dist_key("Megatron_Core-0.15.3.tar.gz") == ("megatron-core", "0.15.3")
    assert dists.dist_key("numpy-2.3.5.zip") == ("numpy", "2.3.5")
    assert dists.dist_key("README.md") == ("", "")
    assert dists.dist_key("broken.whl") == ("", "")
    assert dists.is_dist_of("megatron_core-0.15.3-py3-none-any.whl", "megatron-core", "0.15.3")
    assert not dists.is_dist_of("megatron_core-0.15.3-py3-none-any.whl", "megatron-core", "0.15.4")
    assert not dists.is_dist_of("megatron_core-0.15.3-py3-none-any.whl", "megatron-core", "not a version")
    assert dists.norm_version("2.13.0+CPU") == "2.13.0+cpu" and dists.norm_version("x y") == "x y"
    assert {t.platform for t in dists.wheel_tags("a-1-py3-none-any.whl")} == {"any"}
    assert dists.wheel_tags("a-1.tar.gz") == frozenset()


def test_sha256_file_plain_rereads(tmp_path):
    f = tmp_path / "x.whl"
    f.write_bytes(b"a")
    assert dists.sha256_file(f) == hashlib.sha256(b"a").hexdigest()
    f.write_bytes(b"b")
    assert dists.sha256_file(f) == hashlib.sha256(b"b").hexdigest()


def test_no_second_copy_of_the_helpers():
    """index, lock, sources and image parse names and hash files only through trainbox.specs.dists."""
    from pathlib import Path

    import trainbox

    host = Path(trainbox.__file__).parent
    for mod in ("supply/index.py", "supply/lock.py", "supply/sources.py", "image/build.py", "supply/patches.py", "specs/stack.py"):
        text = (host / mod).read_text()
        for needle in ("parse_wheel_filename", "parse_sdist_filename", "canonicalize_name", "def _sha256_file",
                       "def _canon", "def canon("):
            assert needle not in text, f"{mod} repeats {needle}"
