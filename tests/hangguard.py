"""The rule that no test's verdict depends on how fast the machine is (issue 40), and helpers that keep it.

A test waits for the event it is about (a line, an exit, a returned value), bounded only by a hang guard: a limit
no correct run comes near, however slow or loaded the machine (qemu emulation, a CPU hog on every core). Speed
figures belong in bench/. tests/test_hangguard.py scans tests/ for limits tighter than FLOOR_S.
"""

from __future__ import annotations

import contextlib
import socket
import threading

FLOOR_S = 60  # the tightest wall-clock limit a test may put on a wait (subprocess timeouts, deadlines, elapsed)
HANG_S = 120  # the usual hang guard for a wait on a short step


@contextlib.contextmanager
def silent_endpoint():
    """A TCP endpoint on 127.0.0.1 that accepts connections (the kernel completes the handshake) and never says
    a word: a client without a read timeout waits on it forever. Yields 'host:port'."""
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    try:
        yield f"127.0.0.1:{srv.getsockname()[1]}"
    finally:
        srv.close()


def finishes(fn, *args, within: float = HANG_S, **kwargs):
    """fn(*args, **kwargs)'s value, or AssertionError when it has not returned within the hang guard (it is then
    left running in a daemon thread; the test fails instead of hanging)."""
    out: dict = {}

    def target():
        try:
            out["value"] = fn(*args, **kwargs)
        except BaseException as exc:  # handed to the caller
            out["error"] = exc

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(within)
    if t.is_alive():
        raise AssertionError(f"{getattr(fn, '__name__', fn)} did not return within {within:.0f} s: it hangs")
    if "error" in out:
        raise out["error"]
    return out["value"]


@contextlib.contextmanager
def no_connection():
    """Records each TCP connection this process attempts (a registry or index probe, a pull): a test that an
    answer comes before any long step asserts the list is empty, instead of timing the answer."""
    from unittest import mock

    reached: list[str] = []
    real_connect = socket.socket.connect

    def connect(sock, address):
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            reached.append(f"a connection to {address}")
        return real_connect(sock, address)

    with mock.patch.object(socket.socket, "connect", connect):
        yield reached
