"""The `trainbox` command line.

Each command group lives in trainbox/commands/<group>.py with a `register(subparsers)` function.
Those modules are stdlib-only at import time and import their host module inside the handler, so
`trainbox doctor` works inside an image that has no jinja2/pydantic while `trainbox render` on the
host gets them.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from . import __version__
from .runtime.errors import TrainboxError

# Order here is the order of `trainbox --help`.
COMMAND_MODULES = [
    "stack",
    "render",
    "patches",
    "base",
    "image",
    "launch",
    "doctor",
    "smoke",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trainbox",
        description="Build and launch LLM training stacks (Ascend NPU, NVIDIA CUDA, CPU) as containers.",
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
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        rc = args.func(args)
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
        return 130
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
