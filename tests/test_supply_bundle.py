"""Issue 22: a bundle is sealed, and its git objects are the pinned commits' own.

One real bundle (`trainbox fetch cpu-sources --bundle`: PyPI wheels, the torch wheel from /opt/wheels, MindSpeed
and Megatron-LM from the ../shared/upstream copies through git's insteadOf), then each tamper the issue found:
an added setuptools-99 wheel, a missing file, an emptied SHA256SUMS, a rewritten git object, a `refs/replace` ref
plus objects (with SHA256SUMS untouched, and with it rewritten to match). Each is refused by `image build
--bundle` in one line, exit 2, before the build starts (nothing is staged). Then malformed bundles (not a tar,
no or a non-object bundle.json, non-UTF-8 sums, links, `/`) and output paths that are not files.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from trainbox.paths import REPO_ROOT
from upstream_helpers import (MINDSPEED, git, git_env, hostile_setuptools_wheel, make_mirrors, rewrite_blob,
                              stack_file)

pytestmark = [pytest.mark.network, pytest.mark.slow]
WHEELS = Path("/opt/wheels")  # the torch +cpu wheel: its index is unreachable here


def trainbox(args: list[str], env: dict[str, str], timeout: int = 900) -> subprocess.CompletedProcess:
    env = dict(env, PYTHONPATH=str(REPO_ROOT / "python"))
    return subprocess.run([sys.executable, "-m", "trainbox.cli", *args], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=REPO_ROOT)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    if not WHEELS.is_dir():
        pytest.skip("no /opt/wheels with the torch +cpu wheel to bundle")
    tmp = tmp_path_factory.mktemp("bundle")
    env = git_env(make_mirrors(tmp / "mirrors"), TRAINBOX_CACHE=str(tmp / "cache"))
    stack = stack_file(tmp)
    out = tmp / "good.tar"
    proc = trainbox(["fetch", str(stack), "--bundle", str(out), "--wheelhouse", str(WHEELS)], env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    offline = {k: v for k, v in env.items() if not k.startswith("GIT_CONFIG_")}
    return stack, out, offline


def refused(bundle_file: Path, stack: Path, env: dict, tmp: Path) -> str:
    """`image build --bundle` of `bundle_file`: exit 2, one line, nothing staged (the dry run stages the context
    under the cache, so an empty cache afterwards means the build never got that far)."""
    cache = tmp / "cache-after"
    proc = trainbox(["image", "build", str(stack), "--bundle", str(bundle_file), "--dry-run"],
                    dict(env, TRAINBOX_CACHE=str(cache)))
    err = proc.stderr.strip()
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-2000:], err[-3000:])
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert not (cache / "build").exists(), "a build context was staged for a refused bundle"
    return err


def rewrite(src: Path, dst: Path, drop=(), add=None, replace=None) -> Path:
    """A copy of the tar `src` without the members in `drop`, with `replace`d contents and `add`ed files."""
    add, replace = add or {}, replace or {}
    with tarfile.open(src) as tin, tarfile.open(dst, "w") as tout:
        for m in tin.getmembers():
            rel = m.name.removeprefix("./")
            if rel in drop:
                continue
            if rel in replace:
                m.size = len(replace[rel])
                tout.addfile(m, io.BytesIO(replace[rel]))
            else:
                tout.addfile(m, tin.extractfile(m) if m.isfile() else None)
        for rel, data in add.items():
            ti = tarfile.TarInfo(f"./{rel}")
            ti.size = len(data)
            tout.addfile(ti, io.BytesIO(data))
    return dst


def member(src: Path, rel: str) -> bytes:
    with tarfile.open(src) as tar:
        return tar.extractfile(f"./{rel}").read()


def repack(root: Path, dst: Path, sums: bytes | None = None) -> Path:
    """An unpacked bundle tarred again, with a SHA256SUMS made to match (a forger's) unless `sums` is given."""
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.name != "SHA256SUMS")
    if sums is None:
        sums = "".join(f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.relative_to(root).as_posix()}\n"
                       for p in files).encode()
    (root / "SHA256SUMS").write_bytes(sums)
    with tarfile.open(dst, "w") as tar:
        tar.add(root, arcname=".")
    return dst


def unpacked(src: Path, dest: Path) -> Path:
    with tarfile.open(src) as tar:
        tar.extractall(dest, filter="data")
    for p in dest.rglob("*"):
        p.chmod(p.stat().st_mode | 0o200)
    return dest


def mindspeed_repo(root: Path) -> Path:
    return next((root / "sources" / "git").glob("MindSpeed-*.git"))


# ------------------------------------------------------------------------------------------------ tampers

def test_the_good_bundle_opens(bundle, tmp_path):
    stack, good, env = bundle
    proc = trainbox(["image", "build", str(stack), "--bundle", str(good), "--dry-run"],
                    dict(env, TRAINBOX_CACHE=str(tmp_path / "c")))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "--network none" in proc.stdout


def test_an_added_setuptools_99_wheel_is_refused(bundle, tmp_path):
    stack, good, env = bundle
    wheel = "wheelhouse/setuptools-99.0.0-py3-none-any.whl"
    bad = rewrite(good, tmp_path / "bad.tar", add={wheel: b"PK\x03\x04 runs its code in the build"})
    err = refused(bad, stack, env, tmp_path)
    assert "1 file(s) not in SHA256SUMS" in err and wheel in err


def test_an_added_setuptools_99_wheel_with_the_sums_rewritten_is_refused(bundle, tmp_path):
    """The same wheel (a real one whose code would stop the build) with SHA256SUMS rewritten to match: the seal
    holds, but no pin names the file's sha256, so it never reaches pip."""
    stack, good, env = bundle
    root = unpacked(good, tmp_path / "u")
    hostile_setuptools_wheel(root / "wheelhouse")
    err = refused(repack(root, tmp_path / "bad.tar"), stack, env, tmp_path)
    assert "wheelhouse/setuptools-99.0.0-py3-none-any.whl is not a file the stack's pins or lock name" in err


def test_the_bundle_holds_the_locked_build_requirements(bundle):
    """The MindSpeed wheel's build requirements are in the bundle as the lock pins them (by sha256), so the
    offline build installs them --require-hashes."""
    stack_path, good, _ = bundle
    from trainbox.specs.stack import load_stack

    stack = load_stack(stack_path)
    sums = member(good, "SHA256SUMS").decode()
    for name, d in stack.locked_build_deps("linux/amd64").items():
        assert f"{d['sha256'][0]}  wheelhouse/{name}-{d['version']}-" in sums, (name, sums)


@pytest.mark.parametrize("gone", ["wheelhouse/numpy", "bundle.json", "sources/git/MindSpeed"])
def test_a_missing_file_is_refused(bundle, tmp_path, gone):
    stack, good, env = bundle
    with tarfile.open(good) as tar:
        rel = next(m.name.removeprefix("./") for m in tar.getmembers()
                   if m.isfile() and m.name.removeprefix("./").startswith(gone))
    err = refused(rewrite(good, tmp_path / "bad.tar", drop={rel}), stack, env, tmp_path)
    assert "SHA256SUMS lists are missing" in err and rel in err


@pytest.mark.parametrize("sums", [b"", b"\n", b"# nothing\n", b"\xff\xfe\x00 not utf-8\n"])
def test_an_emptied_or_unreadable_sums_file_is_refused(bundle, tmp_path, sums):
    stack, good, env = bundle
    err = refused(rewrite(good, tmp_path / "bad.tar", replace={"SHA256SUMS": sums}), stack, env, tmp_path)
    assert "SHA256SUMS" in err


def test_a_duplicate_or_foreign_sums_line_is_refused(bundle, tmp_path):
    stack, good, env = bundle
    sums = member(good, "SHA256SUMS")
    first = sums.splitlines(keepends=True)[0]
    err = refused(rewrite(good, tmp_path / "dup.tar", replace={"SHA256SUMS": sums + first}), stack, env, tmp_path)
    assert "twice" in err
    evil = sums + b"0" * 64 + b"  ../../etc/passwd\n"
    err = refused(rewrite(good, tmp_path / "out.tar", replace={"SHA256SUMS": evil}), stack, env, tmp_path)
    assert "is not `<sha256>  <path>`" in err


def test_a_rewritten_git_object_is_refused_even_with_matching_sums(bundle, tmp_path):
    """The pack exploded into loose objects, then the blob of mindspeed/__init__.py rewritten in place under its
    old name; SHA256SUMS rewritten to match, as a forger would. The object no longer hashes to its name."""
    stack, good, env = bundle
    root = unpacked(good, tmp_path / "u")
    repo = mindspeed_repo(root)
    evil = b"import os; os.system('touch /tmp/pwned')\n"
    blob = rewrite_blob(repo, MINDSPEED[2], "mindspeed/__init__.py", evil)
    assert git(repo, "cat-file", "-p", blob).encode() == evil.strip()  # what git archive would have staged
    err = refused(repack(root, tmp_path / "bad.tar"), stack, env, tmp_path)
    assert f"object {blob} does not hash to its name" in err and "component mindspeed" in err


def _replace_commit(repo: Path) -> str:
    """A commit like the pinned one whose tree has a different setup.py; `git replace` makes it stand in."""
    evil = git(repo, "hash-object", "-w", "--stdin", input=b"raise SystemExit('swapped tree')\n")
    entries = [ln if not ln.endswith("\tsetup.py") else f"100644 blob {evil}\tsetup.py"
               for ln in git(repo, "ls-tree", MINDSPEED[2]).splitlines()]
    tree = git(repo, "mktree", input=("\n".join(entries) + "\n").encode())
    new = git(repo, "commit-tree", tree, "-m", "swapped")
    git(repo, "replace", MINDSPEED[2], new)
    swapped = subprocess.run(["git", "--git-dir", str(repo), "rev-parse", f"{MINDSPEED[2]}^{{tree}}"],
                             capture_output=True, text=True, env={**os.environ, "LC_ALL": "C"}).stdout.strip()
    assert swapped == tree, "git itself follows the replace ref (the attack works on plain git)"
    return tree


def test_a_replace_ref_with_sums_untouched_is_refused(bundle, tmp_path):
    stack, good, env = bundle
    root = unpacked(good, tmp_path / "u")
    _replace_commit(mindspeed_repo(root))
    err = refused(repack(root, tmp_path / "bad.tar", sums=member(good, "SHA256SUMS")), stack, env, tmp_path)
    assert "file(s) not in SHA256SUMS" in err and "MindSpeed" in err  # the new objects and the ref


@pytest.mark.parametrize("packed", [False, True])
def test_a_replace_ref_with_sums_rewritten_is_refused(bundle, tmp_path, packed):
    stack, good, env = bundle
    root = unpacked(good, tmp_path / "u")
    repo = mindspeed_repo(root)
    _replace_commit(repo)
    if packed:
        git(repo, "pack-refs", "--all")
        assert not list((repo / "refs" / "replace").glob("*"))
    err = refused(repack(root, tmp_path / "bad.tar"), stack, env, tmp_path)
    assert "refs/replace would substitute git objects" in err


def test_a_graft_is_refused(bundle, tmp_path):
    stack, good, env = bundle
    root = unpacked(good, tmp_path / "u")
    repo = mindspeed_repo(root)
    (repo / "info" / "grafts").write_text(MINDSPEED[2] + "\n")
    err = refused(repack(root, tmp_path / "bad.tar"), stack, env, tmp_path)
    assert "info/grafts would substitute git objects" in err


# ------------------------------------------------------------------------------------------- malformed

def test_links_devices_and_paths_outside_are_refused(bundle, tmp_path):
    stack, good, env = bundle
    for name, kind, what in [("wheelhouse/x.whl", tarfile.SYMTYPE, "link or device"),
                             ("wheelhouse/y.whl", tarfile.LNKTYPE, "link or device"),
                             ("wheelhouse/z", tarfile.CHRTYPE, "link or device"),
                             ("../escape.whl", tarfile.REGTYPE, "outside the bundle")]:
        bad = tmp_path / f"{kind!r}.tar"
        shutil.copy(good, bad)
        with tarfile.open(bad, "a") as tar:
            ti = tarfile.TarInfo(f"./{name}" if not name.startswith("..") else name)
            ti.type, ti.linkname = kind, "/etc/shadow"
            tar.addfile(ti, io.BytesIO(b"") if kind == tarfile.REGTYPE else None)
        assert what in refused(bad, stack, env, tmp_path)


def test_a_file_given_twice_is_refused(bundle, tmp_path):
    stack, good, env = bundle
    bad = tmp_path / "twice.tar"
    shutil.copy(good, bad)
    with tarfile.open(bad, "a") as tar:
        data = member(good, "bundle.json")
        ti = tarfile.TarInfo("./bundle.json")
        ti.size = len(data)
        tar.addfile(ti, io.BytesIO(data))
    assert "given twice" in refused(bad, stack, env, tmp_path)


@pytest.mark.parametrize("meta,words", [(b"[1, 2]", "is not a trainbox.bundle/1 object"),
                                        (b"{not json", "bundle.json cannot be read"),
                                        (b"\xff\xfe", "bundle.json cannot be read")])
def test_a_bad_bundle_json_is_refused(bundle, tmp_path, meta, words):
    stack, good, env = bundle
    root = unpacked(good, tmp_path / "u")
    (root / "bundle.json").write_bytes(meta)
    assert words in refused(repack(root, tmp_path / "bad.tar"), stack, env, tmp_path)


def test_not_a_tar_a_truncated_tar_and_not_a_file(bundle, tmp_path):
    stack, good, env = bundle
    junk = tmp_path / "junk.tar"
    junk.write_bytes(b"\x1f\x8b\x08 not really gzip" * 100)
    assert "cannot be read as a tar" in refused(junk, stack, env, tmp_path)
    cut = tmp_path / "cut.tar"
    with open(good, "rb") as src, open(cut, "wb") as dst:
        dst.write(src.read(300_000))
    assert "cannot be read as a tar" in refused(cut, stack, env, tmp_path)
    for path in ("/", str(tmp_path), "/dev/null", str(tmp_path / "missing.tar")):
        assert "not a bundle file" in refused(Path(path), stack, env, tmp_path)


@pytest.mark.parametrize("out", ["/dev/full", "/", "DIR", "LINK"])
def test_fetch_bundle_writes_only_a_regular_file(bundle, tmp_path, out):
    stack, _good, env = bundle
    if out == "DIR":
        out = str(tmp_path)
    elif out == "LINK":
        (tmp_path / "link.tar").symlink_to("/etc/passwd")
        out = str(tmp_path / "link.tar")
    before = os.lstat(out)
    proc = trainbox(["fetch", str(stack), "--bundle", out], env)
    err = proc.stderr.strip()
    assert proc.returncode == 2 and len(err.splitlines()) == 1 and "not a regular file" in err, err
    after = os.lstat(out)
    assert (after.st_mode, after.st_ino, after.st_rdev) == (before.st_mode, before.st_ino, before.st_rdev)


def _tampered(kind: str, good: Path, tmp: Path) -> tuple[Path, str]:
    """Each HIGH tamper of the issue as a bundle file, and the words its refusal says."""
    if kind == "extra wheel":
        return (rewrite(good, tmp / "bad.tar", add={"wheelhouse/setuptools-99.0.0-py3-none-any.whl": b"PK\x03\x04"}),
                "not in SHA256SUMS")
    if kind == "emptied sums":
        return rewrite(good, tmp / "bad.tar", replace={"SHA256SUMS": b""}), "SHA256SUMS is empty"
    root = unpacked(good, tmp / "u")
    if kind == "extra wheel, sums rewritten":
        hostile_setuptools_wheel(root / "wheelhouse")
        return repack(root, tmp / "bad.tar"), "is not a file the stack's pins or lock name"
    if kind == "rewritten object":
        rewrite_blob(mindspeed_repo(root), MINDSPEED[2], "mindspeed/__init__.py", b"import os\n")
        return repack(root, tmp / "bad.tar"), "does not hash to its name"
    _replace_commit(mindspeed_repo(root))
    if kind == "replace ref":
        return repack(root, tmp / "bad.tar", sums=member(good, "SHA256SUMS")), "not in SHA256SUMS"
    return repack(root, tmp / "bad.tar"), "refs/replace would substitute git objects"  # sums rewritten too


@pytest.mark.docker
@pytest.mark.parametrize("kind", ["extra wheel", "extra wheel, sums rewritten", "emptied sums", "rewritten object",
                                  "replace ref", "replace ref, sums rewritten"])
def test_a_real_image_build_of_the_tampered_bundle_stops_before_the_engine(bundle, tmp_path, kind):
    """Not a dry run: `image build --bundle` of each HIGH tamper exits 2 in one line, writes no report and stages
    no context, so no `docker build` ever started."""
    stack, good, env = bundle
    bad, words = _tampered(kind, good, tmp_path)
    cache = tmp_path / "cache-after"
    report = tmp_path / "report.json"
    proc = trainbox(["image", "build", str(stack), "--bundle", str(bad), "-o", str(report)],
                    dict(env, TRAINBOX_CACHE=str(cache)))
    err = proc.stderr.strip()
    assert proc.returncode == 2 and len(err.splitlines()) == 1 and words in err, err
    assert not report.exists() and not (cache / "build").exists()
