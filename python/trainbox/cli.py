"""The `trainbox` command line.

Each command group lives in trainbox/commands/<group>.py with a `register(subparsers)` function.
Those modules are stdlib-only at import time and import their host module inside the handler, so
`trainbox doctor` works inside an image that has no jinja2/pydantic while `trainbox render` on the
host gets them. The grammar every command follows (positional objects, -o/--output, --json with a schema, exit
statuses, deprecated spellings) and its helpers live in trainbox/commands/_args.py: use them for new options.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import os
import sys

from . import __version__
from .commands._args import Parser, finish
from .runtime.errors import EXIT_INTERRUPTED, EXIT_PIPE, EXIT_PROBLEMS, EXIT_USAGE, TrainboxError, describe_os_error
from .runtime.redact import redact

# Order here is the order of `trainbox --help`.
COMMAND_MODULES = [
    "stack",
    "render",
    "patches",
    "fetch",
    "base",
    "image",
    "launch",
    "jobs",
    "trial",
    "doctor",
    "smoke",
]


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="trainbox",
        description="Build and launch LLM training stacks (Ascend NPU, NVIDIA CUDA, CPU) as containers.",
        epilog="Grammar: the object a command acts on is positional (STACK, RECIPE, COMPONENT); paths it writes "
        "are -o/--output; --json prints one JSON document with a \"schema\" version. Exit status: 0 ok, 1 a check "
        "found problems, 2 usage or invalid input, 130 interrupted, 141 output pipe closed. "
        "`trainbox COMMAND --help` for each command.",
    )
    parser.add_argument("--version", action="version", version=f"trainbox {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            mod = importlib.import_module(f"trainbox.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"trainbox.commands.{name}":
                raise
            continue  # command group not part of this install
        mod.register(sub)
    return parser


@functools.lru_cache(maxsize=1)
def _parser() -> argparse.ArgumentParser:
    """The parser a command runs with, built once per process: building it imports and registers every command
    group, and parsing leaves no state in it (defaults that read the environment are read by the handlers), so a
    process that runs many commands (the tests run hundreds) pays for it once."""
    return build_parser()


def main(argv: list[str] | None = None) -> int:
    """Run one command. Whatever it raises ends here as one line on stderr and the documented exit status:
    130 for Ctrl-C (also during argument parsing or imports), 141 when the reader of stdout went away, 2 for
    invalid input, a file system that refuses a write (full, read-only) or input nested too deep."""
    with _noted_interrupts():
        try:
            return _dispatch(argv)
        except KeyboardInterrupt as exc:
            return _interrupted(exc)
        except BrokenPipeError:
            return _pipe_closed()


# Ctrl-C that lands inside code called from a compiled library (pydantic-core calling a Python regex while it
# checks a lock) is printed as "Exception ignored" and lost there, and the command then fails for a reason it
# never had ("the lock is invalid") with exit 2. Each interrupt is noted as it arrives, the "ignored" report of
# one is left out, and the command's end (an error, or even success) is answered as the interrupt.
_SIGINTS: list[int] = []


@contextlib.contextmanager
def _noted_interrupts():
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:  # ignored (nohup, &), or not ours
        yield
        return

    def note(signum, frame):
        _SIGINTS.append(signum)
        raise KeyboardInterrupt

    before = sys.unraisablehook

    def unraisable(report):
        if not (_SIGINTS and isinstance(report.exc_value, KeyboardInterrupt)):
            before(report)

    _SIGINTS.clear()
    signal.signal(signal.SIGINT, note)
    sys.unraisablehook = unraisable
    try:
        yield
    finally:
        sys.unraisablehook = before
        if signal.getsignal(signal.SIGINT) is note:  # _interrupted() may have set SIG_IGN: leave that
            signal.signal(signal.SIGINT, signal.default_int_handler)


def _dispatch(argv: list[str] | None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    args._argv = list(sys.argv[1:] if argv is None else argv)  # `run --detach` starts the same command again
    finish(args)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        rc = args.func(args)
        sys.stdout.flush()
        if _SIGINTS:
            raise KeyboardInterrupt
    except Exception as exc:  # noqa: BLE001 - re-raised below unless an interrupt caused it
        if not _SIGINTS:
            return _failed(args, exc)
        return _interrupted(KeyboardInterrupt())
    except KeyboardInterrupt as exc:
        return _interrupted(exc)
    return int(rc or 0)


def _failed(args, exc: Exception) -> int:
    """A command's exception as one line and its exit status."""
    try:
        raise exc
    except TrainboxError as exc:
        return _error(str(exc), exc.exit_code)
    except ModuleNotFoundError as exc:
        # Host-only commands inside the image, or a host without the [build] extra.
        return _error(f"`trainbox {args.command}` needs the Python module {exc.name!r}, which is not installed "
                      "here; install the host tools with `pip install 'trainbox[build]'`", EXIT_USAGE)
    except BrokenPipeError:
        return _pipe_closed()
    except OSError as exc:  # a full disk, a read-only cache, TRAINBOX_CACHE naming a file: the path and the fix
        if os.environ.get("TRAINBOX_DEBUG"):
            raise
        return _error(describe_os_error(exc), EXIT_USAGE)
    except RecursionError:  # a document nested past what any reader bounds: never a 1000-frame traceback
        return _error(f"`trainbox {args.command}`: an input is nested too deeply to read; check the files it "
                      "reads (stack, lock, recipe, bundle, SBOM)", EXIT_USAGE)
    except Exception as exc:  # noqa: BLE001 - the last resort: a bug says so in one line, the traceback on demand
        if os.environ.get("TRAINBOX_DEBUG"):
            raise
        what = " ".join(str(exc).split())[:300]
        return _error(f"internal error in `trainbox {args.command}`: {type(exc).__name__}: {what} (a bug in "
                      "trainbox: please report it with the command; TRAINBOX_DEBUG=1 prints the traceback)",
                      EXIT_PROBLEMS)


def _error(message: str, code: int) -> int:
    print(f"trainbox: error: {redact(message)}", file=sys.stderr)  # a URL's credentials never in clear
    return code


def _interrupted(exc: KeyboardInterrupt) -> int:
    """Ctrl-C: one line, 130; whatever was half-done has been undone by the `finally` blocks on the way here.
    A command that knows more (`run`: the job stopped, where its log is) says it in the interrupt's message."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C while saying so is not another traceback
    detail = str(exc.args[0]) if exc.args and isinstance(exc.args[0], str) else ""
    try:
        print(f"trainbox: interrupted{': ' + detail if detail else ''}", file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass
    return EXIT_INTERRUPTED


def _pipe_closed() -> int:
    # `trainbox ... | head`: the reader left. No traceback; and stdout goes to /dev/null so that the
    # interpreter's own flush at exit does not raise again.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return EXIT_PIPE


if __name__ == "__main__":
    sys.exit(main())
