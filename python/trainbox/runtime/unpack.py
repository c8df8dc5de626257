"""Unpacking source archives with our own member checks: one rule for the host (the trees patches apply to) and the
builder (install_source), whatever the Python. Debian bookworm's 3.11.2, the builder's, has no tar extraction
filter, so `extractall` alone would write `../`, absolute, link and device members wherever they point.

Refused: a name that leaves the target (absolute, `..`, empty parts), a hard link, device or fifo, a symlink unless
the caller keeps links (git trees do: a link stays a link, never followed, and nothing may lie below one), and a name
given twice. All members are checked before anything is written. Standard library only: it runs in the builder.
"""

from __future__ import annotations

import tarfile
import zipfile
from pathlib import Path


class MemberRefused(ValueError):
    """One line: the archive, the member and why; nothing was unpacked."""


def _refused(what: str, name: str, why: str) -> MemberRefused:
    return MemberRefused(f"{what}: archive member {name!r} refused: {why}; nothing was unpacked")


def _name_problem(raw: str) -> str:
    name = raw.replace("\\", "/").removeprefix("./").rstrip("/")
    parts = name.split("/")
    if raw.startswith("/") or ".." in parts or "" in parts:
        return "its name leaves the tree"
    return ""


def checked_tar_members(tar: tarfile.TarFile, what: str, keep_links: bool = False) -> list[tarfile.TarInfo]:
    """Every member of `tar`, checked (see the module); modes made plain (no setuid/setgid/sticky bits, nothing
    group- or world-writable). Raises MemberRefused at the first bad member."""
    members, links, seen = tar.getmembers(), set(), set()
    for m in members:
        name = m.name.replace("\\", "/").removeprefix("./").rstrip("/")
        if name in ("", ".") and m.isdir():
            continue  # the tree's own root
        why = _name_problem(m.name)
        if not why and not (m.isfile() or m.isdir() or (keep_links and m.issym())):
            why = "it is a link, device or fifo" if not keep_links else "it is a hard link, device or fifo"
        if not why:
            parts = name.split("/")
            below = next(("/".join(parts[:i]) for i in range(1, len(parts)) if "/".join(parts[:i]) in links), None)
            if below:
                why = f"it lies below the symlink {below!r} (writing it would follow the link)"
            elif name in seen:
                why = "it is given twice"
        if why:
            raise _refused(what, m.name, why)
        seen.add(name)
        if m.issym():
            links.add(name)
        m.mode &= 0o755
    return members


def extract_tar(tar: tarfile.TarFile, dest: Path, what: str, keep_links: bool = False) -> None:
    members = checked_tar_members(tar, what, keep_links)
    # the interpreter's own filter too, where it has one ("tar" keeps the absolute links real trees ship)
    name = "tar" if keep_links else "data"
    tar.extractall(dest, members=members, **({"filter": name} if hasattr(tarfile, "data_filter") else {}))


def extract_zip(zf: zipfile.ZipFile, dest: Path, what: str) -> None:
    for name in zf.namelist():
        why = _name_problem(name)
        if why:
            raise _refused(what, name, why)
    zf.extractall(dest)


__all__ = ["MemberRefused", "checked_tar_members", "extract_tar", "extract_zip"]


if __name__ == "__main__":  # a library module: `python3 -m` on it must fail loudly, not pass silently
    raise SystemExit(f"{__name__} is a library module; nothing to run")
