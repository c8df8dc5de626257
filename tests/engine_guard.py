"""The engine's disk, shared by the docker tests of every xdist worker (tests/conftest.py wires it in).

One disk holds the engine's build cache, the images the tests build and pytest's temporary directories (bundles,
wheelhouses). A full `make test` builds dozens of images: left alone, the build cache grows by tens of GB and a
full disk fails every later build (it failed CI's last 2% once). Before a docker test, when either place has less
than LOW_DISK_GIB free, untagged images are removed and the build cache is cut back.

A cut must not run beside a build: a prune can remove what a running build is about to export, and the build
then fails at "exporting to image" with a missing layer (moby/moby#39547). So a docker test holds the engine
shared from its setup to its teardown, and a cut holds it alone. Two flock(2) files: the lock itself and a gate
that a cut holds while it waits, so that a worker's next docker test waits behind the cut instead of starving it
(four workers rarely leave the engine free at once).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# 15 GiB: above what the largest single docker test writes (a workload image and a bundle, a few GB); at 25 it
# cut the cache before most docker tests of a full run on a 100 GB disk, and the builds after each cut ran cold.
LOW_DISK_GIB = float(os.environ.get("TRAINBOX_TEST_LOW_DISK_GIB", "15"))


def lock_dir() -> Path:
    """Where the lock files live: one place for every worker of a run, and for runs beside each other."""
    return Path(os.environ.get("TRAINBOX_TEST_LOCK_DIR") or tempfile.gettempdir())


def _open(name: str, where: Path | None) -> int:
    return os.open(str((where or lock_dir()) / f"trainbox-test-engine.{name}"), os.O_RDWR | os.O_CREAT, 0o666)


class EngineUse:
    """The engine held shared by one docker test; release() is safe to call twice."""

    def __init__(self, where: Path | None = None):
        gate = _open("gate", where)
        try:
            fcntl.flock(gate, fcntl.LOCK_EX)  # behind a cut that is waiting or running
            self._fd: int | None = _open("lock", where)
            fcntl.flock(self._fd, fcntl.LOCK_SH)
        finally:
            os.close(gate)  # closing the descriptor releases its lock

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


@contextmanager
def engine_alone(where: Path | None = None) -> Iterator[None]:
    """Wait until no docker test of any worker holds the engine, and keep the next ones out meanwhile."""
    gate = _open("gate", where)
    try:
        fcntl.flock(gate, fcntl.LOCK_EX)
        lock = _open("lock", where)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield
        finally:
            os.close(lock)
    finally:
        os.close(gate)


def _free_gib(path: str) -> float:
    try:
        return shutil.disk_usage(path).free / 2**30
    except OSError:
        return float("inf")


def free_disk_when_low(client, docker_root: str, low_gib: float = LOW_DISK_GIB, where: Path | None = None) -> str:
    """Cut the engine's untagged images and build cache when the disk runs low; what was done, "" when nothing.
    Call it while this worker holds no EngineUse (it waits for every holder)."""

    def free() -> float:
        return min(_free_gib(docker_root), _free_gib(tempfile.gettempdir()))

    before = free()
    if before >= low_gib:
        return ""
    with engine_alone(where):
        before = free()  # another worker may have cut while this one waited
        if before >= low_gib:
            return ""
        # In steps, least recently used first, so that what this run builds stays warm: untagged images, then the
        # build cache down to 20 GB, and to 10 GB only when that was not enough (10 GB at once left later builds
        # cold). Only untagged images over an hour old: a queue's next test may use one its last test made.
        client.run("image", "prune", "-f", "--filter", "until=1h", timeout=600, check=False)
        after, cut = free(), "untagged images over an hour old removed"
        for keep in ("20GB", "10GB"):
            if after >= low_gib:
                break
            client.run("builder", "prune", "-f", "--keep-storage", keep, timeout=600, check=False)
            after, cut = free(), f"build cache cut to {keep}"
    return f"low disk before a docker test: {before:.1f} GiB free; {cut}: {after:.1f} GiB free"
