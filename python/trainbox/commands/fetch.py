"""`trainbox fetch`: fill trainbox's cache with what stacks need (stdlib only at import time)."""

from __future__ import annotations

import argparse

from ._args import add_json, add_stacks, exits


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "fetch",
        help="fetch and verify every pinned artifact and git commit of stacks into trainbox's cache",
        description="Fetch each stack's pinned sources once, on this host, with its own git and git "
        "configuration (url.<base>.insteadOf mirrors, credential helpers, proxies; only https, ssh and file "
        "transports), verifying each: wheels and archives by sha256, git commits by the fetched HEAD. "
        "`trainbox image build` then finds them in the cache (and with --offline needs nothing else).",
    )
    exits(p, None, **{"2": "usage or invalid input, or a source that cannot be fetched or does not match its pin "
                           "(the component, URL and commit or hash are named)"})
    add_stacks(p)
    p.add_argument("--sources-only", action="store_true",
                   help="only git commits and archives (not the PyPI artifacts, which the build's pip fetches)")
    p.add_argument("--offline", action="store_true", help="check that the cache holds everything; fetch nothing")
    p.add_argument("--bundle", metavar="FILE", help="write one self-contained offline bundle of one STACK "
                   "(wheels, source trees, lock, manifest, checksums) for `image build --bundle FILE`")
    p.add_argument("--wheelhouse", metavar="DIR", help="wheels already at hand (used only where a pin's sha256 "
                   "names them), e.g. one from an index this host cannot reach")
    p.add_argument("--platform", metavar="P", help="target platform, linux/amd64 or linux/arm64 (default: this "
                   "machine's, or the stack's first when it does not have this machine's)")
    add_json(p, "what was fetched (schema trainbox.fetch/1; with --bundle: trainbox.bundle/1)")
    p.set_defaults(func=_fetch)


def _fetch(args: argparse.Namespace) -> int:
    import json

    from trainbox.supply.fetch import check_platform, fetch_stacks

    check_platform(args.platform)  # before anything is fetched or cached
    if args.bundle:
        return _bundle(args)
    import sys

    rows = fetch_stacks(args.stacks or None, sources_only=args.sources_only, offline=args.offline,
                        platform=args.platform,
                        say=lambda m: print(f"trainbox: fetch {m}", file=sys.stderr, flush=True))
    if args.json:
        print(json.dumps({"schema": "trainbox.fetch/1", "fetched": rows}, indent=2, sort_keys=True))
    else:
        for r in rows:
            print(f"{r['stack']:<14} {r['component']:<16} {r['ref']}  {r['cached']}")
    return 0


def _bundle(args: argparse.Namespace) -> int:
    import json
    import sys
    from pathlib import Path

    from trainbox.image.bundle import write_bundle
    from trainbox.runtime.errors import TrainboxError

    if len(args.stacks) != 1:
        raise TrainboxError("--bundle FILE: name exactly one STACK (a bundle serves one image build)")
    say = (lambda m: print(f"trainbox: {m}", file=sys.stderr)) if args.json else (lambda m: print(f"trainbox: {m}"))
    res = write_bundle(args.stacks[0], Path(args.bundle),
                       wheelhouse=Path(args.wheelhouse) if args.wheelhouse else None, platform=args.platform, say=say)
    if args.json:
        print(json.dumps(res, indent=2, sort_keys=True))
    else:
        print(f"{res['bundle']}: stack {res['stack']} for {res['platform']}, {res['files']} files, "
              f"{res['size'] / 1e6:.0f} MB")
    return 0
