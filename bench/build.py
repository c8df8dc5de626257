"""Build benchmark (`make bench-build`): what a build of a stack costs, cold and after small edits.

Prints, for one stack (cpu by default):
  - the limit: a plain `pip install` of the very same hash-pinned requirements (the stack's rendered
    requirements.txt and deps.txt, the same wheelhouse, no pip cache) into a fresh venv on this host, timed
    in the same run, and the cold build as a multiple of it (the goal: <= 1.2 x). Where no dependency lock
    applies (the build then resolves the pins' dependencies itself), the limit installs the same venv: the pins
    without hashes, dependencies resolved by pip;
  - the cold build's steps with their times (where the rest of the cold build goes);
  - the cold build time (BuildKit's layer cache ignored; the pip/apt download caches stay warm unless
    --prune-cache, which empties the engine's pip/apt cache mounts first: `make bench-build` does);
  - the no-change rebuild, the package-edit rebuild and the launcher-edit rebuild, each as a ratio of
    the cold time (the edits are made in a scratch copy of the inputs, never in the checkout). Each is the
    median of --repeat runs (3; each edit run with an edit of its own): one such rebuild is under a second,
    so one hiccup of a shared machine would otherwise decide its figure;
  - the final image size and the bytes in it that are caches, duplicate files (the same bytes at
    several paths) or shadowed files (replaced or deleted by a later layer). The goal for all three: 0;
  - one workload stack (--workload, twinkle by default; `none` skips it) built cold as `make smoke` builds it
    where no NPU base can be had: on its base.substitute with the smoke profile's pins (--profile), its git
    sources through the user's git configuration (`make bench-build` points it at the upstream mirrors), against
    the same limit measured for that stack in the same run (the goal: <= 1.3 x).

Not a timed test: it takes minutes and its numbers depend on the machine. Needs a Docker engine.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

# the image scanner is a test tool (tests/imagescan.py), shared with this benchmark
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def _edited_copy(root: Path, edit: str) -> Path:
    from trainbox.image.plan import copy_inputs

    copy_inputs(root)
    target = root / edit
    target.write_text(target.read_text() + f"\n# bench edit {time.time()}\n")
    return root


def _timed_build(opts, repo_root: Path | None = None):
    from trainbox.image import build as image_build

    opts.source_root = repo_root
    t0 = time.monotonic()
    out = image_build.build(opts)
    return out, time.monotonic() - t0


def limit_requirements(stack_name: str, sets: dict[str, str] | None = None, plan=None) -> list[bytes]:
    """requirements.txt and deps.txt for the limit. With `plan` (an image_build.plan), the very files the build installs:
    pins moved by `sets` are hashed there as the build hashes them (a moved pin has no hash in the stack's lock)."""
    from trainbox.image import render
    from trainbox.specs.stack import load_stack

    if plan is None:
        rendered = render.render_stack(load_stack(stack_name, sets=sets))
        return [rendered.requirements.encode(), rendered.deps.encode()]
    gen = f"{render.GENERATED_DIR}/{stack_name}"
    texts = [plan.files[f"{gen}/{n}"] for n in ("requirements.txt", "deps.txt")]
    return [t if isinstance(t, bytes) else Path(t).read_bytes() for t in texts]


def _locked(deps: bytes) -> bool:
    """Whether a rendered deps.txt pins anything (a dependency lock applies) or is comments only."""
    return any(ln.strip() and not ln.lstrip().startswith(b"#") for ln in deps.splitlines())


def plain_pip_install(stack_name: str, wheelhouse: str | None, sets: dict[str, str] | None = None,
                      plan=None, pins_only: bool = False) -> tuple[float, float]:
    """(venv seconds, pip seconds): the stack's hash-pinned requirements (limit_requirements) installed with plain
    pip into a fresh venv, no cache, from the indexes that answer (as the build does) plus the wheelhouse; where no
    dependency lock applies, the pins without their hashes and with their dependencies (what the build installs).
    `pins_only`: the hash-pinned lines alone, --no-deps, even then (the limit before 2026-11-28, for comparison)."""
    import subprocess

    from trainbox.image import build as image_build
    from trainbox.specs.stack import load_stack

    stack = load_stack(stack_name, sets=sets)
    texts = limit_requirements(stack_name, sets, plan)
    locked = pins_only or _locked(texts[1])
    if not locked:
        # No dependency lock applies (a stack without one, or pins moved by --set): the build installs the pins
        # hash-checked, then resolves their dependencies. The limit is then what a user without trainbox runs to
        # get the same venv: one plain `pip install -r` of the pins, dependencies resolved by pip; hash-checking
        # mode cannot take unpinned dependencies, so the pins' hashes are left out of it.
        texts = [re.sub(rb" --hash=\S+", b"", texts[0]), b""]
    indexes = [u for u in stack.indexes.values() if image_build.url_answers(u, 6.0)[0]] or ["https://pypi.org/simple"]
    with tempfile.TemporaryDirectory(prefix="trainbox-bench-pip-") as tmp:
        req, deps = Path(tmp, "requirements.txt"), Path(tmp, "deps.txt")
        req.write_bytes(texts[0])
        deps.write_bytes(texts[1])
        t0 = time.monotonic()
        subprocess.run([sys.executable, "-m", "venv", f"{tmp}/venv"], check=True)
        t1 = time.monotonic()
        cmd = [f"{tmp}/venv/bin/python", "-m", "pip", "install", "-q", "--no-cache-dir", "--disable-pip-version-check",
               *(["--require-hashes", "--no-deps"] if locked else []), "--index-url", indexes[0], "-r", str(req),
               "-r", str(deps)]
        for u in indexes[1:]:
            cmd += ["--extra-index-url", u]
        if wheelhouse:
            cmd += ["--find-links", wheelhouse]
        from trainbox.supply.index import ca_bundle

        cert = ca_bundle()
        if cert:
            cmd += ["--cert", cert]
        # only what the build's pip gets too: no pip.conf (this host's find-links and extra indexes), no cache
        env = dict(os.environ, PIP_CONFIG_FILE=os.devnull)
        for k in [k for k in env if k.startswith("PIP_") and k != "PIP_CONFIG_FILE"]:
            del env[k]
        subprocess.run(cmd, check=True, env=env)
        return t1 - t0, time.monotonic() - t1


WORKLOAD_GOAL = 1.3  # a workload image (a source build, patches, a larger venv) against its plain pip install


def workload_inputs(profile: str, stack_name: str) -> tuple[dict[str, str], str]:
    """(pins, base) that `make smoke` builds `stack_name` with where its NPU base cannot be had: the profile's
    `set:` entry for it and the stack's own base.substitute (with those pins applied)."""
    from trainbox.runtime.errors import TrainboxError
    from trainbox.smoke.profile import load_profile
    from trainbox.specs.stack import load_stack

    sets = dict(load_profile(profile).get("set", {}).get(stack_name) or {})
    if not sets:
        raise TrainboxError(f"bench: {profile}: no set.{stack_name} entry (the pins the substitute base needs)")
    substitute = load_stack(stack_name, sets=sets).base.substitute
    if not substitute:
        raise TrainboxError(f"bench: stack {stack_name} has no base.substitute to build on without its NPU base")
    return sets, substitute


def verdict(took: float, limit: float, goal: float) -> str:
    """'0.93 x (goal <= 1.20 x: within)'."""
    return f"{took / limit:.2f} x (goal <= {goal:.2f} x: {'within' if took <= goal * limit else 'OVER'})"


def bench_workload(args, client, created: list[str]) -> dict:
    """The workload stack's cold build on its substitute base against its own plain pip install, same run."""
    from trainbox.image import build as image_build

    sets, base = workload_inputs(args.profile, args.workload)
    opts = image_build.BuildOptions(stack=args.workload, base=base, sets=sets, wheelhouse=args.wheelhouse,
                              ca_bundle=args.ca_bundle, tag_latest=False, labels={"trainbox.bench": "1"},
                              report=str(Path(tempfile.gettempdir()) / f"trainbox-bench-{args.workload}.json"))
    planned = image_build.plan(opts, client, make_base=True)  # the substitute base, made untimed if missing
    print(f"bench: the limit for {args.workload}: plain pip install of its pinned wheels", file=sys.stderr)
    t_venv, t_pip = plain_pip_install(args.workload, args.wheelhouse, sets, plan=planned)
    limit = t_venv + t_pip
    # where the build resolves the pins' dependencies itself, also the limit as measured before 2026-11-28: the
    # pins alone (twinkle: 62 of the 103 distributions the build installs)
    deps = limit_requirements(args.workload, sets, planned)[1]
    pins_only = limit if _locked(deps) else \
        sum(plain_pip_install(args.workload, args.wheelhouse, sets, plan=planned, pins_only=True))
    print(f"bench: cold build of {args.workload} on {base} (layer cache ignored)", file=sys.stderr)
    opts.force, opts.no_cache = True, True
    cold, t_cold = _timed_build(opts)
    created.append(cold.tag)
    print(f"\nworkload stack {args.workload} on {base}: cold {t_cold:.1f} s, limit {limit:.1f} s (venv "
          f"{t_venv:.1f} s + pip install {t_pip:.1f} s)")
    print(f"cold / limit = {verdict(t_cold, limit, WORKLOAD_GOAL)}")
    print(f"(against the pins alone, without their dependencies, {pins_only:.1f} s: {t_cold / pins_only:.2f} x)")
    steps = [s for s in cold.report.get("steps", []) if not s.get("from") and s.get("seconds")]
    for s in sorted(steps, key=lambda s: -s["seconds"])[:5]:
        print(f"  {s['seconds']:6.1f}  {s['name'][:100]}")
    return {"stack": args.workload, "base": base, "sets": sets, "cold_s": round(t_cold, 2),
            "limit_s": round(limit, 2), "limit_venv_s": round(t_venv, 2), "limit_pip_s": round(t_pip, 2),
            "cold_over_limit": round(t_cold / limit, 3), "goal": WORKLOAD_GOAL,
            "limit_pins_only_s": round(pins_only, 2), "cold_over_pins_only": round(t_cold / pins_only, 3),
            "steps": [{"name": s["name"], "seconds": s["seconds"]} for s in steps],
            "image_bytes": cold.report.get("size")}


def _mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stack", default="cpu")
    ap.add_argument("--wheelhouse", default=None, help="passed to every build (e.g. the CPU torch wheel)")
    ap.add_argument("--ca-bundle", default=None)
    ap.add_argument("--prune-cache", action="store_true",
                    help="empty the engine's download caches first (the pip/apt cache mounts, shared by every "
                    "build on this engine), so the cold build downloads what a first build does")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each rebuild; the median is reported")
    ap.add_argument("--workload", default="twinkle", help="the workload stack also measured ('none': skip it)")
    ap.add_argument("--profile", default="ci/smoke-offline.yaml",
                    help="where the workload stack's substitute pins come from")
    ap.add_argument("--json", default=None, help="also write the figures here (default: build/reports/bench-build.json)")
    args = ap.parse_args(argv)

    from trainbox.image import build as image_build
    from imagescan import scan_image
    from trainbox.image.engine import find_client
    from trainbox.paths import REPO_ROOT

    client = find_client()
    client.require_engine()
    if args.prune_cache:
        # the download caches (pip, apt cache mounts) only: --no-cache already ignores the layer cache, and the
        # other builds on a shared engine keep theirs
        client.run("builder", "prune", "-f", "--filter", "type=exec.cachemount", timeout=600)

    def opts(**kw):
        return image_build.BuildOptions(stack=args.stack, wheelhouse=args.wheelhouse, ca_bundle=args.ca_bundle,
                                  tag_latest=False, labels={"trainbox.bench": "1"},
                                  report=str(Path(tempfile.gettempdir()) / f"trainbox-bench-{args.stack}.json"),
                                  **kw)

    created: list[str] = []
    # "base present": a missing or outdated trainbox base (`trainbox base bootstrap`) is made here, untimed, not
    # inside the timed cold build
    image_build.plan(opts(), client, make_base=True)
    print("bench: the limit: plain pip install of the same pinned wheels into a fresh venv", file=sys.stderr)
    t_venv, t_pip = plain_pip_install(args.stack, args.wheelhouse)
    limit = t_venv + t_pip
    try:
        print(f"bench: cold build of {args.stack} (layer cache ignored)", file=sys.stderr)
        cold, t_cold = _timed_build(opts(force=True, no_cache=True))
        created.append(cold.tag)
        print(f"bench: rebuild with nothing changed (x{args.repeat})", file=sys.stderr)
        same_runs = []
        for _ in range(args.repeat):
            same, took = _timed_build(opts())
            assert same.skipped, "a no-change rebuild should be answered from the content-hash tag"
            same_runs.append(took)
        t_same = statistics.median(same_runs)
        results = {}
        for what, edit in (("package", "python/trainbox/__init__.py"), ("launcher", None)):
            if edit is None:
                files = sorted(p for p in (REPO_ROOT / "launchers").rglob("*") if p.is_file())
                edit = str(files[0].relative_to(REPO_ROOT))
            print(f"bench: rebuild after editing {edit} (x{args.repeat}, a new edit each time)", file=sys.stderr)
            runs = []
            for _ in range(args.repeat):
                with tempfile.TemporaryDirectory(prefix="trainbox-bench-") as tmp:
                    out, took = _timed_build(opts(), _edited_copy(Path(tmp), edit))
                created.append(out.tag)
                runs.append(took)
            results[what] = (out, statistics.median(runs), runs)

        print("bench: scanning the image's layers", file=sys.stderr)
        scan = scan_image(client, cold.tag, hash_files=True)
        cache_bytes = sum(f.size for f in scan.cache_files())
        dup_bytes, dups = scan.duplicate_bytes()
        shadow_bytes, shadows = scan.shadowed_bytes()
        size = cold.report["size"]

        rows = [
            ("limit: plain pip", f"{limit:8.2f} s", f"{limit / t_cold:.3f}"),
            ("cold build", f"{t_cold:8.2f} s", "1.000"),
            ("no-change rebuild", f"{t_same:8.2f} s", f"{t_same / t_cold:.3f}"),
            ("package-edit rebuild", f"{results['package'][1]:8.2f} s", f"{results['package'][1] / t_cold:.3f}"),
            ("launcher-edit rebuild", f"{results['launcher'][1]:8.2f} s", f"{results['launcher'][1] / t_cold:.3f}"),
        ]
        print(f"\ntrainbox build benchmark: stack {args.stack}, {client.describe()}")
        print(f"{'':24}{'time':>10}  {'x cold':>7}   (rebuilds: median of {args.repeat} runs)")
        for name, t, ratio in rows:
            print(f"{name:24}{t:>10}  {ratio:>7}")
        print(f"\ncold / limit = {verdict(t_cold, limit, 1.2)}; the limit is venv {t_venv:.1f} s "
              f"+ pip install {t_pip:.1f} s")
        worst = max(t_same, results["package"][1], results["launcher"][1]) / t_cold
        print(f"rebuilds / cold: at most {worst:.3f} x (goal <= 0.050 x each: {'within' if worst <= 0.05 else 'OVER'})")
        steps = [s for s in cold.report.get("steps", []) if not s.get("from") and s.get("seconds")]
        print("\ncold build steps (seconds; BuildKit runs stages in parallel, so they may overlap):")
        for s in sorted(steps, key=lambda s: -s["seconds"])[:10]:
            print(f"  {s['seconds']:6.1f}  {s['name'][:100]}")
        print(f"  {t_cold - sum(s['seconds'] for s in steps):6.1f}  the rest (context transfer, base, export)")
        print(f"\nimage {cold.tag}: {_mb(size)} in {scan.layer_count} layers")
        print(f"  caches (pip, apt, /tmp, debconf backups): {_mb(cache_bytes)}")
        print(f"  duplicate files (same bytes, several paths): {_mb(dup_bytes)} in {len(dups)} groups")
        for sha, fsize, n in dups[:5]:
            paths = [f.path for f in scan.files if f.sha256 == sha][:2]
            print(f"    {_mb(fsize * (n - 1)):>10}  {n} x {paths[0]}" + (f" = {paths[1]}" if len(paths) > 1 else ""))
        print(f"  shadowed files (replaced or deleted by a later layer): {_mb(shadow_bytes)}")
        for path, fsize, layer in shadows[:5]:
            print(f"    {_mb(fsize):>10}  layer {layer}: {path}")

        figures = {
            "stack": args.stack, "client": client.describe(), "cold_s": round(t_cold, 2),
            "limit_s": round(limit, 2), "limit_venv_s": round(t_venv, 2), "limit_pip_s": round(t_pip, 2),
            "cold_over_limit": round(t_cold / limit, 3),
            "steps": [{"name": s["name"], "seconds": s["seconds"]} for s in steps],
            "repeat": args.repeat, "no_change_runs_s": [round(t, 3) for t in same_runs],
            "no_change_s": round(t_same, 2), "no_change_ratio": round(t_same / t_cold, 4),
            "package_edit_s": round(results["package"][1], 2),
            "package_edit_ratio": round(results["package"][1] / t_cold, 4),
            "package_edit_runs_s": [round(t, 3) for t in results["package"][2]],
            "launcher_edit_s": round(results["launcher"][1], 2),
            "launcher_edit_ratio": round(results["launcher"][1] / t_cold, 4),
            "launcher_edit_runs_s": [round(t, 3) for t in results["launcher"][2]],
            "package_edit_steps_run": results["package"][0].report["rebuilt_steps"],
            "launcher_edit_steps_run": results["launcher"][0].report["rebuilt_steps"],
            "image_bytes": size, "layers": scan.layer_count, "cache_bytes": cache_bytes,
            "duplicate_bytes": dup_bytes, "shadowed_bytes": shadow_bytes,
        }
        if args.workload != "none":
            figures["workload"] = bench_workload(args, client, created)
        out_path = Path(args.json) if args.json else REPO_ROOT / "build" / "reports" / "bench-build.json"
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps(figures, indent=2) + "\n")
        print(f"\nfigures: {out_path}")
    finally:
        for tag in created:
            client.remove_image(tag)
    return 0


if __name__ == "__main__":
    sys.exit(main())
