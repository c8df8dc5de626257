"""The `ray-cpu` recipe's job: a Ray driver whose remote tasks check what the launcher promised.

Submitted with `ray job submit` by the launcher script, which started a Ray head on 127.0.0.1. The tasks
run in Ray worker processes and report the environment they see; the job fails unless every variable
named in TRAINBOX_RAY_EXPECT (NAME=VALUE pairs, comma separated) reached them with that value -- which is
how the NPU recipes rely on RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES and the allocator settings
reaching the actors -- and unless a small computation spread over the tasks comes out right.
"""

from __future__ import annotations

import os
import sys

import ray


@ray.remote(num_cpus=1)
def probe(i: int, names: list[str]) -> dict:
    return {"i": i, "square": i * i, "pid": os.getpid(), "env": {n: os.environ.get(n) for n in names}}


def main() -> int:
    expect = dict(item.split("=", 1) for item in os.environ.get("TRAINBOX_RAY_EXPECT", "").split(",") if item)
    ray.init()  # the job supervisor sets RAY_ADDRESS
    resources = ray.cluster_resources()
    print(f"ray-cpu: Ray {ray.__version__}, cluster resources {resources}", flush=True)
    results = ray.get([probe.remote(i, sorted(expect)) for i in range(8)])
    total = sum(r["square"] for r in results)
    pids = sorted({r["pid"] for r in results})
    print(f"ray-cpu: 8 tasks on {len(pids)} worker process(es), sum of squares {total}", flush=True)
    problems = []
    if total != sum(i * i for i in range(8)):
        problems.append(f"sum of squares is {total}, expected {sum(i * i for i in range(8))}")
    for r in results:
        for name, want in expect.items():
            got = r["env"].get(name)
            if got != want:
                problems.append(f"task {r['i']} (pid {r['pid']}): {name}={got!r}, expected {want!r}")
    for p in problems:
        print(f"ray-cpu: FAIL {p}", file=sys.stderr, flush=True)
    if not problems:
        print(f"ray-cpu: ok: the workers see {', '.join(f'{k}={v}' for k, v in sorted(expect.items()))}", flush=True)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
