"""Record what the CANN set_env scripts export, once, at image build time (runtime: stdlib only).

The cann base image's own ENTRYPOINT sources the toolkit's, BiSheng's (AscendNPU-IR) and ATB's set_env.sh;
trainbox's entrypoint replaces that ENTRYPOINT. `python3 -m trainbox.runtime.cann_env --write FILE` runs in the
image build, sources the same scripts the entrypoint would (trainbox.runtime.entrypoint.set_env_scripts) and
writes what they change as JSON (schema 1: {"schema", "sourced": [script...], "env": {NAME: VALUE}}).
`trainbox image build` then bakes the record into the image as ENV (trainbox.image.toolkits.cann: a Dockerfile cannot
compute ENV, so it is committed after the build), so a Kubernetes `command:` that bypasses the entrypoint has
it too. The entrypoint still applies the record instead of running bash at every start (a no-op where the ENV
holds it), and `trainbox doctor` (cann.env_baked) names what the image's ENV lacks. Built on a base without
CANN (the smoke substitute), `sourced` is empty, nothing is baked and the entrypoint looks again at start.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from .entrypoint import set_env_scripts, source_scripts


def capture(env: dict | None = None) -> dict:
    base = dict(os.environ if env is None else env)
    scripts = set_env_scripts(base)
    after, changed = source_scripts(dict(base), scripts)
    return {"schema": 1, "sourced": scripts, "env": {k: after[k] for k in sorted(changed)}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m trainbox.runtime.cann_env", description=__doc__.splitlines()[0])
    p.add_argument("--write", metavar="FILE", help="write the record here (default: print it)")
    args = p.parse_args(argv)
    record = json.dumps(capture(), indent=2, sort_keys=True) + "\n"
    if not args.write:
        sys.stdout.write(record)
        return 0
    tmp = f"{args.write}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(record)
    os.replace(tmp, args.write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
