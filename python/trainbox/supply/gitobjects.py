"""A pinned commit's tree, re-derived from the objects themselves (host module).

git names every object by the hash of its content, but does not re-hash what it reads: a rewritten loose object
keeps its name, a `refs/replace/<commit>` ref or an `info/grafts` line substitutes another object, and `git
archive` or `rev-parse <commit>^{tree}` then serve the substitute under the pinned commit's name. So here every
object from the pinned commit down is read raw (`cat-file --batch`, replace refs and grafts off), hashed, and
compared with the name it was asked for: the commit object gives the tree id, each tree its entries, each blob
its bytes. The staged files are written from those verified bytes only, so the staged tree is the pinned one
by construction. Symlinks are written as symlinks and never followed; submodules (gitlinks) stay empty
directories, as `git archive` leaves them.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

from ..runtime.errors import TrainboxError

HEX40 = frozenset("0123456789abcdef")
# a name git itself refuses in a tree (fsck): it would leave the tree or become its repository
_BAD_NAMES = {b"", b".", b"..", b".git"}


class ObjectError(TrainboxError):
    """An object that is missing, or whose content does not hash to its name."""


def clean_env() -> dict[str, str]:
    """git without replace refs and grafts: what it reads is the object stored under the name asked for."""
    env = dict(os.environ, LC_ALL="C", GIT_NO_REPLACE_OBJECTS="1", GIT_GRAFT_FILE=os.devnull,
               GIT_TERMINAL_PROMPT="0")
    for var in ("GIT_DIR", "GIT_OBJECT_DIRECTORY", "GIT_ALTERNATE_OBJECT_DIRECTORIES", "GIT_REPLACE_REF_BASE",
                "GIT_INDEX_FILE", "GIT_WORK_TREE"):
        env.pop(var, None)
    return env


class _Reader:
    """One `git cat-file --batch` over the repository: raw objects by id."""

    def __init__(self, repo: Path):
        self.repo = repo
        self.proc = subprocess.Popen(["git", "--git-dir", str(repo), "cat-file", "--batch"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     env=clean_env())

    def read(self, oid: str, want: str) -> bytes:
        """The object `oid` of type `want`, after checking that its content hashes to `oid`."""
        return next(self.read_many([oid], want))

    def read_many(self, oids: list[str], want: str):
        """Each object of `oids` in order, checked; asked for in chunks small enough (< the 64 KiB a pipe holds)
        that writing the ids never waits on git, which may be blocked writing objects nobody reads yet."""
        for i in range(0, len(oids), 512):
            chunk = oids[i:i + 512]
            self.proc.stdin.write(b"".join(o.encode() + b"\n" for o in chunk))
            self.proc.stdin.flush()
            for oid in chunk:
                yield self._one(oid, want)

    def _one(self, oid: str, want: str) -> bytes:
        header = self.proc.stdout.readline().split()
        if len(header) != 3:
            raise ObjectError(f"{self.repo}: object {oid} is missing")
        kind, size = header[1].decode(), int(header[2])
        data = self.proc.stdout.read(size)
        self.proc.stdout.read(1)  # the newline after each object
        got = hashlib.sha1(f"{kind} {len(data)}\0".encode() + data).hexdigest()
        if got != oid or kind != want:
            raise ObjectError(f"{self.repo}: object {oid} does not hash to its name (its content is the {kind} "
                              f"{got}): the repository was tampered with or is damaged")
        return data

    def close(self) -> None:
        # after a refused object git may still be writing the rest of a chunk nobody will read: stop it rather
        # than wait for it (waiting would block forever on the full pipe)
        self.proc.kill()
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe:
                pipe.close()


def _commit_tree(reader: _Reader, commit: str) -> str:
    first = reader.read(commit, "commit").split(b"\n", 1)[0]
    tree = first[5:].decode("ascii", "replace")
    if not first.startswith(b"tree ") or len(tree) != 40 or not set(tree) <= HEX40:
        raise ObjectError(f"{reader.repo}: commit {commit} names no tree")
    return tree


def _entries(data: bytes, oid: str, where: str):
    """(mode, name, id) of each entry of a raw tree object; a name that would leave the tree is refused."""
    i, seen = 0, set()
    while i < len(data):
        sp = data.index(b" ", i)
        nul = data.index(b"\0", sp)
        mode, name, sub = data[i:sp], data[sp + 1:nul], data[nul + 1:nul + 21].hex()
        i = nul + 21
        if name.lower() in _BAD_NAMES or b"/" in name or name in seen or len(sub) != 40:
            raise ObjectError(f"{where}: tree {oid} holds the entry {name!r}, which git itself refuses")
        seen.add(name)
        yield mode, name, sub


def tree_of(repo: Path, commit: str) -> str:
    """The pinned commit's tree id, read from the commit object after checking it hashes to `commit`."""
    reader = _Reader(repo)
    try:
        return _commit_tree(reader, commit)
    finally:
        reader.close()


def verify_tree(repo: Path, commit: str, dest: Path | None = None) -> str:
    """Check every object under `commit` (commit, trees, blobs) against its name and return the tree id;
    with `dest` (an existing empty directory) also write the tree there from the checked bytes."""
    reader = _Reader(repo)
    try:
        tree = _commit_tree(reader, commit)
        stack: list[tuple[str, bytes]] = [(tree, b"")]
        while stack:
            oid, rel = stack.pop()
            blobs = []
            for mode, name, sub in _entries(reader.read(oid, "tree"), oid, str(repo)):
                path = rel + b"/" + name if rel else name
                target = os.path.join(os.fsencode(dest), path) if dest is not None else None
                if mode == b"40000":
                    stack.append((sub, path))
                elif mode not in BLOB_MODES and mode != b"160000":
                    raise ObjectError(f"{repo}: entry {path!r} has the unknown mode {mode.decode(errors='replace')}")
                if mode in BLOB_MODES:
                    blobs.append((mode, sub, target))
                elif target is not None:  # a directory; a submodule stays empty, as git archive leaves it
                    os.mkdir(target, 0o755)
            for (mode, _sub, target), data in zip(blobs, reader.read_many([b[1] for b in blobs], "blob")):
                if target is not None:
                    _write(mode, target, data)
        return tree
    finally:
        reader.close()


BLOB_MODES = (b"100644", b"100755", b"100664", b"120000")


def _write(mode: bytes, target: bytes, data: bytes) -> None:
    if mode == b"120000":
        os.symlink(data, target)  # kept as a link; nothing here ever writes through it
        return
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o755 if mode == b"100755" else 0o644)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
