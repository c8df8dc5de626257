"""Patch series: parsing, the zero-fuzz applier, pinned sources in the cache, verify, edit/export round trips.

Everything here runs offline on small synthetic sources (a tarball behind a file:// URL, a PyPI-style index
served on 127.0.0.1, a local bare git repository). The real megatron-core series is tested in
tests/test_megatron_patches.py.
"""

from __future__ import annotations

import hashlib
import http.server
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import threading
from pathlib import Path

import pytest

from trainbox.supply import patches
from trainbox.runtime.errors import TrainboxError
from trainbox.paths import REPO_ROOT
from trainbox.supply.fetch import fetch
from trainbox.supply.pins import Pin
from trainbox.supply.sources import SourceError, unpack

AP = patches.applier()
APPLIER = REPO_ROOT / "python" / "trainbox" / "runtime" / "apply_patches.py"
FIXED = {"GIT_AUTHOR_NAME": "Dev", "GIT_AUTHOR_EMAIL": "dev@example.org", "GIT_AUTHOR_DATE": "2024-05-01T10:00:00+0000",
         "GIT_COMMITTER_NAME": "Dev", "GIT_COMMITTER_EMAIL": "dev@example.org",
         "GIT_COMMITTER_DATE": "2024-05-01T10:00:00+0000"}


def core_py(variant: str = "v1") -> str:
    lines = []
    if variant == "shifted":  # same code three lines further down: hunks apply at an offset
        lines += ["# a", "# b", "# c"]
    for i in range(1, 16):
        body = f"    return {i}"
        if variant == "v2" and i == 12:
            body = f"    return {i}  # changed upstream"
        lines += [f"def f{i}():", body, ""]
    return "\n".join(lines) + "\n"


def make_tarball(dest: Path, version: str, variant: str) -> tuple[Path, str]:
    """An sdist-like demo-<version>.tar.gz with a single top directory."""
    path = dest / f"demo-{version}.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for name, text in {"demo/__init__.py": "", "demo/core.py": core_py(variant), "README": "demo\n"}.items():
            data = text.encode()
            info = tarfile.TarInfo(f"demo-{version}/{name}")
            info.size = len(data)
            info.mtime = 0
            tar.addfile(info, io.BytesIO(data))
    return path, hashlib.sha256(path.read_bytes()).hexdigest()


def url_pin(path: Path, sha: str) -> Pin:
    return Pin(key="demo", source="url", name="demo", url=path.as_uri(), sha256=(sha,))


def git(tree: Path, *args: str, env: dict | None = None) -> str:
    e = dict(os.environ, GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_NOSYSTEM="1", **FIXED)
    e.update(env or {})
    return subprocess.run(["git", "-C", str(tree), *args], check=True, capture_output=True, text=True,
                          env=e).stdout


def commit(tree: Path, subject: str, why: str = "Because the demo needs it.", status: str = "Pending",
           date: str | None = None) -> None:
    msg = f"{subject}\n\n{why}\n"
    if status:
        msg += f"\nUpstream-Status: {status}\n"
    git(tree, "commit", "-qam", msg, env={"GIT_AUTHOR_DATE": date} if date else None)


def replace(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new, 1))


@pytest.fixture
def env(tmp_path):
    """A demo source v1 (plus shifted and v2 variants), a cache, a patches dir with a two-patch series."""
    src = tmp_path / "src"
    src.mkdir()
    v1, v1sha = make_tarball(src, "1.0", "v1")
    shifted, shsha = make_tarball(src, "1.1", "shifted")
    v2, v2sha = make_tarball(src, "2.0", "v2")
    cache = tmp_path / "cache"
    pdir = tmp_path / "patches"
    (pdir / "demo").mkdir(parents=True)
    (pdir / "demo" / "series").write_text("# demo series\n")
    tree = tmp_path / "edit"
    pin = url_pin(v1, v1sha)
    patches.edit(pin, "demo", tree, patches_dir=pdir, cache_dir=cache)
    replace(tree / "demo" / "core.py", "    return 2\n", "    return 200\n")
    replace(tree / "demo" / "core.py", "    return 12\n", "    return 1200\n")
    commit(tree, "core: scale f2 and f12")
    replace(tree / "demo" / "core.py", "    return 7\n", "    return 700\n")
    commit(tree, "core: scale f7", status="Submitted https://example.org/pr/1")
    patches.export(tree, patches_dir=pdir)
    return {
        "tmp": tmp_path, "cache": cache, "pdir": pdir, "tree": tree, "pin": pin,
        "shifted": url_pin(shifted, shsha), "v2": url_pin(v2, v2sha),
    }


def series_bytes(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


# ---------------------------------------------------------------------------------------------------------
# layout and parsing


def test_export_writes_series_and_headers(env):
    d = env["pdir"] / "demo"
    names = AP.read_series(d)
    assert names == ["0001-core-scale-f2-and-f12.patch", "0002-core-scale-f7.patch"]
    assert (d / "series").read_text().startswith("# demo series\n\n0001-")  # the comment block is kept
    p1, p2 = AP.load_series(d)
    assert p1.subject == "core: scale f2 and f12" and p1.why == "Because the demo needs it."
    assert p1.upstream_status == "Pending"
    assert p2.upstream_status == "Submitted https://example.org/pr/1"
    assert p1.upstream_ref == f"{env['pin'].url} sha256:{env['pin'].sha256[0]}"
    assert [h.header.split(" @@")[0] for h in p1.files[0].hunks] == ["@@ -2,7 +2,7", "@@ -32,7 +32,7"]
    text = (d / names[0]).read_text()
    assert text.startswith("From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n")
    assert "Subject: [PATCH] core: scale f2 and f12" in text
    assert "\n-- \n" not in text  # no signature carrying the git version


def test_series_comments_blank_lines_and_errors(tmp_path, env):
    d = env["pdir"] / "demo"
    (d / "series").write_text("# c\n\n0001-core-scale-f2-and-f12.patch  # trailing comment\n\n")
    assert AP.read_series(d) == ["0001-core-scale-f2-and-f12.patch"]

    (d / "series").write_text("0001-core-scale-f2-and-f12.patch\n0009-missing.patch\n")
    with pytest.raises(AP.PatchError, match=r"series:2: 0009-missing.patch does not exist"):
        AP.read_series(d)
    (d / "series").write_text("0001-core-scale-f2-and-f12.patch\n0001-core-scale-f2-and-f12.patch\n")
    with pytest.raises(AP.PatchError, match="listed twice"):
        AP.read_series(d)
    (d / "notes.patch").write_text("just some notes\n")
    (d / "series").write_text("notes.patch\n")
    with pytest.raises(AP.PatchError, match=r"notes.patch: not a patch"):
        AP.load_series(d)
    with pytest.raises(TrainboxError, match="not a patch"):
        patches.load_series("demo", env["pdir"])
    shutil.rmtree(d)
    with pytest.raises(AP.PatchError, match="no such patch series directory"):
        AP.read_series(d)


def test_corrupt_and_unsafe_patches_are_refused(tmp_path, env):
    good = (env["pdir"] / "demo" / "0002-core-scale-f7.patch").read_text()
    cut = tmp_path / "cut.patch"
    cut.write_text(good[: good.index("+    return 700")])
    with pytest.raises(AP.PatchError, match="cut short"):
        AP.parse_patch(cut)
    escape = tmp_path / "escape.patch"
    escape.write_text(good.replace("a/demo/core.py", "a/../etc/passwd").replace("b/demo/core.py", "b/../etc/passwd"))
    with pytest.raises(AP.PatchError, match="leaves the tree"):
        AP.parse_patch(escape)
    marker = tmp_path / "marker.patch"
    marker.write_text(good.replace("+    return 700", "+<<<<<<< HEAD"))
    with pytest.raises(AP.PatchError, match="conflict marker"):
        AP.parse_patch(marker)
    rej = tmp_path / "rej.patch"
    rej.write_text(good.replace("demo/core.py", "demo/core.py.rej"))
    with pytest.raises(AP.PatchError, match=r"\.rej/\.orig"):
        AP.parse_patch(rej)


def test_applied_patches_lists_files_and_hashes(env):
    d = env["pdir"] / "demo"
    got = patches.applied_patches("demo", env["pdir"])
    assert [g["file"] for g in got] == AP.read_series(d)
    assert got[0]["sha256"] == hashlib.sha256((d / got[0]["file"]).read_bytes()).hexdigest()


# ---------------------------------------------------------------------------------------------------------
# applying


def unpacked(env, pin: Pin, name: str) -> Path:
    return unpack(fetch(pin, cache_dir=env["cache"]), env["tmp"] / name)


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_apply_clean_then_offset(env):
    series = AP.load_series(env["pdir"] / "demo")
    tree = unpacked(env, env["pin"], "t1")
    results = AP.apply_series(series, tree)
    assert [r.status for r in results] == ["clean", "clean"]
    text = (tree / "demo" / "core.py").read_text()
    assert "return 200\n" in text and "return 1200\n" in text and "return 700\n" in text

    tree2 = unpacked(env, env["shifted"], "t2")
    results = AP.apply_series(series, tree2)
    assert [r.status for r in results] == ["offset", "offset"]
    assert results[0].describe() == "offset (demo/core.py hunk 1: +3 lines, demo/core.py hunk 2: +3 lines)"
    assert "return 700\n" in (tree2 / "demo" / "core.py").read_text()

    tree3 = unpacked(env, env["shifted"], "t3")
    before = snapshot(tree3)
    results = AP.apply_series(series, tree3, strict=True)
    assert results[0].status == "failed" and "applies only +3 lines away" in results[0].describe()
    assert results[1].status == "skipped"
    assert snapshot(tree3) == before


def test_apply_fails_at_file_and_hunk_and_leaves_target_untouched(env):
    series = AP.load_series(env["pdir"] / "demo")
    tree = unpacked(env, env["v2"], "t")
    before = snapshot(tree)
    results = AP.apply_series(series, tree)
    assert results[0].status == "failed"
    assert results[0].describe() == (
        "fails at demo/core.py hunk 2 (@@ -32,7 +32,7 @@ def f11():): context does not match"
    )
    assert results[1].status == "skipped"
    # hunk 1 applied inside the scratch copy, but the target is as it was and holds no .rej/.orig
    assert snapshot(tree) == before


def test_apply_refuses_a_target_with_leftovers(env):
    series = AP.load_series(env["pdir"] / "demo")
    tree = unpacked(env, env["pin"], "t")
    (tree / "demo" / "core.py.orig").write_text("left by a blind patch run\n")
    with pytest.raises(AP.PatchError, match=r"leftovers of an earlier patch run \(demo/core.py.orig\)"):
        AP.apply_series(series, tree)


def test_apply_reports_a_missing_file(env, tmp_path):
    series = AP.load_series(env["pdir"] / "demo")
    tree = unpacked(env, env["pin"], "t")
    (tree / "demo" / "core.py").unlink()
    results = AP.apply_series(series, tree)
    assert results[0].describe() == "fails at demo/core.py: file not found in the tree"


def run_applier(*args: str, pythonpath: Path | None = None) -> subprocess.CompletedProcess:
    e = dict(os.environ)
    if pythonpath:
        e["PYTHONPATH"] = str(pythonpath)
    return subprocess.run([sys.executable, str(APPLIER), *args], capture_output=True, text=True, env=e)


def fake_dist(site: Path, version: str) -> None:
    """A stand-in installed distribution `demo` (dist-info only) so --dist finds site-packages and a version."""
    info = site / f"demo-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: demo\nVersion: {version}\n")


def test_applier_cli_target_and_dist(env):
    sdir = env["pdir"] / "demo"
    site = unpacked(env, env["pin"], "site")
    proc = run_applier("--series", str(sdir / "series"), "--target", str(site), "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "0001-core-scale-f2-and-f12.patch: clean" in proc.stdout
    assert "return 200" not in (site / "demo" / "core.py").read_text()  # dry run

    fake_dist(site, "1.0")
    cache = site / "demo" / "__pycache__"
    cache.mkdir()
    (cache / "core.cpython-311.pyc").write_bytes(b"stale")
    (cache / "__init__.cpython-311.pyc").write_bytes(b"untouched")
    rec = env["tmp"] / "rec" / "applied.json"
    proc = run_applier("--series-dir", str(sdir), "--dist", "demo", "--record", str(rec), pythonpath=site)
    assert proc.returncode == 0, proc.stderr
    assert "return 200" in (site / "demo" / "core.py").read_text()
    assert sorted(p.name for p in cache.iterdir()) == ["__init__.cpython-311.pyc"]  # stale bytecode dropped
    assert [p["file"] for p in json.loads(rec.read_text())["patches"]] == AP.read_series(sdir)

    # a second run meets an already patched tree: it fails and names the file
    proc = run_applier("--series-dir", str(sdir), "--dist", "demo", pythonpath=site)
    assert proc.returncode == 1
    assert "0001-core-scale-f2-and-f12.patch does not apply" in proc.stderr
    assert "demo/core.py: already applied" in proc.stderr


def test_applier_cli_pin_moved(env):
    """The image-build half of a moved pin: the applier fails, naming the patch and the hunk."""
    sdir = env["pdir"] / "demo"
    site = unpacked(env, env["v2"], "site")
    proc = run_applier("--series", str(sdir / "series"), "--target", str(site))
    assert proc.returncode == 1
    assert ("0001-core-scale-f2-and-f12.patch does not apply to" in proc.stderr
            and "fails at demo/core.py hunk 2 (@@ -32,7 +32,7 @@ def f11():)" in proc.stderr), proc.stderr
    assert not list(site.rglob("*.rej")) and not list(site.rglob("*.orig"))


def test_applier_cli_refuses_a_series_made_for_another_version(env):
    sdir = env["pdir"] / "demo"
    for p in sdir.glob("*.patch"):  # a series whose headers say it was made against demo 1.0
        text = p.read_text()
        ref = text[text.index("Upstream-Ref: "):].split("\n", 1)[0]
        p.write_text(text.replace(ref, f"Upstream-Ref: demo==1.0 sha256:{'0' * 64}"))
    site = unpacked(env, env["shifted"], "site")
    fake_dist(site, "1.1")
    before = snapshot(site)
    proc = run_applier("--series-dir", str(sdir), "--dist", "demo", pythonpath=site)
    assert proc.returncode == 1
    assert "made against demo 1.0, but 1.1 is installed" in proc.stderr
    assert snapshot(site) == before  # checked, never applied


def test_applier_without_gnu_patch(env, monkeypatch):
    monkeypatch.setenv("PATH", str(env["tmp"]))
    with pytest.raises(AP.PatchError, match="GNU patch is not installed"):
        AP.gnu_patch()


# ---------------------------------------------------------------------------------------------------------
# sources


def test_url_source_sha_mismatch_caches_nothing(env):
    bad = Pin(key="demo", source="url", name="demo", url=env["pin"].url, sha256=("1" * 64,))
    cache = env["tmp"] / "fresh-cache"
    with pytest.raises(SourceError, match=r"has sha256 [0-9a-f]{64}, but the pin says 1111"):
        fetch(bad, cache_dir=cache)
    assert not any(p.is_file() for p in cache.rglob("*"))
    assert not list((cache / "sources" / "sha256").iterdir())


def test_cached_source_works_offline_and_corruption_is_dropped(env):
    f = fetch(env["pin"], cache_dir=env["cache"], offline=True)  # the env fixture filled the cache
    assert f.sha256 == env["pin"].sha256[0]
    f.path.write_bytes(b"tampered")
    with pytest.raises(SourceError, match="not in the cache"):
        fetch(env["pin"], cache_dir=env["cache"], offline=True)
    assert fetch(env["pin"], cache_dir=env["cache"]).path.read_bytes() != b"tampered"  # re-downloaded


def test_unpack_is_all_or_nothing(env, tmp_path):
    evil = tmp_path / "evil.tar.gz"
    with tarfile.open(evil, "w:gz") as tar:
        info = tarfile.TarInfo("../outside")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    pin = url_pin(evil, hashlib.sha256(evil.read_bytes()).hexdigest())
    dest = tmp_path / "tree"
    with pytest.raises(SourceError, match="leaves the tree; nothing was unpacked"):
        unpack(fetch(pin, cache_dir=env["cache"]), dest)
    assert not dest.exists() and not (tmp_path / ".tree.partial").exists()


class _Index(http.server.BaseHTTPRequestHandler):
    """A PEP 691 index on 127.0.0.1: /simple/demo/ lists the files in `routes`."""

    routes: dict[str, tuple[str, bytes]] = {}

    def do_GET(self):  # noqa: N802
        ctype, body = self.routes.get(self.path, ("text/plain", b""))
        self.send_response(200 if self.path in self.routes else 404)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def index_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Index)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server, f"http://127.0.0.1:{server.server_address[1]}/simple"
    finally:
        server.shutdown()
        server.server_close()


def test_pypi_source_from_an_index(env, index_server):
    server, url = index_server
    sdist = Path(env["pin"].url[len("file://"):]).read_bytes()
    sha = hashlib.sha256(sdist).hexdigest()
    files = [
        {"filename": "demo-1.0.tar.gz", "url": "/files/demo-1.0.tar.gz", "hashes": {"sha256": sha}},
        {"filename": "demo-1.0-py3-none-any.whl", "url": "/files/other.whl", "hashes": {"sha256": "2" * 64}},
        {"filename": "demo-0.9.tar.gz", "url": "/files/old.tar.gz", "hashes": {"sha256": "3" * 64}},
    ]
    _Index.routes = {
        "/simple/demo/": ("application/vnd.pypi.simple.v1+json", json.dumps({"files": files}).encode()),
        "/files/demo-1.0.tar.gz": ("application/octet-stream", sdist),
    }
    cache = env["tmp"] / "c2"
    pin = Pin(key="demo", source="pypi", name="demo", version="1.0", index_name="local", index_url=url,
              sha256=(sha,))
    got = fetch(pin, cache_dir=cache)
    assert got.filename == "demo-1.0.tar.gz" and got.kind == "sdist"
    assert got.upstream_ref == f"demo==1.0 sha256:{sha} (tree: sdist root, patch -p1)"
    assert (unpack(got, env["tmp"] / "tree") / "demo" / "core.py").is_file()  # top directory stripped

    server.shutdown()  # from here on only the cache can answer
    assert fetch(pin, cache_dir=cache, offline=True).path == got.path
    assert fetch(pin, cache_dir=cache).path == got.path

    with pytest.raises(SourceError, match="no sha256 pinned"):
        fetch(Pin(key="demo", source="pypi", name="demo", version="1.0", index_url=url), cache_dir=cache)


def test_pypi_source_whose_bytes_do_not_match_the_pin(env, index_server):
    _, url = index_server
    files = [{"filename": "demo-1.0.tar.gz", "url": "/files/demo-1.0.tar.gz", "hashes": {"sha256": "4" * 64}}]
    _Index.routes = {
        "/simple/demo/": ("application/vnd.pypi.simple.v1+json", json.dumps({"files": files}).encode()),
        "/files/demo-1.0.tar.gz": ("application/octet-stream", b"not the pinned bytes"),
    }
    cache = env["tmp"] / "c3"
    pin = Pin(key="demo", source="pypi", name="demo", version="1.0", index_url=url, sha256=("4" * 64,))
    with pytest.raises(SourceError, match="but the pin says 4444"):
        fetch(pin, cache_dir=cache)
    assert not any(p.is_file() for p in cache.rglob("*"))
    other = Pin(key="demo", source="pypi", name="demo", version="1.0", index_url=url, sha256=("5" * 64,))
    with pytest.raises(SourceError, match="none of the 1 files of demo==1.0"):
        fetch(other, cache_dir=cache)


def test_git_source_by_commit(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    git(work, "init", "-q")
    (work / "lib.py").write_text("x = 1\n")
    git(work, "add", "-A")
    git(work, "commit", "-qm", "one")
    first = git(work, "rev-parse", "HEAD").strip()
    (work / "lib.py").write_text("x = 2\n")
    git(work, "commit", "-qam", "two")
    bare = tmp_path / "upstream.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(bare)], check=True)
    cache = tmp_path / "cache"
    pin = Pin(key="lib", source="git", name="lib", git=bare.as_uri(), commit=first)
    got = fetch(pin, cache_dir=cache)
    assert got.upstream_ref == f"{bare.as_uri()}@{first}"
    assert (unpack(got, tmp_path / "tree") / "lib.py").read_text() == "x = 1\n"
    shutil.rmtree(bare)  # offline from here
    assert fetch(pin, cache_dir=cache, offline=True).commit == first
    with pytest.raises(SourceError, match="cannot fetch from .*upstream.git: fatal: .*does not appear to be a git"):
        fetch(Pin(key="lib", source="git", name="lib", git=pin.git, commit="f" * 40), cache_dir=cache)
    with pytest.raises(SourceError, match="exact `commit`"):
        fetch(Pin(key="lib", source="git", name="lib", git=pin.git, commit=None), cache_dir=cache)


# ---------------------------------------------------------------------------------------------------------
# verify


def test_verify_pin_clean(env):
    rows = patches.verify_pin(env["pin"], "demo", stack="s", patches_dir=env["pdir"], cache_dir=env["cache"],
                              offline=True)
    assert [(r.patch, r.result, r.ok) for r in rows] == [
        ("0001-core-scale-f2-and-f12.patch", "clean", True), ("0002-core-scale-f7.patch", "clean", True)]
    table = patches.format_table(rows)
    assert table.splitlines()[0].split() == ["STACK", "COMPONENT", "PINNED", "REF", "PATCH", "RESULT"]
    assert json.loads(patches.rows_json(rows))["ok"] is True


def test_verify_pin_moved_names_patch_and_hunk(env):
    rows = patches.verify_pin(env["v2"], "demo", patches_dir=env["pdir"], cache_dir=env["cache"])
    assert not rows[0].ok and rows[0].status == "failed"
    assert rows[0].result.startswith("fails at demo/core.py hunk 2 (@@ -32,7 +32,7 @@ def f11():)")
    assert "made against sha256:" in rows[0].result  # the header names another artifact, too
    assert rows[1].status == "skipped" and not rows[1].ok
    data = json.loads(patches.rows_json(rows))
    assert data["ok"] is False and data["results"][0]["hunks"][0]["number"] == 2


def test_verify_flags_a_patch_made_for_another_artifact_even_if_it_applies(env):
    rows = patches.verify_pin(env["shifted"], "demo", patches_dir=env["pdir"], cache_dir=env["cache"])
    assert rows[0].status == "failed" and rows[0].result.startswith("offset (")
    assert "which the pin does not name" in rows[0].result


def test_verify_reports_bad_input_as_rows(env):
    bad_pin = Pin(key="demo", source="url", name="demo", url=env["pin"].url, sha256=("9" * 64,))
    cache = env["tmp"] / "c4"
    rows = patches.verify_pin(bad_pin, "demo", patches_dir=env["pdir"], cache_dir=cache)
    assert len(rows) == 1 and rows[0].patch == "(source)" and "but the pin says 9999" in rows[0].result
    assert not any(p.is_file() for p in cache.rglob("*"))
    (env["pdir"] / "demo" / "series").write_text("0404-nope.patch\n")
    rows = patches.verify_pin(env["pin"], "demo", patches_dir=env["pdir"], cache_dir=env["cache"])
    assert rows[0].patch == "(series)" and "0404-nope.patch does not exist" in rows[0].result


def test_verify_checks_headers(env):
    p = env["pdir"] / "demo" / "0002-core-scale-f7.patch"
    p.write_text(p.read_text().replace("Upstream-Status: Submitted https://example.org/pr/1", "Upstream-Status: Maybe"))
    rows = patches.verify_pin(env["pin"], "demo", patches_dir=env["pdir"], cache_dir=env["cache"])
    assert rows[0].ok and not rows[1].ok
    assert "Upstream-Status 'Maybe': expected one of Pending" in rows[1].result


# ---------------------------------------------------------------------------------------------------------
# edit / export


def test_edit_export_round_trip_is_byte_identical(env):
    d = env["pdir"] / "demo"
    before = series_bytes(d)
    tree, applied, stopped = patches.edit(env["pin"], "demo", env["tree"], force=True, patches_dir=env["pdir"],
                                          cache_dir=env["cache"], offline=True)
    assert stopped is None and applied == AP.read_series(d)
    assert git(tree, "log", "--format=%s", "upstream..").splitlines() == ["core: scale f7", "core: scale f2 and f12"]
    patches.export(tree, patches_dir=env["pdir"])
    assert series_bytes(d) == before


def test_export_shows_only_the_change(env):
    d = env["pdir"] / "demo"
    before = series_bytes(d)
    tree = env["tree"]
    # amend the first patch the README way (rebase keeps the second patch's author date), then add a third
    git(tree, "rebase", "-q", "-i", "upstream", env={"GIT_SEQUENCE_EDITOR": "sed -i 1s/^pick/edit/"})
    replace(tree / "demo" / "core.py", "    return 200\n", "    return 2000\n")
    git(tree, "commit", "-q", "-a", "--amend", "--no-edit")
    git(tree, "rebase", "--continue")
    replace(tree / "demo" / "core.py", "    return 9\n", "    return 900\n")
    commit(tree, "core: scale f9", status="Inappropriate [demo only]", date="2024-06-01T00:00:00+0000")
    patches.export(tree, patches_dir=env["pdir"])
    after = series_bytes(d)
    assert after["0002-core-scale-f7.patch"] == before["0002-core-scale-f7.patch"]
    assert after["0001-core-scale-f2-and-f12.patch"] != before["0001-core-scale-f2-and-f12.patch"]
    assert "0003-core-scale-f9.patch" in after
    assert after["series"].decode().splitlines()[-1] == "0003-core-scale-f9.patch"
    old_lines = before["0001-core-scale-f2-and-f12.patch"].decode().splitlines()
    new_lines = (d / "0001-core-scale-f2-and-f12.patch").read_text().splitlines()
    assert len(old_lines) == len(new_lines)
    assert [b for a, b in zip(old_lines, new_lines) if a != b] == ["+    return 2000"]
    assert not any(ln.startswith("index ") for ln in new_lines)  # blob hashes would change with other patches


def test_export_refuses_incomplete_work(env):
    tree, d = env["tree"], env["pdir"] / "demo"
    before = series_bytes(d)
    replace(tree / "demo" / "core.py", "    return 3\n", "    return 300\n")
    with pytest.raises(TrainboxError, match="uncommitted changes"):
        patches.export(tree, patches_dir=env["pdir"])
    commit(tree, "core: scale f3", status="")
    with pytest.raises(TrainboxError, match="0003-core-scale-f3.patch: no Upstream-Status header"):
        patches.export(tree, patches_dir=env["pdir"])
    git(tree, "commit", "-q", "--amend", "-m", "core: scale f3\n\nUpstream-Status: Pending\n")
    with pytest.raises(TrainboxError, match="no explanation of why"):
        patches.export(tree, patches_dir=env["pdir"])
    assert series_bytes(d) == before
    with pytest.raises(TrainboxError, match="not a trainbox edit tree"):
        patches.export(env["tmp"], patches_dir=env["pdir"])
    with pytest.raises(TrainboxError, match="already exists"):
        patches.edit(env["pin"], "demo", tree, patches_dir=env["pdir"], cache_dir=env["cache"])


def test_edit_after_a_pin_move_stops_at_the_failing_patch_then_rebases(env):
    tree = env["tmp"] / "edit2"
    _, applied, stopped = patches.edit(env["v2"], "demo", tree, patches_dir=env["pdir"], cache_dir=env["cache"])
    assert applied == [] and stopped == "0001-core-scale-f2-and-f12.patch"
    with pytest.raises(TrainboxError, match="git am/rebase is still in progress|`git am`/rebase is still"):
        patches.export(tree, patches_dir=env["pdir"])
    # resolve by hand, as the README says: redo the change on the new upstream and continue
    replace(tree / "demo" / "core.py", "    return 2\n", "    return 200\n")
    replace(tree / "demo" / "core.py", "    return 12  # changed upstream\n", "    return 1200  # changed upstream\n")
    git(tree, "add", "-A")
    git(tree, "am", "--continue")
    git(tree, "am", "--continue") if (tree / ".git" / "rebase-apply").exists() else None
    patches.export(tree, patches_dir=env["pdir"])
    rows = patches.verify_pin(env["v2"], "demo", patches_dir=env["pdir"], cache_dir=env["cache"])
    assert all(r.ok for r in rows), rows
    p1 = AP.parse_patch(env["pdir"] / "demo" / "0001-core-scale-f2-and-f12.patch")
    assert p1.upstream_ref == f"{env['v2'].url} sha256:{env['v2'].sha256[0]}"  # the new artifact


def test_cli_patches_help_lists_subcommands(capsys):
    from trainbox.cli import main

    with pytest.raises(SystemExit):
        main(["patches", "--help"])
    out = capsys.readouterr().out
    assert "verify" in out and "edit" in out and "export" in out


def test_stack_selection_errors():
    assert patches.verify(["cpu"]) == []  # the cpu stack patches nothing
    with pytest.raises(TrainboxError, match="no component 'nope'"):
        patches.verify(["npu-910b"], "nope")
    with pytest.raises(TrainboxError, match="has no `patches:` series"):
        patches.verify(["npu-910b"], "torch")
    with pytest.raises(TrainboxError, match="name it"):
        patches.verify(None, sets={"megatron-core.version": "0.16.0"})


def test_pin_from_component_collects_platform_hashes():
    from types import SimpleNamespace

    from trainbox.supply.fetch import pin_from_component

    pins = {"linux/amd64": SimpleNamespace(version="1.0", sha256=["a" * 64]),
            "linux/arm64": SimpleNamespace(version="1.0", sha256=["b" * 64, "a" * 64])}
    comp = SimpleNamespace(key="demo", source="pypi", name="demo-dist", dist_name="demo-dist", version="1.0",
                           index="mirror", sha256=["c" * 64], git=None, commit=None, url=None,
                           pin_for=lambda plat: pins[plat])
    stack = SimpleNamespace(platforms=["linux/amd64", "linux/arm64"], indexes={"mirror": "https://m.example/simple"})
    pin = pin_from_component(comp, stack)
    assert pin.sha256 == ("c" * 64, "a" * 64, "b" * 64)
    assert pin.index_url == "https://m.example/simple" and pin.ref == "demo-dist==1.0"
