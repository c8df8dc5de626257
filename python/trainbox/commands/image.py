"""`trainbox image build|ls|prune|push|wheelhouse|sbom` (stdlib only at import time)."""

from __future__ import annotations

import argparse
import os
import sys

from ._args import EXIT_PROBLEMS, add_json, add_output, add_stack, add_stacks, exits, group_help
from ._output import emit_json, print_table


ENGINE_2 = "usage or invalid input, or no Docker engine answers"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("image", help="build, list and prune stack images")
    isub = p.add_subparsers(dest="image_command", metavar="SUBCOMMAND")
    _register_build(isub)

    w = isub.add_parser(
        "wheelhouse",
        help="fill a directory with every pinned artifact a stack's build installs (hash-verified)",
        description="Download (or take from trainbox's source cache) each pinned artifact the image build of "
        "STACK installs on PLATFORM: its pypi components and, when locked, their dependency closure. Every file "
        "is checked against the stack's sha256 before it is added; files already there are kept. Use the "
        "directory with `image build --wheelhouse DIR` on a machine without index access.",
    )
    add_stack(w)
    w.add_argument("--platform", metavar="P", help="target platform, e.g. linux/arm64 (default: this machine's)")
    w.add_argument("-o", "--output", metavar="DIR", required=True, help="the wheelhouse directory to fill")
    w.add_argument("--set", action="append", default=[], metavar="COMPONENT.FIELD=VALUE", dest="sets",
                   help="override a pin, as for image build (the moved pin needs a sha256 in the stack or lock)")
    add_json(w, "what was added and kept (schema trainbox.wheelhouse/1)")
    exits(w, None, **{"2": "usage or invalid input, or a pinned artifact cannot be fetched or verified"})
    w.set_defaults(func=_wheelhouse)

    ls = isub.add_parser("ls", help="built images: stack, platform, content hash, base, substitute/override flags, "
                         "size, age",
                         description="trainbox's images in the engine (those labelled io.trainbox.stack), newest "
                         "first, from their labels. PLATFORM: what the image config says it runs on (linux/arm64 "
                         "images carry an -arm64 tag suffix). SUBST: built on a base other than the stack's own (its base.substitute, or "
                         "--base IMAGE), as the image's manifest and doctor say; "
                         "OVERRIDES: built with --set or --base; PUSHED: the REG/repo@sha256:... of each `image push`.")
    add_stacks(ls, help="only the images of these stacks (default: all)")
    add_json(ls, "the images")
    exits(ls, None, **{"2": ENGINE_2})
    ls.set_defaults(func=_ls)

    pr = isub.add_parser("prune", help="remove older content-hash tags of each stack, keeping the newest N",
                         description="For each stack, keep the --keep newest images and remove the "
                         "trainbox/<stack>:<hash> tags of the older ones (the image goes with its last tag; :latest "
                         "and your own tags are never removed), and the untagged images `image ls` lists. Without "
                         "STACK on an engine holding several stacks, it names them first.")
    exits(pr, "a tag could not be removed (e.g. a container still uses the image)", **{"2": ENGINE_2})
    add_stacks(pr, help="only these stacks (default: all)")
    pr.add_argument("--keep", type=int, default=3, metavar="N", help="newest images to keep per stack (default 3)")
    pr.add_argument("--dry-run", action="store_true", help="say what would be removed; remove nothing")
    add_json(pr, "what was (or would be) removed")
    pr.set_defaults(func=_prune)
    _register_push(isub)

    sb = isub.add_parser(
        "sbom", help="print an image's SBOM: installed distributions, git sources, patches, base, toolkits",
        description="The CycloneDX SBOM that `trainbox image build` wrote into IMAGE (/etc/trainbox/sbom.cdx.json): "
        "every installed distribution with its version and artifact sha256 (or why none is known), every git "
        "source with URL, commit and tree id, every patch with its sha256, the base image's digest (or its id "
        "where it has none), and the CANN / CUDA toolkit versions. A copy lies beside the build report.")
    sb.add_argument("image", nargs="?", metavar="IMAGE", help="an image reference, e.g. trainbox/cpu:latest (required)")
    sb.set_defaults(_required=[("image", "IMAGE")])
    add_json(sb, "the SBOM document itself (CycloneDX JSON: its schema is named by $schema and specVersion)")
    exits(sb, None, **{"2": ENGINE_2 + ", or IMAGE has no SBOM"})
    sb.set_defaults(func=_sbom)

    p.set_defaults(func=group_help(p))


def _register_build(isub) -> None:
    b = isub.add_parser(
        "build",
        help="build a stack's image with BuildKit (skipped when its content-hash tag exists)",
        description="Render the stack, stage its inputs, and build trainbox/<stack>:<content hash> with "
        "BuildKit. Every pinned artifact is installed in pip's hash-checking mode; the CA bundle and index "
        "URL reach the build as BuildKit secrets, never as build args or layers.",
    )
    exits(b, "the build failed (its step is named), or with --dry-run the build would stop (the plan says where)",
          **{"2": ENGINE_2})
    add_stack(b)
    b.add_argument("--tag", action="append", default=[], metavar="T", help="extra tag (repeatable)")
    b.add_argument("--base", metavar="IMAGE", help="build FROM this image instead of the stack's base")
    b.add_argument("--set", action="append", default=[], metavar="COMPONENT.FIELD=VALUE", dest="sets",
                   help="override a pin of the stack, e.g. --set torch.version=2.13.0+cpu (repeatable; recorded in "
                   "the image manifest and its io.trainbox.overrides label)")
    b.add_argument("--wheelhouse", metavar="DIR", help="directory of wheels pip may install from inside the build")
    b.add_argument("--profile", metavar="FILE",
                   help="take the pins, wheelhouse and base choice for STACK from a smoke profile, as `trainbox "
                   "smoke --profile` does: e.g. ci/smoke-offline.yaml builds an NPU/CUDA stack on a CPU host (its "
                   "base.substitute when its own base cannot be pulled, with pins PyPI serves); the command line "
                   "wins")
    b.add_argument("--pip-index-url", metavar="URL", help="PyPI mirror (may hold credentials: passed as a secret)")
    b.add_argument("--ca-bundle", metavar="FILE",
                   help="CA certificates for pip inside the build (default: pip's configured cert, else "
                   "/etc/ssl/certs/ca-certificates.crt); passed as a secret")
    b.add_argument("--platform", metavar="P", help="target platform, e.g. linux/arm64 (default: this machine's)")
    b.add_argument("--force", action="store_true", help="build even when the content-hash tag exists")
    b.add_argument("--no-cache", action="store_true", help="do not reuse BuildKit's layer cache")
    b.add_argument("--cache-from", action="append", default=[], metavar="SPEC",
                   help="BuildKit cache source, e.g. type=local,src=DIR (repeatable; CI keeps DIR between runs)")
    b.add_argument("--cache-to", action="append", default=[], metavar="SPEC",
                   help="BuildKit cache export, e.g. type=local,dest=DIR,mode=max (buildx with a builder that "
                   "exports caches, e.g. the docker-container driver)")
    b.add_argument("--offline", action="store_true", help="git commits and archives only from trainbox's cache")
    b.add_argument("--bundle", metavar="FILE", help="build from a `trainbox fetch --bundle` file, network off")
    b.add_argument("--dry-run", action="store_true",
                   help="print the plan (findings, base, inputs, content hash, tags, secrets, where every source comes "
                   "from) and a docker command that runs as printed; planned as the build plans (an error finding "
                   "refuses both, exit 1 as in `stack validate`); builds nothing, needs no engine, asks an index only for pins --set moved")
    add_output(b, "where to write the JSON build report (default: build/reports/<stack>.json)", old=("--report",),
               metavar="FILE")
    add_json(b, "the build report (with --dry-run: the plan, schema trainbox.image-plan/1)")
    b.add_argument("-v", "--verbose", action="store_true", help="stream every line of the build's output")
    b.set_defaults(func=_build)

def _register_push(isub) -> None:
    pu = isub.add_parser(
        "push", help="push a stack's content-hash tag to a registry and record the digest it got",
        description="Tag trainbox/STACK:<content hash> as REG/trainbox/STACK:<hash> and push it. The digest the "
        "registry stored is recorded in the build report and shown by `image ls`; the cluster targets of `launch "
        "render` then name REG/trainbox/STACK@sha256:..., which every node can pull.")
    add_stack(pu)
    pu.add_argument("--registry", metavar="REG", default=None,
                    help="registry host[:port][/path] (default: $TRAINBOX_REGISTRY); a registry on 127.0.0.1 is "
                    "plain HTTP to the engine, any other needs TLS or the engine's insecure-registries")
    pu.add_argument("--platform", metavar="P[,P]", default=None,
                    help="push the stack's image built for each platform (e.g. linux/amd64,linux/arm64; each "
                    "`image build --platform P` first), then one manifest list naming them by digest, which the "
                    "cluster targets name (default: the plain content-hash tag)")
    add_json(pu, "the pushed image: tag, digest, ref (with --platform: the manifest list and its images)")
    exits(pu, "the push failed (the registry's message is shown)", **{"2": ENGINE_2})
    pu.set_defaults(func=_push)


def _build(args: argparse.Namespace) -> int:
    import contextlib
    import json

    from trainbox.image import build as image_build
    from trainbox.specs.findings import FindingsRefused
    from trainbox.specs.stack import parse_sets

    if args.profile:
        _apply_profile(args)
    opts = image_build.BuildOptions(
        stack=args.stack, tags=args.tag, base=args.base, sets=parse_sets(args.sets),
        wheelhouse=args.wheelhouse, pip_index_url=args.pip_index_url, ca_bundle=args.ca_bundle,
        platform=args.platform, force=args.force, dry_run=args.dry_run, report=args.output,
        verbose=args.verbose, no_cache=args.no_cache, cache_from=args.cache_from, cache_to=args.cache_to,
        json=bool(args.json and args.dry_run),
        offline=args.offline, bundle=args.bundle,
    )
    try:
        if not args.json or args.dry_run:
            outcome = image_build.build(opts)  # a dry run prints its plan, as JSON with --json
            # a plan the build could not carry out ("the build would stop here") is a failed check
            return 1 if args.dry_run and outcome.report.get("would_stop") else 0
        # --json: stdout carries the one JSON document; what the build prints for people goes to stderr
        with contextlib.redirect_stdout(sys.stderr):
            outcome = image_build.build(opts)
    except FindingsRefused as exc:
        if not args.json:
            raise
        # the refusal as the one JSON document, its findings as `stack validate --json` gives them
        emit_json({"ok": False, "dry_run": bool(args.dry_run), "refused": str(exc).splitlines()[0],
                   "findings": [r.as_dict() for r in exc.reported]})
        return exc.exit_code  # as without --json, and as validate and lock exit on the same finding
    report = json.loads(json.dumps(outcome.report, default=str))
    emit_json({**report, "dry_run": bool(args.dry_run), "command": list(outcome.argv or []),
               "report_file": str(outcome.report_path) if outcome.report_path else None})
    return 0


def _apply_profile(args: argparse.Namespace) -> None:
    """`--profile FILE`: the profile's pins for the stack (under the command line's --set), its wheelhouse, and
    its base choice (substitute_base: auto, never or an image) decided as `trainbox smoke` decides it."""
    from trainbox.image.base import profile_base
    from trainbox.smoke.profile import load_profile
    from trainbox.specs.stack import load_stack

    prof = load_profile(args.profile)
    stack = load_stack(args.stack)
    pins = dict((prof.get("set") or {}).get(stack.name) or {})
    args.sets = [f"{k}={v}" for k, v in pins.items()] + list(args.sets)  # later wins: the command line
    args.wheelhouse = args.wheelhouse or prof.get("wheelhouse")
    mode = prof.get("substitute_base") or "auto"
    own, sub = stack.base.image, stack.base.substitute
    note = f"--profile {args.profile}: " + (", ".join(f"{k}={v}" for k, v in pins.items()) or "no pins")
    if not args.base:  # the command line's --base wins
        choice = profile_base(mode, own, sub, stack.base.auto_substitute)
        args.base = choice.base
        if choice.base:
            note += f"; base {choice.base} ({choice.reason})"
    print(note, file=sys.stderr)


def _wheelhouse(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from trainbox.image import build as image_build
    from trainbox.supply import wheelhouse
    from trainbox.supply.fetch import check_platform
    from trainbox.runtime.errors import TrainboxError
    from trainbox.specs.stack import load_stack, parse_sets

    check_platform(args.platform)  # a platform no stack targets: one line, before anything is downloaded
    stack = load_stack(args.stack, sets=parse_sets(args.sets) or None)
    plat = args.platform or image_build.host_platform()
    if plat not in stack.platforms:
        raise TrainboxError(f"--platform {plat}: stack {stack.name} supports {', '.join(stack.platforms)} "
                            f"({stack.source_file}: platforms)")
    say = (lambda m: print(m, file=sys.stderr)) if args.json else print
    out = wheelhouse.fill(stack, plat, Path(args.output), say=say)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(f"{args.output}: {len(out['added'])} added, {len(out['kept'])} already there"
              + ("" if out["deps_locked"] else f"; the dependency closure is not locked for {plat}, so only the "
                 "components are here (`trainbox stack lock` records it)"))
    return 0


def _ls(args: argparse.Namespace) -> int:
    from trainbox.image.inventory import built_images, human_age, human_size

    images = built_images(args.stacks or None)
    if args.json:
        emit_json({"images": [i.as_dict() for i in images]})
        return 0
    rows = [[(i.hash_tags or i.tags or ["<none>"])[0], i.stack, i.platform or "?", i.hash, i.base, i.substitute,
             ",".join(f"{k}={v}" for k, v in sorted(i.overrides.items())), human_size(i.size), human_age(i.age_s),
             i.id, " ".join(i.digests) or "-"] for i in images]
    print_table(["IMAGE", "STACK", "PLATFORM", "HASH", "BASE", "SUBST", "OVERRIDES", "SIZE", "AGE", "ID", "PUSHED"],
                rows)
    return 0


def _push(args: argparse.Namespace) -> int:
    from trainbox.image.push import push

    args.registry = args.registry or os.environ.get("TRAINBOX_REGISTRY")  # read here: the parser is built once
    if not args.registry:
        args._cmd_parser.error("--registry REG is required (or set TRAINBOX_REGISTRY)")
    say = (lambda m: print(m, file=sys.stderr)) if args.json else print
    if args.platform:
        return _push_platforms(args, say)
    pushed = push(args.stack, args.registry, say=say)
    if args.json:
        emit_json(pushed.as_dict())
    else:
        print(f"pushed {pushed.ref}\n  cluster targets now name it: trainbox launch render RECIPE --target slurm")
    return 0


def _push_platforms(args: argparse.Namespace, say) -> int:
    from trainbox.specs.platforms import PLATFORM_ARCH
    from trainbox.image.push import push_platforms

    plats = [p.strip() for p in args.platform.split(",") if p.strip()]
    bad = [p for p in plats if p not in PLATFORM_ARCH]
    if bad or not plats or len(set(plats)) != len(plats):
        args._cmd_parser.error(f"--platform {args.platform}: a comma-separated list of distinct platforms out of "
                               f"{', '.join(PLATFORM_ARCH)}")
    listed = push_platforms(args.stack, args.registry, plats, say=say)
    if args.json:
        emit_json(listed.as_dict())
    else:
        print(f"pushed {listed.ref} ({', '.join(plats)})\n  cluster targets now name it: trainbox launch render "
              "RECIPE --target slurm")
    return 0


def _sbom(args: argparse.Namespace) -> int:
    from trainbox.image import sbom
    from trainbox.image.engine import find_client

    client = find_client()
    client.require_engine()
    text = sbom.read_from_image(client, args.image)
    # the image may be anyone's: its document is checked and everything printed from it made printable
    doc = sbom.parse_document(text, f"{sbom.printable(args.image)}: {sbom.SBOM_PATH}")
    if args.json:
        sys.stdout.write(sbom.json_text(text, doc))
        return 0
    head, rows = sbom.summary(doc, args.image)
    print(head)
    print_table(["TYPE", "NAME", "VERSION", "SHA256", "FROM"], rows)
    return 0


def _prune(args: argparse.Namespace) -> int:
    from trainbox.image.inventory import built_images, prune, prune_plan

    if args.keep < 1:
        args._cmd_parser.error(f"--keep {args.keep}: keep at least 1 image per stack")
    images = built_images(args.stacks or None)
    plan = prune_plan(images, args.keep)
    note = sys.stderr if args.json else sys.stdout
    stacks = sorted({i.stack for i in images})
    if not args.stacks and len(stacks) > 1:
        # a shared engine: say whose images this touches before touching them
        print(f"no STACK given: pruning every stack on this engine ({', '.join(stacks)}); name STACKs to limit it",
              file=note)
    if not args.dry_run:
        prune(plan)
    for act in plan:
        state = "would remove" if args.dry_run else "removed" if act.removed else f"kept ({act.error})"
        what = act.tag or f"untagged {act.stack} image"
        print(f"{state} {what} ({act.image}, built {act.created})", file=note)
    if not plan:
        print(f"nothing to prune (at most {args.keep} image(s) per stack)", file=note)
    failed = [a for a in plan if not args.dry_run and not a.removed]
    if args.json:
        emit_json({"dry_run": args.dry_run, "keep": args.keep, "ok": not failed, "stacks": stacks,
                   "tags": [{"stack": a.stack, "tag": a.tag, "image": a.image, "created": a.created,
                             "removed": a.removed, "error": a.error} for a in plan]})
    return EXIT_PROBLEMS if failed else 0
