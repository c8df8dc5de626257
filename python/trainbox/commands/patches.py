"""`trainbox patches ...`: verify patch series against pinned upstreams, edit and export them (stdlib only at
import time)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ._args import add_json, add_stacks, exits, group_help
from ._output import emit_json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("patches", help="verify, edit and export the patch series of patched components")
    psub = p.add_subparsers(dest="patches_command", metavar="SUBCOMMAND")

    v = psub.add_parser(
        "verify",
        help="apply each series to its pinned upstream in a scratch tree and report per patch",
        description="Fetch each patched component's pinned source (PyPI artifact by version and sha256, or a git "
        "commit) into the cache, apply its series there with zero fuzz and print one row per patch: clean, offset, "
        "or fails at FILE hunk N. Exit status 1 when any patch fails. Works offline once the cache holds the "
        "sources.",
    )
    add_stacks(v, help="stacks to check (default: every stack)")
    v.add_argument("--component", metavar="COMPONENT", help="only this component")
    add_json(v, "one result per patch")
    v.add_argument("--strict", action="store_true", help="count hunks that apply only at an offset as failures")
    v.add_argument("--offline", action="store_true", help="use the cache only; never touch the network")
    v.add_argument("--set", action="append", metavar="COMPONENT.FIELD=VALUE", dest="sets",
                   help="override a pin of the stack before checking; as in `trainbox image build`, e.g. "
                   "megatron-core.version=0.16.0 then megatron-core.sha256=HEX")
    exits(v, "a patch does not apply (or with --strict applies only at an offset)")
    v.set_defaults(func=_verify)

    e = psub.add_parser(
        "edit",
        help="make a git working tree of the pinned source with one commit per patch",
        description="Create a git repository holding the component's pinned source as a first commit (tag "
        "`upstream`) and each patch of its series as a commit on top. Change patches with ordinary git (commit "
        "--amend, rebase -i, new commits), then write them back with `trainbox patches export`.",
    )
    e.add_argument("component", metavar="COMPONENT", help="component key, e.g. megatron-core")
    e.add_argument("--stack", metavar="STACK", help="take the pin from this stack (needed when stacks disagree)")
    e.add_argument("--dir", type=Path, help="where to create the tree (default: the cache's edit/C)")
    e.add_argument("--force", action="store_true", help="discard an existing tree at --dir")
    e.add_argument("--offline", action="store_true", help="use the cache only")
    exits(e, "a patch of the series does not apply to the pin (the tree stops there to resolve it)")
    e.set_defaults(func=_edit)

    x = psub.add_parser(
        "export",
        help="write an edit tree's commits back as the series (stable names, no timestamp churn)",
        description="Run git format-patch over the commits above `upstream` with stable options (zero From "
        "hash, no signature, no numbering in subjects, no diffstat) and replace patches/<series>/ with the "
        "result, rewriting `series` in commit order. Unchanged commits give byte-identical files.",
    )
    x.add_argument("component", metavar="COMPONENT", help="component key, e.g. megatron-core")
    x.add_argument("--dir", type=Path, help="the edit tree (default: the cache's edit/C)")
    exits(x)
    x.set_defaults(func=_export)

    i = psub.add_parser(
        "import",
        help="turn a single diff from another project into series entries with provenance headers",
        description="Apply DIFF (e.g. one of Relax's docker/npu_patch/*.patch) to the component's pinned source "
        "on top of its series, one entry per file, each with a message naming DIFF, Upstream-Status and "
        "Upstream-Ref (the pin: URL@commit for git), and write the series back. Fails, changing nothing, when a "
        "file's change does not apply to the pin.",
    )
    exits(i, None, **{"2": "usage or invalid input, or a file of the diff does not apply to the pin (named; "
                           "nothing under patches/ changes)"})
    i.add_argument("diff", type=Path, metavar="DIFF", help="the diff file")
    i.add_argument("--component", required=True, metavar="COMPONENT", help="component key whose series receives it")
    i.add_argument("--stack", metavar="STACK", help="take the pin from this stack (needed when stacks disagree)")
    i.add_argument("--status", default="Pending", help="Upstream-Status for the entries (default: Pending)")
    i.add_argument("--why", help="the explanation each entry's message carries")
    i.add_argument("--offline", action="store_true", help="use the cache only")
    i.set_defaults(func=_import)

    p.set_defaults(func=group_help(p))


def _import(args: argparse.Namespace) -> int:
    from trainbox.supply.patch_import import import_diff

    names = import_diff(args.diff, args.component, stack=args.stack, status=args.status, why=args.why,
                        offline=args.offline)
    print(f"{args.component}: series now {len(names)} patch(es): {', '.join(names)}")
    return 0


def _verify(args: argparse.Namespace) -> int:
    from trainbox.supply import patches

    from trainbox.specs.stack import parse_sets

    sets = parse_sets(args.sets)
    found = _findings(args.stacks, sets)
    rows = patches.verify(args.stacks or None, args.component, strict=args.strict, offline=args.offline, sets=sets)
    if args.json:
        emit_json({**json.loads(patches.rows_json(rows)), "findings": found})
    else:
        print(patches.format_table(rows) if rows else "no patched components")
    bad = [r for r in rows if not r.ok]
    if bad and not args.json:
        failed = sum(r.status != "skipped" for r in bad)
        skipped = len(bad) - failed
        print(f"\n{failed} of {len(rows)} patch(es) failed" + (f", {skipped} not tried" if skipped else ""),
              file=sys.stderr)
    return 1 if bad else 0


def _findings(names: list[str] | None, sets: dict[str, str]) -> list[dict]:
    """The findings pass over the stacks verified: an error refuses, as everywhere a stack is used, except under
    --set, which asks what a series does to another pin (the pairing rules may well object: notes then)."""
    from trainbox.specs.findings import LOCK_RULES, Review, refuse_errors, unique_lines
    from trainbox.specs.stack import list_stacks, load_stack

    review = Review(skip=LOCK_RULES)  # the pins are fetched by hash: the lock's state shows where it matters
    found = [r for name in names or list_stacks() for r in review.stack(load_stack(name, sets=sets or None))]
    if not sets:
        refuse_errors("patches verify", found)
    for line in unique_lines(found):
        print(f"note: {line}", file=sys.stderr)
    return [r.as_dict() for r in found]


def _edit(args: argparse.Namespace) -> int:
    from trainbox.supply import patches

    d, applied, stopped, series = patches.edit_from_stack(args.component, stack=args.stack, directory=args.dir,
                                                          force=args.force, offline=args.offline)
    export_cmd = f"trainbox patches export {args.component}" + (f" --dir {args.dir}" if args.dir else "")
    if stopped:
        print(f"{d}: applied {len(applied)} patch(es); {stopped} does not apply to this pin.\n"
              f"Resolve it there: `git -C {d} am --show-current-patch=diff`, `git apply --reject` or edit the files,"
              f" `git add -A`, `git am --continue` (or `git am --skip` to drop it); then `{export_cmd}`.",
              file=sys.stderr)
        return 1
    print(f"{d}: {len(applied)} patch(es) of patches/{series} as commits on top of tag `upstream`.\n"
          f"Change them with git (commit --amend, rebase -i upstream, new commits), then `{export_cmd}`.")
    return 0


def _export(args: argparse.Namespace) -> int:
    from trainbox.supply import patches

    target, names = patches.export(args.dir or patches.default_edit_dir(args.component))
    print(f"{target}: wrote {len(names)} patch(es) and series")
    return 0
