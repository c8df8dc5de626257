#!/usr/bin/env python3
"""Apply one trainbox patch series to an installed tree, strictly.

Runs inside image builds (any Python 3.10+, standard library only) and is imported by the host-side
`trainbox patches verify`, so both report the same way. For each patch of `<series-dir>/series`, in
order, GNU patch applies it with zero fuzz to a scratch copy of the files the series touches; the first
patch that does not apply stops the run with "fails at FILE hunk N (@@ ... @@)" and exit status 1.
Only when the whole series applied are the files copied back into the target, so a failed run leaves the
target as it was. Patches that add conflict markers or .rej/.orig files are refused, and so is a target
that still holds .rej/.orig files from an earlier blind `patch` run.

    python3 apply_patches.py --series-dir /tmp/patches/megatron-core --dist megatron-core
    python3 apply_patches.py --series patches/megatron-core/series --target /path/to/site-packages --dry-run

--dist NAME finds the target (the site-packages directory the distribution is installed in) and its
version, which must be the version named by each patch's `Upstream-Ref: NAME==VERSION ...` header.
"""

from __future__ import annotations

import argparse
import codecs
import email.parser
import email.policy
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

PROG = "trainbox-apply-patches"
UPSTREAM_STATUSES = ("Pending", "Submitted", "Accepted", "Backport", "Inappropriate")
# `Upstream-Ref: megatron-core==0.15.3 sha256:<hex> ...` (pypi) / `<url>@<40 hex>` (git) / `<url> sha256:<hex>`
PYPI_REF_RE = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>\S+)(?:\s+sha256:(?P<sha256>[0-9a-f]{64}))?")
GIT_REF_RE = re.compile(r"^(?P<url>\S+)@(?P<commit>[0-9a-f]{40})\b")
URL_REF_RE = re.compile(r"^(?P<url>\S+)\s+sha256:(?P<sha256>[0-9a-f]{64})")
HUNK_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@(.*)$")
CONFLICT_RE = re.compile(r"^(<{7}|>{7}|\|{7})( |$)")
LEFTOVER_SUFFIXES = (".rej", ".orig")


class PatchError(Exception):
    """A series or patch that cannot be used; the message names the file and the fix."""


def canon_name(name: str) -> str:
    """PEP 503 normalised project name: the one copy (trainbox.specs.dists and the doctor use it too). It lives here
    because this file runs alone in the builder, where it cannot import a sibling module."""
    return re.sub(r"[-_.]+", "-", name).lower()


# ---------------------------------------------------------------------------------------------------------
# parsing


@dataclass
class Hunk:
    number: int  # 1-based within its file, as GNU patch counts
    header: str  # the "@@ -a,b +c,d @@ context" line
    old_start: int
    old_len: int
    new_start: int
    new_len: int


@dataclass
class FilePatch:
    old_path: str | None  # relative path after stripping one component; None for /dev/null
    new_path: str | None
    hunks: list[Hunk] = field(default_factory=list)

    @property
    def path(self) -> str:
        return self.new_path or self.old_path or "?"


@dataclass
class Patch:
    name: str
    path: Path
    sha256: str
    subject: str
    author: str
    date: str
    message: str  # commit message body (the why and the trailers), without the subject
    trailers: dict[str, str]
    files: list[FilePatch]

    @property
    def upstream_status(self) -> str | None:
        return self.trailers.get("Upstream-Status")

    @property
    def upstream_ref(self) -> str | None:
        return self.trailers.get("Upstream-Ref")

    @property
    def why(self) -> str:
        lines = [ln for ln in self.message.splitlines() if not _trailer(ln)]
        return "\n".join(lines).strip()

    def touched(self) -> list[str]:
        out: list[str] = []
        for f in self.files:
            for p in (f.old_path, f.new_path):
                if p and p not in out:
                    out.append(p)
        return out


def _trailer(line: str) -> tuple[str, str] | None:
    m = re.match(r"^(Upstream-Status|Upstream-Ref):\s*(.*?)\s*$", line)
    return (m.group(1), m.group(2)) if m else None


def _unquote(path: str) -> str:
    # git C-quotes paths with unusual characters: "a/sp\303\244ce.py"
    if len(path) >= 2 and path[0] == '"' and path[-1] == '"':
        raw = codecs.escape_decode(path[1:-1].encode("utf-8"))[0]
        return raw.decode("utf-8", "surrogateescape")
    return path


def _strip_one(path: str, where: str) -> str | None:
    path = _unquote(path.split("\t")[0].strip())
    if path == "/dev/null":
        return None
    if path.startswith("/"):
        raise PatchError(f"{where}: absolute path {path!r}; patch paths are relative to the tree (a/..., b/...)")
    parts = path.split("/", 1)
    if len(parts) != 2 or not parts[1]:
        raise PatchError(f"{where}: path {path!r} has no leading component to strip (patches use a/ and b/)")
    return _inside(parts[1], path, where)


def _inside(rel: str, shown: str, where: str) -> str:
    if rel.startswith("/") or ".." in rel.split("/") or "\x00" in rel:
        raise PatchError(f"{where}: path {shown!r} leaves the tree; patch paths must stay inside it")
    return rel


# git modes a patch may not create: a symlink (120000) could make the applier copy a host file into the
# tree, a gitlink (160000) names a submodule commit, not file contents
_REFUSED_MODES = {"120000": "a symbolic link", "160000": "a submodule (gitlink)"}
_MODE_RE = re.compile(r"^(new file mode|deleted file mode|old mode|new mode|index [0-9a-f]+\.\.[0-9a-f]+) ?([0-7]{6})?")
_RENAME_RE = re.compile(r"^(rename|copy) (from|to) (.+)$")


def parse_patch(path: Path) -> Patch:
    """Read a git format-patch file: mail headers, message (why + trailers), then unified diffs."""
    path = Path(path)
    where = str(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise PatchError(f"{where}: no such file") from None
    except IsADirectoryError:
        raise PatchError(f"{where}: is a directory, not a patch file") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise PatchError(f"{where}: not UTF-8 text, so not a patch") from None
    lines = text.split("\n")

    # where the diff starts
    start = None
    for i, ln in enumerate(lines):
        if ln.startswith("diff --git ") or (
            ln.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ ")
        ):
            start = i
            break
    if start is None:
        raise PatchError(
            f"{where}: not a patch (no 'diff --git' or '---/+++' section); write it with "
            "`trainbox patches export` (git format-patch)"
        )

    head = lines[:start]
    if head and head[0].startswith("From ") and not head[0].startswith("From:"):
        head = head[1:]  # the mbox separator line
    blank = head.index("") if "" in head else len(head)
    hdr = email.parser.HeaderParser(policy=email.policy.default).parsestr("\n".join(head[:blank]) + "\n\n")
    subject = str(hdr.get("Subject") or "").strip()
    subject = re.sub(r"^\[PATCH[^\]]*\]\s*", "", subject)
    body_lines = head[blank + 1:]
    # the message ends at the '---' line that precedes the diffstat / diff
    if "---" in body_lines:
        body_lines = body_lines[: len(body_lines) - 1 - body_lines[::-1].index("---")]
    message = "\n".join(body_lines).strip("\n")
    trailers: dict[str, str] = {}
    for ln in body_lines:
        t = _trailer(ln)
        if t:
            trailers[t[0]] = t[1]

    files = _parse_diff(lines, start, where)
    if not files:
        raise PatchError(f"{where}: not a patch (no file changes in its diff section)")
    return Patch(
        name=path.name,
        path=path,
        sha256=hashlib.sha256(data).hexdigest(),
        subject=subject,
        author=str(hdr.get("From") or ""),
        date=str(hdr.get("Date") or ""),
        message=message,
        trailers=trailers,
        files=files,
    )


def _check_extended_header(ln: str, at: str) -> None:
    """Refuse a git extended header line that would make a link or a submodule, or move a file out."""
    mode = _MODE_RE.match(ln)
    if mode and mode.group(2) in _REFUSED_MODES:
        raise PatchError(f"{at}: {ln!r}: the patch makes {_REFUSED_MODES[mode.group(2)]}; "
                         "patches may change regular files only")
    moved = _RENAME_RE.match(ln)
    if moved:
        _inside(_unquote(moved.group(3)), moved.group(3), at)


def _parse_diff(lines: list[str], i: int, where: str) -> list[FilePatch]:
    files: list[FilePatch] = []
    cur: FilePatch | None = None
    n = len(lines)
    while i < n:
        ln = lines[i]
        if ln.startswith("diff --git "):
            m = re.match(r'^diff --git ("(?:[^"\\]|\\.)*"|\S+) ("(?:[^"\\]|\\.)*"|\S+)$', ln)
            if not m:
                raise PatchError(f"{where}:{i + 1}: cannot read the file names in {ln!r}")
            at = f"{where}:{i + 1}"
            cur = FilePatch(_strip_one(m.group(1), at), _strip_one(m.group(2), at))
            files.append(cur)
            i += 1
            continue
        _check_extended_header(ln, f"{where}:{i + 1}")
        if ln.startswith("new file mode"):
            if cur:
                cur.old_path = None
        elif ln.startswith("deleted file mode"):
            if cur:
                cur.new_path = None
        elif ln.startswith(("GIT binary patch", "Binary files ")):
            raise PatchError(f"{where}:{i + 1}: binary patches are not supported; ship binary files another way")
        elif ln.startswith("--- ") and i + 1 < n and lines[i + 1].startswith("+++ "):
            old = _strip_one(ln[4:], f"{where}:{i + 1}")
            new = _strip_one(lines[i + 1][4:], f"{where}:{i + 2}")
            if cur is None or cur.hunks:
                cur = FilePatch(old, new)
                files.append(cur)
            else:
                cur.old_path, cur.new_path = old, new
            i += 2
            continue
        elif ln.startswith("@@"):
            m = HUNK_RE.match(ln)
            if not m or cur is None:
                raise PatchError(f"{where}:{i + 1}: malformed hunk header {ln!r}")
            old_len = int(m.group(2)) if m.group(2) is not None else 1
            new_len = int(m.group(4)) if m.group(4) is not None else 1
            hunk = Hunk(len(cur.hunks) + 1, ln, int(m.group(1)), old_len, int(m.group(3)), new_len)
            cur.hunks.append(hunk)
            i += 1
            o = nw = 0
            while o < old_len or nw < new_len:
                if i >= n:
                    raise PatchError(f"{where}: hunk {ln!r} is cut short (the file ends inside it)")
                body = lines[i]
                tag = body[:1]
                if tag == " " or body == "":  # some editors strip the space of empty context lines
                    o += 1
                    nw += 1
                elif tag == "-":
                    o += 1
                elif tag == "+":
                    nw += 1
                    if CONFLICT_RE.match(body[1:]):
                        raise PatchError(
                            f"{where}:{i + 1}: adds a conflict marker ({body[1:8]}); finish the merge in the "
                            "edit tree (`trainbox patches edit`) and export again"
                        )
                elif tag == "\\":
                    pass
                else:
                    raise PatchError(f"{where}:{i + 1}: hunk {ln!r} holds a line that is not ' ', '-' or '+'")
                i += 1
            while i < n and lines[i].startswith("\\"):
                i += 1
            continue
        i += 1
    for f in files:
        for p in (f.old_path, f.new_path):
            if p and p.endswith(LEFTOVER_SUFFIXES):
                raise PatchError(f"{where}: touches {p}, a .rej/.orig leftover; remove it from the patch")
    return files


def read_series(series_dir: Path) -> list[str]:
    """Patch file names from `series`, in order; comments (#) and blank lines are skipped."""
    series_dir = Path(series_dir)
    sfile = series_dir / "series"
    if not series_dir.is_dir():
        raise PatchError(f"{series_dir}: no such patch series directory")
    if not sfile.is_file():
        raise PatchError(f"{sfile}: missing; a series directory lists its patches, one per line, in `series`")
    try:
        text = sfile.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PatchError(f"{sfile}: not UTF-8 text (byte {exc.start}); a series file lists patch names, "
                         "one per line") from None
    except OSError as exc:
        raise PatchError(f"{sfile}: cannot read it ({exc.strerror or exc})") from None
    names: list[str] = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if "/" in line or line in (".", ".."):
            raise PatchError(f"{sfile}:{lineno}: {line!r}: entries are file names inside {series_dir}")
        if line in names:
            raise PatchError(f"{sfile}:{lineno}: {line} is listed twice")
        if not (series_dir / line).is_file():
            raise PatchError(
                f"{sfile}:{lineno}: {line} does not exist in {series_dir}; fix the name or remove the line"
            )
        names.append(line)
    return names


def load_series(series_dir: Path) -> list[Patch]:
    return [parse_patch(Path(series_dir) / name) for name in read_series(series_dir)]


def ref_version(ref: str | None) -> tuple[str, str] | None:
    """(name, version) named by a pypi `Upstream-Ref`, else None."""
    m = PYPI_REF_RE.match(ref or "")
    return (m.group("name"), m.group("version")) if m else None


# ---------------------------------------------------------------------------------------------------------
# applying


@dataclass
class HunkResult:
    file: str
    number: int
    header: str
    status: str  # ok | offset | failed
    offset: int = 0
    reason: str = ""


@dataclass
class PatchResult:
    name: str
    sha256: str
    status: str  # clean | offset | failed | skipped
    hunks: list[HunkResult] = field(default_factory=list)
    detail: str = ""  # why it failed, in words
    output: str = ""  # GNU patch's own report

    @property
    def ok(self) -> bool:
        return self.status in ("clean", "offset")

    def describe(self) -> str:
        if self.status == "clean":
            return "clean"
        if self.status == "skipped":
            return self.detail or "not tried (an earlier patch failed)"
        if self.status == "offset":
            moved = [h for h in self.hunks if h.status == "offset"]
            return "offset (" + ", ".join(f"{h.file} hunk {h.number}: {h.offset:+d} lines" for h in moved) + ")"
        parts = []
        files: dict[str, list[HunkResult]] = {}
        for h in self.hunks:
            files.setdefault(h.file, []).append(h)
        for name, hunks in files.items():
            failed = [h for h in hunks if h.status == "failed"]
            reasons = {h.reason for h in failed}
            if failed and len(failed) == len(hunks) and len(reasons) == 1 and \
                    next(iter(reasons)) not in ("context does not match", ""):
                parts.append(f"{name}: {failed[0].reason}")  # a whole-file problem, not a hunk's
                continue
            parts.extend(f"{h.file} hunk {h.number} ({h.header}){': ' + h.reason if h.reason else ''}"
                         for h in failed)
        text = "fails at " + "; ".join(parts) if parts else "fails"
        return f"{text}{' - ' + self.detail if self.detail else ''}"

    def as_dict(self) -> dict:
        return {
            "patch": self.name,
            "sha256": self.sha256,
            "status": self.status,
            "result": self.describe(),
            "hunks": [h.__dict__ for h in self.hunks if h.status != "ok"],
        }


_PATCHING_RE = re.compile(r"^(?:patching|checking) file (.+?)(?: \((?:renamed|copied) from .*\))?$")
_HUNK_OK_RE = re.compile(r"^Hunk #(\d+) succeeded at (\d+)(?: \(offset (-?\d+) lines?\))?(?: with fuzz (\d+))?\.")
_HUNK_FAIL_RE = re.compile(r"^Hunk #(\d+) FAILED at (\d+)")


def gnu_patch() -> str:
    exe = shutil.which("patch")
    if not exe:
        raise PatchError(
            "GNU patch is not installed: add `patch` to the stack's system_packages (apt-get/yum install patch)"
        )
    out = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout
    if "GNU patch" not in out:
        raise PatchError(f"{exe} is not GNU patch (zero-fuzz application needs it): install the `patch` package")
    return exe


def _run_patch(exe: str, patch: Patch, tree: Path) -> PatchResult:
    env = dict(os.environ, LC_ALL="C", LANG="C")
    env.pop("POSIXLY_CORRECT", None)
    env.pop("PATCH_VERSION_CONTROL", None)
    env.pop("VERSION_CONTROL", None)
    proc = subprocess.run(
        [exe, "-p1", "--batch", "--forward", "--fuzz=0", "--no-backup-if-mismatch", "--reject-file=-",
         "-d", str(tree), "-i", str(Path(patch.path).resolve())],
        capture_output=True, text=True, env=env,
    )
    output = (proc.stdout + proc.stderr).strip()
    by_path = {}
    for f in patch.files:
        for p in (f.new_path, f.old_path):
            if p:
                by_path.setdefault(p, f)
    results: dict[tuple[str, int], HunkResult] = {}
    for f in patch.files:
        for h in f.hunks:
            results[(f.path, h.number)] = HunkResult(f.path, h.number, h.header, "ok")
    current: FilePatch | None = None
    pending_problem = ""
    for line in output.splitlines():
        m = _PATCHING_RE.match(line)
        if m:
            name = m.group(1).strip("'\"")
            current = by_path.get(name)
            continue
        m = _HUNK_OK_RE.match(line)
        if m and current is not None:
            r = results.get((current.path, int(m.group(1))))
            if r is not None:
                if m.group(4) and m.group(4) != "0":
                    r.status, r.reason = "failed", f"needed fuzz {m.group(4)}"
                elif m.group(3) and int(m.group(3)) != 0:
                    r.status, r.offset = "offset", int(m.group(3))
            continue
        m = _HUNK_FAIL_RE.match(line)
        if m and current is not None:
            r = results.get((current.path, int(m.group(1))))
            if r is not None:
                r.status = "failed"
                r.reason = "context does not match"
            continue
        if line.startswith("Reversed (or previously applied) patch detected"):
            pending_problem = "already applied (or reversed)"
        elif line.startswith("can't find file to patch") or line.startswith("No file to patch"):
            pending_problem = "file not found in the tree"
        elif "which already exists" in line:
            pending_problem = "would create a file that already exists"
        elif re.match(r"^\d+ out of \d+ hunks? ignored", line):
            target = current
            if target is None:
                # the file was never found: attribute to the first file not yet reported
                target = next((f for f in patch.files if all(
                    results[(f.path, h.number)].status == "ok" for h in f.hunks)), None)
            if target is not None:
                for h in target.hunks:
                    r = results[(target.path, h.number)]
                    r.status, r.reason = "failed", pending_problem or "ignored"
            pending_problem = ""
            current = None
    hunks = list(results.values())
    failed = [h for h in hunks if h.status == "failed"]
    if proc.returncode != 0 and not failed:
        return PatchResult(patch.name, patch.sha256, "failed", hunks,
                           detail=f"GNU patch exited {proc.returncode}: {output.splitlines()[-1] if output else ''}",
                           output=output)
    if failed:
        return PatchResult(patch.name, patch.sha256, "failed", hunks, output=output)
    status = "offset" if any(h.status == "offset" for h in hunks) else "clean"
    return PatchResult(patch.name, patch.sha256, status, hunks, output=output)


def _no_links(root: Path, rel: str, where: str) -> None:
    """Refuse a symbolic link anywhere on root/rel: patching through one would read or write outside
    the tree (a link to /etc/hostname would have its contents copied into the image)."""
    path = Path(root)
    for part in Path(rel).parts:
        path = path / part
        if path.is_symlink():
            raise PatchError(f"{where}: {path.relative_to(root)} is a symbolic link; patches change regular "
                             "files inside the tree only")


def _result_confined(last: PatchResult, scratch: Path, touched: list[str]) -> bool:
    """False (and `last` marked failed) when applying left a symbolic link where a touched file goes."""
    for rel in touched:
        try:
            _no_links(scratch, rel, rel)
        except PatchError as exc:
            last.status, last.detail = "failed", str(exc)
            return False
    return True


def find_leftovers(root: Path, tops: list[str]) -> list[str]:
    """.rej/.orig files under the top-level directories a series touches."""
    found: list[str] = []
    for top in sorted(set(tops)):
        base = root / top
        if base.is_file() and base.name.endswith(LEFTOVER_SUFFIXES):
            found.append(top)
        if not base.is_dir():
            continue
        for dirpath, _dirs, files in os.walk(base):
            for fn in files:
                if fn.endswith(LEFTOVER_SUFFIXES):
                    found.append(os.path.relpath(os.path.join(dirpath, fn), root))
    return sorted(found)


def apply_series(
    patches: list[Patch],
    target: Path,
    *,
    dry_run: bool = False,
    strict: bool = False,
) -> list[PatchResult]:
    """Apply `patches` in order to a scratch copy of the files they touch under `target`.

    The target changes only if every patch applies (and, with strict, none needs an offset). Results come
    back for every patch: the first failure is "failed", the ones after it "skipped".
    """
    target = Path(target)
    if not target.is_dir():
        raise PatchError(f"{target}: target tree does not exist")
    exe = gnu_patch()
    touched: list[str] = []
    for p in patches:
        for rel in p.touched():
            if rel not in touched:
                touched.append(rel)
    tops = sorted({rel.split("/", 1)[0] for rel in touched})
    leftovers = find_leftovers(target, tops)
    if leftovers:
        raise PatchError(
            f"{target}: holds leftovers of an earlier patch run ({', '.join(leftovers[:5])}"
            f"{' ...' if len(leftovers) > 5 else ''}); start from a pristine install"
        )
    results: list[PatchResult] = []
    scratch = Path(tempfile.mkdtemp(prefix="trainbox-patch-"))
    try:
        for rel in touched:
            _no_links(target, rel, f"{target}: {rel}")
            src = target / rel
            if src.is_file():
                dst = scratch / rel
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dst)
        failed = False
        for p in patches:
            if failed:
                results.append(PatchResult(p.name, p.sha256, "skipped"))
                continue
            r = _run_patch(exe, p, scratch)
            if r.status == "offset" and strict:
                r.status, r.detail = "failed", "offsets are refused with --strict"
                for h in r.hunks:
                    if h.status == "offset":
                        h.status, h.reason = "failed", f"applies only {h.offset:+d} lines away"
            results.append(r)
            failed = not r.ok
        if not failed:
            left = find_leftovers(scratch, tops)
            if left:
                results[-1].status = "failed"
                results[-1].detail = f"left {', '.join(left)} behind"
                failed = True
        if not failed:
            failed = not _result_confined(results[-1], scratch, touched)
        if failed or dry_run:
            return results
        for rel in touched:
            src, dst = scratch / rel, target / rel
            if src.is_file():
                dst.parent.mkdir(parents=True, exist_ok=True)
                tmp = dst.with_name(f".{dst.name}.trainbox-tmp")
                shutil.copy2(src, tmp)
                os.replace(tmp, dst)
            elif dst.exists():
                dst.unlink()
            if rel.endswith(".py"):
                # bytecode pip compiled from the unpatched file is keyed on mtime and size, which a patch
                # applied within the same second that keeps the size would not change
                for pyc in (dst.parent / "__pycache__").glob(f"{dst.stem}.*.pyc"):
                    pyc.unlink()
        return results
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


# ---------------------------------------------------------------------------------------------------------
# command line


def _dist_target(name: str) -> tuple[Path, str]:
    from importlib import metadata

    try:
        dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        raise PatchError(f"distribution {name!r} is not installed in {sys.executable}; install it first") from None
    return Path(str(dist.locate_file(""))).resolve(), dist.version


def check_versions(patches: list[Patch], dist: str, installed: str) -> list[str]:
    """Patches whose Upstream-Ref names another version of `dist` than the one installed."""
    problems = []
    norm = canon_name(dist)
    for p in patches:
        nv = ref_version(p.upstream_ref)
        if nv and canon_name(nv[0]) == norm and nv[1] != installed:
            problems.append(f"{p.name} was made against {nv[0]} {nv[1]}, but {installed} is installed")
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--series-dir", type=Path, help="directory holding `series` and the patches")
    src.add_argument("--series", type=Path, help="the `series` file itself (its directory holds the patches)")
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--target", type=Path, help="tree the patch paths are relative to (e.g. site-packages)")
    where.add_argument("--dist", help="installed distribution: patch the site-packages it lives in")
    ap.add_argument("--component", help="name used in messages (default: the series directory name)")
    ap.add_argument("--dry-run", action="store_true", help="check only; change nothing")
    ap.add_argument("--strict", action="store_true", help="refuse hunks that apply only at an offset")
    ap.add_argument("--record", type=Path, help="write the applied patches and their sha256 as JSON here")
    args = ap.parse_args(argv)
    if args.series is not None:
        args.series_dir = args.series if args.series.is_dir() else args.series.parent
    label = args.component or args.series_dir.name
    try:
        patches = load_series(args.series_dir)
        mismatch: list[str] = []
        if args.dist:
            target, installed = _dist_target(args.dist)
            mismatch = check_versions(patches, args.dist, installed)
        else:
            target = args.target
        # a series made for another version is only checked, never applied: the report still names the hunks
        results = apply_series(patches, target, dry_run=args.dry_run or bool(mismatch), strict=args.strict)
    except PatchError as exc:
        print(f"{PROG}: error: {label}: {exc}", file=sys.stderr)
        return 2
    for r in results:
        print(f"{label}: {r.name}: {r.describe()}")
    bad = next((r for r in results if not r.ok), None)
    if bad is not None:
        note = f" ({mismatch[0]}: rebase the series with `trainbox patches edit` / `export`)" if mismatch else ""
        print(f"{PROG}: error: {label}: {bad.name} does not apply to {target}: {bad.describe()}{note}",
              file=sys.stderr)
        if bad.output:
            print("GNU patch said:\n  " + bad.output.replace("\n", "\n  "), file=sys.stderr)
        return 1
    if mismatch:
        print(f"{PROG}: error: {label}: {mismatch[0]}; the series applies but was not made for this "
              "version, so nothing was changed: rebase it with `trainbox patches edit` / `export`",
              file=sys.stderr)
        return 1
    if args.record:
        args.record.parent.mkdir(parents=True, exist_ok=True)
        args.record.write_text(json.dumps(
            {"component": label, "target": str(target),
             "patches": [{"file": p.name, "sha256": p.sha256} for p in patches]}, indent=2) + "\n")
    verb = "would apply" if args.dry_run else "applied"
    print(f"{label}: {verb} {len(results)} patch(es) to {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
