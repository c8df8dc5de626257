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
    p.add_argument("--image", metavar="IMAGE",
                   help="on the host: run the doctor inside IMAGE (docker run, no network, the shared memory and "
                        "ulimits `trainbox run` gives a CPU job; an image of another platform runs under qemu with "
                        "docker's init, as `trainbox run` does)")
    exits(p, "a check failed (with --strict: a warning too)", **{"2": "usage or invalid input, or (--image) no "
                                                                    "engine answers or the image is not here"})
    p.set_defaults(func=_run)


def _run(args) -> int:
    if not args.image:
        from ..runtime.doctor import cli

        return cli.run(args)
    from ..launch.docker import doctor_in_image  # a host module: --image is for the host, never inside an image

    flags = [f for f, on in (("--json", args.json), ("--strict", args.strict), ("--quick", args.quick)) if on]
    flags += ["--manifest", args.manifest] if args.manifest else []
    return doctor_in_image(args.image, flags)
