"""`trainbox stack validate|show|diff|lock|rules` (stdlib at import; host modules inside the handlers)."""

from __future__ import annotations

import json
import sys


def register(sub) -> None:
    p = sub.add_parser("stack", help="validate, show, diff and lock stack files")
    s = p.add_subparsers(dest="stack_cmd", metavar="SUBCOMMAND")

    v = s.add_parser("validate", help="schema + compatibility rules; --strict makes warnings errors")
    v.add_argument("stacks", nargs="*", metavar="STACK", help="stack names or files (default: all)")
    v.add_argument("--strict", action="store_true", help="warnings (unpinned sources, missing hashes) fail too")
    v.add_argument("--json", action="store_true", help="machine-readable findings")
    v.set_defaults(func=cmd_validate)

    sh = s.add_parser("show", help="resolved pins as a table")
    sh.add_argument("stack")
    sh.add_argument("--json", action="store_true")
    sh.set_defaults(func=cmd_show)

    d = s.add_parser("diff", help="what changes between two stacks (a bump or a variant)")
    d.add_argument("a")
    d.add_argument("b")
    d.add_argument("--json", action="store_true")
    d.set_defaults(func=cmd_diff)

    lk = s.add_parser("lock", help="fill in / refresh hashes and the dependency lock from the package indexes")
    lk.add_argument("stack")
    lk.add_argument("--wheelhouse", help="directory of wheels offered to the resolver (air-gapped indexes)")
    lk.add_argument("--no-deps", action="store_true", help="refresh component hashes only")
    lk.add_argument("--check", action="store_true", help="change nothing; exit 1 if the lock would change")
    lk.set_defaults(func=cmd_lock)

    r = s.add_parser("rules", help="list the compatibility rules")
    r.set_defaults(func=cmd_rules)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def cmd_validate(args) -> int:
    from ..runtime.errors import TrainboxError
    from ..rules import check
    from ..stack import list_stacks, load_stack

    names = args.stacks or list_stacks()
    failed = False
    report = []
    for name in names:
        try:
            stack = load_stack(name)
        except TrainboxError as exc:
            failed = True
            report.append({"stack": name, "ok": False, "findings": [{"rule": "schema", "level": "error",
                                                                      "message": str(exc)}]})
            if not args.json:
                print(f"FAIL {name}\n{exc}", file=sys.stderr)
            continue
        findings = check(stack)
        bad = [f for f in findings if f.level == "error" or args.strict]
        failed |= bool(bad)
        report.append({"stack": name, "ok": not bad,
                       "findings": [{"rule": f.rule, "level": f.level, "message": f.message} for f in findings]})
        if not args.json:
            print(f"{'FAIL' if bad else 'ok  '} {name} ({stack.source_file})")
            for f in findings:
                print(f"  {f.format(stack)}", file=sys.stderr if f in bad else sys.stdout)
    if args.json:
        print(json.dumps({"ok": not failed, "strict": args.strict, "stacks": report}, indent=2))
    return 2 if failed else 0


def _rows(stack):
    rows = []
    for key, c in sorted(stack.components.items()):
        for plat in stack.platforms:
            pin = c.pin_for(plat) if c.source == "pypi" else None
            rows.append({
                "component": key, "platform": plat, "source": c.source,
                "ref": (f"{c.dist_name}=={pin.version}" if pin else c.pinned_ref),
                "index": pin.index if pin else None,
                "sha256": (pin.sha256 if pin else c.sha256),
                "install": c.install, "patches": c.patches,
            })
    return rows


def cmd_show(args) -> int:
    from rich.console import Console
    from rich.table import Table

    from ..stack import load_stack

    stack = load_stack(args.stack)
    rows = _rows(stack)
    if args.json:
        print(json.dumps({"stack": stack.name, "device": stack.device, "python": stack.python,
                          "base": stack.base.model_dump(), "platforms": stack.platforms, "components": rows,
                          "env": stack.env, "deps_locked": {p: bool(stack.locked_deps(p)) for p in stack.platforms}},
                         indent=2, sort_keys=True))
        return 0
    t = Table(title=f"{stack.name}: {stack.device}, Python {stack.python}, base {stack.base.image}")
    for col in ("component", "platform", "pin", "index", "sha256", "patches"):
        t.add_column(col)
    for r in rows:
        sha = ", ".join(h[:12] for h in r["sha256"]) or "-"
        t.add_row(r["component"] + ("" if r["install"] else " (off)"), r["platform"], r["ref"],
                  r["index"] or "-", sha, r["patches"] or "-")
    Console().print(t)
    for k, v in sorted(stack.env.items()):
        print(f"env {k}={v}")
    return 0


def cmd_diff(args) -> int:
    from ..stack import load_stack

    a, b = load_stack(args.a), load_stack(args.b)
    changes = []

    def cmp(what, x, y):
        if x != y:
            changes.append({"what": what, "a": x, "b": y})

    cmp("device", a.device, b.device)
    cmp("python", a.python, b.python)
    cmp("platforms", a.platforms, b.platforms)
    cmp("base.image", a.base.image, b.base.image)
    for key in sorted(set(a.components) | set(b.components)):
        ca, cb = a.components.get(key), b.components.get(key)
        cmp(f"components.{key}", ca.pinned_ref if ca else None, cb.pinned_ref if cb else None)
        if ca and cb:
            cmp(f"components.{key}.patches", ca.patches, cb.patches)
            cmp(f"components.{key}.install", ca.install, cb.install)
    for k in sorted(set(a.env) | set(b.env)):
        cmp(f"env.{k}", a.env.get(k), b.env.get(k))
    if args.json:
        print(json.dumps({"a": a.name, "b": b.name, "changes": changes}, indent=2))
    else:
        if not changes:
            print(f"{a.name} and {b.name} resolve to the same pins")
        for c in changes:
            print(f"{c['what']}: {c['a']} -> {c['b']}")
    return 0


def cmd_lock(args) -> int:
    from pathlib import Path

    from ..lock import lock_stack, write_lock
    from ..stack import load_stack

    stack = load_stack(args.stack)
    print(f"locking {stack.name} for Python {stack.python} on {', '.join(stack.platforms)} ...", file=sys.stderr)
    rep = lock_stack(stack, Path(args.wheelhouse) if args.wheelhouse else None, resolve_deps=not args.no_deps)
    for line in rep.unreachable:
        print(f"unreachable: {line}", file=sys.stderr)
    for line in rep.problems:
        print(f"problem: {line}", file=sys.stderr)
    for line in rep.incomplete:
        print(f"incomplete: {line}", file=sys.stderr)
    for line in rep.changes:
        print(f"changed: {line}")
    if not rep.changes:
        print("no change")
    if rep.problems:
        return 1
    if args.check:
        return 1 if rep.changes else 0
    path = write_lock(stack, rep.lock)
    print(f"wrote {path}")
    return 0


def cmd_rules(args) -> int:
    from ..rules import RULES

    for r in RULES:
        print(f"{r.id}: {r.explanation}")
    return 0
