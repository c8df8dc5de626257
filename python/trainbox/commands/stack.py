"""`trainbox stack list|validate|show|diff|lock|rules` (stdlib at import; host modules inside the handlers)."""

from __future__ import annotations

import sys

from ._args import EXIT_PROBLEMS, EXIT_USAGE, add_json, add_stack, add_stacks, exits, group_help
from ._output import emit_json, print_table


def register(sub) -> None:
    p = sub.add_parser("stack", help="list, validate, show, diff and lock stack files",
                       description="Stacks are build/stacks/NAME.yaml; every subcommand takes stack names (or "
                       "stack files) as positional arguments.")
    s = p.add_subparsers(dest="stack_cmd", metavar="SUBCOMMAND")

    ls = s.add_parser("list", help="the stacks: device, Python, base, CANN, parent, lock state",
                      description="One row per stack file: device, Python, parent (extends), CANN, chip, lock "
                      "state (fresh, stale, none; inherited: the parent's lock, used for the pins a stack does not "
                      "change) and base image.")
    exits(ls, "a stack file cannot be loaded")
    add_json(ls, "the stacks")
    ls.set_defaults(func=cmd_list)

    v = s.add_parser("validate", help="schema + compatibility rules (base image reference, stale locks, ...)",
                     description="Load each stack and run every compatibility rule (`trainbox stack rules`), "
                     "among them the base image reference (declared CANN, chip, OS and Python against the "
                     "image tag) and the lock's freshness.")
    exits(v, "a stack has an error finding (with --strict: any finding)")
    add_stacks(v)
    v.add_argument("--strict", action="store_true", help="warnings (unpinned sources, missing hashes) fail too")
    add_json(v, "the findings")
    v.set_defaults(func=cmd_validate)

    sh = s.add_parser("show", help="resolved pins as a table")
    add_stack(sh)
    add_json(sh, "the resolved stack")
    exits(sh)
    sh.set_defaults(func=cmd_show)

    d = s.add_parser("diff", help="what changes between two stacks (a bump or a variant); exit 1 when they differ",
                     description="Compare everything a build depends on: device, Python, platforms, base image "
                     "(CANN, chip, OS), indexes, system and build packages, every component field with the pin and "
                     "hashes in force per platform, env and the lock state.")
    exits(d, "the stacks differ (like `git diff --exit-code`)")
    d.add_argument("a", metavar="STACK_A", help="stack name or file")
    d.add_argument("b", metavar="STACK_B", help="stack name or file")
    add_json(d, "the differences")
    d.set_defaults(func=cmd_diff)

    lk = s.add_parser("lock", help="fill in / refresh hashes and the dependency lock from the package indexes",
                      description="Query each pin's index (PEP 691) for its artifact hashes and resolve the "
                      "dependency closure with pip, per platform, and write build/stacks/NAME.lock. Stacks that "
                      "extend a locked one (`extends:`) are locked after it, since their pins moved with it "
                      "(--no-dependants only names them). A stack with an error finding (`stack validate`) is not "
                      "locked; the finding is said once, at the file that holds the pin.")
    exits(lk, "a pin cannot be locked, a stack has an error finding (it is not locked), or with --check a lock "
          "would change")
    add_stacks(lk, default_all=False, help="stack names or files to lock (or --all)")
    lk.add_argument("--all", action="store_true", help="lock every stack")
    lk.add_argument("--no-dependants", action="store_true",
                    help="do not lock the stacks that extend these; name them instead")
    lk.add_argument("--wheelhouse", metavar="DIR", help="directory of wheels offered to the resolver (air-gapped indexes)")
    lk.add_argument("--no-deps", action="store_true", help="refresh component hashes only")
    lk.add_argument("--check", action="store_true", help="change nothing; exit 1 if a lock would change")
    add_json(lk, "what changed per stack")
    lk.set_defaults(func=cmd_lock)

    r = s.add_parser("rules", help="list the compatibility rules")
    add_json(r, "the rules")
    exits(r)
    r.set_defaults(func=cmd_rules)
    p.set_defaults(func=group_help(p))


def _lock_state(stack) -> str:
    if not stack.lock:
        return "none"
    state = "fresh" if stack.lock_is_fresh() else "stale"
    return f"{state} (inherited: {stack.lock_inherited})" if stack.lock_inherited else state


def cmd_list(args) -> int:
    from ..runtime.errors import TrainboxError
    from ..specs.stack import list_stacks, load_stack

    rows, failed = [], False
    for name in list_stacks():
        try:
            st = load_stack(name)
        except TrainboxError as exc:
            failed = True
            print(f"FAIL {name}: {exc}", file=sys.stderr)
            continue
        rows.append({"name": st.name, "device": st.device, "python": st.python, "extends": st.extends,
                     "base": st.base.image, "cann": st.base.cann, "chip": st.base.chip, "platforms": st.platforms,
                     "lock": _lock_state(st), "file": str(st.source_file), "description": st.description})
    if args.json:
        emit_json({"stacks": rows})
    else:
        cols = ("name", "device", "python", "extends", "cann", "chip", "lock", "base")
        print_table([c.upper() for c in cols], [[r[c] for c in cols] for r in rows])
    return EXIT_PROBLEMS if failed else 0


def cmd_validate(args) -> int:
    from ..specs.findings import exit_status, validate

    result = validate(args.stacks, strict=args.strict)
    if args.json:
        emit_json(result.as_dict())
    else:
        _print_validation(result)
    return EXIT_USAGE if result.invalid else exit_status(result.failed)


def _print_validation(result) -> None:
    """A line per stack (FAIL on stderr), then its findings; a finding inherited from a stack of this run is shown
    there, once, and the dependant only counts it."""
    in_run = {v.file for v in result.stacks if v.file}
    shown: set = set()
    for v in result.stacks:
        if v.error is not None:
            print(f"FAIL {v.stack}\n{v.error}", file=sys.stderr)
            continue
        elsewhere = [r for r in v.found if r.inherited_from and str(r.file) in in_run]
        count = (f": {len(elsewhere)} finding{'s' if len(elsewhere) != 1 else ''} inherited from "
                 f"{', '.join(sorted({r.inherited_from for r in elsewhere}))} (shown there)" if elsewhere else "")
        print(f"{'FAIL' if v.bad else 'ok  '} {v.stack} ({v.file}){count}", file=sys.stderr if v.bad else sys.stdout)
        _print_findings([r for r in v.found if r not in elsewhere and r.where not in shown], v.bad)
        shown |= {r.where for r in v.found}


_LEVELS = {"error": 0, "warning": 1, "info": 2}


def _print_findings(found: list, bad: list) -> None:
    """Errors first, then warnings, one line each; the info findings of one rule and file in one line (all of them
    are in --json), so that the one error is not buried under notes."""
    infos: dict[tuple, list] = {}
    for r in sorted(found, key=lambda r: _LEVELS.get(r.level, 3)):
        if r.level == "info":
            infos.setdefault((str(r.file), r.finding.rule), []).append(r)
            continue
        print(f"  {r.line()}", file=sys.stderr if r in bad else sys.stdout)
    for (file, rule), group in infos.items():
        more = (f" (and {len(group) - 1} more like it: `trainbox stack validate --json` lists them)"
                if len(group) > 1 else "")
        print(f"  {group[0].line()}{more}")


def _rows(stack):
    rows = []
    for key, c in sorted(stack.components.items()):
        for plat in stack.platforms:
            pin = c.pin_for(plat) if c.kind.from_index else None
            rows.append({
                "component": key, "platform": plat, "source": c.source,
                "ref": (f"{c.dist_name}=={pin.version}" if pin else c.pinned_ref),
                "index": pin.index if pin else None,
                "sha256": (pin.sha256 if pin else c.sha256),
                "install": c.install, "patches": c.patches,
            })
    return rows


def cmd_show(args) -> int:
    from ..specs.stack import load_stack

    stack = load_stack(args.stack)
    rows = _rows(stack)
    if args.json:
        emit_json({"stack": stack.name, "device": stack.device, "python": stack.python,
                   "base": stack.base.model_dump(), "platforms": stack.platforms, "components": rows,
                   "env": stack.env, "lock": _lock_state(stack),
                   "deps_locked": {p: bool(stack.locked_deps(p)) for p in stack.platforms}})
        return 0
    table = [[r["component"] + ("" if r["install"] else " (off)"), r["platform"], r["ref"], r["index"],
              ", ".join(h[:12] for h in r["sha256"]), r["patches"]] for r in rows]
    print_table(["COMPONENT", "PLATFORM", "PIN", "INDEX", "SHA256", "PATCHES"], table,
                title=f"{stack.name}: {stack.device}, Python {stack.python}, base {stack.base.image}")
    for k, v in sorted(stack.env.items()):
        print(f"env {k}={v}")
    return 0


def cmd_diff(args) -> int:
    import json

    from ..specs.stack import load_stack
    from ..specs.stackdiff import diff_stacks

    a, b = load_stack(args.a), load_stack(args.b)
    changes = diff_stacks(a, b)
    if args.json:
        emit_json({"a": a.name, "b": b.name, "same": not changes, "changes": changes})
    else:
        if not changes:
            print(f"{a.name} and {b.name} build the same (no difference in pins, base, indexes, packages or env)")

        def show(v):
            if isinstance(v, dict) and "source" in v:  # a whole component on one side only: its pins
                pins = v.get("pins") or {}
                return ", ".join(sorted({f"{v['source']} {p['version']} from {p['index']}" for p in pins.values()})
                                 ) or f"{v['source']} {v.get('commit') or v.get('ref') or v.get('url')}"
            return "(absent)" if v is None else v if isinstance(v, str) else json.dumps(v, sort_keys=True)

        for c in changes:
            print(f"{c['key']}: {show(c['a'])} -> {show(c['b'])}")
    return EXIT_PROBLEMS if changes else 0


def cmd_lock(args) -> int:
    from pathlib import Path

    from ..specs.findings import exit_status
    from ..specs.stack import list_stacks
    from ..supply.lockrun import lock_stacks

    if args.all and args.stacks:
        args._cmd_parser.error("give stack names or --all, not both")
    if not (args.all or args.stacks):
        args._cmd_parser.error("the following arguments are required: STACK (or --all)")
    out = sys.stderr if args.json else sys.stdout

    def started(stack, why) -> None:
        print(f"locking {stack.name}{why} for Python {stack.python} on {', '.join(stack.platforms)} ...",
              file=sys.stderr)

    def done(res) -> None:
        if res.refused:
            for r in res.said_first:
                print(r.line(), file=sys.stderr)
            where = sorted({r.inherited_from for r in res.refused if r.inherited_from})
            print(f"{res.stack}: not locked: {len(res.refused)} error finding{'s' if len(res.refused) != 1 else ''}"
                  + (f" (inherited from {', '.join(where)})" if where else ""), file=sys.stderr)
            return
        for kind in ("unreachable", "problems", "incomplete"):
            for line in getattr(res, kind):
                print(f"{res.stack}: {kind.rstrip('s') if kind == 'problems' else kind}: {line}", file=sys.stderr)
        for line in res.changes:
            print(f"{res.stack}: changed: {line}", file=out)
        if not res.changes:
            print(f"{res.stack}: no change", file=out)
        if res.written:
            print(f"{res.stack}: wrote {res.written}", file=out)

    run = lock_stacks(list_stacks() if args.all else args.stacks, dependants=not args.no_dependants,
                      wheelhouse=Path(args.wheelhouse) if args.wheelhouse else None, resolve_deps=not args.no_deps,
                      check=args.check, on_start=started, on_done=done,
                      progress=lambda m: print(m, file=sys.stderr, flush=True))
    for name, parent in run.named:
        print(f"{name} extends {parent}: its lock may now be stale; run `trainbox stack lock {name}` "
              "(or lock without --no-dependants)", file=sys.stderr)
    if args.json:
        emit_json(run.as_dict())
    # a refused stack exits as validate and build exit on the same finding; a pin that cannot be locked is 1 too
    return exit_status(run.refused) or (EXIT_PROBLEMS if run.failed else 0)


def cmd_rules(args) -> int:
    from ..specs.rules import RULES

    if args.json:
        emit_json({"rules": [{"id": r.id, "explanation": r.explanation} for r in RULES]})
        return 0
    for r in RULES:
        print(f"{r.id}: {r.explanation}")
    return 0
