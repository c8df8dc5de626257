"""`trainbox render [--stack S] [--out DIR] [--check]`."""

from __future__ import annotations

import shutil
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
    from ..render import GENERATED_FILES, drift, render_all, stale_generated, write_set

    outputs = render_all(args.stack)  # everything in memory first: a template error writes nothing
    root = Path(args.out) if args.out else REPO_ROOT
    if args.check:
        bad = drift(outputs, root, whole=not args.stack)
        for line in bad:
            print(f"drift: {line}", file=sys.stderr)
        if bad:
            print("run `make render` (trainbox render) and commit the result; never edit generated files by hand",
                  file=sys.stderr)
            return 1
        print(f"{len(outputs)} generated files match the templates")
        return 0
    for rel in write_set(outputs, root):  # all or nothing
        print(f"wrote {rel}")
    if not args.stack:
        for stale in stale_generated(outputs, root):
            if {p.name for p in stale.iterdir()} <= GENERATED_FILES:
                shutil.rmtree(stale)
                print(f"removed {stale.relative_to(root)}/ (no stack produces it)")
            else:
                print(f"warning: {stale.relative_to(root)}/ is stale (no stack produces it) but holds other "
                      "files; delete it by hand", file=sys.stderr)
    return 0
