"""`trainbox render [--stack S] [--out DIR] [--check]`."""

from __future__ import annotations

import sys


def register(sub) -> None:
    p = sub.add_parser("render", help="render stacks to Dockerfiles (Dockerfile.npu, Dockerfile.cuda, build/generated)")
    p.add_argument("--stack", action="append", help="stack to render (repeatable; default: all)")
    p.add_argument("--out", help="write under this directory instead of the repository root")
    p.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 if the committed files differ from what the templates produce")
    p.set_defaults(func=cmd_render)


def cmd_render(args) -> int:
    from pathlib import Path

    from ..paths import REPO_ROOT
    from ..render import drift, render_all, write_atomic

    outputs = render_all(args.stack)  # everything in memory first: a template error writes nothing
    root = Path(args.out) if args.out else REPO_ROOT
    if args.check:
        bad = drift(outputs, root)
        for line in bad:
            print(f"drift: {line}", file=sys.stderr)
        if bad:
            print("run `make render` (trainbox render) and commit the result; never edit generated files by hand",
                  file=sys.stderr)
            return 1
        print(f"{len(outputs)} generated files match the templates")
        return 0
    for rel, data in sorted(outputs.items()):
        write_atomic(root / rel, data)
        print(f"wrote {rel}")
    return 0
