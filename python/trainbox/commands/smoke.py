"""`trainbox smoke`: every stack through validate, lock, render, hadolint, patches, build, doctor and its recipes,
with a summary matrix, JUnit XML and a JSON report (stdlib at import; trainbox.smoke inside the handler)."""

from __future__ import annotations

import argparse

from ._args import add_output, add_stacks, exits


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "smoke",
        help="CI smoke: validate, lock, render, lint, verify patches, build, doctor and dry-run recipes per stack",
        description="For each stack, in order: `stack validate --strict`, `stack lock --no-deps --check`, "
        "`render --check`, hadolint, `patches verify`, `image build` (on the stack's base.substitute when its own "
        "base cannot be pulled, recorded in the report), `doctor --json` in the built image (findings a runner "
        "without accelerators and a substitute base must produce are marked expected), then every recipe on "
        "the stack rendered, shellchecked and dry-run. Prints a stack x step matrix; exit status 1 when any "
        "step failed, 2 for a usage error. Needs no accelerator. --set here is a pin override per stack.",
        epilog="Example (a machine that reaches PyPI only): trainbox smoke cpu npu-910b "
        "--profile ci/smoke-offline.yaml --wheelhouse /opt/wheels --keep-going --junit smoke.xml",
    )
    add_stacks(p, help="stacks to check, in this order (default: the profile's, else every stack)")
    p.add_argument("--json", action="store_true", help="print the JSON report (with a \"schema\" version) on "
                   "stdout; the matrix goes to stderr")
    p.add_argument("--junit", metavar="FILE", help="write JUnit XML: one testsuite per stack, one testcase per step")
    p.add_argument("--keep-going", action="store_true",
                   help="check every stack even after one failed (default: the stacks after a failed one are "
                   "reported as not run)")
    p.add_argument("--jobs", type=int, metavar="N",
                   help="check N stacks at once (default: the profile's `jobs`, else 1): the first stack runs "
                   "alone, since it makes the substitute base present; the rest start in the order given as "
                   "others finish (stacks that share image layers are best listed one after the other)")
    p.add_argument("--set", action="append", metavar="[STACK:]COMPONENT.FIELD=VALUE", dest="sets",
                   help="override a pin of STACK (without STACK: of every stack); for the build and the patch "
                   "check, e.g. npu-910b:torch.version=2.13.0+cpu (repeatable; recorded in the report and the "
                   "image manifest)")
    p.add_argument("--profile", metavar="FILE",
                   help="smoke profile YAML: stacks, set (per stack), wheelhouse, substitute_base, skip, keep_going; "
                   "command-line options win")
    p.add_argument("--wheelhouse", metavar="DIR", help="directory of wheels offered to every image build")
    p.add_argument("--substitute-base", metavar="auto|never|IMAGE",
                   help="auto (default): build on the stack's base.substitute only when its own base is neither "
                   "present nor pullable (registry probe bounded by --pull-timeout); never: always the stack's "
                   "own base; IMAGE: build every stack on IMAGE")
    p.add_argument("--pull-timeout", type=float, metavar="SECONDS",
                   help="how long the registry of a stack's own base may take to answer (default 20)")
    p.add_argument("--skip", action="append", metavar="STEP",
                   help="skip a step (repeatable or comma-separated): validate, lock, render, hadolint, patches, "
                   "build, doctor, recipes; skipping build skips doctor")
    add_output(p, "where logs, rendered files, build reports and report.json go (default: build/reports/smoke)",
               old=("--workdir",), metavar="DIR")
    p.add_argument("--build-cache", metavar="DIR",
                   help="keep the BuildKit cache of each stack's build in DIR/<stack> (CI caches DIR between runs; "
                   "needs a buildx builder that exports caches, e.g. the docker-container driver)")
    p.add_argument("-v", "--verbose", action="store_true", help="stream the image builds' output")
    exits(p, "a step failed for a stack")
    p.set_defaults(func=_smoke)


def _smoke(args: argparse.Namespace) -> int:
    from trainbox import smoke

    opts = smoke.build_options(stacks=args.stacks, sets=args.sets, profile=args.profile, wheelhouse=args.wheelhouse,
                               substitute_base=args.substitute_base, keep_going=args.keep_going, skip=args.skip,
                               workdir=args.output, pull_timeout=args.pull_timeout, verbose=args.verbose,
                               build_cache=args.build_cache, jobs=args.jobs)
    return smoke.main(opts, as_json=args.json, junit=args.junit)
