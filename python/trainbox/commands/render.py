"""`trainbox render [STACK...] [-o DIR] [--check] [--json]`."""

from __future__ import annotations

import shutil
import sys

from ._args import EXIT_PROBLEMS, add_json, add_output, add_stacks, exits
from ._output import emit_json


def register(sub) -> None:
    p = sub.add_parser("render", help="render stacks to Dockerfiles (Dockerfile.npu, Dockerfile.cuda, build/generated)",
                       description="Render each stack's templates in memory (a template error writes nothing), then "
                       "write them, or with --check compare them with the files on disk.")
    exits(p, "--check found drift")
    add_stacks(p)
    add_output(p, "write under this directory instead of the repository root", old=("--out",), metavar="DIR")
    p.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 if the committed files differ from what the templates produce")
    add_json(p, "the files (and with --check the drift)")
    p.set_defaults(func=cmd_render)


def cmd_render(args) -> int:
    from pathlib import Path

    from ..paths import REPO_ROOT
    from ..image.render import GENERATED_FILES, drift, render_all, stale_generated, write_set

    found = _findings(args.stacks)  # an error finding refuses, before anything is rendered or written
    outputs = render_all(args.stacks or None)  # everything in memory first: a template error writes nothing
    root = Path(args.output) if args.output else REPO_ROOT
    note = sys.stderr if args.json else sys.stdout
    if args.check:
        bad = drift(outputs, root, whole=not args.stacks)
        for line in bad:
            print(f"drift: {line}", file=sys.stderr)
        if bad:
            print("run `make render` (trainbox render) and commit the result; never edit generated files by hand",
                  file=sys.stderr)
        else:
            print(f"{len(outputs)} generated files match the templates", file=note)
        if args.json:
            emit_json({"root": str(root), "check": True, "ok": not bad, "files": sorted(outputs), "drift": bad,
                       "findings": found})
        return EXIT_PROBLEMS if bad else 0
    if args.output:
        print(f"writing into {root}/ (the paths below are relative to it)", file=note)
    for rel in write_set(outputs, root):  # all or nothing
        print(f"wrote {rel}", file=note)
    if not args.stacks:
        for stale in stale_generated(outputs, root):
            if {p.name for p in stale.iterdir()} <= GENERATED_FILES:
                shutil.rmtree(stale)
                print(f"removed {stale.relative_to(root)}/ (no stack produces it)", file=note)
            else:
                print(f"warning: {stale.relative_to(root)}/ is stale (no stack produces it) but holds other "
                      "files; delete it by hand", file=sys.stderr)
    if args.json:
        emit_json({"root": str(root), "check": False, "ok": True, "files": sorted(outputs), "drift": [],
                   "findings": found})
    return 0


def _findings(names: list[str] | None) -> list[dict]:
    """The findings pass over the stacks rendered: errors refuse; warnings are said once each (stderr). The lock's
    state is left to `stack validate` and `stack lock` (a render of a stack whose pin moved fails on the pin)."""
    from ..specs.findings import LOCK_RULES, Review, refuse_errors, unique_lines
    from ..specs.stack import list_stacks, load_stack

    review = Review(skip=LOCK_RULES)
    found = [r for name in names or list_stacks() for r in review.stack(load_stack(name))]
    refuse_errors("render", found)
    for line in unique_lines(found):
        print(f"note: {line}", file=sys.stderr)
    return [r.as_dict() for r in found]
