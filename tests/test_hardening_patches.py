"""Issue 14, item 2: a patch may change regular files inside its tree and nothing else.

A symlink-creating patch (`new file mode 120000` pointing at /etc/hostname) used to be "clean" and the applier
copied the link target's contents into the tree; an absolute `+++ /tmp/x` path was silently written inside the
tree. Both, and `..`, renames out of the tree and links already in the tree, are refused with patch and line.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from trainbox.supply import patches
from trainbox.paths import REPO_ROOT

AP = patches.applier()
APPLIER = REPO_ROOT / "python" / "trainbox" / "runtime" / "apply_patches.py"

HEADER = """From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001
From: Dev <dev@example.org>
Date: Wed, 1 May 2024 10:00:00 +0000
Subject: [PATCH] {subject}

Why: a test.

Upstream-Status: Pending
---
"""

SYMLINK = """diff --git a/pkg/hostname b/pkg/hostname
new file mode 120000
index 0000000..1111111
--- /dev/null
+++ b/pkg/hostname
@@ -0,0 +1 @@
+/etc/hostname
\\ No newline at end of file
"""

ABSOLUTE = """--- a/pkg/core.py
+++ /tmp/trainbox-absolute-x
@@ -1 +1 @@
-x = 1
+x = 2
"""

DOTDOT = """diff --git a/pkg/../../escape.py b/pkg/../../escape.py
--- a/pkg/../../escape.py
+++ b/pkg/../../escape.py
@@ -1 +1 @@
-x = 1
+x = 2
"""

RENAME_OUT = """diff --git a/pkg/core.py b/pkg/core2.py
similarity index 100%
rename from pkg/core.py
rename to ../outside.py
"""

MODE_TO_LINK = """diff --git a/pkg/core.py b/pkg/core.py
old mode 100644
new mode 120000
"""

GOOD = """diff --git a/pkg/core.py b/pkg/core.py
--- a/pkg/core.py
+++ b/pkg/core.py
@@ -1 +1 @@
-x = 1
+x = 2
"""


def series(tmp_path: Path, body: str) -> Path:
    d = tmp_path / "series-dir"
    d.mkdir(exist_ok=True)
    (d / "0001-test.patch").write_text(HEADER.format(subject="test") + body)
    (d / "series").write_text("0001-test.patch\n")
    return d


def tree(tmp_path: Path) -> Path:
    t = tmp_path / "tree"
    (t / "pkg").mkdir(parents=True)
    (t / "pkg" / "core.py").write_text("x = 1\n")
    return t


@pytest.mark.parametrize("body, line, words", [
    (SYMLINK, 2, "symbolic link"),
    (ABSOLUTE, 2, "absolute path"),
    (DOTDOT, 1, "leaves the tree"),
    (RENAME_OUT, 4, "leaves the tree"),
    (MODE_TO_LINK, 3, "symbolic link"),
])
def test_patch_leaving_its_tree_is_refused_with_patch_and_line(tmp_path, body, line, words):
    d = series(tmp_path, body)
    diff_start = HEADER.count("\n")  # the diff starts on the line after the header
    with pytest.raises(AP.PatchError) as exc:
        AP.load_series(d)
    msg = str(exc.value)
    assert f"0001-test.patch:{diff_start + line}:" in msg, msg
    assert words in msg


def test_applier_cli_refuses_a_symlink_patch_and_copies_nothing(tmp_path):
    t = tree(tmp_path)
    d = series(tmp_path, SYMLINK)
    proc = subprocess.run([sys.executable, str(APPLIER), "--series-dir", str(d), "--target", str(t)],
                          capture_output=True, text=True)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "symbolic link" in proc.stderr and "Traceback" not in proc.stderr
    assert not (t / "pkg" / "hostname").exists()


def test_absolute_path_is_not_written_into_the_tree(tmp_path):
    t = tree(tmp_path)
    d = series(tmp_path, ABSOLUTE)
    proc = subprocess.run([sys.executable, str(APPLIER), "--series-dir", str(d), "--target", str(t)],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "absolute path" in proc.stderr
    assert not (t / "tmp").exists() and (t / "pkg" / "core.py").read_text() == "x = 1\n"


def test_a_link_already_in_the_tree_is_not_patched_through(tmp_path):
    t = tree(tmp_path)
    outside = tmp_path / "outside.py"
    outside.write_text("x = 1\n")
    (t / "pkg" / "core.py").unlink()
    (t / "pkg" / "core.py").symlink_to(outside)
    with pytest.raises(AP.PatchError, match="symbolic link"):
        AP.apply_series(AP.load_series(series(tmp_path, GOOD)), t)
    assert outside.read_text() == "x = 1\n"


def test_regular_patch_still_applies(tmp_path):
    t = tree(tmp_path)
    results = AP.apply_series(AP.load_series(series(tmp_path, GOOD)), t)
    assert [r.status for r in results] == ["clean"]
    assert (t / "pkg" / "core.py").read_text() == "x = 2\n"


def test_non_utf8_series_file_is_one_line_error(tmp_path):
    d = series(tmp_path, GOOD)
    (d / "series").write_bytes(b"0001-test.patch\n\xff\xfe\n")
    proc = subprocess.run([sys.executable, str(APPLIER), "--series-dir", str(d), "--target", str(tree(tmp_path)),
                           "--dry-run"], capture_output=True, text=True)
    assert proc.returncode == 2 and "not UTF-8" in proc.stderr and "Traceback" not in proc.stderr


def test_host_verify_reports_symlink_patch_as_error(tmp_path):
    # the host side (trainbox patches) reads series through the same parser
    pdir = tmp_path / "patches"
    pdir.mkdir()
    series(tmp_path, SYMLINK).rename(pdir / "demo")
    with pytest.raises(patches.PatchSeriesError, match="symbolic link"):
        patches.load_series("demo", pdir)
