"""The low-disk guard of the docker tests (tests/engine_guard.py): a cut of the engine's build cache waits until no
docker test of another worker holds the engine, and a docker test that comes while a cut waits waits behind it.
Threads stand in for xdist's worker processes: flock(2) locks belong to each open of the file, so two threads'
opens exclude each other as two processes' do. A recording client stands in for the engine."""

from __future__ import annotations

import fcntl
import os
import threading
import time
from types import SimpleNamespace

import pytest

import engine_guard
from hangguard import HANG_S

# How long a thread that must wait is watched: a thread that should have waited and did not is caught when it runs
# within this time; a slow machine can only let such a fault through, never fail a correct guard.
SETTLE_S = 0.5


class _Recording:
    def __init__(self):
        self.calls: list[tuple[str, ...]] = []

    def run(self, *args, **kwargs):
        self.calls.append(args)
        return SimpleNamespace(returncode=0, stdout=b"")


@pytest.fixture
def low_disk(monkeypatch):
    """A disk that is always low: the guard cuts every step it has."""
    monkeypatch.setattr(engine_guard, "_free_gib", lambda path: 1.0)


def _wait_until_held(path) -> None:
    """Until someone holds the lock file `path` (a non-blocking try fails), bounded by a hang guard."""
    deadline = time.monotonic() + HANG_S
    while time.monotonic() < deadline:
        fd = os.open(str(path), os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return
        finally:
            os.close(fd)
        time.sleep(0.05)
    raise AssertionError(f"nobody took {path}")


def _in_thread(fn) -> tuple[threading.Thread, threading.Event]:
    done = threading.Event()

    def body():
        fn()
        done.set()

    t = threading.Thread(target=body, daemon=True)
    t.start()
    return t, done


def test_a_cut_waits_for_the_builds_of_other_workers_and_new_ones_wait_for_the_cut(tmp_path, low_disk):
    client = _Recording()
    building = engine_guard.EngineUse(tmp_path)  # another worker's docker test, mid-build

    cutter, cut_done = _in_thread(lambda: engine_guard.free_disk_when_low(client, "/", low_gib=15, where=tmp_path))
    assert not cut_done.wait(SETTLE_S), "the cut ran under another worker's build"
    assert client.calls == []
    _wait_until_held(tmp_path / "trainbox-test-engine.gate")  # the cut is waiting, not yet about to

    later: list[engine_guard.EngineUse] = []
    newcomer, came_in = _in_thread(lambda: later.append(engine_guard.EngineUse(tmp_path)))
    assert not came_in.wait(SETTLE_S), "a new docker test went ahead of the waiting cut"

    building.release()
    assert cut_done.wait(HANG_S) and came_in.wait(HANG_S)
    assert [c[:2] for c in client.calls] == [("image", "prune"), ("builder", "prune"), ("builder", "prune")]
    later[0].release()
    later[0].release()  # twice: the hook releases whatever it holds, also after a failed setup


def test_docker_tests_of_several_workers_share_the_engine(tmp_path):
    first = engine_guard.EngineUse(tmp_path)
    second, came_in = _in_thread(lambda: engine_guard.EngineUse(tmp_path).release())
    assert came_in.wait(HANG_S), "two docker tests could not hold the engine together"
    first.release()


def test_no_cut_and_no_wait_while_the_disk_has_room(tmp_path, monkeypatch):
    monkeypatch.setattr(engine_guard, "_free_gib", lambda path: 100.0)
    client = _Recording()
    building = engine_guard.EngineUse(tmp_path)
    assert engine_guard.free_disk_when_low(client, "/", low_gib=15, where=tmp_path) == ""
    assert client.calls == []
    building.release()


def test_the_conftest_hook_holds_the_engine_through_a_docker_test(tmp_path, monkeypatch):
    """The wiring: a docker test's setup holds the engine, the protocol's end lets it go."""
    import conftest

    monkeypatch.setenv("TRAINBOX_TEST_LOCK_DIR", str(tmp_path))
    monkeypatch.setattr(conftest, "_engine", [_Recording()])
    monkeypatch.setattr(conftest, "_docker_root", ["/"])
    monkeypatch.setattr(engine_guard, "_free_gib", lambda path: 100.0)
    item = SimpleNamespace(keywords={"docker": True})
    conftest.pytest_runtest_setup(item)
    assert conftest._held, "a docker test's setup did not hold the engine"

    def cut():
        with engine_guard.engine_alone(tmp_path):
            pass

    _, cut_done = _in_thread(cut)
    assert not cut_done.wait(SETTLE_S), "a cut could run during the docker test"
    wrapper = conftest.pytest_runtest_protocol(item, None)
    next(wrapper)
    with pytest.raises(StopIteration):
        wrapper.send(None)
    assert not conftest._held
    assert cut_done.wait(HANG_S), "the engine stayed held after the test"
