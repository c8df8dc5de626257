"""Running a build plan through the engine client, and its report (host module).

`run` stages the plan's context, answers from the content-hash tag when the image exists, otherwise runs
BuildKit through trainbox.engine, then writes the build report (steps in Dockerfile order, cached/rebuilt
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

from .paths import write_atomic
from . import cann_bake, sbom
from .buildplan import BuildPlan, stage
from .engine import Client, ConsoleProgress, run_build
from .runtime.errors import TrainboxError


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
    baked = bake_cann_env(plan, client, say)  # an image from before the bake, or one whose bake was cut short
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
    if not force and client.image_exists(plan.tag):
        return _skip(plan, client, report_path, say)
    with stage(plan, pip_index_url=pip_index_url):
        say(f"building {plan.tag} for {plan.platform} on {plan.base.used} with {client.describe()}")
        result = run_build(client, plan.build_args(), plan.context, on_event=ConsoleProgress(verbose=verbose))
    steps = [s.as_dict() for s in dockerfile_order(result.steps, plan.dockerfile)]
    for st in steps:
        st["from"] = st["name"].partition("] ")[2].startswith("FROM ")  # the base, not a build step
    report = {**common_report(plan, client), "ok": result.ok, "skipped": False, "wall_s": round(result.wall_s, 2),
              "steps": steps, "cached_steps": sum(s["status"] == "cached" for s in steps if not s["from"]),
              "rebuilt_steps": sum(s["status"] == "done" for s in steps if not s["from"])}
    if not result.ok:
        _fail(plan, result, report, report_path)
    report.update(bake_cann_env(plan, client, say))
    report.update(add_sbom(plan, client, report_path, say))
    report.update(image_facts(client, plan.tag))
    write_report(report, report_path)
    print(summary(report))
    return BuildOutcome(plan.tag, plan.tags, False, report, report_path, plan.argv())


def bake_cann_env(plan: BuildPlan, client: Client, say) -> dict:
    """NPU images: the CANN environment the build recorded, baked as ENV (trainbox.cann_bake)."""
    if plan.stack.device != "npu":
        return {}
    try:
        return {"cann_env": cann_bake.bake(client, plan.tags, say)}
    except TrainboxError as exc:  # EngineError included
        raise BuildFailed(f"{plan.tag}: baking the CANN environment as ENV failed: {exc}") from None


def add_sbom(plan: BuildPlan, client: Client, report_path: Path, say) -> dict:
    """The image's SBOM (trainbox.sbom), written into it as its last layer and beside the report."""
    try:
        return sbom.for_plan(plan, client, report_path, say)
    except TrainboxError as exc:  # EngineError included
        raise BuildFailed(f"{plan.tag}: writing the SBOM failed: {exc}") from None


def _fail(plan: BuildPlan, result, report: dict, report_path: Path) -> None:
    failed = result.failed
    report["error"] = {"step": failed.name if failed else None, "message": result.error,
                       "last_lines": list(failed.log)[-25:] if failed else result.output_tail[-25:]}
    write_report(report, report_path)
    lines = report["error"]["last_lines"] or result.output_tail[-25:]
    where = f"step {failed.name}" if failed else "the build"
    raise BuildFailed(
        f"building {plan.tag} failed at {where}: {result.error or 'exit ' + str(result.returncode)}\n"
        "  last lines of its output:\n    " + "\n    ".join(lines) + f"\n  report: {report_path}")


def dockerfile_order(steps: list, dockerfile: str) -> list:
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


def write_report(report: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(report, indent=2, sort_keys=False) + "\n")


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
