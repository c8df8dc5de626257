"""`trainbox base ...`: base images made without a registry (stdlib only at import time)."""

from __future__ import annotations

import argparse

from ._args import exits, group_help


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("base", help="make base images without a registry (debootstrap)")
    bsub = p.add_subparsers(dest="base_command", metavar="SUBCOMMAND")

    b = bsub.add_parser(
        "bootstrap",
        help="build local/debian:bookworm (or :bookworm-arm64) from Debian's archive with debootstrap and import it",
        description="Build a minimal Debian root filesystem with debootstrap (--variant=minbase) from "
        "Debian's archive and import it into the engine. Skips the work when the tag exists.",
    )
    b.add_argument("--tag", default=None,
                   help="image tag (default: local/debian:bookworm; for linux/arm64 local/debian:bookworm-arm64)")
    b.add_argument("--platform", metavar="P", default=None,
                   help="linux/amd64 or linux/arm64 (default: this machine's); another architecture is made "
                   "through qemu (`ci/ensure-docker.sh --emulate arm64` sets it up) and imported with BuildKit, so "
                   "that the image config records it")
    b.add_argument("--suite", default="bookworm", help="Debian suite (default: %(default)s)")
    b.add_argument("--mirror", default=None,
                   help="Debian mirror URL (default: $TRAINBOX_DEBIAN_MIRROR or http://deb.debian.org/debian)")
    b.add_argument("--security-mirror", default="http://deb.debian.org/debian-security",
                   help="mirror for <suite>-security in the image's sources.list, or 'none' (default: %(default)s)")
    b.add_argument("--include", action="append", default=[], metavar="PKG",
                   help="extra package to install (repeatable)")
    b.add_argument("--force", action="store_true", help="rebuild even when the tag exists")
    b.add_argument("-v", "--verbose", action="store_true", help="show every debootstrap line")
    exits(b, None, **{"2": "usage or invalid input, or debootstrap / the import failed (named, with its last lines)"})
    b.set_defaults(func=_bootstrap)

    p.set_defaults(func=group_help(p))


def _bootstrap(args: argparse.Namespace) -> int:
    from trainbox.image import base

    base.bootstrap(tag=args.tag, suite=args.suite, mirror=args.mirror, security_mirror=args.security_mirror,
                   force=args.force, include=args.include or None, verbose=args.verbose, platform=args.platform)
    return 0
