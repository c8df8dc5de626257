"""Patch series: verify against the pinned upstream, edit as git commits, export back (host module).

Layout: patches/<series>/series lists NNNN-subject.patch files (git format-patch form) in order; every
patch says why it exists and carries `Upstream-Status:` and `Upstream-Ref:` trailers. A stack component
names its series with `patches: <series>`.

The applying itself lives in trainbox/runtime/apply_patches.py (standard library only, because it also runs
inside image builds); this module loads that same file, so `verify` and the image build cannot disagree
about what "applies" means.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from ..runtime.apply_patches import Patch
from ..runtime.errors import TrainboxError
from .. import paths
from ..paths import PATCHES_DIR
from .fetch import fetch, pin_from_component
from . import pins
from .pins import Pin
from .sources import run_git, unpack

_EDIT_META = "trainbox-edit.json"
# Fixed identity and dates for the commits trainbox itself makes, so an edit tree is reproducible.
_PRISTINE_DATE = "2000-01-01T00:00:00+0000"
_TRAINBOX_ID = ("trainbox", "trainbox@localhost")


class PatchSeriesError(TrainboxError):
    """A series, patch or edit tree that cannot be used as it is."""


# git in the edit workspaces: the one helper, without the user's configuration (it must not shape the patches)
workspace_git = functools.partial(run_git, user_config=False, error=PatchSeriesError)


def applier():
    """The applier the image build runs (trainbox.runtime.apply_patches): one parser for both sides."""
    from ..runtime import apply_patches

    return apply_patches


def series_dir(series: str, patches_dir: Path | None = None) -> Path:
    return Path(patches_dir or PATCHES_DIR) / series


def load_series(series: str, patches_dir: Path | None = None) -> list[Patch]:
    """The parsed patches of a series, in order (apply_patches.Patch objects)."""
    ap = applier()
    try:
        return ap.load_series(series_dir(series, patches_dir))
    except ap.PatchError as exc:
        raise PatchSeriesError(str(exc)) from None


def applied_patches(series: str, patches_dir: Path | None = None) -> list[dict[str, str]]:
    """[{"file": "0001-x.patch", "sha256": "<hex of the file>"}] in series order, for the image manifest.

    `series` is the component's `patches:` value (a directory under patches/).
    """
    ap = applier()
    d = series_dir(series, patches_dir)
    try:
        names = ap.read_series(d)
    except ap.PatchError as exc:
        raise PatchSeriesError(str(exc)) from None
    return [{"file": n, "sha256": hashlib.sha256((d / n).read_bytes()).hexdigest()} for n in names]


# ---------------------------------------------------------------------------------------------------------
# header checks


def _ref_matches(ref: str | None, pin: Pin) -> str | None:
    """None when `Upstream-Ref` fits the pin, else what is wrong with it (the pin's kind knows its form)."""
    if not ref:
        return "no Upstream-Ref header"
    return pins.ref_problem(ref, pin)


def header_problems(patch: Patch) -> list[str]:
    """What is missing from a patch's provenance header (the ref is checked against a pin separately)."""
    ap = applier()
    out = []
    if not patch.subject:
        out.append("no Subject")
    if not patch.why:
        out.append("no explanation of why the patch exists (the message body is empty)")
    status = patch.upstream_status
    if not status:
        out.append("no Upstream-Status header")
    else:
        word = status.split()[0]
        if word not in ap.UPSTREAM_STATUSES:
            out.append(f"Upstream-Status {status!r}: expected one of {', '.join(ap.UPSTREAM_STATUSES)}")
        elif word in ("Submitted", "Accepted", "Backport") and len(status.split()) < 2:
            out.append(f"Upstream-Status {word} needs the upstream URL after it")
        elif word == "Inappropriate" and len(status.split()) < 2:
            out.append("Upstream-Status Inappropriate needs a [reason]")
    if not patch.upstream_ref:
        out.append("no Upstream-Ref header")
    return out


# ---------------------------------------------------------------------------------------------------------
# verify


@dataclass
class Row:
    stack: str
    component: str
    series: str
    ref: str  # pinned ref and the artifact used
    patch: str
    result: str
    ok: bool
    status: str  # clean | offset | failed | skipped | error
    sha256: str = ""
    hunks: list[dict] = field(default_factory=list)  # the hunks that did not apply cleanly, as JSON
    artifact: str = ""  # file name (and sha256) or git commit the series was applied to

    def as_dict(self) -> dict:
        return {
            "stack": self.stack, "component": self.component, "series": self.series, "ref": self.ref,
            "artifact": self.artifact, "patch": self.patch, "sha256": self.sha256, "status": self.status,
            "ok": self.ok, "result": self.result, "hunks": self.hunks,
        }


def verify_pin(
    pin: Pin,
    series: str,
    *,
    stack: str = "",
    strict: bool = False,
    offline: bool = False,
    patches_dir: Path | None = None,
    cache_dir: Path | None = None,
) -> list[Row]:
    """Apply `series` to a scratch copy of the pinned source; one row per patch."""
    ap = applier()

    def error(ref: str, patch: str, msg: str) -> list[Row]:
        return [Row(stack, pin.key, series, ref, patch, f"error: {msg}", False, "error")]

    try:
        patches = load_series(series, patches_dir)
    except PatchSeriesError as exc:
        return error(pin.ref, "(series)", str(exc))
    if not patches:
        return error(pin.ref, "(series)", f"{series_dir(series, patches_dir) / 'series'} lists no patches")
    prefer = []
    for p in patches:
        m = ap.PYPI_REF_RE.match(p.upstream_ref or "") or ap.URL_REF_RE.match(p.upstream_ref or "")
        if m and m.groupdict().get("sha256"):
            prefer.append(m.group("sha256"))
    try:
        fetched = fetch(pin, prefer=prefer, offline=offline, cache_dir=cache_dir)
    except TrainboxError as exc:
        return error(pin.ref, "(source)", str(exc))
    scratch = Path(tempfile.mkdtemp(prefix="trainbox-verify-"))
    try:
        tree = unpack(fetched, scratch / "tree")
        try:
            results = ap.apply_series(patches, tree, dry_run=True, strict=strict)
        except ap.PatchError as exc:
            return error(fetched.label, "(apply)", str(exc))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    artifact = f"{fetched.filename} sha256:{fetched.sha256}" if fetched.sha256 else f"{pin.git}@{fetched.commit}"
    rows = []
    for p, r in zip(patches, results):
        text, ok, status = r.describe(), r.ok, r.status
        problems = header_problems(p)
        ref_problem = _ref_matches(p.upstream_ref, pin) if p.upstream_ref else None
        if ref_problem:
            problems.append(ref_problem + " (rebase: `trainbox patches edit` then `export`)")
        if problems and status != "skipped":
            ok, status = False, "failed"
            header = "header: " + "; ".join(problems)
            text = header if r.status == "clean" else f"{text}; {header}"
        rows.append(Row(stack, pin.key, series, fetched.label, p.name, text, ok, status, p.sha256,
                        [h.__dict__ for h in r.hunks if h.status != "ok"], artifact))
    return rows


def _stack_targets(stack_names: list[str] | None, component: str | None,
                   sets: dict[str, str] | None = None) -> list[tuple[str, Pin, str]]:
    from ..specs.stack import list_stacks, load_stack

    if sets and not stack_names:
        raise PatchSeriesError("--set moves a pin in one stack: name it (`trainbox patches verify STACK --set ...`)")
    names = stack_names or list_stacks()
    out = []
    found_component = False
    for name in names:
        st = load_stack(name, sets=sets or None)
        for key, comp in st.components.items():
            if component and key != component:
                continue
            found_component = found_component or key == component
            if not comp.patches:
                continue
            out.append((st.name, pin_from_component(comp, st), comp.patches))
    if component and not found_component:
        raise PatchSeriesError(f"no component {component!r} in stack(s) {', '.join(names)}")
    if component and not out:
        raise PatchSeriesError(f"component {component!r} has no `patches:` series in stack(s) {', '.join(names)}")
    return out


def verify(
    stack_names: list[str] | None = None,
    component: str | None = None,
    *,
    strict: bool = False,
    offline: bool = False,
    patches_dir: Path | None = None,
    cache_dir: Path | None = None,
    sets: dict[str, str] | None = None,
) -> list[Row]:
    """Verify every patched component of the given stacks (all stacks when None); `sets` moves pins."""
    rows: list[Row] = []
    done: dict[tuple, list[Row]] = {}
    for stack, pin, series in _stack_targets(stack_names, component, sets):
        key = (pin, series)
        if key not in done:  # stacks that share a pin and a series share one check
            done[key] = verify_pin(pin, series, stack=stack, strict=strict, offline=offline,
                                   patches_dir=patches_dir, cache_dir=cache_dir)
        rows.extend(Row(**{**r.__dict__, "stack": stack}) for r in done[key])
    return rows


def format_table(rows: list[Row]) -> str:
    head = ("STACK", "COMPONENT", "PINNED REF", "PATCH", "RESULT")
    data = [(r.stack, r.component, r.ref, r.patch, r.result) for r in rows]
    widths = [max(len(x) for x in col) for col in zip(head, *data)] if data else [len(h) for h in head]
    widths[-1] = 0  # the result column is not padded
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in [head, *data]]
    return "\n".join(lines)


def rows_json(rows: list[Row]) -> str:
    return json.dumps({"ok": all(r.ok for r in rows), "results": [r.as_dict() for r in rows]}, indent=2)


# ---------------------------------------------------------------------------------------------------------
# edit / export


def resolve_component(component: str, stack: str | None = None) -> tuple[str, Pin, str]:
    """(stack name, pin, series) for a patched component; all stacks must agree unless --stack is given."""
    targets = _stack_targets([stack] if stack else None, component)
    distinct = {(pin, series) for _, pin, series in targets}
    if len(distinct) > 1:
        if len({(p.ref, ser) for _, p, ser in targets}) == 1:
            # same version, other artifact hashes: one stack's lock was computed for other pins
            where = ", ".join(f"{s}: sha256 {','.join(h[:12] for h in p.sha256) or '-'}" for s, p, _ in targets)
            raise PatchSeriesError(f"component {component!r} is {targets[0][1].ref} in every stack, but with other "
                                   f"hashes ({where}): a stale lock? `trainbox stack validate` names it and "
                                   "`trainbox stack lock STACK` refreshes it (with the stacks that extend it)")
        where = ", ".join(f"{s}: {p.ref} -> {ser}" for s, p, ser in targets)
        raise PatchSeriesError(f"component {component!r} is pinned differently across stacks ({where}); "
                               "choose one with --stack")
    return targets[0]


def default_edit_dir(component: str) -> Path:
    return paths.cache_dir() / "edit" / component


def edit(
    pin: Pin,
    series: str,
    directory: Path,
    *,
    force: bool = False,
    offline: bool = False,
    patches_dir: Path | None = None,
    cache_dir: Path | None = None,
) -> tuple[Path, list[str], str | None]:
    """Make `directory` a git tree of the pinned source with one commit per patch of the series.

    Returns (directory, patches applied, the patch that stopped `git am` or None). When a patch does not
    apply (the usual case after moving a pin) the tree is left mid-`git am` for the user to resolve.
    """
    ap = applier()
    directory = Path(directory).resolve()
    if directory.exists():
        if not force:
            raise PatchSeriesError(f"{directory}: already exists (an edit in progress?); export it with "
                                   "`trainbox patches export`, or pass --force to discard it and start over")
        shutil.rmtree(directory)
    d = series_dir(series, patches_dir)
    patches = []
    if (d / "series").exists():
        patches = load_series(series, patches_dir)
    elif not d.parent.is_dir():
        raise PatchSeriesError(f"{d.parent}: no patches directory")
    prefer = []
    for p in patches:
        m = ap.PYPI_REF_RE.match(p.upstream_ref or "") or ap.URL_REF_RE.match(p.upstream_ref or "")
        if m and m.groupdict().get("sha256"):
            prefer.append(m.group("sha256"))
    fetched = fetch(pin, prefer=prefer, offline=offline, cache_dir=cache_dir)
    unpack(fetched, directory)
    try:
        workspace_git("init", "--quiet", "--initial-branch=patches", cwd=directory)
        info = directory / ".git" / "info"
        info.mkdir(parents=True, exist_ok=True)
        (info / "exclude").write_text("__pycache__/\n*.py[cod]\n")
        (info / "attributes").write_text("* -text\n")  # byte-exact: no end-of-line conversion
        if workspace_git("config", "user.name", check=False, cwd=directory).returncode != 0:
            workspace_git("config", "user.name", _TRAINBOX_ID[0], cwd=directory)
            workspace_git("config", "user.email", _TRAINBOX_ID[1], cwd=directory)
        workspace_git("add", "--all", "--force", cwd=directory)
        fixed = {
            "GIT_AUTHOR_NAME": _TRAINBOX_ID[0], "GIT_AUTHOR_EMAIL": _TRAINBOX_ID[1],
            "GIT_COMMITTER_NAME": _TRAINBOX_ID[0], "GIT_COMMITTER_EMAIL": _TRAINBOX_ID[1],
            "GIT_AUTHOR_DATE": _PRISTINE_DATE, "GIT_COMMITTER_DATE": _PRISTINE_DATE,
        }
        workspace_git("commit", "--quiet", "--no-verify", "-m",
                      f"{pin.ref}: pristine upstream\n\nUpstream-Ref: {fetched.upstream_ref}\n", env=fixed,
                      cwd=directory)
        workspace_git("tag", "upstream", cwd=directory)
        base = workspace_git("rev-parse", "HEAD", cwd=directory).stdout.strip()
        meta = {
            "component": pin.key, "series": series, "ref": pin.ref, "upstream_ref": fetched.upstream_ref,
            "sha256": fetched.sha256, "commit": fetched.commit, "base": base,
            "patches_dir": str(Path(patches_dir or PATCHES_DIR).resolve()),
            "pin": {"source": pin.source, "name": pin.name, "version": pin.version, "sha256": list(pin.sha256),
                    "git": pin.git, "commit": pin.commit, "url": pin.url},
        }
        (directory / ".git" / _EDIT_META).write_text(json.dumps(meta, indent=2) + "\n")
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    applied: list[str] = []
    am_env = {"GIT_COMMITTER_NAME": _TRAINBOX_ID[0], "GIT_COMMITTER_EMAIL": _TRAINBOX_ID[1]}
    for p in patches:
        proc = workspace_git("am", "--quiet", "--keep-cr", "--committer-date-is-author-date", str(p.path),
                             env=am_env, check=False, cwd=directory)
        if proc.returncode != 0:
            return directory, applied, p.name
        applied.append(p.name)
    return directory, applied, None


def edit_meta(directory: Path) -> dict:
    """What `patches edit` recorded in its edit tree (the pin, its upstream ref, the base commit)."""
    path = Path(directory) / ".git" / _EDIT_META
    if not Path(directory).exists():
        raise PatchSeriesError(f"{directory}: no edit tree there; create one with `trainbox patches edit COMPONENT`"
                               " (or pass the tree with --dir)")
    if not path.is_file():
        raise PatchSeriesError(f"{directory}: not a trainbox edit tree (no .git/{_EDIT_META}); create one with "
                               "`trainbox patches edit COMPONENT`")
    return json.loads(path.read_text())


_INDEX_RE = re.compile(r"^index [0-9a-f]+\.\.[0-9a-f]+(?: [0-7]{6})?\n", re.MULTILINE)


def _drop_index_lines(text: str) -> str:
    """Remove the `index <blob>..<blob>` lines: they hash whole files, so changing one patch would change
    them in every later patch of the same file; neither git am nor GNU patch needs them."""
    start = text.find("\ndiff --git ")
    if start < 0:
        return text
    return text[:start] + _INDEX_RE.sub("", text[start:])


def _set_ref(text: str, ref: str) -> str:
    """Put `Upstream-Ref: ref` into an exported patch's message (replace or add after Upstream-Status)."""
    # the message ends where the diff (or, with a diffstat, the '---' line) begins
    cut = min(i for i in (text.find("\n---\n"), text.find("\ndiff --git "), len(text)) if i >= 0)
    head, rest = text[:cut], text[cut:]
    lines = head.split("\n")
    for i, ln in enumerate(lines):
        if ln.startswith("Upstream-Ref:"):
            lines[i] = f"Upstream-Ref: {ref}"
            break
    else:
        for i, ln in enumerate(lines):
            if ln.startswith("Upstream-Status:"):
                lines.insert(i + 1, f"Upstream-Ref: {ref}")
                break
    return "\n".join(lines) + rest


def export(directory: Path, *, patches_dir: Path | None = None) -> tuple[Path, list[str]]:
    """Write the edit tree's commits back as the series: format-patch with stable names and headers.

    Nothing changes on disk unless every commit exports to a valid patch with a complete header.
    Returns (series directory, patch names).
    """
    ap = applier()
    directory = Path(directory).resolve()
    meta = edit_meta(directory)
    if (directory / ".git" / "rebase-apply").exists() or (directory / ".git" / "rebase-merge").exists():
        raise PatchSeriesError(f"{directory}: a `git am`/rebase is still in progress; finish it "
                               "(`git am --continue` or `git am --skip`) before exporting")
    dirty = workspace_git("status", "--porcelain", "--untracked-files=all", cwd=directory).stdout.strip()
    if dirty:
        first = dirty.splitlines()[:5]
        raise PatchSeriesError(f"{directory}: uncommitted changes ({'; '.join(x.strip() for x in first)}); commit "
                               "them (`git commit` or `git commit --amend`) or discard them, then export")
    base = meta["base"]
    if workspace_git("merge-base", "--is-ancestor", base, "HEAD", check=False, cwd=directory).returncode != 0:
        raise PatchSeriesError(f"{directory}: HEAD does not descend from the pristine upstream commit "
                               f"{base[:12]}; keep the patches on top of it")
    commits = workspace_git("rev-list", "--reverse", f"{base}..HEAD", cwd=directory).stdout.split()
    pin = Pin(key=meta["component"], **{k: (tuple(v) if k == "sha256" else v) for k, v in meta["pin"].items()})
    target = series_dir(meta["series"], Path(patches_dir) if patches_dir else Path(meta["patches_dir"]))
    stage = Path(tempfile.mkdtemp(prefix="trainbox-export-"))
    try:
        if commits:
            workspace_git("-c", "core.abbrev=12", "format-patch", "--quiet", "--zero-commit", "--no-signature",
                          "--no-numbered", "--no-stat", "--no-renames", "--filename-max-length=64", "--start-number=1",
                          "--diff-algorithm=myers", "-o", str(stage), f"{base}..HEAD", cwd=directory)
        names = sorted(p.name for p in stage.iterdir())
        if len(names) != len(commits):
            raise PatchSeriesError(f"{directory}: git format-patch wrote {len(names)} files for {len(commits)} "
                                   "commits; is one of them empty? drop it with `git rebase -i`")
        problems = []
        for name in names:
            path = stage / name
            text = _drop_index_lines(path.read_text(encoding="utf-8"))
            path.write_text(text, encoding="utf-8")
            try:
                patch = ap.parse_patch(path)
            except ap.PatchError as exc:
                problems.append(str(exc).replace(str(stage) + "/", ""))
                continue
            if _ref_matches(patch.upstream_ref, pin) is not None:
                text = _set_ref(text, meta["upstream_ref"])
                path.write_text(text, encoding="utf-8")
                patch = ap.parse_patch(path)
            hp = header_problems(patch)
            if hp:
                problems.append(f"{name}: {'; '.join(hp)}")
        if problems:
            raise PatchSeriesError(
                "cannot export: " + " | ".join(problems) + ". Amend the commit message (`git commit --amend` or "
                "`git rebase -i`): a why paragraph, then `Upstream-Status: Pending|Submitted <url>|Accepted <url>|"
                "Backport <url>|Inappropriate [reason]`"
            )
        _write_series(target, stage, names)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return target, names


def _series_header(sfile: Path) -> list[str]:
    """The comment block at the top of an existing series file (kept across exports)."""
    if not sfile.is_file():
        return []
    head = []
    try:
        text = sfile.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise PatchSeriesError(f"{sfile}: not UTF-8 text; a series file lists patch names, one per line") from None
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            break
        head.append(line)
    while head and not head[-1].strip():
        head.pop()
    return head


def _write_series(target: Path, stage: Path, names: list[str]) -> None:
    """Replace the series directory's patches and `series` file in one rename."""
    target.parent.mkdir(parents=True, exist_ok=True)
    new = Path(tempfile.mkdtemp(prefix=f".{target.name}.new-", dir=target.parent))
    old = target.with_name(f".{target.name}.old")
    try:
        if target.is_dir():  # keep files that are not patches (a README, notes)
            for p in target.iterdir():
                if p.name != "series" and not p.name.endswith(".patch"):
                    if p.is_dir():
                        shutil.copytree(p, new / p.name)
                    else:
                        shutil.copy2(p, new / p.name)
        for name in names:
            shutil.copyfile(stage / name, new / name)
        header = _series_header(target / "series")
        lines = header + ([""] if header else []) + names
        (new / "series").write_text("\n".join(lines) + "\n", encoding="utf-8")
        os.chmod(new, 0o755)
        shutil.rmtree(old, ignore_errors=True)
        if target.exists():
            os.rename(target, old)
        os.rename(new, target)
    finally:
        shutil.rmtree(new, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)


def edit_from_stack(component: str, *, stack: str | None = None, directory: Path | None = None,
                    force: bool = False, offline: bool = False) -> tuple[Path, list[str], str | None, str]:
    """`trainbox patches edit`: resolve the component in the stacks, then build the edit tree."""
    _, pin, series = resolve_component(component, stack)
    d, applied, stopped = edit(pin, series, directory or default_edit_dir(component), force=force, offline=offline)
    return d, applied, stopped, series

