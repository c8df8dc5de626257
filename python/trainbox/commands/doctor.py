"""`trainbox doctor`: check the environment, inside an image or on a bare host (stdlib only)."""

from __future__ import annotations

from ._args import exits


def register(subparsers) -> None:
    from ..runtime.doctor import cli

    p = subparsers.add_parser(
        "doctor",
        help="check this environment (packages, CANN, devices, limits) and say how to fix what is wrong",
        description=cli.DESCRIPTION,
    )
    cli.add_arguments(p)
    exits(p, "a check failed (with --strict: a warning too)")
    p.set_defaults(func=cli.run)
