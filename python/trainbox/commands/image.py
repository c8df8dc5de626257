"""`trainbox image ...`: build a stack's image (stdlib only at import time)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("image", help="build a stack's container image")
    isub = p.add_subparsers(dest="image_command", metavar="SUBCOMMAND")

    b = isub.add_parser(
        "build",
        help="build a stack's image with BuildKit (skipped when its content-hash tag exists)",
        description="Render the stack, stage its inputs, and build trainbox/<stack>:<content hash> with "
        "BuildKit. Every pinned artifact is installed in pip's hash-checking mode; the CA bundle and index "
        "URL reach the build as BuildKit secrets, never as build args or layers.",
    )
    b.add_argument("--stack", required=True, help="stack name (build/stacks/NAME.yaml) or a stack file")
    b.add_argument("--tag", action="append", default=[], metavar="T", help="extra tag (repeatable)")
    b.add_argument("--base", metavar="IMAGE", help="build FROM this image instead of the stack's base")
    b.add_argument("--set", action="append", default=[], metavar="COMPONENT.FIELD=V", dest="sets",
                   help="override a pin, e.g. --set torch.version=2.13.0+cpu (repeatable; recorded in the "
                   "image manifest)")
    b.add_argument("--wheelhouse", metavar="DIR", help="directory of wheels pip may install from inside the build")
    b.add_argument("--pip-index-url", metavar="URL", help="PyPI mirror (may hold credentials: passed as a secret)")
    b.add_argument("--ca-bundle", metavar="FILE",
                   help="CA certificates for pip inside the build (default: pip's configured cert, else "
                   "/etc/ssl/certs/ca-certificates.crt); passed as a secret")
    b.add_argument("--platform", metavar="P", help="target platform, e.g. linux/arm64 (default: this machine's)")
    b.add_argument("--force", action="store_true", help="build even when the content-hash tag exists")
    b.add_argument("--no-cache", action="store_true", help="do not reuse BuildKit's layer cache")
    b.add_argument("--cache-from", action="append", default=[], metavar="SPEC",
                   help="BuildKit cache source, e.g. type=local,src=DIR (repeatable; CI keeps DIR between runs)")
    b.add_argument("--cache-to", action="append", default=[], metavar="SPEC",
                   help="BuildKit cache export, e.g. type=local,dest=DIR,mode=max (buildx with a builder that "
                   "exports caches, e.g. the docker-container driver)")
    b.add_argument("--dry-run", action="store_true",
                   help="print the plan (base, inputs, content hash, tags, secrets, what is fetched from where) and "
                   "a docker command that runs as printed; builds nothing, needs no engine and no index")
    b.add_argument("--json", action="store_true", help="with --dry-run: the plan as JSON (schema "
                   "trainbox.build-plan/1)")
    b.add_argument("--report", metavar="FILE", help="where to write the JSON build report "
                   "(default: build/reports/<stack>.json)")
    b.add_argument("-v", "--verbose", action="store_true", help="stream every line of the build's output")
    b.set_defaults(func=_build)

    w = isub.add_parser(
        "wheelhouse",
        help="fill a directory with every pinned artifact a stack's build installs (hash-verified)",
        description="Download (or take from trainbox's source cache) each pinned artifact the image build of "
        "STACK installs on PLATFORM: its pypi components and, when locked, their dependency closure. Every file "
        "is checked against the stack's sha256 before it is added; files already there are kept. Use the "
        "directory with `image build --wheelhouse DIR` on a machine without index access.",
    )
    w.add_argument("stack", metavar="STACK", help="stack name (build/stacks/NAME.yaml) or a stack file")
    w.add_argument("--platform", metavar="P", help="target platform, e.g. linux/arm64 (default: this machine's)")
    w.add_argument("-o", "--output", metavar="DIR", required=True, help="the wheelhouse directory to fill")
    w.add_argument("--set", action="append", default=[], metavar="COMPONENT.FIELD=V", dest="sets",
                   help="override a pin, as for image build (the moved pin needs a sha256 in the stack or lock)")
    w.add_argument("--json", action="store_true", help="print what was added and kept as JSON")
    w.set_defaults(func=_wheelhouse)

    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def _build(args: argparse.Namespace) -> int:
    from trainbox import image
    from trainbox.stack import parse_sets
    opts = image.BuildOptions(
        stack=args.stack, tags=args.tag, base=args.base, sets=parse_sets(args.sets),
        wheelhouse=args.wheelhouse, pip_index_url=args.pip_index_url, ca_bundle=args.ca_bundle,
        platform=args.platform, force=args.force, dry_run=args.dry_run, report=args.report,
        verbose=args.verbose, no_cache=args.no_cache, cache_from=args.cache_from, cache_to=args.cache_to,
        json=args.json,
    )
    if args.json and not args.dry_run:
        from trainbox.runtime.errors import TrainboxError

        raise TrainboxError("image build: --json goes with --dry-run (a real build writes its report: --report)")
    image.build(opts)
    return 0


def _wheelhouse(args: argparse.Namespace) -> int:
    import json
    import sys
    from pathlib import Path

    from trainbox import image, wheelhouse
    from trainbox.stack import load_stack, parse_sets

    stack = load_stack(args.stack, sets=parse_sets(args.sets) or None)
    plat = args.platform or image.host_platform()
    say = (lambda m: print(m, file=sys.stderr)) if args.json else print
    out = wheelhouse.fill(stack, plat, Path(args.output), say=say)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(f"{args.output}: {len(out['added'])} added, {len(out['kept'])} already there"
              + ("" if out["deps_locked"] else f"; the dependency closure is not locked for {plat}, so only the "
                 "components are here (`trainbox stack lock` records it)"))
    return 0
