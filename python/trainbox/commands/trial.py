"""`trainbox trial RECIPE`: the recipe's own job, shrunk by its `trial:` overlay, for its first training steps in its
image (stdlib at import; trainbox.launch.trial inside the handler)."""

from __future__ import annotations

import sys

from ._args import EXIT_PROBLEMS, add_json, exits
from ._output import emit_json


def register(sub) -> None:
    p = sub.add_parser(
        "trial", help="preflight: run a recipe's real job, shrunk by its trial overlay, for its first steps",
        description="Runs the recipe's own rendered job in its stack's image with the tiny overlay the recipe "
        "declares (`trial:`: model size, sequence length, steps, ranks, paths; everything else as the recipe "
        "renders it). Tiny model, tokenizer and data are made in the image (cached by content hash). On a host "
        "without the stack's cards it runs in CPU mode (TRAINBOX_DEVICE=cpu, Gloo, the overlay's ranks as "
        "processes). Prints loss and time per optimizer step, then `passed N steps` or `stopped at FILE:LINE: "
        "Exception: what it means`.")
    p.add_argument("recipe", nargs="?", metavar="RECIPE", help="recipe name or file (with a `trial:` overlay)")
    p.add_argument("--list", action="store_true", help="list the recipes that declare a trial overlay")
    p.add_argument("--image", help="image to run in (default: trainbox/STACK:latest; a substitute-built image is "
                   "fine for a trial, and named)")
    p.add_argument("--devices", metavar="LIST", help="run on these cards of this host instead of CPU mode")
    p.add_argument("--cpu", action="store_true", help="CPU mode even where the host has the stack's cards")
    p.add_argument("--set", dest="sets", action="append", metavar="NAME=VALUE",
                   help="a recipe input on top of the overlay's (e.g. a real TRAIN_DATA_PATH to try)")
    p.add_argument("--dry-run", action="store_true", help="print the plan (overlaid recipe, artifacts, image) and "
                   "run nothing")
    p.add_argument("-v", "--verbose", action="store_true", help="stream the job's whole output, not only the "
                   "step lines")
    add_json(p, "the trial's result (steps, final line, where it stopped)")
    exits(p, "the trial stopped before its steps (the final line says where and why)")
    p.set_defaults(func=cmd_trial)


def cmd_trial(args) -> int:
    from ..launch.trial import plan_trial, run_trial, trial_recipes
    from ..runtime.errors import TrainboxError

    if args.list:
        for name in trial_recipes():
            print(name)
        return 0
    if not args.recipe:
        raise TrainboxError("trainbox trial: name a RECIPE (`trainbox trial --list` shows those with an overlay)")
    if args.cpu and args.devices:
        raise TrainboxError("trainbox trial: --cpu and --devices exclude each other")
    from ..launch import parse_sets

    plan = plan_trial(args.recipe, image=args.image, devices=args.devices, cpu=True if args.cpu else None,
                      sets=parse_sets(args.sets))
    say = (lambda msg: print(msg, file=sys.stderr, flush=True))
    if args.dry_run:
        doc = {"recipe": plan.recipe, "image": plan.image, "image_note": plan.image_note, "mode": plan.mode,
               "recipe_file": str(plan.recipe_file), "script": str(plan.script_path), "artifacts": str(plan.artifacts),
               "made": plan.made, "overlay": plan.overlay.model_dump(), "run_dir": str(plan.run_dir)}
        if args.json:
            emit_json(doc, "trainbox.trial/1")
        else:
            for k, v in doc.items():
                print(f"{k}: {v}")
        return 0
    result = run_trial(plan, say, verbose=args.verbose)
    if args.json:
        emit_json({k: v for k, v in result.items() if k != "schema"}, result["schema"])
        print(f"trial {plan.recipe}: {result['line']}", file=sys.stderr)
    else:
        print(f"trial {plan.recipe}: {result['line']}")
        print(f"  log {result['log']}; {result['wall_s']}s" + (f", peak memory {result['peak_mem_mb']} MB"
                                                               if result.get("peak_mem_mb") else ""), file=sys.stderr)
    return 0 if result["ok"] else EXIT_PROBLEMS
