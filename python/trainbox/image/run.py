"""Running a build plan through the engine client, and its report (host module).

`run` stages the plan's context, answers from the content-hash tag when the image exists, otherwise runs
BuildKit through trainbox.image.engine, then writes the build report (steps in Dockerfile order, cached/rebuilt
counts, image id, size, layers) and prints a one-line summary.
"""

from __future__ import annotations

import datetime as _dt
import json
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from ..paths import GENERATED_DIR, write_atomic
from . import sbom, toolkits
from .plan import BuildPlan, stage
from .engine import BuildResult, Client, ConsoleProgress, Step, run_build
from ..runtime.errors import TrainboxError
from ..runtime.redact import redact, redact_data, url_secrets


class BuildFailed(TrainboxError):
    """The engine ran the build and a step failed."""

    exit_code = 1


@dataclass
class BuildOutcome:
    tag: str
    tags: list[str]
    skipped: bool
    report: dict
    report_path: Path | None
    argv: list[str]


def common_report(plan: BuildPlan, client: Client) -> dict:
    b = plan.base
    return {
        "stack": plan.stack.name, "device": plan.stack.device, "platform": plan.platform, "tag": plan.tag,
        "tags": plan.tags, "content_hash": plan.content_hash,
        "base": {"requested": b.requested, "used": b.used, "substituted": b.substituted},
        "overrides": dict(plan.stack.overrides or {}), "wheelhouse": [w.name for w in plan.wheels],
        "client": client.describe(),
        "started_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }


def _skip(plan: BuildPlan, client: Client, report_path: Path, say) -> BuildOutcome:
    t0 = time.monotonic()
    for t in plan.tags[1:]:
        client.tag(plan.tag, t)
    baked = bake_toolkit_env(plan, client, say)  # an image from before the bake, or one whose bake was cut short
    baked.update(add_sbom(plan, client, report_path, say))  # ... or from before SBOMs
    report = {**common_report(plan, client), **image_facts(client, plan.tag), "ok": True, "skipped": True,
              **baked,
              "wall_s": round(time.monotonic() - t0, 3), "steps": [], "cached_steps": 0, "rebuilt_steps": 0}
    write_report(report, report_path)
    say(f"{plan.tag} is up to date (its inputs are unchanged); not rebuilding (--force rebuilds)")
    print(summary(report))
    return BuildOutcome(plan.tag, plan.tags, True, report, report_path, plan.argv())


def run(plan: BuildPlan, client: Client, report_path: Path, *, force: bool = False, verbose: bool = False,
        pip_index_url: str | None = None, say=print) -> BuildOutcome:
    """Execute `plan` with `client`: skip when its tag exists (unless `force`), else build and report."""
    sbom.require_library()  # every image gets an SBOM: fail now, not after the build
    secrets = url_secrets(pip_index_url)
    if not force and client.image_exists(plan.tag):
        return _skip(plan, client, report_path, say)
    before = client.image_info(plan.tag)  # --force: the image the tag names now, if any (see `replaced`)
    with stage(plan, pip_index_url=pip_index_url):
        say(f"building {plan.tag} for {plan.platform} on {plan.base.used} with {client.describe()}")
        result = run_build(client, plan.build_args(), plan.context,
                           on_event=ConsoleProgress(verbose=verbose, secrets=secrets))
    steps = [s.as_dict() for s in dockerfile_order(result.steps, plan.dockerfile)]
    for st in steps:
        st["from"] = st["name"].partition("] ")[2].startswith("FROM ")  # the base, not a build step
    report = {**common_report(plan, client), "ok": result.ok, "skipped": False, "wall_s": round(result.wall_s, 2),
              "steps": steps, "cached_steps": sum(s["status"] == "cached" for s in steps if not s["from"]),
              "rebuilt_steps": sum(s["status"] == "done" for s in steps if not s["from"])}
    if not result.ok:
        _fail(plan, result, report, report_path, secrets)
    report.update(bake_toolkit_env(plan, client, say))
    report.update(add_sbom(plan, client, report_path, say))
    report.update(image_facts(client, plan.tag))
    if before:
        report.update(replaced(client, plan, before, report["image_id"], say))
    write_report(report, report_path, secrets)
    print(summary(report))
    return BuildOutcome(plan.tag, plan.tags, False, report, report_path, plan.argv())


def replaced(client: Client, plan: BuildPlan, before: dict, new_id: str, say) -> dict:
    """A forced rebuild moved the content-hash tag off the image it named (`before`): that image must neither stay
    behind as a nameless 1 GB `<none>` nor vanish when a registry has it.

    Pushed (it has a registry digest): kept, reachable by that digest here and in the registry, and named by its
    registry tag REG/trainbox/STACK:HASH (given back if it lost it), so jobs rendered before (which name
    REG/...@sha256:...) pull what they always did; the move is said, not silent. Not pushed and no other name: removed
    (with the layers only it had); a container that still uses it keeps it, and that is said too."""
    old_id = before.get("Id") or ""
    now = client.image_info(old_id) if old_id and old_id != new_id else None
    if now is None:
        return {}
    tags, digests = list(now.get("RepoTags") or []), list(now.get("RepoDigests") or [])
    short, hash_tag = old_id.removeprefix("sha256:")[:12], plan.tag.split(":", 1)[1]
    if digests:
        for repo in sorted({d.split("@", 1)[0] for d in digests} - {t.rsplit(":", 1)[0] for t in tags}):
            client.tag(old_id, f"{repo}:{hash_tag}")
            tags.append(f"{repo}:{hash_tag}")
        say(f"warning: {plan.tag} now names the rebuilt image {new_id.removeprefix('sha256:')[:12]}; the one it "
            f"named ({short}) was pushed as {', '.join(digests)}: it stays, as {', '.join(tags)}, and jobs rendered "
            f"before pull it by that digest. `trainbox image push {plan.stack.name}` pushes the rebuilt one")
        return {"replaced": {"image_id": old_id, "pushed": digests, "kept_as": tags, "removed": False}}
    if tags:  # a name of the user's own (a --tag of an earlier build, say) keeps it
        return {"replaced": {"image_id": old_id, "pushed": [], "kept_as": tags, "removed": False}}
    proc = client.run("image", "rm", old_id, check=False, timeout=300)
    if proc.returncode != 0:
        why = (proc.stderr.decode(errors="replace").strip().splitlines() or ["?"])[-1]
        say(f"warning: the image {plan.tag} named before this rebuild ({short}) is left untagged: {why}")
    return {"replaced": {"image_id": old_id, "pushed": [], "kept_as": [], "removed": proc.returncode == 0}}


def bake_toolkit_env(plan: BuildPlan, client: Client, say) -> dict:
    """The environment the build recorded for the stack's toolkit, baked as ENV by the toolkit's own module
    (trainbox.image.toolkits: NPU images get their set_env exports; a CUDA base sets its own ENV)."""
    toolkit = toolkits.for_device(plan.stack.device)
    if toolkit is None or toolkit.ENV_RECORD is None:
        return {}
    try:
        return {f"{toolkit.NAME}_env": toolkit.bake(client, plan.tags, say)}
    except TrainboxError as exc:  # EngineError included
        raise BuildFailed(f"{plan.tag}: baking the {toolkit.NAME.upper()} environment as ENV failed: {exc}") from None


def add_sbom(plan: BuildPlan, client: Client, report_path: Path, say) -> dict:
    """The image's SBOM (trainbox.image.sbom), written into it as its last layer and beside the report."""
    try:
        return sbom_for_plan(plan, client, report_path, say)
    except TrainboxError as exc:  # EngineError included
        raise BuildFailed(f"{plan.tag}: writing the SBOM failed: {exc}") from None


def _base_facts(client: Client, plan: BuildPlan) -> dict:
    info = client.image_info(plan.base.used) or {}
    digests = sorted(d for d in info.get("RepoDigests") or [] if "@sha256:" in d)
    return {"used": plan.base.used, "requested": plan.base.requested, "substituted": plan.base.substituted,
            "digest": digests[0].split("@", 1)[1] if digests else None,
            "image_id": info.get("Id") or plan.base.image_id}


def sbom_for_plan(plan: BuildPlan, client: Client, report_path: Path, say=print) -> dict:
    """Make the SBOM of the image `plan` built, write it into the image (every tag) and beside the report.
    An image that already carries one (its label) keeps it. Returns what the build report records."""
    gen = f"{GENERATED_DIR}/{plan.stack.name}"
    done = client.labels(plan.tag).get(sbom.SBOM_LABEL)
    if done:
        path = sbom.write_beside(report_path, sbom.read_from_image(client, plan.tag))
        return {"sbom": {"path": str(path), "sha256": done.removeprefix("sha256:"), "already": True}}
    inv = sbom.inventory_of(client, plan.tag)
    texts = [plan.files[f"{gen}/{n}"] for n in ("requirements.txt", "deps.txt") if f"{gen}/{n}" in plan.files]
    manifest = json.loads(_text(plan.files[f"{gen}/stack.json"]))
    bom = sbom.make_bom(manifest=manifest, inventory=inv, base=_base_facts(client, plan),
                        image=f"trainbox/{plan.stack.name}", content_hash=plan.content_hash, platform=plan.platform,
                        requirements=[_text(t) for t in texts], wheels=plan.wheels)
    doc = sbom.to_json(bom)
    problems = sbom.compare(json.loads(doc), inv)
    if problems:  # the document was made from this very listing: a difference is a bug in trainbox
        raise TrainboxError(f"{plan.tag}: the SBOM does not match what is installed: " + "; ".join(problems))
    digest = sbom.commit(client, plan.tags, doc)
    path = sbom.write_beside(report_path, doc)
    say(f"SBOM of {plan.tag}: {len(inv['distributions'])} distributions, in the image at {sbom.SBOM_PATH} and at "
        f"{path}")
    return {"sbom": {"path": str(path), "sha256": digest, "distributions": len(inv["distributions"])}}


def _text(src: Path | bytes) -> str:
    return src.decode() if isinstance(src, bytes) else Path(src).read_text()


# The engine's build cache naming a layer the engine no longer has: what a prune beside a running build, or an
# engine stopped mid-write, leaves behind (moby/moby#39547). Every later build that reuses that cache entry fails
# at its export the same way, until the cache is dropped; the images themselves are sound.
_STALE_CACHE = re.compile(r"layer does not exist|/overlay2/[^:\s]+: no such file or directory")
STALE_CACHE_FIX = ("the engine's build cache names a layer the engine no longer has (left by a prune or an engine "
                   "stop during a build): run `docker builder prune -af` (images stay; the next build runs cold), "
                   "then build again")


def _fail(plan: BuildPlan, result: BuildResult, report: dict, report_path: Path, secrets: list[str] = ()) -> None:
    failed = result.failed
    report["error"] = {"step": failed.name if failed else None, "message": result.error,
                       "last_lines": list(failed.log)[-25:] if failed else result.output_tail[-25:]}
    stale = bool(_STALE_CACHE.search(result.error or ""))
    if stale:
        report["error"]["fix"] = STALE_CACHE_FIX
    write_report(report, report_path, secrets)
    lines = report["error"]["last_lines"] or result.output_tail[-25:]
    where = f"step {failed.name}" if failed else "the build"
    fix = f"\n  {STALE_CACHE_FIX}" if stale else ""
    # a step's output can hold the index credentials (a command that printed them): masked like pip masks them
    raise BuildFailed(redact(
        f"building {plan.tag} failed at {where}: {result.error or 'exit ' + str(result.returncode)}\n"
        "  last lines of its output:\n    " + "\n    ".join(lines) + f"\n  report: {report_path}" + fix, secrets))


def dockerfile_order(steps: list[Step], dockerfile: str) -> list[Step]:
    """BuildKit reports steps as they start (stages run in parallel); put them in Dockerfile order."""
    stages: list[str] = []
    for m in re.finditer(r"(?im)^\s*FROM\s+\S+(?:\s+AS\s+(\S+))?", dockerfile):
        stages.append(m.group(1) or f"stage-{len(stages)}")
    rank = {name: i for i, name in enumerate(stages)}
    return sorted(steps, key=lambda s: (rank.get(s.stage or "", len(stages)), s.index or 0))


def image_facts(client: Client, ref: str) -> dict:
    with ThreadPoolExecutor(max_workers=1) as pool:  # two engine round trips at once
        layers = pool.submit(client.layers, ref)
        info = client.inspect(ref)
        return {"image_id": info.get("Id"), "size": int(info.get("Size") or 0), "layers": layers.result()}


def write_report(report: dict, path: Path, secrets: list[str] | tuple[str, ...] = ()) -> None:
    """The report, with every URL's credentials and each of `secrets` masked (it is kept, shared, attached to CI)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(redact_data(report, secrets), indent=2, sort_keys=False) + "\n")


def summary(report: dict) -> str:
    size = report.get("size")
    size_s = f"{size / 1e6:.0f} MB" if size else "?"
    if report.get("skipped"):
        how = "up to date, not rebuilt"
    else:
        how = (f"built in {report.get('wall_s', 0):.1f}s, {report.get('rebuilt_steps', 0)} steps run, "
               f"{report.get('cached_steps', 0)} cached")
    sub = report.get("base", {}).get("substituted")
    return (f"{report['tag']} {(report.get('image_id') or '')[7:19]} {size_s} {len(report.get('layers') or [])} "
            f"layers: {how}" + (f" (base substituted by {sub})" if sub else ""))
