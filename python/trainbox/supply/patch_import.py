"""`trainbox patches import DIFF --component NAME`: a diff taken from another project becomes series entries
(host module).

Projects keep single diffs against a pinned upstream (Relax's docker/npu_patch/*.patch: a plain `git diff`, no
message, no provenance). Importing one builds the component's edit tree at its pinned source with the series so
far (`patches edit`), applies the diff there one file at a time with `git apply` (no fuzz), commits each file as
its own entry whose message says where it came from and carries `Upstream-Status:` and `Upstream-Ref: URL@sha`
(the pin's exact reference), and writes the series back (`patches export`). A diff that does not apply to the
pin fails naming the file and git's reason; nothing in patches/ changes then.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path

from .patches import PatchSeriesError, edit, edit_meta, export, resolve_component, workspace_git

_FILE_RE = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.MULTILINE)


def split_diff(text: str) -> list[tuple[str, str]]:
    """[(path, the part of the diff for that file)] in order; plain `--- a/ +++ b/` diffs are accepted too."""
    starts = [(m.start(), m.group(2)) for m in _FILE_RE.finditer(text)]
    if not starts:
        plain = list(re.finditer(r"^--- (?:a/)?(\S+).*\n\+\+\+ (?:b/)?(\S+)", text, re.MULTILINE))
        starts = [(m.start(), m.group(2)) for m in plain]
    out = []
    for i, (pos, path) in enumerate(starts):
        end = starts[i + 1][0] if i + 1 < len(starts) else len(text)
        out.append((path, text[pos:end].rstrip("\n") + "\n"))
    return out


def import_diff(diff: Path, component: str, *, stack: str | None = None, status: str = "Pending",
                why: str | None = None, offline: bool = False, patches_dir: Path | None = None) -> list[str]:
    """Append the diff's files to the component's series; returns the new series' patch names."""
    diff = Path(diff)
    if not diff.is_file():
        raise PatchSeriesError(f"{diff}: no such file; give the diff to import")
    parts = split_diff(diff.read_text(errors="replace"))
    if not parts:
        raise PatchSeriesError(f"{diff}: holds no diff (no `diff --git` or `--- a/ +++ b/` sections)")
    _, pin, series = resolve_component(component, stack)
    work = Path(tempfile.mkdtemp(prefix=f"trainbox-import-{component}-"))
    try:
        tree, _, stopped = edit(pin, series, work / component, offline=offline, patches_dir=patches_dir)
        if stopped:
            raise PatchSeriesError(f"component {component}: the existing series stops at {stopped} on {pin.ref}; "
                                   "fix the series first (`trainbox patches verify`)")
        ref = edit_meta(tree)["upstream_ref"]
        for path, chunk in parts:
            one = work / "one.patch"
            one.write_text(chunk)
            proc = workspace_git("apply", "--index", "--whitespace=nowarn", str(one), check=False, cwd=tree)
            if proc.returncode != 0:
                reason = (proc.stderr.strip().splitlines() or ["?"])[0]
                raise PatchSeriesError(f"{diff}: the change to {path} does not apply to {pin.ref}: {reason}")
            workspace_git("commit", "--quiet", "--no-verify", "-m",
                          f"{path}: from {diff.name}\n\n"
                          "Why: " + (why or f"imported from {diff.name}, a diff kept outside this project; "
                                     "one entry per file") +
                          f"\n\nUpstream-Status: {status}\nUpstream-Ref: {ref}\n", cwd=tree)
        _, names = export(tree, patches_dir=patches_dir)
        return names
    finally:
        shutil.rmtree(work, ignore_errors=True)
