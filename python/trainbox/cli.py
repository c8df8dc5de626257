"""The `trainbox` command line.

Each command group lives in trainbox/commands/<group>.py with a `register(subparsers)` function.
Those modules are stdlib-only at import time and import their host module inside the handler, so
`trainbox doctor` works inside an image that has no jinja2/pydantic while `trainbox render` on the
host gets them. The grammar every command follows (positional objects, -o/--output, --json with a schema, exit
statuses, deprecated spellings) and its helpers live in trainbox/commands/_args.py: use them for new options.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from . import __version__
from .commands._args import EXIT_INTERRUPTED, EXIT_PIPE, EXIT_USAGE, Parser, finish
from .runtime.errors import TrainboxError

# Order here is the order of `trainbox --help`.
COMMAND_MODULES = [
    "stack",
    "render",
    "patches",
    "fetch",
    "base",
    "image",
    "launch",
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


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    finish(args)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        rc = args.func(args)
        sys.stdout.flush()
    except TrainboxError as exc:
        print(f"trainbox: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except ModuleNotFoundError as exc:
        # Host-only commands inside the image, or a host without the [build] extra.
        print(
            f"trainbox: error: `trainbox {args.command}` needs the Python module {exc.name!r}, which is not "
            "installed here; install the host tools with `pip install 'trainbox[build]'`",
            file=sys.stderr,
        )
        return 2
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # `trainbox ... | head`: the reader left. No traceback; and stdout goes to /dev/null so that the
        # interpreter's own flush at exit does not raise again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_PIPE
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
