"""The CANN toolkit's one home on the host (Ascend NPU stacks), in the shape of hpccm's building blocks: one object
per toolkit owns its install facts and its runtime half. Every CANN fact and step is reachable from here:

- the facts (set_env scripts, toolkit homes, driver mounts, device nodes, the record's path, the base's tag form):
  spelled once in trainbox.runtime.npu, which the image's own code (entrypoint, doctor, device) reads too and
  which cannot import a host module: `facts` is that module;
- the environment record: trainbox.runtime.cann_env captures what the set_env scripts export, in the image build
  (the Dockerfile's step, rendered from ENV_RECORD_STEP);
- the bake: `bake()` below commits that record as ENV after the build;
- the rules about CANN pins (torch_npu's CANN line, the base's tag): RULES, in trainbox.specs.rules;
- the base: `base_facts(image)` (what a cann base's tag states), `declared_version(manifest)`, `image_labels()`;
- the launch half (`runtime()` in hpccm's terms): `docker_args`, `host_mounts`, `launch_env`, VISIBLE_DEVICES_VAR,
  HOST_NEEDS;
- the doctor's half: DOCTOR_MODULES and `doctor_checks()` (trainbox.runtime.doctor.npu and .hccl).

The bake: a Dockerfile's ENV cannot be computed by a RUN, and `trainbox render` cannot know what a base it cannot
pull exports. The NPU image's build records it instead (`python3 -m trainbox.runtime.cann_env --write
/etc/trainbox/cann-env.json`: the toolkit's, BiSheng's / AscendNPU-IR's and ATB's (`--cxx_abi=1`) set_env.sh,
sourced as the cann base's own ENTRYPOINT would). `trainbox image build` then reads that record from the built
image and commits it as ENV on the same tags (metadata only: no layer is added), so that a Kubernetes `command:`
that bypasses the entrypoint gets the CANN environment too. The entrypoint still applies the record at every
start (a no-op where the ENV already holds it) and `trainbox doctor` names what an image built by plain `docker
build` lacks. A record with nothing sourced (a base without CANN, the smoke substitute) bakes nothing. The baked
image is checked against the record: a value that did not survive fails the build.
"""

from __future__ import annotations

import io
import json
import os
import tarfile

from ..engine import Client
from ...runtime import cann_env as env_record, npu as facts
from ...runtime.doctor import hccl as doctor_hccl, npu as doctor_npu
from ...runtime.errors import TrainboxError
from ...runtime.npu import CANN_ENV_FILE
from ...specs import rules

NAME = "cann"
DEVICE = "npu"
NEEDS = "cann-toolkit"  # what a component's `needs:` names for it (trainbox.runtime.install_source checks it)
ENV_RECORD = env_record
ENV_RECORD_FILE = CANN_ENV_FILE
VISIBLE_DEVICES_VAR = facts.VISIBLE_DEVICES_VAR
#: The spec rules about CANN pins (trainbox.specs.rules registers them; `stack check` runs them).
RULES = ("torch-npu-cann", "base-reference", "npu-no-cuda-torch")
#: Where the doctor checks the toolkit, the cards and the driver, and HCCL's settings.
DOCTOR_MODULES = (doctor_npu, doctor_hccl)
#: The doctor's findings where no card is given (a CI runner: no device nodes, no driver mounts, and `import torch`
#: fails because torch auto-loads torch_npu, which needs the driver's libascend_hal.so) ...
DOCTOR_FAILS_WITHOUT_CARDS = ("npu.devices", "npu.driver", "npu.visible_devices", "torch.import")
#: ... and on a substitute base (a plain Debian standing in for the cann image): no toolkit either.
DOCTOR_FAILS_ON_SUBSTITUTE = ("cann.toolkit", "cann.env", "cann.libs")
#: What the host (or cluster) must provide: said at the top of every job script.
HOST_NEEDS = (f"Ascend driver + firmware, the cards as {facts.NPU_CARD_NODE}N with "
              + ", ".join(n.rsplit("/", 1)[-1] for n in facts.NPU_DEVICE_NODES)
              + f", and {os.path.dirname(facts.DRIVER_LIB64)} mounted into the container (`trainbox run` adds them)")


def base_facts(image: str) -> dict[str, str] | None:
    """What a CANN base image's tag states (cann, chip, os, python), or None for another image."""
    return rules.cann_tag(image)


def declared_version(manifest: dict) -> str | None:
    """The CANN a built image's manifest declares (its stack's base.cann)."""
    return (manifest.get("base") or {}).get("cann")


def image_labels(cann: str | None, substituted: bool) -> dict[str, str]:
    """The image's CANN label: on a substitute base (Debian standing in for the CANN image) the image holds no CANN,
    so it says which one the stack declares without claiming it (`trainbox run` reads io.trainbox.cann)."""
    if not cann:
        return {}
    return {"io.trainbox.cann.declared" if substituted else "io.trainbox.cann": cann}


def doctor_checks() -> tuple[str, ...]:
    """The ids of the doctor's checks of this toolkit, cards and driver."""
    from ...runtime.doctor.core import CHECKS

    mods = {m.__name__ for m in DOCTOR_MODULES}
    return tuple(c.id for c in CHECKS if c.func.__module__ in mods)


def host_mounts(nodes: int) -> list[str]:
    """The host's driver files a container needs read-only at the same path (and, on more than one node, HCCL's
    NIC tool and its configuration)."""
    return list(facts.NPU_DRIVER_MOUNTS) + (list(facts.NPU_MULTINODE_MOUNTS) if nodes > 1 else [])


def docker_args(cards: list[int], nodes: int, mount_arg) -> list[str]:
    """`docker run` flags for the cards: --device per card and the control nodes, -v for the driver; the
    multi-node files as --mount (`mount_arg(source, target, readonly)`), so that a node that lacks one fails at
    `docker run` naming the path instead of creating an empty directory in its place."""
    args: list[str] = []
    for c in cards:
        args += ["--device", f"{facts.NPU_CARD_NODE}{c}"]
    for d in facts.NPU_DEVICE_NODES:
        args += ["--device", d]
    for m in facts.NPU_DRIVER_MOUNTS:
        args += ["-v", f"{m}:{m}:ro"]
    if nodes > 1:
        for m in facts.NPU_MULTINODE_MOUNTS:
            args += ["--mount", mount_arg(m, m, True)]
    return args


def host_has_cards() -> bool:
    """Whether this host has Ascend cards (its device manager node)."""
    return os.path.exists(facts.NPU_DEVICE_NODES[0])


def launch_env() -> dict[str, str]:
    """What a job's env needs for the cards: Ray must not rewrite the visible-devices variable."""
    return {flag: "1" for flag in facts.NPU_NOSET}


# -------------------------------------------------------------------------------------------------- the bake

BAKED_LABEL = "io.trainbox.cann-env"  # value: the number of variables baked, so a re-run knows it is done


def _quote(value: str) -> str:
    """A Dockerfile ENV value in double quotes: backslash, quote and $ escaped (no expansion)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$") + '"'


def env_changes(record: dict, source: str = CANN_ENV_FILE) -> list[str]:
    """The `docker commit --change` instructions that bake `record` (empty when nothing was sourced)."""
    if not isinstance(record, dict) or not isinstance(record.get("env"), dict):
        raise TrainboxError(f"{source}: expected the CANN environment record (schema 1: sourced, env)")
    env = record["env"]
    if not record.get("sourced") or not env:
        return []
    pairs = []
    for key, value in sorted(env.items()):
        if not (isinstance(value, str) and key.replace("_", "a").isalnum() and not key[0].isdigit()):
            raise TrainboxError(f"{source}: env {key!r}={value!r}: expected NAME=VALUE text")
        if "\n" in value or "\r" in value or "\0" in value:
            raise TrainboxError(f"{source}: {key}: a value with a line break or NUL cannot be baked as ENV")
        pairs.append(f"{key}={_quote(value)}")
    return ["ENV " + " ".join(pairs), f"LABEL {BAKED_LABEL}={len(pairs)}"]


def _read_record(client: Client, container: str) -> dict | None:
    proc = client.run("cp", f"{container}:{CANN_ENV_FILE}", "-", check=False, timeout=120)
    if proc.returncode != 0:
        return None  # an image built before the record existed: nothing to bake
    with tarfile.open(fileobj=io.BytesIO(proc.stdout)) as tar:
        member = tar.next()
        fh = tar.extractfile(member) if member is not None else None
        if fh is None:
            raise TrainboxError(f"{CANN_ENV_FILE} in the image is not a file")
        try:
            return json.loads(fh.read().decode())
        except ValueError as exc:
            raise TrainboxError(f"{CANN_ENV_FILE} in the image is not JSON ({exc})") from None


def check_baked(client: Client, ref: str, record: dict) -> None:
    """Every variable of the record holds the recorded value in the image's ENV, or the build fails naming it."""
    env = dict(e.partition("=")[::2] for e in (client.inspect(ref).get("Config") or {}).get("Env") or [])
    for key, value in sorted(record["env"].items()):
        if env.get(key) != value:
            raise TrainboxError(f"{ref}: baking the CANN environment: {key} is {env.get(key)!r} in the image's "
                                f"ENV, but {CANN_ENV_FILE} records {value!r}")


def bake(client: Client, tags: list[str], say=print) -> dict:
    """Commit the record of the image `tags[0]` as ENV on every tag; what the build report keeps:
    {"baked": N, "names": [...]}, {"baked": N, "already": True} (an earlier run did it) or {"baked": 0, "why"}."""
    ref = tags[0]
    done = client.labels(ref).get(BAKED_LABEL)
    if done is not None:
        return {"baked": int(done) if done.isdigit() else done, "already": True}
    # created, never started: no process runs, and the container's config is the image's own
    cid = client.run("create", "--network", "none", ref).stdout.decode().strip()
    try:
        record = _read_record(client, cid)
        changes = env_changes(record) if record is not None else []
        if not changes:
            return {"baked": 0, "why": "no record in the image" if record is None
                    else "nothing sourced: the base has no CANN set_env script"}
        args = ["commit", "-m", f"trainbox: the CANN environment of {CANN_ENV_FILE} as ENV"]
        for c in changes:
            args += ["--change", c]
        client.run(*args, cid, ref)
    finally:
        client.run("rm", "-f", cid, check=False)
    check_baked(client, ref, record)
    for t in tags[1:]:
        client.tag(ref, t)
    say(f"baked the CANN environment ({len(record['env'])} variables from {CANN_ENV_FILE}) into {ref} as ENV")
    return {"baked": len(record["env"]), "names": sorted(record["env"])}
