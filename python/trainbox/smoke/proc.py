"""Child processes for trainbox smoke: run bounded in time, killed as a group, logged; output helpers."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from .model import Proc


# Every child running now (a parallel smoke runs several): cancelling the smoke takes them all down.
_LIVE: set[subprocess.Popen] = set()
_LIVE_LOCK = threading.Lock()


def kill_running() -> None:
    with _LIVE_LOCK:
        live = list(_LIVE)
    for p in live:
        _kill_group(p)


def _kill_group(proc: subprocess.Popen) -> None:
    # The CLI's own children (docker build, pip) must go too, not only the python that started them.
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()


def run_process(argv: list[str], timeout: float, log: Path | None = None, stream: bool = False,
                env: dict[str, str] | None = None) -> Proc:
    """Run argv in its own process group, bounded by `timeout`. stdout and stderr are kept apart (stdout carries
    the JSON of --json commands) and both go to `log` as they come (a long build can be followed there); with
    `stream`, stderr lines are echoed too."""
    t0 = time.monotonic()
    fh = None
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        fh = open(log, "a", buffering=1)
        fh.write(f"$ {shlex.join(argv)}\n")
    lock = threading.Lock()
    try:
        try:
            p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace",
                                 start_new_session=True, env=env, stdin=subprocess.DEVNULL)
        except OSError as exc:
            msg = f"{argv[0]}: {exc.strerror or exc}"
            if fh:
                fh.write(msg + "\n# exit 127\n\n")
            return Proc(argv, 127, "", msg, 0.0)
        with _LIVE_LOCK:
            _LIVE.add(p)
        out_chunks: list[str] = []
        err_chunks: list[str] = []

        def pump(stream_in, sink: list[str], echo: bool) -> None:
            for line in stream_in:
                sink.append(line)
                with lock:
                    if fh:
                        fh.write(line)
                    if echo:
                        sys.stderr.write("    | " + line)
                        sys.stderr.flush()

        threads = [threading.Thread(target=pump, args=(p.stdout, out_chunks, False), daemon=True),
                   threading.Thread(target=pump, args=(p.stderr, err_chunks, stream), daemon=True)]
        for t in threads:
            t.start()
        timed_out = False
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(p)
            p.wait()
        except BaseException:  # Ctrl-C, or CI cancelling the job (SIGTERM, see main): take the build down too
            _kill_group(p)
            raise
        finally:
            with _LIVE_LOCK:
                _LIVE.discard(p)
        for t in threads:
            t.join(timeout=10)
        out, err = "".join(out_chunks), "".join(err_chunks)
        if timed_out:
            err += f"\n(killed after {timeout:g}s)\n"
        res = Proc(argv, 124 if timed_out else p.returncode, out, err, time.monotonic() - t0, timed_out)
        if fh:
            with lock:
                fh.write(("" if not (out or err) or (out + err).endswith("\n") else "\n")
                         + (f"# killed after {timeout:g}s\n" if timed_out else "")
                         + f"# exit {res.rc} after {res.seconds:.1f}s\n\n")
        return res
    finally:
        if fh:
            fh.close()


def cli_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "trainbox.cli", *args]


def failure_message(proc: Proc, what: str) -> str:
    """One or a few lines saying why a child failed: the CLI's own error line when it printed one."""
    err = proc.err.strip()
    if proc.rc == 2 and "invalid choice" in err:
        return f"`{what}` is not available in this trainbox (the command does not exist): {err.splitlines()[-1]}"
    if proc.rc == 127:
        return err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("trainbox: error:")]
    if errors:
        i = lines.index(errors[-1])
        text = "\n".join(lines[i:i + 8])
        return text[len("trainbox: error: "):]
    tail = lines[-6:] or [ln for ln in proc.out.splitlines() if ln.strip()][-6:]
    head = ("timed out" if proc.timed_out else f"killed by signal {-proc.rc}" if proc.rc < 0
            else f"exit status {proc.rc}")
    return f"{what}: {head}" + (": " + "\n".join(tail) if tail else "")


def printed_json(text: str):
    """The JSON document a --json command printed (tolerating lines before it)."""
    text = text.strip()
    try:
        return json.loads(text)
    except ValueError:
        pass
    for opener in ("{", "["):
        i = text.find(opener)
        while i != -1:
            try:
                return json.loads(text[i:])
            except ValueError:
                i = text.find(opener, i + 1)
    return None


# --------------------------------------------------------------------------------------- doctor findings


def log_tail(path: Path, n: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


# ----------------------------------------------------------------------------------------- profile / opts


