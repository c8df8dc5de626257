"""The doctor's arguments, shared by `trainbox doctor` and `python3 -m trainbox.runtime.doctor`."""

from __future__ import annotations

import argparse

DESCRIPTION = (
    "Check the training environment: installed versions against the stack manifest, CANN, "
    "NPU/GPU devices and driver mounts, Ray/HCCL/allocator settings, /dev/shm, memlock and disk. "
    "Prints one PASS/WARN/FAIL/SKIP line per check with the fix. Never imports torch in-process. "
    "Exit status: 1 when a check fails (with --strict also on a warning), else 0; 2 for a usage error."
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true",
                   help="print the report as JSON (schema 1, see trainbox.runtime.doctor)")
    p.add_argument("--strict", action="store_true", help="exit 1 on warnings too")
    p.add_argument("--manifest", metavar="PATH",
                   help="stack manifest to check against (default: $TRAINBOX_MANIFEST or /etc/trainbox/stack.json)")
    p.add_argument("--quick", action="store_true",
                   help="only the checks that start no child process (what TRAINBOX_CHECK runs at container start)")


def run(args: argparse.Namespace) -> int:
    from .core import main

    return main(manifest=args.manifest, as_json=args.json, strict=args.strict, quick=args.quick)


if __name__ == "__main__":  # `python3 -m` on a library module must fail loudly, not pass silently
    from trainbox.runtime.errors import not_a_command

    raise SystemExit(not_a_command(__spec__.name))
