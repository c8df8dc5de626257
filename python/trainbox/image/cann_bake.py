"""Bake the CANN environment the base's set_env scripts export into the built image as ENV (host module).

Why after the build: a Dockerfile's ENV cannot be computed by a RUN, and `trainbox render` cannot know what a
base it cannot pull exports. The NPU image's build records it instead (`python3 -m trainbox.runtime.cann_env
--write /etc/trainbox/cann-env.json`: the toolkit's, BiSheng's / AscendNPU-IR's and ATB's (`--cxx_abi=1`)
set_env.sh, sourced as the cann base's own ENTRYPOINT would). `trainbox image build` then reads that record
from the built image and commits it as ENV on the same tags (metadata only: no layer is added), so that a
Kubernetes `command:` that bypasses the entrypoint gets the CANN environment too. The entrypoint still applies
the record at every start (a no-op where the ENV already holds it) and `trainbox doctor` names what an image
built by plain `docker build` lacks. A record with nothing sourced (a base without CANN, the smoke substitute)
bakes nothing. The baked image is checked against the record: a value that did not survive fails the build.
"""

from __future__ import annotations

import io
import json
import tarfile

from .engine import Client
from ..runtime.errors import TrainboxError
from ..runtime.npu import CANN_ENV_FILE

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
